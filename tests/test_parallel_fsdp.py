"""FSDP2（fully_shard，2 个进程，gloo）：AdamW 4 步后与单进程整批（也就是与 DDP）的损失（相对 1e-5）、参数（≤ 5e-5，
实测约 4e-6，与 DDP 相同）一致（PAD 在各进程间分布不均，损失按全局目标数平均）；每个进程实际持有的参数/梯度/优化器字节等于 ZeRO 阶段 3 的公式。"""

import pytest
import torch

from tformer_lib import PAD
from tformer_lib.lm import LMConfig, make_lm
from tformer_lib.parallel import launch
from tformer_lib.parallel.data_parallel import train_single_process
from tformer_lib.parallel.fsdp import fsdp_train_worker
from tformer_lib.parallel.zero import zero_bytes_per_rank

STEPS, BATCH, LR = 4, 8, 1e-2


@pytest.mark.distributed
def test_fully_shard_trains_like_one_process_and_stores_a_half_per_rank():
    torch.manual_seed(0)
    model = make_lm(LMConfig(vocab_size=30, d_model=16, n_heads=2, n_layers=2, d_ff=32, max_len=16))
    gen = torch.Generator().manual_seed(2)
    blocks = torch.randint(4, 30, (32, 9), generator=gen)
    keep = torch.randint(2, 10, (32,), generator=gen)
    blocks[torch.arange(9) >= keep[:, None]] = PAD  # 每块尾部随机长度的 PAD：各进程每步的真实目标数不同
    ref = train_single_process(model, blocks, STEPS, BATCH, LR)
    res = launch(fsdp_train_worker, 2, (model.config.to_dict(), model.state_dict(), blocks, STEPS, BATCH, LR), timeout=150)
    assert ref["losses"] == pytest.approx(res[0]["losses"], rel=1e-5)
    for name, value in ref["params"].items():
        assert torch.allclose(res[0]["params"][name], value, atol=5e-5, rtol=0), name
    n = res[0]["n_params"]
    assert n == sum(p.numel() for p in model.parameters())
    formula = zero_bytes_per_rank(n, 2, 3)
    for r in res:  # 这个模型的每个张量第 0 维都是偶数，分片没有填充：逐字节相等
        assert r["bytes"] == {k: formula[k] for k in ("parameters", "gradients", "optimizer")}
    assert sum(r["bytes"]["parameters"] for r in res) == 4 * n


def test_zero_formula_by_stage():
    n, p = 1000, 4
    assert zero_bytes_per_rank(n, p, 0)["total"] == 16 * n
    assert zero_bytes_per_rank(n, p, 1)["total"] == 8 * n + 8 * n / p
    assert zero_bytes_per_rank(n, p, 2)["total"] == 4 * n + 12 * n / p
    assert zero_bytes_per_rank(n, p, 3)["total"] == 16 * n / p
    assert zero_bytes_per_rank(n, 1, 3)["total"] == zero_bytes_per_rank(n, 1, 0)["total"]
    mixed = zero_bytes_per_rank(n, p, 0, param_bytes=2, grad_bytes=2, optimizer_bytes=12)
    assert mixed["total"] == 16 * n
    with pytest.raises(ValueError, match="stage 应是"):
        zero_bytes_per_rank(n, p, 4)
    with pytest.raises(ValueError, match="world_size"):
        zero_bytes_per_rank(n, 0, 1)
