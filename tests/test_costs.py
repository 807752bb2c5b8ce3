"""FLOPs 与内存的闭式公式：与 FlopCounterMode 的实测、与真实张量大小逐一对照。"""

import pytest
import torch

from tformer_lib import DecoderLayer, EncoderLayer, TransformerConfig, make_model, scaled_dot_product_attention
from tformer_lib.measurement.costs import (
    attention_flops,
    attention_memory,
    decoder_layer_flops,
    encoder_layer_flops,
    encoder_layer_memory,
    kv_cache_bytes,
    kv_cache_bytes_per_token,
    largest_tensor_bytes,
    measure_flops,
    median_time,
    model_forward_flops,
    saved_tensor_bytes,
)


def _config(**kw):
    base = dict(src_vocab_size=50, tgt_vocab_size=40, d_model=32, n_heads=4, d_ff=64,
                n_encoder_layers=2, n_decoder_layers=2, dropout=0.0)
    base.update(kw)
    return TransformerConfig(**base)


@pytest.mark.parametrize("batch,length", [(1, 1), (2, 10), (3, 17)])
def test_encoder_layer_flops_match_flop_counter(batch, length):
    c = _config()
    layer = EncoderLayer(c.d_model, c.n_heads, c.d_ff).eval()
    x = torch.randn(batch, length, c.d_model)
    measured = measure_flops(lambda: layer(x))
    predicted = encoder_layer_flops(c, batch, length)
    assert measured["total"] == predicted["total"]
    # 注意力的两次批量矩阵乘法（QKᵀ 与 AV）单独对得上
    assert measured["bmm"] == predicted["self_attn.scores"] + predicted["self_attn.weighted_sum"]


def test_decoder_layer_and_model_flops_match_flop_counter():
    c = _config()
    layer = DecoderLayer(c.d_model, c.n_heads, c.d_ff).eval()
    x, memory = torch.randn(2, 7, c.d_model), torch.randn(2, 11, c.d_model)
    assert measure_flops(lambda: layer(x, memory))["total"] == decoder_layer_flops(c, 2, 7, 11)["total"]
    model = make_model(c).eval()
    src, tgt = torch.randint(4, 50, (2, 11)), torch.randint(4, 40, (2, 7))
    assert measure_flops(lambda: model(src, tgt))["total"] == model_forward_flops(c, 2, 11, 7)["total"]


def test_attention_flops_quadratic_part():
    small, large = attention_flops(1, 100, 100, 64, 4), attention_flops(1, 200, 200, 64, 4)
    assert large["scores"] == 4 * small["scores"]  # 长度翻倍，QKᵀ 变 4 倍
    assert large["q_proj"] == 2 * small["q_proj"]  # 投影只翻倍
    assert small["scores"] == 2 * 100 * 100 * 64


def test_attention_memory_matches_tensor_sizes():
    B, h, T, d_k = 2, 4, 9, 8
    q, k, v = (torch.randn(B, h, T, d_k, requires_grad=True) for _ in range(3))
    out, weights = scaled_dot_product_attention(q, k, v)
    mem = attention_memory(B, T, T, h * d_k, h)
    assert mem["weights"] == weights.numel() * weights.element_size()
    assert mem["scores"] == mem["weights"]
    assert mem["q"] == q.numel() * q.element_size()
    assert mem["output"] == out.numel() * out.element_size()
    # autograd 为反向保存的正是 q、k、v 与 softmax 权重
    saved = saved_tensor_bytes(lambda: scaled_dot_product_attention(q, k, v))
    assert saved == mem["q"] + mem["k"] + mem["v"] + mem["weights"]


@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize("length", [5, 16, 33])
def test_encoder_layer_memory_equals_saved_activations(norm_first, length):
    c = _config(norm_first=norm_first)
    layer = EncoderLayer(c.d_model, c.n_heads, c.d_ff, norm_first=norm_first)
    x = torch.randn(2, length, c.d_model, requires_grad=True)
    measured = saved_tensor_bytes(lambda: layer(x), exclude=tuple(layer.parameters()))
    assert measured == encoder_layer_memory(c, 2, length)["total"]


def test_kv_cache_bytes_match_real_cache():
    c = _config()
    model = make_model(c).eval()
    src = torch.randint(4, 50, (3, 8))
    with torch.no_grad():
        memory = model.encode(src)
        cache = model.new_cache()
        tgt = torch.randint(4, 40, (3, 1))
        for _ in range(5):
            model.decode(memory, tgt, cache=cache)

    def nbytes(caches):
        return sum(t.numel() * t.element_size() for a in caches for t in (a.k, a.v))

    predicted = kv_cache_bytes(c, batch=3, tgt_len=5, src_len=8)
    assert nbytes(cache.self_attn) == predicted["self_attn"]
    assert nbytes(cache.cross_attn) == predicted["cross_attn"]
    assert kv_cache_bytes_per_token(c) == 2 * 2 * 32 * 4
    assert kv_cache_bytes_per_token(c, bytes_per_element=2) == 2 * 2 * 32 * 2


def test_bad_arguments():
    with pytest.raises(TypeError, match="config"):
        encoder_layer_flops({"d_model": 8}, 1, 1)
    with pytest.raises(ValueError, match="length"):
        encoder_layer_flops(_config(), 1, 0)
    with pytest.raises(ValueError, match="d_model=10 不能被 n_heads=3 整除"):
        attention_flops(1, 2, 2, 10, 3)


def test_median_time_is_positive():
    assert median_time(lambda: sum(range(100)), repeats=3) > 0


def test_largest_tensor_is_the_score_matrix_or_one_tile():
    from tformer_lib import tiled_attention

    B, h, T, d_k = 1, 4, 96, 16
    q, k, v = (torch.randn(B, h, T, d_k) for _ in range(3))
    explicit = largest_tensor_bytes(lambda: scaled_dot_product_attention(q, k, v))
    assert explicit == attention_memory(B, T, T, h * d_k, h)["scores"]  # (B, h, T, T)
    tiled = largest_tensor_bytes(lambda: tiled_attention(q, k, v, block_size=32))
    assert tiled == B * h * T * 32 * 4  # 一块分数 (B, h, T, 32)
