"""张量并行（2 个进程，gloo）：手写的 Megatron 切法（注意力按头、FFN 列切→行切，各一次 all-reduce）与
PyTorch 的 ColwiseParallel/RowwiseParallel（只切 FFN，或注意力与 FFN 都切），都与不切的块一致。

容差：输出与梯度 ≤ 1e-6；SGD 训练 6 步后损失相对 1e-6、参数 ≤ 1e-6（实测约 3e-8）。
"""

import pytest
import torch

from tformer_lib import MultiHeadAttention, causal_mask
from tformer_lib.parts.feedforward import PositionwiseFeedForward
from tformer_lib.parallel import launch
from tformer_lib.parallel.comm import tensor_parallel_payload
from tformer_lib.parallel.tensor_parallel import (
    ResidualBlock,
    TensorParallelAttention,
    TensorParallelFFN,
    column_shard,
    torch_parallelize_attention,
    torch_parallelize_ffn,
)
from tformer_lib.parallel.tensor_parallel_workers import gather_manual_params, tp_grad_worker, tp_train_worker, train_single_block

STEPS, LR = 6, 0.1


def _problem(activation):
    torch.manual_seed(0)
    block = ResidualBlock(MultiHeadAttention(16, 4), PositionwiseFeedForward(16, 32, activation=activation))
    return block, torch.randn(3, 5, 16), torch.randn(3, 5, 16), causal_mask(5)


def _assert_same_training(ref, res, params):
    assert res[0]["losses"] == res[1]["losses"]  # all-reduce 之后每个进程的输出相同
    assert ref["losses"] == pytest.approx(res[0]["losses"], rel=1e-6)
    assert ref["losses"][-1] < ref["losses"][0]
    assert sorted(params) == sorted(ref["params"])
    for name, value in ref["params"].items():
        assert torch.allclose(params[name], value, atol=1e-6, rtol=0), name


@pytest.mark.distributed
@pytest.mark.parametrize("activation", ["gelu", "swiglu"])
def test_manual_megatron_split_trains_like_the_unsplit_block(activation):
    block, x, target, mask = _problem(activation)
    x.requires_grad_(activation == "swiglu")  # 输入要梯度时，注意力入口 f 的反向 all-reduce 也要发生
    ref = train_single_block(block, x, target, mask, STEPS, LR)
    res = launch(tp_train_worker, 2, ("manual", block, x, target, mask, STEPS, LR), timeout=150)
    _assert_same_training(ref, res, gather_manual_params([r["params"] for r in res]))
    # 通信量：每步前向 2 次 + 反向 2 次 all-reduce，每次 (B, T, d_model)——与参数量无关
    # （x 不需要梯度时注意力入口的反向 all-reduce 不发生：3 次而不是 4 次）
    payload = tensor_parallel_payload(*x.shape, n_blocks=1, input_requires_grad=x.requires_grad)
    assert res[0]["bytes_per_step"] == payload == (4 if x.requires_grad else 3) * x.numel() * 4
    # 每个进程只存 1/p 的 W^Q 与 W_1
    assert res[0]["params"]["attn.w_q.weight"].shape == (8, 16) and res[0]["params"]["ffn.w_1.weight"].shape == (16, 16)


@pytest.mark.distributed
@pytest.mark.parametrize(("mode", "activation"), [("torch", "gelu"), ("torch_block", "gelu"), ("torch_block", "swiglu")])
def test_torch_tensor_parallel_trains_like_the_unsplit_block(mode, activation):
    """≥ 5 步：曾经从第 2 步起偏离（spawn 传来的参数在两个进程间共享内存，见 tensor_parallel 模块说明）。"""
    block, x, target, mask = _problem(activation)
    x.requires_grad_(activation == "swiglu")  # 输入要梯度时，入口的反向 all-reduce 也要出现（且 q/k/v 只一次）
    before = {k: v.clone() for k, v in block.state_dict().items()}
    ref = train_single_block(block, x, target, mask, STEPS, LR)
    res = launch(tp_train_worker, 2, (mode, block, x, target, mask, STEPS, LR), timeout=150)
    for r in res:
        _assert_same_training(ref, res, r["params"])
    # PyTorch 插入的 all-reduce 与手写的一样多、一样大：前向每个 RowwiseParallel 一次，反向每个模块入口一次
    # （x 不需要梯度时注意力入口那次省掉；SwiGLU 的 w_1、w_3 共用一个入口）；只切 FFN 时是前向 1 次 + 反向 1 次
    one = x.numel() * x.element_size()
    expected = (tensor_parallel_payload(*x.shape, n_blocks=1, input_requires_grad=x.requires_grad)
                if mode == "torch_block" else 2 * one)
    assert res[0]["bytes_per_step"] == res[1]["bytes_per_step"] == expected
    # worker 训练的是私有副本：父进程的 block 没有被子进程原地改掉
    for name, value in block.state_dict().items():
        assert torch.equal(value, before[name]), name


@pytest.mark.distributed
def test_torch_tensor_parallel_attention_output_gradients_and_local_heads():
    """一步的输出与梯度（训练测试已覆盖带掩码的情形；这里 mask=None 也要能进 DTensor 的注意力）。"""
    mode = "torch_block"
    block, x, target, _ = _problem("gelu")
    mask = None
    model = ResidualBlock(MultiHeadAttention(16, 4), PositionwiseFeedForward(16, 32, activation="gelu"))
    model.load_state_dict(block.state_dict())
    out = model(x, mask)
    torch.nn.functional.mse_loss(out, target).backward()
    res = launch(tp_grad_worker, 2, (mode, block, x, target, mask), timeout=150)
    for r in res:
        assert torch.allclose(r["out"], out.detach(), atol=1e-6)
        for name, p in model.named_parameters():
            assert torch.allclose(r["grads"][name], p.grad, atol=1e-6), name
    assert res[0]["local_weights_shape"] == (3, 2, 5, 5)  # 每个进程只算自己的 h/p = 2 个头


def test_shapes_that_do_not_divide_are_rejected():
    with pytest.raises(ValueError, match="d_ff=30 不能被进程数 world_size=4 整除"):
        TensorParallelFFN(PositionwiseFeedForward(8, 30), 0, 4)
    with pytest.raises(ValueError, match="n_heads=2 不能被进程数 world_size=4 整除"):
        TensorParallelAttention(MultiHeadAttention(8, 2), 0, 4)
    with pytest.raises(ValueError, match="只演示普通多头注意力"):
        TensorParallelAttention(MultiHeadAttention(8, 4, n_kv_heads=2), 0, 2)
    with pytest.raises(TypeError, match="ffn 应是 PositionwiseFeedForward"):
        TensorParallelFFN(torch.nn.Linear(2, 2), 0, 2)


def test_torch_attention_split_rejects_what_dtensor_cannot_run():
    with pytest.raises(ValueError, match="n_heads=2 不能被进程数 world_size=4 整除"):
        torch_parallelize_attention(MultiHeadAttention(8, 2), 4)
    with pytest.raises(ValueError, match="fast=True"):
        torch_parallelize_attention(MultiHeadAttention(8, 4, fast=True), 2)
    with pytest.raises(ValueError, match="n_kv_heads=2"):
        torch_parallelize_attention(MultiHeadAttention(8, 4, n_kv_heads=2), 2)
    with pytest.raises(ValueError, match="rope=True"):
        torch_parallelize_attention(MultiHeadAttention(8, 4, rope=True), 2)
    with pytest.raises(TypeError, match="attn 应是 MultiHeadAttention"):
        torch_parallelize_attention(torch.nn.Linear(2, 2), 2)
    with pytest.raises(ValueError, match="mode 应是"):
        tp_grad_worker(0, 2, "megatron", *_problem("gelu"))


def test_bad_world_sizes_and_ranks_are_named():
    with pytest.raises(ValueError, match="world_size 应是正整数，收到 0"):
        TensorParallelFFN(PositionwiseFeedForward(8, 16), 0, 0)
    with pytest.raises(TypeError, match="world_size 应是整数"):
        TensorParallelFFN(PositionwiseFeedForward(8, 16), 0, True)
    with pytest.raises(ValueError, match="rank 应是 0 到 world_size-1=1 之间的整数，收到 2"):
        TensorParallelAttention(MultiHeadAttention(8, 4), 2, 2)
    with pytest.raises(TypeError, match="linear 应是 nn.Linear"):
        column_shard(torch.nn.Conv1d(2, 2, 1), 0, 2)
    # 没有进程组时 PyTorch 路径直接说清楚，而不是去读环境变量
    with pytest.raises(RuntimeError, match="需要先有进程组"):
        torch_parallelize_ffn(PositionwiseFeedForward(8, 16), 2)
    with pytest.raises(RuntimeError, match="需要先有进程组"):
        torch_parallelize_attention(MultiHeadAttention(8, 4), 2)
    with pytest.raises(ValueError, match="steps 应是正整数，收到 0"):
        train_single_block(*_problem("gelu"), 0, LR)
