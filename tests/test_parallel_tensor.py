"""张量并行（2 个进程，gloo）：手写的 Megatron 切法（注意力按头、FFN 列切→行切，各一次 all-reduce）与
PyTorch 的 ColwiseParallel/RowwiseParallel，都与不切的块一致。

容差：输出与梯度 ≤ 1e-6；手写版 SGD 训练 3 步后的损失相对 1e-6、参数 ≤ 1e-6（实测约 1e-8）。
"""

import pytest
import torch

from tformer_lib import MultiHeadAttention, causal_mask
from tformer_lib.feedforward import PositionwiseFeedForward
from tformer_lib.parallel import launch
from tformer_lib.parallel.comm import tensor_parallel_payload
from tformer_lib.parallel.tensor_parallel import (
    ResidualBlock,
    TensorParallelAttention,
    TensorParallelFFN,
    gather_manual_params,
    tp_grad_worker,
    tp_train_worker,
    train_single_block,
)

STEPS, LR = 3, 0.1


def _problem(activation):
    torch.manual_seed(0)
    block = ResidualBlock(MultiHeadAttention(16, 4), PositionwiseFeedForward(16, 32, activation=activation))
    return block, torch.randn(3, 5, 16), torch.randn(3, 5, 16), causal_mask(5)


@pytest.mark.parametrize("activation", ["gelu", "swiglu"])
def test_manual_megatron_split_trains_like_the_unsplit_block(activation):
    block, x, target, mask = _problem(activation)
    ref = train_single_block(block, x, target, mask, STEPS, LR)
    res = launch(tp_train_worker, 2, ("manual", block, x, target, mask, STEPS, LR), timeout=150)
    assert res[0]["losses"] == res[1]["losses"]  # all-reduce 之后每个进程的输出相同
    assert ref["losses"] == pytest.approx(res[0]["losses"], rel=1e-6)
    assert ref["losses"][-1] < ref["losses"][0]
    params = gather_manual_params([r["params"] for r in res])
    assert sorted(params) == sorted(ref["params"])
    for name, value in ref["params"].items():
        assert torch.allclose(params[name], value, atol=1e-6, rtol=0), name
    # 通信量：每步前向 2 次 + 反向 2 次 all-reduce，每次 (B, T, d_model)——与参数量无关
    # （x 是数据、不需要梯度，所以注意力入口的反向 all-reduce 不发生：3 次而不是 4 次）
    assert res[0]["bytes_per_step"] == tensor_parallel_payload(*x.shape, n_blocks=1, input_requires_grad=False)
    # 每个进程只存 1/p 的 W^Q 与 W_1
    assert res[0]["params"]["attn.w_q.weight"].shape == (8, 16) and res[0]["params"]["ffn.w_1.weight"].shape == (16, 16)


def test_torch_tensor_parallel_ffn_matches_the_unsplit_block():
    block, x, target, mask = _problem("gelu")
    model = ResidualBlock(MultiHeadAttention(16, 4), PositionwiseFeedForward(16, 32, activation="gelu"))
    model.load_state_dict(block.state_dict())
    out = model(x, mask)
    torch.nn.functional.mse_loss(out, target).backward()
    res = launch(tp_grad_worker, 2, ("torch", block, x, target, mask), timeout=150)
    for r in res:
        assert torch.allclose(r["out"], out.detach(), atol=1e-6)
        for name, p in model.named_parameters():
            assert torch.allclose(r["grads"][name], p.grad, atol=1e-6), name


def test_shapes_that_do_not_divide_are_rejected():
    with pytest.raises(ValueError, match="d_ff=30 不能被进程数 world_size=4 整除"):
        TensorParallelFFN(PositionwiseFeedForward(8, 30), 0, 4)
    with pytest.raises(ValueError, match="n_heads=2 不能被进程数 world_size=4 整除"):
        TensorParallelAttention(MultiHeadAttention(8, 2), 0, 4)
    with pytest.raises(ValueError, match="只演示普通多头注意力"):
        TensorParallelAttention(MultiHeadAttention(8, 4, n_kv_heads=2), 0, 2)
    with pytest.raises(TypeError, match="ffn 应是 PositionwiseFeedForward"):
        TensorParallelFFN(torch.nn.Linear(2, 2), 0, 2)
