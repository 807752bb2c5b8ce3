"""第 4 章练习的前提：两段“找错”代码的错误确实存在、只在特定情形下露馅；“哪些输出会变”的理论答案与实验一致。

检查器本身（参考答案 ✅、各种错误 ❌、桩 ⏳……）由 tests/test_checkers_shared.py 与 tests/checkers/ch04.py 测试。
"""

import itertools

import pytest
import torch

from tformer_lib import MultiHeadAttention, causal_mask, scaled_dot_product_attention
from tformer_lib.exercises.ch04 import _changed_truth, buggy_masked_attention, buggy_mha_forward, changed_positions_experiment


def test_buggy_masked_attention_rows_no_longer_sum_to_one():
    g = torch.Generator().manual_seed(0)
    q = k = v = torch.randn(1, 2, 5, 8, generator=g)
    mask = causal_mask(5)
    _, w = buggy_masked_attention(q, k, v, mask)
    _, ref = scaled_dot_product_attention(q, k, v, mask=mask)
    assert torch.equal(w == 0, ref == 0)  # 屏蔽的位置一样是 0……
    assert torch.allclose(w[..., -1, :], ref[..., -1, :])  # 最后一行什么都没屏蔽，一样
    assert (w.sum(-1)[..., :-1] < 1 - 1e-3).all()  # ……但其余每行的和都小于 1


@pytest.mark.parametrize("n_heads, same", [(1, True), (2, False), (4, False)])
def test_buggy_mha_forward_is_right_only_for_one_head(n_heads, same):
    torch.manual_seed(0)
    mha = MultiHeadAttention(8, n_heads).eval()
    x = torch.randn(2, 5, 8)
    with torch.no_grad():
        assert torch.allclose(buggy_mha_forward(mha, x), mha(x, x, x), atol=1e-6) == same


def test_changed_positions_theory_matches_the_experiment_everywhere():
    for T in range(1, 8):
        for t, causal, pad in itertools.product(range(T), (False, True), (False, True)):
            assert _changed_truth(T, t, causal, pad) == changed_positions_experiment(T, t, causal, pad, seed=T + t), \
                (T, t, causal, pad)
