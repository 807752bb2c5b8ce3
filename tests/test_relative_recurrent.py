"""第 2 章的两个小模块：相对位置偏置（Shaw 截断 + T5 标量偏置）与极小的循环编码器。"""

import math

import pytest
import torch
import torch.nn.functional as F

from tformer_lib import MultiHeadAttention
from tformer_lib.parts.recurrent import TinyRNNEncoder, measure_sequence_mixing
from tformer_lib.parts.relative_position import RelativePositionBias, relative_position_index


def test_relative_index_is_clipped_signed_distance():
    idx = relative_position_index(4, 6, 2)
    assert idx.shape == (4, 6) and idx.dtype == torch.long
    for i in range(4):
        for j in range(6):
            assert idx[i, j] == max(-2, min(2, j - i)) + 2
    assert int(idx.min()) == 0 and int(idx.max()) == 4


@pytest.mark.parametrize("bad", [dict(t_q=0, t_k=3, max_distance=2), dict(t_q=3, t_k=3, max_distance=0)])
def test_relative_index_rejects_bad_sizes(bad):
    with pytest.raises((ValueError, TypeError)):
        relative_position_index(**bad)


def test_bias_depends_only_on_clipped_distance_and_works_for_any_length():
    torch.manual_seed(0)
    rel = RelativePositionBias(n_heads=3, max_distance=4)
    assert torch.count_nonzero(rel(5, 5)) == 0  # 初始化为 0：不改变注意力
    torch.nn.init.normal_(rel.bias.weight)
    b = rel(7, 7)  # (h, T_q, T_k)
    assert b.shape == (3, 7, 7)
    for o in range(-6, 7):  # 每条对角线 j − i = o 上取值相同
        d = torch.diagonal(b, offset=o, dim1=1, dim2=2)
        assert torch.allclose(d, d[:, :1].expand_as(d))
    long = rel(50, 50)  # 比任何“训练长度”都长也有定义；远处共用端点的桶
    assert torch.equal(long[:, 0, 10], long[:, 0, 49]) and torch.equal(long[:, 0, 10], b[:, 0, 6])
    assert sum(p.numel() for p in rel.parameters()) == (2 * 4 + 1) * 3


def test_bias_as_float_attn_mask_equals_adding_it_to_the_scores():
    torch.manual_seed(0)
    rel = RelativePositionBias(n_heads=2, max_distance=3)
    torch.nn.init.normal_(rel.bias.weight)
    q, k, v = torch.randn(1, 2, 5, 4), torch.randn(1, 2, 6, 4), torch.randn(1, 2, 6, 4)
    bias = rel(5, 6)  # (h, T_q, T_k)
    fast = F.scaled_dot_product_attention(q, k, v, attn_mask=bias)
    ref = ((q @ k.transpose(-2, -1)) / math.sqrt(4) + bias).softmax(-1) @ v
    assert torch.allclose(fast, ref, atol=1e-6)


def test_rnn_tells_the_two_orders_apart_where_attention_cannot():
    torch.manual_seed(0)
    rnn = TinyRNNEncoder(vocab_size=7, d_model=8)
    a, b = torch.tensor([[4, 5, 6]]), torch.tensor([[6, 5, 4]])  # 狗 咬 人 / 人 咬 狗
    ha, hb = rnn(a), rnn(b)
    assert ha.shape == (1, 3, 8) and rnn.last_sequential_steps == 3
    assert not torch.allclose(ha.mean(1), hb.mean(1), atol=1e-3)  # 句向量不同
    mha = MultiHeadAttention(8, 2).eval()
    xa, xb = rnn.embed(a), rnn.embed(b)
    with torch.no_grad():
        assert torch.allclose(mha(xa, xa, xa).mean(1), mha(xb, xb, xb).mean(1), atol=1e-6)  # 无位置编码：相同


def test_rnn_is_causal_in_time():
    torch.manual_seed(0)
    rnn = TinyRNNEncoder(vocab_size=9, d_model=4)
    x, y = torch.tensor([[4, 5, 6, 7]]), torch.tensor([[4, 5, 8, 8]])
    assert torch.equal(rnn(x)[:, :2], rnn(y)[:, :2])  # 前两步只看前两个词元


def test_measure_reports_step_counts_and_positive_times():
    r = measure_sequence_mixing(lengths=(4, 16), d_model=8, batch_size=2, repeats=2)
    assert r["rnn_steps"] == [4, 16] and r["attention_steps"] == [1, 1]
    assert all(t > 0 for t in r["rnn_seconds"] + r["attention_seconds"]) and r["threads"] >= 1
