"""第 3 章练习里“找错”题的前提：有错的代码在本章的方阵例子上与库一致，换成 T ≠ d_k 就露馅。

检查器本身（参考答案 ✅、各种错误 ❌、桩 ⏳……）由 tests/test_checkers_shared.py 与 tests/checkers/ch03.py 测试。
"""

import torch

from tformer_lib import scaled_dot_product_attention
from tformer_lib.exercises.ch03 import buggy_attention


def test_buggy_attention_hides_on_square_inputs_and_shows_otherwise():
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 4, 4, generator=g) for _ in range(3))  # T = d_k = 4，和“人工智能”一样
    for a, b in zip(buggy_attention(q, k, v), scaled_dot_product_attention(q, k, v)):
        assert torch.allclose(a, b, atol=1e-6)
    q, k, v = torch.randn(2, 5, 16, generator=g), torch.randn(2, 7, 16, generator=g), torch.randn(2, 7, 3, generator=g)
    assert not torch.allclose(buggy_attention(q, k, v)[1], scaled_dot_product_attention(q, k, v)[1], atol=1e-3)
