"""第 3 章检查器的用例：参考答案（与 notebooks/solutions/03_solutions.ipynb 一致）和已知错误答案。"""

import math

import torch

from checkers import Case, Wrong
from tformer_lib import scaled_dot_product_attention
from tformer_lib.exercises.ch03 import (
    buggy_attention,
    check_attention_shapes,
    check_fixed_attention,
    check_softmax_backward,
    check_unit_variance_scale,
)


# ---- 练习 1：预测形状 ----
def ref_shapes(B, h, T_q, T_k, d_k, d_v):
    return (B, h, T_q, T_k), (B, h, T_q, d_v)


SHAPES = Case(check_attention_shapes, ref_shapes, also_correct=[
    lambda B, h, T_q, T_k, d_k, d_v: (torch.Size([B, h, T_q, T_k]), [B, h, T_q, torch.tensor(d_v)]),
], wrong=[
    Wrong("hard_coded", lambda *a: ((2, 4, 3, 7), (2, 4, 3, 8))),
    Wrong("output_d_k", lambda B, h, T_q, T_k, d_k, d_v: ((B, h, T_q, T_k), (B, h, T_q, d_k)), key="output_shape"),
    Wrong("weights_transposed", lambda B, h, T_q, T_k, d_k, d_v: ((B, h, T_k, T_q), (B, h, T_q, d_v)),
          key="weights_shape"),
    Wrong("weights_square", lambda B, h, T_q, T_k, d_k, d_v: ((B, h, T_q, T_q), (B, h, T_q, d_v)),
          key="weights_shape"),
    Wrong("output_rows_T_k", lambda B, h, T_q, T_k, d_k, d_v: ((B, h, T_q, T_k), (B, h, T_k, d_v)),
          key="output_shape"),
    Wrong("one_shape", lambda *a: (1, 2, 3, 4), key="type"),
    Wrong("string", lambda B, h, T_q, T_k, d_k, d_v: (f"({B}, {h}, {T_q}, {T_k})", (B, h, T_q, d_v)), key="string"),
])


# ---- 练习 2：单位方差的缩放系数 ----
def ref_scale(d_k, sigma_q, sigma_k):
    return 1 / (math.sqrt(d_k) * sigma_q * sigma_k)


SCALE = Case(check_unit_variance_scale, ref_scale, returns="number", wrong=[
    Wrong("hard_coded", lambda d, a, b: 0.125),
    Wrong("sigma_ignored", lambda d, a, b: 1 / math.sqrt(d), key="sigma_ignored"),
    Wrong("variance_not_std", lambda d, a, b: 1 / (d * a * b), key="variance_not_std"),
    Wrong("sigma_squared", lambda d, a, b: 1 / (math.sqrt(d) * a * a * b * b), key="sigma_squared"),
    Wrong("reciprocal", lambda d, a, b: math.sqrt(d) * a * b, key="reciprocal"),
    Wrong("sum_of_sigmas", lambda d, a, b: 1 / (math.sqrt(d) * (a + b)), key="sum_of_sigmas"),
    Wrong("other", lambda d, a, b: 1 / (math.sqrt(d + 1) * a * b), key="values"),
])


# ---- 练习 3（找错）----
def ref_fixed_attention(q, k, v):
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])  # (..., T_q, T_k)：√d_k，不是 √T
    weights = scores.softmax(dim=-1)
    return weights @ v, weights


def _no_scale(q, k, v):
    w = (q @ k.transpose(-2, -1)).softmax(dim=-1)
    return w @ v, w


def _cols(q, k, v):
    w = (q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])).softmax(dim=-2)
    return w @ v, w


_SQUARE = torch.randn(1, 4, 4)

FIXED = Case(check_fixed_attention, ref_fixed_attention,
             also_correct=[lambda q, k, v: scaled_dot_product_attention(q, k, v)], wrong=[
    Wrong("hard_coded", lambda q, k, v: buggy_attention(_SQUARE, _SQUARE, _SQUARE)),
    Wrong("the_bug", buggy_attention, key="sqrt_T"),
    Wrong("no_scale", _no_scale, key="no_scale"),
    Wrong("wrong_axis", _cols, key="wrong_axis"),
    Wrong("swapped_pair", lambda q, k, v: ref_fixed_attention(q, k, v)[::-1]),
    Wrong("only_output", lambda q, k, v: ref_fixed_attention(q, k, v)[0], key="type"),
])


# ---- 练习 4：softmax 的反向传播 ----
def ref_backward(s, g):
    a = s.softmax(dim=-1)
    return a * (g - (a * g).sum(dim=-1, keepdim=True))


def _via_jacobian(s, g):
    a = s.softmax(dim=-1)
    J = torch.diag_embed(a) - a.unsqueeze(-1) * a.unsqueeze(-2)  # (..., n, n)
    return (J @ g.unsqueeze(-1)).squeeze(-1)


BACKWARD = Case(check_softmax_backward, ref_backward, also_correct=[_via_jacobian], wrong=[
    Wrong("hard_coded", lambda s, g: torch.zeros_like(s)),
    Wrong("no_subtract", lambda s, g: s.softmax(-1) * g, key="no_subtract"),
    Wrong("forgot_a", lambda s, g: g - (s.softmax(-1) * g).sum(-1, keepdim=True), key="forgot_a"),
    Wrong("sign", lambda s, g: -ref_backward(s, g), key="sign"),
    Wrong("mean", lambda s, g: s.softmax(-1) * (g - g.mean(-1, keepdim=True)), key="mean"),
    Wrong("wrong_axis", lambda s, g: s.softmax(-1) * (g - (s.softmax(-1) * g).sum(0, keepdim=True)),
          key="wrong_axis"),
])

CASES = [SHAPES, SCALE, FIXED, BACKWARD]
