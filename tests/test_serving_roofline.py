"""serving.roofline：预填充与解码的 FLOPs 与 FlopCounterMode 实测相等，权重字节与模型参数相等，强度的性质。"""

import pytest
import torch

from tformer_lib.measurement.costs import measure_flops
from tformer_lib.lm import LMConfig, make_lm
from tformer_lib.serving.roofline import (
    arithmetic_intensity,
    attainable_flops,
    decode_cost,
    lm_forward_bytes,
    lm_forward_flops,
    lm_weight_elements,
    machine_balance,
    measure_memory_bandwidth,
    prefill_cost,
)

CONFIGS = [
    dict(),
    dict(n_kv_heads=2, activation="swiglu", tie_embeddings=False, positional="rope"),
    dict(n_kv_heads=1, activation="relu", norm="rms"),
]


def _config(**kw):
    return LMConfig(vocab_size=50, d_model=32, n_heads=4, n_layers=2, d_ff=48, max_len=32, **kw)


@pytest.mark.parametrize("kw", CONFIGS)
def test_flops_equal_flop_counter_for_prefill_and_decode(kw):
    c = _config(**kw)
    model = make_lm(c).eval()
    batch, length = 3, 7
    cache = model.new_cache()
    tokens = torch.randint(4, c.vocab_size, (batch, length), generator=torch.Generator().manual_seed(0))
    assert measure_flops(lambda: model(tokens, cache=cache))["total"] == lm_forward_flops(c, batch, length, length)["total"]
    assert measure_flops(lambda: model(tokens[:, :1], cache=cache))["total"] == lm_forward_flops(c, batch, 1, length + 1)["total"]


@pytest.mark.parametrize("kw", CONFIGS)
def test_weight_elements_equal_the_models_matmul_weights(kw):
    c = _config(**kw)
    model = make_lm(c)
    matmul = {id(m.weight): m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear)}
    assert sum(matmul.values()) == lm_weight_elements(c)["total"]  # 共享的输出层只算一次
    assert lm_forward_bytes(c, 2, 1, 5)["weights"] == 4 * sum(matmul.values())


def test_kv_bytes_grow_with_batch_and_context_weights_do_not():
    c = _config(n_kv_heads=2)
    a, b = lm_forward_bytes(c, 1, 1, 10), lm_forward_bytes(c, 4, 1, 20)
    assert b["weights"] == a["weights"]
    assert b["kv_cache"] == 8 * a["kv_cache"] == 8 * 2 * c.n_layers * 10 * 2 * c.d_k * 4
    assert lm_forward_bytes(c, 1, 1, 10, bytes_per_element=2)["total"] * 2 == a["total"]


def test_decode_intensity_climbs_with_batch_and_prefill_is_higher():
    c = LMConfig(vocab_size=4000, d_model=256, n_heads=4, n_layers=4, d_ff=1024, max_len=128)
    decode = [decode_cost(c, b, 64)["intensity"] for b in (1, 2, 4, 8, 16, 32)]
    assert all(x < y for x, y in zip(decode, decode[1:]))
    assert decode[0] < 1.0  # 一条序列解码：每读 4 字节的权重只做 2 次运算
    assert prefill_cost(c, 64)["intensity"] > 10 * decode[0]


def test_roofline_helpers():
    assert machine_balance(1e11, 1e10) == 10
    assert attainable_flops(2.0, 1e11, 1e10) == 2e10
    assert attainable_flops(50.0, 1e11, 1e10) == 1e11
    assert arithmetic_intensity(8, 4) == 2
    assert measure_memory_bandwidth(8, repeats=2) > 0


@pytest.mark.parametrize("call, match", [
    (lambda c: lm_forward_flops(c, 1, 5, 4), "context=4 不能小于 new_tokens=5"),
    (lambda c: lm_forward_bytes(c, 1, 1, 33), "max_len=32"),
    (lambda c: lm_forward_flops(c, 0, 1, 1), "batch"),
    (lambda c: lm_forward_flops("cfg", 1, 1, 1), "LMConfig"),
    (lambda c: machine_balance(0, 1), "peak_flops"),
    (lambda c: arithmetic_intensity(1, -1), "n_bytes"),
])
def test_errors_name_the_argument(call, match):
    with pytest.raises((ValueError, TypeError), match=match):
        call(_config())


@pytest.mark.parametrize("kw", CONFIGS)
def test_kv_bytes_equal_what_the_cache_holds_after_the_forward(kw):
    c = _config(**kw)
    model = make_lm(c).eval()
    cache = model.new_cache()
    with torch.no_grad():
        model(torch.randint(4, c.vocab_size, (3, 9)), cache=cache)  # 预填充 9 个位置
        model(torch.randint(4, c.vocab_size, (3, 1)), cache=cache)  # 解码第 10 个：读出 10 个位置
    assert lm_forward_bytes(c, 3, 1, 10)["kv_cache"] == cache.nbytes()
