"""量化格式：误差界来自格式本身（|w − ŵ| ≤ s/2）、int4 打包在奇数长度上精确、量化层 = 反量化权重的矩阵乘法、
``quantize_model`` 换掉该换的层、字节公式与真实张量的 nbytes 逐字节相等。"""

import pytest
import torch
from torch import nn

from tformer_lib.lm import LMConfig, make_lm
from tformer_lib.quant import (
    WEIGHT_FORMATS,
    Int4Linear,
    Int8Linear,
    dequantize_groupwise,
    dequantize_symmetric,
    int_range,
    kv_bytes_per_token,
    linear_shapes,
    linear_weight_bytes,
    pack_int4,
    parameter_count,
    quantize_groupwise,
    quantize_model,
    quantize_symmetric,
    sessions_per_memory,
    tensor_bytes,
    unpack_int4,
    weight_bytes,
)

EPS = torch.finfo(torch.float32).eps


def _within_half_step(w, w_hat, scale) -> bool:
    """|w − ŵ| ≤ s/2，只给 ŵ = s·q 的浮点舍入留一点余量（几个 ulp(|w|)）。"""
    return bool(((w.float() - w_hat.float()).abs() <= scale / 2 + 4 * EPS * w.float().abs()).all())


def _heavy_tailed(shape, seed=0):
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(shape, generator=g) * torch.rand(shape[0], 1, generator=g).mul(3)  # 每行尺度不同
    w[0, 0] = 25.0  # 一个离群值：它那一行的比例因子变大
    w[1] = 0.0  # 全零的一行：比例因子截在 eps，不出现 0/0
    return w


@pytest.mark.parametrize("bits", [8, 4])
def test_round_trip_error_is_at_most_half_a_step(bits):
    w = _heavy_tailed((16, 96))
    q, s = quantize_symmetric(w, bits)
    q_min, q_max = int_range(bits)
    assert q.dtype == torch.int8 and int(q.min()) >= q_min and int(q.max()) <= q_max
    assert s.shape == (16, 1) and s.dtype == torch.float32
    assert _within_half_step(w, dequantize_symmetric(q, s), s)
    assert torch.equal(s[:, 0], (w.abs().amax(1) / ((q_max - q_min) / 2)).clamp(min=torch.finfo(torch.float32).eps))
    assert bool((dequantize_symmetric(q, s)[1] == 0).all())
    # 最大的那个数正好落在 ±(q_max − q_min)/2 上，被截到端点后仍只差半步
    assert int(q.abs().amax()) >= q_max


@pytest.mark.parametrize("group", [32, 64, 128])
def test_groupwise_error_bound_holds_per_group(group):
    w = _heavy_tailed((8, 256), seed=group)
    q, s = quantize_groupwise(w, 4, group)
    assert q.shape == w.shape and s.shape == (8, 256 // group)
    assert _within_half_step(w.view(8, -1, group), dequantize_groupwise(q, s).view(8, -1, group), s[..., None])
    # 分组越小，比例因子越贴近局部的最大值：离群值只拖累它自己那一组
    assert float(s[0, 1]) < float(s[0, 0])


def test_groupwise_rejects_a_size_that_is_not_a_multiple_of_the_group():
    with pytest.raises(ValueError, match="in_features.*100.*group_size=32"):
        quantize_groupwise(torch.randn(4, 100), 4, 32)
    with pytest.raises(ValueError, match="in_features"):
        Int4Linear.from_linear(nn.Linear(100, 4), group_size=32)
    with pytest.raises(ValueError, match="bits"):
        quantize_symmetric(torch.randn(3), 2)


@pytest.mark.parametrize("n", [1, 2, 7, 31, 64])
def test_int4_packing_is_exact_on_odd_and_even_lengths(n):
    q = torch.randint(-8, 8, (3, n), generator=torch.Generator().manual_seed(n), dtype=torch.int8)
    packed = pack_int4(q)
    assert packed.dtype == torch.uint8 and packed.shape == (3, (n + 1) // 2)
    assert torch.equal(unpack_int4(packed, n), q)


def test_int4_packing_layout_and_errors():
    q = torch.tensor([-8, 7, 0], dtype=torch.int8)
    assert pack_int4(q).tolist() == [0 | (15 << 4), 8]  # 偶数下标在低 4 位；奇数长度补一个 0
    with pytest.raises(ValueError, match=r"\[-8, 7\]"):
        pack_int4(torch.tensor([8]))
    with pytest.raises(ValueError, match="n=5"):
        unpack_int4(pack_int4(q), 5)
    with pytest.raises(TypeError, match="整数张量"):
        pack_int4(torch.zeros(2))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_int8_linear_equals_the_matmul_with_its_dequantized_weight(dtype):
    torch.manual_seed(0)
    linear = nn.Linear(96, 40).to(dtype)
    layer = Int8Linear.from_linear(linear)
    assert layer.weight.dtype == torch.int8 and layer.scale.shape == (40,)
    x = torch.randn(5, 7, 96, dtype=dtype)
    reference = x.float() @ layer.dequantized_weight(torch.float32).T + linear.bias.float()
    out = layer(x)
    assert out.dtype == dtype and out.shape == (5, 7, 40)
    tol = 1e-5 if dtype == torch.float32 else 3e-2  # 比例因子提到乘法之外，只差浮点舍入
    assert torch.allclose(out.float(), reference, atol=tol, rtol=tol)
    assert _within_half_step(linear.weight, layer.dequantized_weight(torch.float32), layer.scale[:, None])


@pytest.mark.parametrize("group", [32, 64, 128])
def test_int4_linear_is_exactly_the_matmul_with_its_dequantized_weight(group):
    torch.manual_seed(group)
    linear = nn.Linear(256, 24)
    layer = Int4Linear.from_linear(linear, group_size=group)
    assert layer.packed.shape == (24, 128) and layer.scale.shape == (24, 256 // group)
    x = torch.randn(3, 256)
    assert torch.equal(layer(x), torch.nn.functional.linear(x, layer.dequantized_weight(), linear.bias))
    assert _within_half_step(linear.weight.view(24, -1, group), layer.dequantized_weight().view(24, -1, group),
                             layer.scale[..., None])
    with pytest.raises(ValueError, match="group_size"):
        Int4Linear.from_linear(linear, group_size=16)


CONFIGS = [
    LMConfig(vocab_size=300, d_model=128, n_heads=4, n_layers=2, d_ff=256, max_len=32),
    LMConfig(vocab_size=300, d_model=128, n_heads=4, n_kv_heads=2, n_layers=2, d_ff=256, max_len=32,
             positional="rope", norm="rms", activation="swiglu", tie_embeddings=False, qkv_bias=False, out_bias=False,
             ffn_bias=False),
    LMConfig(vocab_size=300, d_model=128, n_heads=4, n_layers=1, d_ff=256, max_len=32, out_bias=False, ffn_bias=False),
    LMConfig(vocab_size=300, d_model=128, n_heads=8, n_layers=1, d_ff=384, max_len=16, positional="sinusoidal",
             norm_first=False),
]


@pytest.mark.parametrize("config", CONFIGS, ids=["gpt", "llama-like", "qkv-bias-only", "post-ln"])
def test_weight_bytes_formula_equals_the_tensors_nbytes(config):
    assert parameter_count(config) == sum(p.numel() for p in make_lm(config).parameters())
    for fmt in WEIGHT_FORMATS:
        model = quantize_model(make_lm(config), fmt)
        assert weight_bytes(config, fmt) == tensor_bytes(model) == weight_bytes(model, fmt), fmt
    bf16_rest = quantize_model(make_lm(config).to(torch.bfloat16), "int8")
    assert weight_bytes(config, "int8", dtype=torch.bfloat16) == tensor_bytes(bf16_rest)


def test_quantize_model_replaces_every_untied_linear_and_keeps_the_tied_head():
    tied, untied = CONFIGS[0], CONFIGS[1]
    model = quantize_model(make_lm(tied), "int8")
    assert isinstance(model.lm_head, nn.Linear) and model.lm_head.weight is model.tok_embed.weight
    assert not any(type(m) is nn.Linear for name, m in model.named_modules() if name != "lm_head")
    model = quantize_model(make_lm(untied), "int4-g64")
    names = {name for name, m in model.named_modules() if isinstance(m, Int4Linear)}
    assert names == {name for name, _, _ in linear_shapes(untied)} and "lm_head" in names
    for name, out, inp in linear_shapes(untied):
        layer = model.get_submodule(name)
        assert (layer.out_features, layer.in_features) == (out, inp)
        assert layer.packed.nbytes + layer.scale.nbytes == linear_weight_bytes(out, inp, "int4-g64")
    with pytest.raises(ValueError, match="fmt"):
        quantize_model(make_lm(tied), "int3")
    with pytest.raises(ValueError, match="in_features"):
        quantize_model(make_lm(LMConfig(vocab_size=50, d_model=64, n_heads=4, n_layers=1, d_ff=64)), "int4-g128")


def test_smaller_groups_reconstruct_the_weights_better_and_int8_best():
    torch.manual_seed(0)
    model = make_lm(CONFIGS[1]).eval()
    tokens = torch.randint(3, 300, (2, 12))
    mean_error, logit_error = {}, {}
    with torch.no_grad():
        reference = model(tokens)
        for fmt in ("int8", "int4-g32", "int4-g64", "int4-g128"):
            clone = make_lm(CONFIGS[1]).eval()
            clone.load_state_dict(model.state_dict())
            quantize_model(clone, fmt)
            errors = [(clone.get_submodule(n).dequantized_weight() - model.get_submodule(n).weight).abs().mean()
                      for n, _, _ in linear_shapes(CONFIGS[1])]
            mean_error[fmt] = float(torch.stack(errors).mean())
            logit_error[fmt] = float((clone(tokens) - reference).abs().max())
    assert mean_error["int8"] < mean_error["int4-g32"] < mean_error["int4-g64"] < mean_error["int4-g128"]
    # int8 的台阶是 int4 的 1/17（127.5 对 7.5）：logits 的误差也小一个数量级
    assert logit_error["int8"] < 0.1 * min(v for k, v in logit_error.items() if k != "int8")


def test_kv_bytes_and_sessions():
    c = CONFIGS[1]  # 2 层、2 个 K/V 头、d_k = 32
    assert kv_bytes_per_token(c, "fp32") == 2 * 2 * 2 * 32 * 4
    assert kv_bytes_per_token(c, "bf16") == 2 * 2 * 2 * 32 * 2
    assert kv_bytes_per_token(c, "int8") == 2 * 2 * 2 * (32 + 4)
    memory = weight_bytes(c, "int8", dtype=torch.bfloat16) + 3 * kv_bytes_per_token(c, "int8") * 16 + 5
    assert sessions_per_memory(c, "int8", "int8", 16, memory_bytes=memory) == 3
    assert sessions_per_memory(c, "fp32", "fp32", 16, memory_bytes=1000) == 0
    with pytest.raises(ValueError, match="fmt"):
        kv_bytes_per_token(c, "int4")
    with pytest.raises(TypeError, match="config_or_model"):
        weight_bytes("llama", "int8")


def test_real_model_rows_use_the_presets():
    from tformer_lib.lm import PRESETS
    from tformer_lib.quant.real_models import real_model_rows

    rows = real_model_rows(("llama-2-7b",), context=4096)
    assert [r["weights"] for r in rows] == ["bf16", "int8", "int4-g128"]
    c = PRESETS["llama-2-7b"]
    with torch.device("meta"):
        assert rows[0]["parameters"] == sum(p.numel() for p in make_lm(c).parameters())
    assert rows[0]["weight_bytes"] == 2 * rows[0]["parameters"]
    assert rows[0]["kv_bytes_per_token"] == {"bf16": 2 * 32 * 32 * 128 * 2, "int8": 2 * 32 * 32 * (128 + 4)}
    assert rows[1]["weight_bytes"] < rows[0]["weight_bytes"] / 1.9 and rows[2]["weight_bytes"] < rows[1]["weight_bytes"]
    assert rows[0]["sessions"]["bf16"] == (80 * 10**9 - rows[0]["weight_bytes"]) // (4096 * 2 * 32 * 32 * 128 * 2)
    with pytest.raises(ValueError, match="预设"):
        real_model_rows(("gpt-5",))


# ---------------------------------------------------------------- 坏输入与边角（一次独立的接口攻击找到的）
def test_a_plain_tensor_bias_is_registered_moved_and_counted():
    import torch
    from tformer_lib.quant import Int4Linear, Int8Linear, pack_int4, quantize_groupwise, quantize_symmetric, tensor_bytes

    w = torch.randn(3, 64)
    q4, s4 = quantize_groupwise(w, 4, 32)
    m4 = Int4Linear(pack_int4(q4), s4, 64, 32, bias=torch.randn(3))
    assert "bias" in m4.state_dict() and tensor_bytes(m4) == 3 * 32 + 3 * 2 * 4 + 3 * 4
    q8, s8 = quantize_symmetric(w, 8)
    m8 = Int8Linear(q8, s8.squeeze(1), bias=torch.randn(3))
    assert "bias" in m8.state_dict() and not m8.bias.requires_grad
    assert m8.to(torch.float64).bias.dtype == torch.float64
    for bad, err in ((torch.randn(4), ValueError), ([1.0, 2.0, 3.0], TypeError)):
        with pytest.raises(err, match="bias"):
            Int8Linear(q8, s8.squeeze(1), bias=bad)
    for scale in (-s8.squeeze(1), torch.zeros(3), torch.full((3,), float("nan")), torch.ones(3, dtype=torch.int64)):
        with pytest.raises((ValueError, TypeError), match="scale"):
            Int8Linear(q8, scale)
    for in_features in (64.0, True, -64, 63):
        with pytest.raises(ValueError, match="in_features"):
            Int4Linear(pack_int4(q4), s4, in_features, 32)


def test_quantize_model_refuses_an_already_quantized_model():
    from tformer_lib.lm import LMConfig, make_lm
    from tformer_lib.quant import quantize_model

    model = quantize_model(make_lm(LMConfig(vocab_size=40, d_model=32, n_heads=2, n_layers=1, d_ff=64, max_len=8)), "int8")
    for fmt in ("int4-g32", "bf16", "int8"):
        with pytest.raises(ValueError, match="已经量化过"):
            quantize_model(model, fmt)


def test_non_finite_weights_and_bad_dequantize_arguments_are_refused():
    import torch
    from tformer_lib.quant import (dequantize_groupwise, dequantize_symmetric, quantize_groupwise, quantize_symmetric,
                                   unpack_int4)

    bad = torch.tensor([[1.0, float("nan")], [1.0, float("inf")]])
    with pytest.raises(ValueError, match="NaN 或 inf"):
        quantize_symmetric(bad, 8)
    with pytest.raises(ValueError, match="NaN 或 inf"):
        quantize_groupwise(bad, 4, 2)
    q, s = quantize_symmetric(bad, 8, check_finite=False)  # K/V 的热路径不扫描
    assert q.shape == (2, 2)
    with pytest.raises(ValueError, match="bits"):
        quantize_symmetric(torch.randn(2, 4), 8.0)
    q, s = quantize_groupwise(torch.randn(4, 8), 4, 4)
    with pytest.raises(ValueError, match="scale 的形状"):
        dequantize_groupwise(q, s[:, :1].repeat(1, 3))
    with pytest.raises(TypeError, match="dtype"):
        dequantize_symmetric(q, s[:, :1], torch.int8)
    with pytest.raises(TypeError, match="dtype"):
        dequantize_symmetric(q, s[:, :1], "float32")
    with pytest.raises(TypeError, match="q 应是整数张量"):
        dequantize_symmetric(q.float(), s[:, :1])
    with pytest.raises(ValueError, match="广播"):
        dequantize_symmetric(q, torch.ones(3, 1))
    with pytest.raises(ValueError, match="至少要有一维"):
        unpack_int4(torch.tensor(5, dtype=torch.uint8), 1)


def test_sessions_per_memory_names_the_argument_that_is_wrong():
    from tformer_lib.lm import PRESETS
    from tformer_lib.quant import sessions_per_memory

    with pytest.raises(ValueError, match="kv_fmt"):
        sessions_per_memory(PRESETS["llama-2-7b"], "bf16", "int4-g32", 10)
    with pytest.raises(ValueError, match="weight_fmt"):
        sessions_per_memory(PRESETS["llama-2-7b"], "int3", "bf16", 10)
