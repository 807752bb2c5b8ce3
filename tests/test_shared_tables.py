"""一次前向里各层共用的东西与逐层现算的结果逐位相同：RoPE 表（RopeTables）、因果路径（causal=True / is_causal）、
快速路径里不复制 K/V 的分组查询注意力（enable_gqa）。这些都是为速度做的改动：前向不能改变任何一个数（GQA 的梯度只在舍入误差内相同：同组各头求和的次序不同）。"""

import pytest
import torch

from tformer_lib import MultiHeadAttention, apply_rope, causal_mask
from tformer_lib.lm import LMConfig, make_lm
from tformer_lib.parts.positional import RopeTables


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_rope_tables_rotate_exactly_like_apply_rope(dtype):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(3, 4, 9, 16, generator=g).to(dtype)  # (B, h, T, d)
    positions = torch.randint(0, 5000, (9,), generator=g)
    tables = RopeTables(positions, 16, base=500000.0)
    assert torch.equal(tables.rotate(x), apply_rope(x, positions, base=500000.0))
    assert torch.equal(tables.rotate(x[:1]), apply_rope(x[:1], positions, base=500000.0))  # 第二种用法复用同一张表
    per_row = torch.randint(0, 5000, (3, 9), generator=g)  # 每行不同的位置（左填充的批）
    rotated = RopeTables(per_row, 16, base=500000.0).rotate(x)
    for b in range(3):
        assert torch.equal(rotated[b], apply_rope(x[b], per_row[b], base=500000.0))


def test_rope_tables_refuse_bad_input():
    with pytest.raises(ValueError, match="positions"):
        RopeTables(torch.zeros(2, 3, 4, dtype=torch.long), 8)
    with pytest.raises(ValueError, match="偶数"):
        RopeTables(torch.arange(4), 7)
    with pytest.raises(ValueError, match="最后两维"):
        RopeTables(torch.arange(4), 8).rotate(torch.randn(1, 2, 5, 8))
    per_row = RopeTables(torch.arange(8).view(2, 4), 8)  # (B=2, T=4)
    for x in (torch.randn(1, 2, 4, 8), torch.randn(3, 2, 4, 8), torch.randn(2, 4, 8)):  # 能广播，但批不对
        with pytest.raises(ValueError, match="B=2"):
            per_row.rotate(x)
    with pytest.raises(ValueError, match="浮点"):
        RopeTables(torch.arange(4), 8).rotate(torch.ones(1, 2, 4, 8, dtype=torch.long))
    for positions in (torch.ones(4, dtype=torch.bool), torch.ones(4, dtype=torch.complex64), [0, 1, 2, 3]):
        with pytest.raises((TypeError, ValueError), match="positions"):
            RopeTables(positions, 8)
    with pytest.raises(ValueError, match="base"):
        RopeTables(torch.arange(4), 8, base="10000")


def test_rope_building_blocks_name_their_bad_arguments():
    from tformer_lib.parts.positional import rope_angles, rotate_pairs

    with pytest.raises(TypeError, match="positions"):
        rope_angles(torch.ones(3, dtype=torch.bool), 8)
    with pytest.raises(ValueError, match="d 应是正的偶数"):
        rope_angles(torch.arange(3), 7)
    with pytest.raises(ValueError, match="base"):
        rope_angles(torch.arange(3), 8, base=0.0)
    cos, sin = rope_angles(torch.arange(3), 8)  # 各 (3, 4)
    with pytest.raises(ValueError, match="x 应是"):
        rotate_pairs(torch.ones(3, 8, dtype=torch.long), cos, sin)
    with pytest.raises(ValueError, match="cos 应能广播"):
        rotate_pairs(torch.randn(5, 8), cos, sin)  # T 不同
    with pytest.raises(ValueError, match="cos 应能广播"):
        rotate_pairs(torch.randn(3, 8), cos[None].expand(2, 3, 4), sin)  # 能广播，但会把结果变大
    with pytest.raises(ValueError, match="positions"):
        apply_rope(torch.randn(3, 8), [0, 1, 2])
    # 分数位置（位置插值）与整数位置用同一个公式：位置 2.0 与整数 2 的角度相同
    assert torch.equal(rope_angles(torch.tensor([2.0]), 8)[0], rope_angles(torch.tensor([2]), 8)[0])


def test_attention_refuses_a_rope_table_built_for_another_layer():
    attn = _attention(True, 2, True)
    x = torch.randn(2, 5, 32, dtype=torch.float64)
    for tables, match in ((RopeTables(torch.arange(5), 8, base=500000.0), "base"),
                          (RopeTables(torch.arange(4), 8), "T=4"),
                          (RopeTables(torch.arange(5), 16), "d=16"),
                          (RopeTables(torch.arange(15).view(3, 5), 8), "批大小 3")):
        with pytest.raises(ValueError, match=f"positions.*{match}"):
            attn(x, x, x, positions=tables)
    with pytest.raises(ValueError, match="rope_base"):
        MultiHeadAttention(32, 4, rope=True, rope_base="1e4")
    with pytest.raises(ValueError, match="rope_base"):
        LMConfig(60, positional="rope", rope_base=float("inf"))


def _attention(fast, n_kv_heads, rope, seed=0):
    torch.manual_seed(seed)
    return MultiHeadAttention(32, 4, fast=fast, n_kv_heads=n_kv_heads, rope=rope).double()


@pytest.mark.parametrize("fast", [True, False])
@pytest.mark.parametrize("n_kv_heads,rope", [(4, False), (2, True), (1, True)])
def test_causal_flag_equals_the_causal_mask_bit_for_bit_forward_and_backward(fast, n_kv_heads, rope):
    attn = _attention(fast, n_kv_heads, rope)
    x = torch.randn(2, 11, 32, dtype=torch.float64, requires_grad=True)
    grads = []
    outs = []
    for kwargs in ({"mask": causal_mask(11)}, {"causal": True}):
        out = attn(x, x, x, **kwargs)
        outs.append(out)
        grads.append(torch.autograd.grad(out.sum(), (x, *attn.parameters())))
    assert torch.equal(outs[0], outs[1])
    assert all(torch.equal(a, b) for a, b in zip(*grads))
    if not fast:  # 显式路径的权重也一样：被屏蔽处恰好为 0
        assert torch.all(attn.attn_weights.triu(1) == 0)


def test_causal_flag_refuses_a_mask_or_a_filled_cache():
    from tformer_lib.parts.kv_cache import AttentionCache

    attn = _attention(True, 4, False)
    x = torch.randn(1, 3, 32, dtype=torch.float64)
    with pytest.raises(ValueError, match="causal=True"):
        attn(x, x, x, causal_mask(3), causal=True)
    cache = AttentionCache()
    attn(x, x, x, causal=True, cache=cache)
    with pytest.raises(ValueError, match="T_q=3、T_k=6"):
        attn(x, x, x, causal=True, cache=cache)
    assert cache.k.shape[2] == 3  # 出错的那一步没有写进缓存


@pytest.mark.parametrize("fast", [True, False])
def test_a_bad_mask_leaves_the_cache_as_it_was(fast):
    from tformer_lib.parts.kv_cache import AttentionCache

    attn, cache = _attention(fast, 2, True), AttentionCache()
    x = torch.randn(1, 4, 32, dtype=torch.float64)
    attn(x, x, x, causal=True, cache=cache)
    with pytest.raises(ValueError, match="mask 的形状"):
        attn(x[:, :1], x[:, :1], x[:, :1], torch.ones(1, 1, 1, 4, dtype=torch.bool), cache=cache)  # 应是 T_k=5
    assert cache.k.shape[2] == 4


@pytest.mark.parametrize("n_kv_heads", [1, 2])
def test_sdpa_reads_shared_kv_heads_like_copied_heads(n_kv_heads):
    """快速路径把 GQA 的分组交给 SDPA（enable_gqa）：前向与先复制 K/V 逐位相同，梯度在舍入误差内相同。"""
    from tformer_lib.parts.attention import _sdpa

    g = torch.Generator().manual_seed(0)
    q = torch.randn(2, 4, 7, 8, generator=g, requires_grad=True)  # (B, h, T, d_k)
    k, v = (torch.randn(2, n_kv_heads, 7, 8, generator=g, requires_grad=True) for _ in range(2))  # (B, h_kv, T, d_k)
    mask = torch.rand(2, 1, 7, 7, generator=g) > 0.3
    group = 4 // n_kv_heads
    for kwargs in ({"causal": True}, {"mask": mask}, {}):
        m = kwargs.get("mask")
        shared = _sdpa(q, k, v, m, causal=kwargs.get("causal", False), gqa=True)
        copied = _sdpa(q, k.repeat_interleave(group, 1), v.repeat_interleave(group, 1), m, causal=kwargs.get("causal", False))
        assert torch.equal(shared, copied)
        for a, b in zip(torch.autograd.grad(shared.square().sum(), (q, k, v)),
                        torch.autograd.grad(copied.square().sum(), (q, k, v))):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("n_kv_heads", [1, 2])
def test_fast_gqa_trains_like_the_explicit_path(n_kv_heads):
    """训练时快速路径不复制 K/V，显式路径复制：同一组权重的输出与梯度在舍入误差内相同。"""
    fast, explicit = _attention(True, n_kv_heads, True), _attention(False, n_kv_heads, True)
    x = torch.randn(2, 9, 32, dtype=torch.float64)
    outs = [attn(x, x, x, causal=True) for attn in (fast, explicit)]
    torch.testing.assert_close(outs[0], outs[1], rtol=1e-10, atol=1e-12)
    for a, b in zip(torch.autograd.grad(outs[0].square().sum(), list(fast.parameters())),
                    torch.autograd.grad(outs[1].square().sum(), list(explicit.parameters()))):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


def test_fast_attention_still_names_a_bad_mask():
    attn = _attention(True, 2, False)
    x = torch.randn(2, 5, 32, dtype=torch.float64)
    with pytest.raises(ValueError, match="mask 的形状"):
        attn(x, x, x, torch.ones(3, 5, 5, dtype=torch.bool))
    with pytest.raises(TypeError, match="torch.bool"):
        attn(x, x, x, torch.ones(5, 5))


@pytest.mark.parametrize("fast", [True, False])
@pytest.mark.parametrize("positional,n_kv_heads", [("rope", 2), ("learned", 4)])
def test_language_model_causal_path_equals_the_mask_path(fast, positional, n_kv_heads):
    """没有 attn_mask 时模型走因果路径；给一个全 True 的 attn_mask 就走布尔掩码的路径：logits 与梯度逐位相同。"""
    torch.manual_seed(0)
    model = make_lm(LMConfig(60, d_model=32, n_heads=4, n_kv_heads=n_kv_heads, n_layers=2, d_ff=48, max_len=24,
                             positional=positional, fast_attention=fast, norm="rms", activation="swiglu"))
    tokens = torch.randint(3, 60, (3, 17))
    results = []
    for attn_mask in (None, torch.ones(3, 1, 1, 17, dtype=torch.bool)):
        logits = model(tokens, attn_mask=attn_mask)
        results.append((logits, torch.autograd.grad(logits.square().mean(), list(model.parameters()))))
    assert torch.equal(results[0][0], results[1][0])
    assert all(torch.equal(a, b) for a, b in zip(results[0][1], results[1][1]))


def test_same_tensor_for_query_key_value_still_checks_the_cross_attention_cache_batch():
    """自注意力的捷径（三个是同一个张量时只查一次）不能跳过“已缓存的编码器 K/V 与 query 同批”的检查。"""
    from tformer_lib.parts.kv_cache import AttentionCache

    attn = _attention(True, 4, False).float()
    memory, cache = torch.randn(2, 7, 32), AttentionCache(static=True)
    attn(torch.randn(2, 3, 32), memory, memory, cache=cache)
    q = torch.randn(1, 3, 32)
    with pytest.raises(ValueError, match="cache.k 的批大小是 2"):
        attn(q, q, q, cache=cache)


def test_caches_say_how_long_they_are_or_ask_for_positions():
    from tformer_lib.inference.static_cache import StaticKVCache
    from tformer_lib.parts.kv_cache import AttentionCache

    attn = _attention(True, 2, True)
    x = torch.randn(1, 3, 32, dtype=torch.float64)
    cross = AttentionCache(static=True)
    plain = AttentionCache()
    attn(x, x, x, cache=plain)
    assert plain.cached_length() == 3 and plain.key_length(1) == 4
    with pytest.raises(ValueError, match="new"):
        plain.key_length(0)
    # 已填好的交叉注意力缓存：update 原样返回编码器的 K/V，与 key_length 说的一致
    k, v = torch.randn(1, 2, 5, 8), torch.randn(1, 2, 5, 8)
    cross.update(k, v)
    got_k, _ = cross.update(torch.randn(1, 2, 2, 8), torch.randn(1, 2, 2, 8))
    assert got_k is k and cross.key_length(2) == 5
    # 按槽位写入的缓存没有“已缓存的长度”：不给 positions 就报错，而不是从槽位数 L 接着数
    model = make_lm(LMConfig(60, d_model=32, n_heads=4, n_kv_heads=2, n_layers=1, d_ff=48, max_len=8, positional="rope",
                             fast_attention=True)).double()
    static = StaticKVCache(model, 1, 8)
    with pytest.raises(ValueError, match="positions"):
        model.blocks[0].self_attn(x, x, x, cache=static.layers[0])
    # 已缓存的 K/V 与 query 的批大小不同：点名 cache.k，而不是 torch.cat 的报错
    with pytest.raises(ValueError, match="cache.k"):
        attn(x.expand(2, 3, 32), x.expand(2, 3, 32), x.expand(2, 3, 32), cache=plain)
    assert plain.cached_length() == 3
    with pytest.raises(ValueError, match="NaN"):
        RopeTables(torch.tensor([0.0, float("nan")]), 8)
