"""剖析：训练步 FLOPs 公式与 FlopCounterMode 相等；profiler 表的结构；MFU 的算术。不断言任何耗时。"""

import pytest
import torch
import torch.nn.functional as F

from tformer_lib.lm import LMConfig, make_lm
from tformer_lib.measurement.profiling import count_training_flops, lm_training_flops, matmul_peak_flops, mfu, profile_step


def step_fn(model, tokens, targets):
    def step():
        model.zero_grad(set_to_none=True)
        F.cross_entropy(model(tokens).flatten(0, 1), targets.flatten()).backward()
    return step


@pytest.mark.parametrize("options", [dict(), dict(activation="swiglu", norm="rms"), dict(n_kv_heads=2),
                                     dict(positional="rope", tie_embeddings=False, norm_first=False)])
@pytest.mark.parametrize("size", [(2, 9), (3, 16)])
def test_training_flops_formula_equals_flop_counter(options, size):
    config = LMConfig(50, d_model=32, n_heads=4, n_layers=2, d_ff=48, max_len=16, **options)
    model = make_lm(config).train()
    tokens, targets = torch.randint(4, 50, size), torch.randint(4, 50, size)
    formula = lm_training_flops(config, *size)
    assert count_training_flops(step_fn(model, tokens, targets)) == formula["total"] == 3 * formula["forward"]


def test_profile_table_lists_the_top_operators():
    model = make_lm(LMConfig(50, d_model=32, n_heads=4, n_layers=2, d_ff=48, max_len=16)).train()
    rows = profile_step(step_fn(model, torch.randint(4, 50, (2, 16)), torch.randint(4, 50, (2, 16))), row_limit=8)
    assert 1 <= len(rows) <= 8
    assert set(rows[0]) == {"name", "calls", "self_seconds", "share"}
    shares = [r["share"] for r in rows]
    assert shares == sorted(shares, reverse=True) and 0 < sum(shares) <= 1 + 1e-9
    assert all(r["calls"] >= 1 and r["name"] for r in rows)


def test_mfu_arithmetic_and_errors():
    assert mfu(6e9, 2.0, 1e10) == pytest.approx(0.3)
    assert matmul_peak_flops(64, repeats=2) > 0
    with pytest.raises(ValueError, match="seconds"):
        mfu(1e9, 0, 1e10)
    with pytest.raises(TypeError, match="LMConfig"):
        lm_training_flops("config", 2, 8)
    with pytest.raises(ValueError, match="row_limit"):
        profile_step(lambda: None, row_limit=0)
