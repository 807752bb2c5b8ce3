"""在线 softmax 与逐块注意力：与显式路径、与 PyTorch 的 SDPA 逐元素相等。"""

import pytest
import torch
import torch.nn.functional as F

from tformer_lib import PAD, causal_mask, combine_masks, padding_mask, scaled_dot_product_attention
from tformer_lib.parts.flash import online_softmax, tiled_attention

BLOCKS = [1, 3, 5, 8, 16, 17, 64]  # 含不整除 T 的块宽，以及比 T 还宽的块


@pytest.mark.parametrize("block_size", BLOCKS)
def test_online_softmax_matches_torch(block_size):
    x = torch.randn(3, 4, 17) * 10  # 大数值：检验减最大值确实起作用
    assert torch.allclose(online_softmax(x, block_size), x.softmax(-1), atol=1e-6)


def test_online_softmax_other_dim_and_trace():
    x = torch.randn(7, 5)
    out, trace = online_softmax(x, 3, dim=0, return_trace=True)
    assert torch.allclose(out, x.softmax(0), atol=1e-6)
    assert len(trace) == 3  # ceil(7 / 3)
    assert torch.equal(trace[-1]["m"], x.max(0).values)
    # 运行最大值单调不减
    for before, after in zip(trace, trace[1:]):
        assert torch.all(after["m"] >= before["m"])
    assert torch.allclose(trace[-1]["l"], torch.exp(x - x.max(0).values).sum(0))


def test_online_softmax_no_overflow_and_neg_inf():
    x = torch.tensor([[1000.0, 1001.0, 999.0, float("-inf")], [float("-inf")] * 4])
    out = online_softmax(x, 2)
    assert torch.allclose(out[0], x[0].softmax(-1))
    assert torch.equal(out[1], torch.zeros(4))  # 整行 -inf：0，而不是 nan


def _qkv(B=2, h=3, T_q=11, T_k=13, d=8):
    return torch.randn(B, h, T_q, d), torch.randn(B, h, T_k, d), torch.randn(B, h, T_k, d)


@pytest.mark.parametrize("block_size", BLOCKS)
def test_tiled_matches_explicit_and_sdpa_no_mask(block_size):
    q, k, v = _qkv()
    out = tiled_attention(q, k, v, block_size=block_size)
    explicit, _ = scaled_dot_product_attention(q, k, v)
    assert torch.allclose(out, explicit, atol=1e-5)
    assert torch.allclose(out, F.scaled_dot_product_attention(q, k, v), atol=1e-5)


@pytest.mark.parametrize("block_size", BLOCKS)
def test_tiled_with_padding_mask(block_size):
    q, k, v = _qkv(T_q=13, T_k=13)
    tokens = torch.randint(4, 20, (2, 13))
    tokens[1, 9:] = PAD
    mask = padding_mask(tokens, PAD)  # (B, 1, 1, T_k)
    out = tiled_attention(q, k, v, mask, block_size=block_size)
    explicit, _ = scaled_dot_product_attention(q, k, v, mask)
    assert torch.allclose(out, explicit, atol=1e-5)
    assert torch.allclose(out, F.scaled_dot_product_attention(q, k, v, attn_mask=mask), atol=1e-5)


@pytest.mark.parametrize("block_size", BLOCKS)
def test_tiled_with_causal_and_padding_mask(block_size):
    q, k, v = _qkv(T_q=13, T_k=13)
    tokens = torch.randint(4, 20, (2, 13))
    tokens[0, 10:] = PAD
    mask = combine_masks(padding_mask(tokens, PAD), causal_mask(13))  # (B, 1, T, T)
    out = tiled_attention(q, k, v, mask, block_size=block_size)
    explicit, _ = scaled_dot_product_attention(q, k, v, mask)
    assert torch.allclose(out, explicit, atol=1e-5)
    causal_only = tiled_attention(q, k, v, causal_mask(13), block_size=block_size)
    assert torch.allclose(causal_only, F.scaled_dot_product_attention(q, k, v, is_causal=True), atol=1e-5)


@pytest.mark.parametrize("block_size", [1, 4, 6])
def test_fully_masked_row_gives_zeros(block_size):
    q, k, v = _qkv(T_q=5, T_k=6)
    mask = torch.ones(5, 6, dtype=torch.bool)
    mask[2] = False  # 第 3 个查询什么也看不见
    mask[3, :4] = False  # 第 4 个查询的前几块全被屏蔽，后面才有可见的键
    out = tiled_attention(q, k, v, mask, block_size=block_size)
    assert not torch.isnan(out).any()
    assert torch.equal(out[:, :, 2], torch.zeros_like(out[:, :, 2]))
    explicit, _ = scaled_dot_product_attention(q, k, v, mask)
    assert torch.allclose(out, explicit, atol=1e-5)


def test_trace_running_max_is_row_max():
    q, k, v = _qkv(T_q=4, T_k=10)
    out, trace = tiled_attention(q, k, v, block_size=4, return_trace=True)
    assert [(t["start"], t["stop"]) for t in trace] == [(0, 4), (4, 8), (8, 10)]
    scores = q @ k.transpose(-2, -1) / 8 ** 0.5  # (B, h, T_q, T_k)
    assert torch.allclose(trace[-1]["m"], scores.max(-1).values, atol=1e-6)
    assert torch.allclose(trace[-1]["l"], torch.exp(scores - scores.max(-1, keepdim=True).values).sum(-1), atol=1e-5)


def test_tiled_gradients_match_explicit():
    q, k, v = (t.requires_grad_() for t in _qkv(T_q=6, T_k=9))
    tiled_attention(q, k, v, block_size=4).square().sum().backward()
    grads = [t.grad.clone() for t in (q, k, v)]
    for t in (q, k, v):
        t.grad = None
    scaled_dot_product_attention(q, k, v)[0].square().sum().backward()
    for g, t in zip(grads, (q, k, v)):
        assert torch.allclose(g, t.grad, atol=1e-5)


def test_bad_inputs_raise_clear_errors():
    q, k, v = _qkv()
    with pytest.raises(ValueError, match="block_size"):
        tiled_attention(q, k, v, block_size=0)
    with pytest.raises(TypeError, match="block_size"):
        online_softmax(torch.randn(4), 2.5)
    with pytest.raises(ValueError, match="d_k"):
        tiled_attention(q, k[..., :4], v)
    with pytest.raises(TypeError, match="mask"):
        tiled_attention(q, k, v, mask=torch.ones(11, 13))
    with pytest.raises(TypeError, match="x 应是浮点类型"):
        online_softmax(torch.arange(4), 2)
