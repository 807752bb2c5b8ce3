"""ALiBi 作为语言模型的位置方式（``positional="alibi"``，第 16 章）：与 PyTorch 的 SDPA 加性掩码对照、
显式与快速路径、GQA、缓存、左填充，以及不支持它的缓存给出清楚的错误。"""

import math

import pytest
import torch
import torch.nn.functional as F

from tformer_lib import MultiHeadAttention, alibi_bias, alibi_slopes
from tformer_lib.inference import StaticKVCache
from tformer_lib.lm import LMConfig, generate, make_lm
from tformer_lib.serving import Engine

V = 40


def tiny(**kw):
    base = dict(vocab_size=V, d_model=32, n_heads=4, n_layers=2, d_ff=48, max_len=32, positional="alibi")
    base.update(kw)
    return make_lm(LMConfig(**base)).eval()


@pytest.mark.parametrize("fast", [False, True])
@pytest.mark.parametrize("n_kv_heads", [None, 2])
def test_attention_equals_torch_sdpa_with_alibi_mask(fast, n_kv_heads):
    """每个头的分数加 -m_h·(i-j)、再因果屏蔽，与把同一个偏置当加性掩码交给 F.scaled_dot_product_attention 相同。"""
    torch.manual_seed(0)
    attn = MultiHeadAttention(32, 4, fast=fast, n_kv_heads=n_kv_heads, alibi=True).eval()
    x = torch.randn(2, 9, 32)
    q = attn.split_heads(attn.w_q(x))  # (B, h, T, d_k)
    k = attn.split_heads(attn.w_k(x), attn.n_kv_heads).repeat_interleave(4 // attn.n_kv_heads, dim=1)  # (B, h, T, d_k)
    v = attn.split_heads(attn.w_v(x), attn.n_kv_heads).repeat_interleave(4 // attn.n_kv_heads, dim=1)  # (B, h, T, d_k)
    i = torch.arange(9)
    slopes = torch.tensor([2.0 ** (-8 * (h + 1) / 4) for h in range(4)])
    bias = -slopes[:, None, None] * (i[:, None] - i[None, :]).float()  # (h, T, T)
    bias = bias.masked_fill(i[None, :] > i[:, None], float("-inf"))  # 因果
    expected = attn.w_o(attn.merge_heads(F.scaled_dot_product_attention(q, k, v, attn_mask=bias)))
    torch.testing.assert_close(attn(x, x, x, causal=True), expected, rtol=1e-5, atol=1e-6)


def test_alibi_changes_scores_and_adds_no_parameters():
    torch.manual_seed(1)
    alibi, none = tiny(), tiny(positional="none")
    none.load_state_dict(alibi.state_dict())  # 参数完全相同：ALiBi 没有可学的位置参数
    tokens = torch.randint(0, V, (2, 12))
    assert not torch.allclose(alibi(tokens), none(tokens), atol=1e-3)
    alibi(tokens)
    weights = alibi.attention_weights()[0]  # (B, h, T, T)
    # 斜率最大的头最偏向近处：它给最近一个键的平均权重不小于斜率最小的头
    near = weights.diagonal(offset=-1, dim1=-2, dim2=-1).mean(dim=(0, 2))  # (h,)
    assert near[0] > near[-1]


def test_fast_path_equals_explicit_path_forward_and_backward():
    torch.manual_seed(2)
    model = tiny(n_kv_heads=2)
    tokens = torch.randint(0, V, (3, 20))
    slow = model(tokens)
    slow.square().mean().backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    model.set_fast_attention(True)
    fast = model(tokens)
    fast.square().mean().backward()
    torch.testing.assert_close(fast, slow, rtol=1e-5, atol=1e-5)
    for n, p in model.named_parameters():
        torch.testing.assert_close(p.grad, grads[n], rtol=1e-4, atol=1e-6, msg=n)


@pytest.mark.parametrize("fast", [False, True])
def test_generation_with_cache_equals_without(fast):
    torch.manual_seed(3)
    model = tiny(fast_attention=fast)
    prompt = torch.randint(4, V, (2, 5))
    with_cache = generate(model, prompt, 12, method="greedy")
    without = generate(model, prompt, 12, method="greedy", use_cache=False)
    assert torch.equal(with_cache, without)


def test_bias_is_right_aligned_for_incremental_queries():
    full = alibi_bias(4, 7, 7)
    torch.testing.assert_close(alibi_bias(4, 2, 7), full[:, 5:])  # 最后两个查询
    assert alibi_bias(4, 3, 3, device="cpu").dtype == torch.float32
    with pytest.raises(ValueError, match="t_q=5"):
        alibi_bias(4, 5, 3)
    assert torch.equal(full[:, 3, 1], -alibi_slopes(4) * 2)
    assert math.isclose(float(alibi_slopes(4)[0]), 2 ** -2)


def test_unsupported_combinations_are_refused_by_name():
    with pytest.raises(ValueError, match="alibi=True 与 rope=True"):
        MultiHeadAttention(32, 4, rope=True, alibi=True)
    with pytest.raises(TypeError, match="alibi"):
        MultiHeadAttention(32, 4, alibi=1)
    with pytest.raises(ValueError, match="rope_scaling"):
        LMConfig(vocab_size=V, positional="alibi", rope_scaling={"kind": "linear", "factor": 2.0})
    model = tiny()
    with pytest.raises(ValueError, match="静态缓存不支持 positional='alibi'"):
        StaticKVCache(model, 1)
    with pytest.raises(ValueError, match="Engine 不支持 positional='alibi'"):
        Engine(model)
    attn = MultiHeadAttention(32, 4, alibi=True)
    x, y = torch.randn(1, 3, 32), torch.randn(1, 5, 32)
    with pytest.raises(ValueError, match="ALiBi 只用于自注意力"):
        attn(x, y, y)
    with pytest.raises(ValueError, match="ALiBi 只用于自注意力"):
        attn(x, x.clone(), x.clone())  # 一样长也不行：交叉注意力没有“距离”
    from tformer_lib import scaled_dot_product_attention
    from tformer_lib.lm.reference import torch_twin
    from tformer_lib.parallel.tensor_parallel import TensorParallelAttention

    q = torch.randn(1, 2, 3, 4)
    with pytest.raises(TypeError, match="bias 应是浮点张量"):
        scaled_dot_product_attention(q, q, q, bias=torch.ones(3, 3, dtype=torch.bool))
    with pytest.raises(ValueError, match="应能广播到分数的形状"):
        scaled_dot_product_attention(q, q, q, bias=torch.zeros(7, 1, 2, 3, 3))
    with pytest.raises(ValueError, match="ALiBi"):
        torch_twin(model)
    with pytest.raises(ValueError, match="ALiBi"):
        TensorParallelAttention(attn, 0, 1)
