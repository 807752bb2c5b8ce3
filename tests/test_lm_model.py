"""仅解码器语言模型：与 nn.TransformerEncoder（因果掩码）孪生相等、GQA/MQA 的孪生、因果性、
缓存与不缓存逐位置相同、位置与掩码参数、上下文长度与坏输入的错误。"""

import itertools

import pytest
import torch
from torch import nn

from tformer_lib import MultiHeadAttention, PositionwiseFeedForward
from tformer_lib.parts.norms import RMSNorm
from tformer_lib.lm import LMConfig, LMCache, make_lm
from tformer_lib.lm.reference import TorchEncoderLM, torch_twin

V = 40


def tiny(**kw):
    base = dict(vocab_size=V, d_model=32, n_heads=4, n_layers=2, d_ff=48, max_len=24)
    base.update(kw)
    return make_lm(LMConfig(**base)).eval()


ALL_OPTIONS = list(
    itertools.product(
        ("learned", "sinusoidal", "rope", "alibi", "none"),  # positional
        ("layer", "rms"),  # norm
        (True, False),  # norm_first
        ("relu", "gelu", "swiglu"),  # activation
        (None, 2, 1),  # n_kv_heads
    )
)


@pytest.mark.parametrize("positional, norm_first, activation, tie", list(
    itertools.product(("learned", "sinusoidal", "none"), (True, False), ("relu", "gelu"), (True, False))))
def test_equals_causal_torch_transformer_encoder(positional, norm_first, activation, tie):
    torch.manual_seed(1)
    model = tiny(positional=positional, norm_first=norm_first, activation=activation, tie_embeddings=tie)
    twin = torch_twin(model)
    tokens = torch.randint(0, V, (3, 17))
    torch.testing.assert_close(model(tokens), twin(tokens), rtol=1e-5, atol=1e-5)
    # 训练模式（dropout=0）下的梯度也相同
    model.train()
    twin.train()
    model(tokens).logsumexp(-1).sum().backward()
    twin(tokens).logsumexp(-1).sum().backward()
    torch.testing.assert_close(model.tok_embed.weight.grad, twin.tok_embed.weight.grad, rtol=1e-4, atol=1e-5)


def test_twin_refuses_options_torch_lacks():
    for kw in (dict(norm="rms"), dict(activation="swiglu"), dict(positional="rope"), dict(n_kv_heads=2)):
        with pytest.raises(ValueError, match="nn.TransformerEncoder"):
            TorchEncoderLM(LMConfig(V, d_model=32, n_heads=4, **kw))


def test_gqa_with_all_heads_equals_mha():
    torch.manual_seed(2)
    mha = MultiHeadAttention(32, 4)
    gqa = MultiHeadAttention(32, 4, n_kv_heads=4)
    gqa.load_state_dict(mha.state_dict())
    x = torch.randn(2, 9, 32)
    torch.testing.assert_close(gqa(x, x, x), mha(x, x, x))


@pytest.mark.parametrize("n_kv_heads", [1, 2, 4])
@pytest.mark.parametrize("rope", [False, True])
def test_gqa_equals_mha_with_repeated_kv_weights(n_kv_heads, rope):
    torch.manual_seed(3)
    d_model, n_heads = 48, 8
    d_k, group = d_model // n_heads, n_heads // n_kv_heads
    gqa = MultiHeadAttention(d_model, n_heads, n_kv_heads=n_kv_heads, rope=rope)
    mha = MultiHeadAttention(d_model, n_heads, rope=rope)
    assert gqa.w_k.weight.shape == (n_kv_heads * d_k, d_model)
    with torch.no_grad():
        for name in ("w_q", "w_o"):
            getattr(mha, name).load_state_dict(getattr(gqa, name).state_dict())
        for name in ("w_k", "w_v"):
            src = getattr(gqa, name)
            # 每个 K/V 头的 d_k 行复制 group 份，成为同组各查询头的 K/V 投影
            w = src.weight.view(n_kv_heads, d_k, d_model).repeat_interleave(group, dim=0)
            b = src.bias.view(n_kv_heads, d_k).repeat_interleave(group, dim=0)
            getattr(mha, name).weight.copy_(w.reshape(d_model, d_model))
            getattr(mha, name).bias.copy_(b.reshape(d_model))
    x = torch.randn(2, 11, d_model)
    mask = torch.ones(11, 11, dtype=torch.bool).tril()
    torch.testing.assert_close(gqa(x, x, x, mask), mha(x, x, x, mask), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(gqa.attn_weights, mha.attn_weights, rtol=1e-5, atol=1e-6)


def test_swiglu_formula():
    torch.manual_seed(4)
    ffn = PositionwiseFeedForward(16, 24, activation="swiglu")
    x = torch.randn(2, 3, 16)
    expected = ffn.w_2(nn.functional.silu(ffn.w_1(x)) * ffn.w_3(x))
    torch.testing.assert_close(ffn(x), expected)
    assert PositionwiseFeedForward(16, 24).w_3 is None


@pytest.mark.parametrize("positional, norm, norm_first, activation, n_kv_heads", ALL_OPTIONS[::3])
def test_causality(positional, norm, norm_first, activation, n_kv_heads):
    """改动位置 t 之后的词元，位置 ≤ t 的 logits 不变。"""
    torch.manual_seed(5)
    model = tiny(positional=positional, norm=norm, norm_first=norm_first, activation=activation,
                 n_kv_heads=n_kv_heads)
    tokens = torch.randint(0, V, (2, 16))
    changed = tokens.clone()
    changed[:, 9:] = torch.randint(0, V, (2, 7))
    a, b = model(tokens), model(changed)
    torch.testing.assert_close(a[:, :9], b[:, :9], rtol=0, atol=1e-6)
    assert not torch.allclose(a[:, 9:], b[:, 9:])


@pytest.mark.parametrize("positional, norm, norm_first, activation, n_kv_heads", ALL_OPTIONS)
def test_cached_logits_equal_uncached(positional, norm, norm_first, activation, n_kv_heads):
    torch.manual_seed(6)
    model = tiny(positional=positional, norm=norm, norm_first=norm_first, activation=activation,
                 n_kv_heads=n_kv_heads)
    tokens = torch.randint(0, V, (2, 14))
    full = model(tokens)
    cache = model.new_cache()
    pieces = [model(tokens[:, :5], cache=cache)] + [model(tokens[:, t : t + 1], cache=cache) for t in range(5, 14)]
    torch.testing.assert_close(torch.cat(pieces, dim=1), full, rtol=1e-5, atol=1e-5)
    # 缓存只存 K/V 头
    kv = model.config.kv_heads
    assert cache.length == 14 and cache.layers[0].k.shape == (2, kv, 14, model.config.d_k)
    assert cache.nbytes() == 2 * 2 * 2 * kv * 14 * model.config.d_k * 4  # 层 × (K, V) × B × h_kv × T × d_k × 4 字节


def test_fast_path_equals_explicit_path():
    torch.manual_seed(7)
    model = tiny(positional="rope", n_kv_heads=2)
    tokens = torch.randint(0, V, (2, 12))
    slow = model(tokens)
    assert model.attention_weights()[0].shape == (2, 4, 12, 12)
    model.set_fast_attention(True)
    torch.testing.assert_close(model(tokens), slow, rtol=1e-5, atol=1e-5)
    assert model.attention_weights() == [None, None]


@pytest.mark.parametrize("positional", ["learned", "sinusoidal", "rope", "alibi"])
def test_explicit_positions_and_left_padding(positional):
    """左侧填充 + 每行自己的位置编号 + 填充掩码 = 各行单独跑（服务端批处理依赖这一点）。"""
    torch.manual_seed(8)
    model = tiny(positional=positional)
    a, b = torch.randint(4, V, (7,)), torch.randint(4, V, (4,))
    batch = torch.zeros(2, 7, dtype=torch.long)
    batch[0], batch[1, 3:] = a, b
    positions = torch.tensor([list(range(7)), [0, 0, 0, 0, 1, 2, 3]])
    keep = (batch != 0) | (torch.arange(7) >= 3)[None]  # 第 2 行前三个是填充
    keep[0] = True
    logits = model(batch, positions=positions, attn_mask=keep[:, None, None, :])
    torch.testing.assert_close(logits[0], model(a[None])[0], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(logits[1, 3:], model(b[None])[0], rtol=1e-5, atol=1e-5)


def test_crop_and_reorder_cache():
    torch.manual_seed(9)
    model = tiny(positional="rope")
    tokens = torch.randint(0, V, (2, 10))
    cache = model.new_cache()
    model(tokens, cache=cache)
    cache.crop(6)
    torch.testing.assert_close(model(tokens[:, 6:8], cache=cache), model(tokens[:, :8])[:, 6:], rtol=1e-5, atol=1e-5)
    cache.reorder(torch.tensor([1]))
    assert cache.layers[0].k.shape[0] == 1


def test_parameter_counts_of_options():
    base = dict(vocab_size=V, d_model=32, n_heads=4, n_layers=2, d_ff=48)
    count = lambda **kw: sum(p.numel() for p in make_lm(LMConfig(**base, **kw)).parameters())  # noqa: E731
    assert count(tie_embeddings=False) - count() == V * 32
    assert count() - count(n_kv_heads=1) == 2 * 2 * (32 + 1) * (32 - 8)  # 层 × (K, V) × (权重+偏置) × 少掉的维度
    assert count(activation="swiglu") - count() == 2 * (32 * 48 + 48)
    assert count() - count(norm="rms") == (2 * 2 + 1) * 32  # RMSNorm 没有偏置
    assert count() - count(qkv_bias=False) == 2 * (32 + 2 * 32)  # 层 × (q 偏置 + k、v 偏置)
    assert count() - count(out_bias=False) == 2 * 32
    assert count() - count(ffn_bias=False) == 2 * (48 + 32)
    assert count(activation="swiglu") - count(activation="swiglu", ffn_bias=False) == 2 * (2 * 48 + 32)


def test_bias_flags_remove_exactly_those_biases():
    model = tiny(qkv_bias=False, out_bias=True, ffn_bias=False, activation="swiglu")
    attn, ffn = model.blocks[0].self_attn, model.blocks[0].feed_forward
    assert attn.w_q.bias is None and attn.w_k.bias is None and attn.w_v.bias is None
    assert attn.w_o.bias is not None
    assert ffn.w_1.bias is None and ffn.w_2.bias is None and ffn.w_3.bias is None
    # 默认（旧模型）四个投影与 FFN 都带偏置
    default = tiny()
    assert all(getattr(default.blocks[0].self_attn, n).bias is not None for n in ("w_q", "w_k", "w_v", "w_o"))


def test_gelu_tanh_is_the_tanh_approximation():
    torch.manual_seed(3)
    exact, approx = tiny(activation="gelu"), tiny(activation="gelu_tanh")
    approx.load_state_dict(exact.state_dict())
    x = torch.randn(2, 5, 32)
    ffn = approx.blocks[0].feed_forward
    want = ffn.w_2(torch.nn.functional.gelu(ffn.w_1(x), approximate="tanh"))
    torch.testing.assert_close(ffn(x), want, rtol=0, atol=0)
    tokens = torch.randint(0, V, (2, 9))
    assert not torch.equal(exact(tokens), approx(tokens))  # 两种 GELU 的确不同


@pytest.mark.parametrize("norm", ["layer", "rms"])
def test_norm_eps_reaches_every_norm(norm):
    model = tiny(norm=norm, norm_eps=1e-6)
    norms = [m for m in model.modules() if isinstance(m, (nn.LayerNorm, RMSNorm))]
    assert len(norms) == 2 * 2 + 1 and all(m.eps == 1e-6 for m in norms)


def test_old_config_dict_without_new_fields_loads_as_before():
    cfg = LMConfig(V, d_model=32, n_heads=4, n_layers=2, d_ff=48)
    old = {k: v for k, v in cfg.to_dict().items() if k not in ("qkv_bias", "out_bias", "ffn_bias", "norm_eps")}
    restored = LMConfig.from_dict(old)
    assert restored == cfg
    assert (restored.qkv_bias, restored.out_bias, restored.ffn_bias, restored.norm_eps) == (True, True, True, 1e-5)


@pytest.mark.parametrize(
    "call, exc, word",
    [
        (lambda m: m(torch.randint(0, V, (1, 25))), ValueError, "max_len=24"),
        (lambda m: m(torch.randint(0, V, (1, 3)).float()), TypeError, "tokens"),
        (lambda m: m(torch.full((1, 3), V)), ValueError, "tokens"),
        (lambda m: m(torch.zeros(3, dtype=torch.long)), ValueError, "tokens"),
        (lambda m: m(torch.zeros(1, 3, dtype=torch.long), positions=torch.arange(4)), ValueError, "positions"),
        (lambda m: m(torch.zeros(1, 3, dtype=torch.long), positions=torch.tensor([0, 1, 24])), ValueError, "positions"),
        (lambda m: m(torch.zeros(1, 3, dtype=torch.long), attn_mask=torch.ones(3, 3)), TypeError, "attn_mask"),
        (lambda m: m(torch.zeros(1, 3, dtype=torch.long), cache=object()), TypeError, "cache"),
    ],
)
def test_bad_inputs(call, exc, word):
    with pytest.raises(exc, match=word):
        call(tiny())


def test_context_overflow_with_cache():
    model = tiny()
    cache = model.new_cache()
    model(torch.zeros(1, 20, dtype=torch.long), cache=cache)
    with pytest.raises(ValueError, match="已缓存的 20"):
        model(torch.zeros(1, 5, dtype=torch.long), cache=cache)


@pytest.mark.parametrize(
    "kw, exc, word",
    [
        (dict(d_model=30), ValueError, "n_heads"),
        (dict(n_kv_heads=3), ValueError, "n_kv_heads"),
        (dict(positional="xpos"), ValueError, "positional"),
        (dict(norm="batch"), ValueError, "norm"),
        (dict(activation="tanh"), ValueError, "activation"),
        (dict(dropout=1.0), ValueError, "dropout"),
        (dict(norm_first=1), TypeError, "norm_first"),
        (dict(pad_id=V), ValueError, "pad_id"),
        (dict(max_len=0), ValueError, "max_len"),
        (dict(qkv_bias=0), TypeError, "qkv_bias"),
        (dict(out_bias="no"), TypeError, "out_bias"),
        (dict(ffn_bias=None), TypeError, "ffn_bias"),
        (dict(norm_eps=0.0), ValueError, "norm_eps"),
        (dict(norm_eps=float("inf")), ValueError, "norm_eps"),
        (dict(norm_eps=True), ValueError, "norm_eps"),
    ],
)
def test_bad_config(kw, exc, word):
    with pytest.raises(exc, match=word):
        LMConfig(V, **kw)


def test_config_round_trip_and_factory_type():
    cfg = LMConfig(V, n_kv_heads=2, positional="rope")
    assert LMConfig.from_dict(cfg.to_dict()) == cfg
    with pytest.raises(ValueError, match="bogus"):
        LMConfig.from_dict({**cfg.to_dict(), "bogus": 1})
    with pytest.raises(TypeError, match="LMConfig"):
        make_lm(cfg.to_dict())
    assert isinstance(make_lm(cfg).new_cache(), LMCache)
