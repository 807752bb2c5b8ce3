"""第 3 章检查器的用例：参考答案（与 notebooks/solutions/03_solutions.ipynb 一致）和已知错误答案。"""

import math

import torch

from checkers import Case, Wrong
from tformer_lib import scaled_dot_product_attention
from tformer_lib.exercises.ch03 import (
    buggy_attention,
    check_fixed_attention,
    check_min_scale,
    check_self_weight,
    check_softmax_backward,
    check_unit_variance_scale,
)


# ---- 练习 1：预测“自己给自己”的权重 ----
def ref_self_weight(T, r):
    e = math.exp(r * r)  # x_i · x_i = r²，与别人的点积为 0（e⁰ = 1）
    return e / (e + T - 1)


SELF = Case(check_self_weight, ref_self_weight, returns="number", wrong=[
    Wrong("hard_coded", lambda T, r: 0.9479),  # T = 4、r = 2 的答案
    Wrong("forgot_square", lambda T, r: math.exp(r) / (math.exp(r) + T - 1), key="forgot_square"),
    Wrong("uniform", lambda T, r: 1 / T, key="uniform"),
    Wrong("denominator_T", lambda T, r: math.exp(r * r) / (math.exp(r * r) + T), key="denominator_T"),
    Wrong("forgot_others", lambda T, r: 1.0, key="forgot_others"),
    Wrong("score_not_weight", lambda T, r: r * r, key="score_not_weight"),
    Wrong("other", lambda T, r: math.exp(r * r) / (math.exp(r * r) + T - 2), key="values"),
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
    Wrong("negative", lambda d, a, b: -ref_scale(d, a, b), key="negative"),
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

def _helper_calls_library(q, k, v):  # 读者自己的辅助函数里调用库：检查器也看进去
    return _my_attention(q, k, v)


def _my_attention(q, k, v):
    return scaled_dot_product_attention(q, k, v)


FIXED = Case(check_fixed_attention, ref_fixed_attention, wrong=[
    Wrong("calls_the_library", lambda q, k, v: scaled_dot_product_attention(q, k, v), key="library_call"),
    Wrong("helper_calls_the_library", _helper_calls_library, key="library_call"),
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

CASES = [SELF, SCALE, FIXED, BACKWARD]


# ---- 练习 5（动手实验）：最小的放大倍数 ----
def _bisect(top, threshold):
    lo, hi = 0.0, 1.0
    while top(hi) < threshold:  # 先找到一个够大的 c
        hi *= 2
    for _ in range(50):  # 再二分
        mid = (lo + hi) / 2
        lo, hi = (lo, mid) if top(mid) >= threshold else (mid, hi)
    return hi


def ref_min_scale(q, K, threshold):
    return _bisect(lambda c: scaled_dot_product_attention(c * q[None], K, K)[1].max().item(), threshold)


def _coarse(q, K, threshold):  # 只会翻倍、不再二分
    c = 0.1
    while scaled_dot_product_attention(c * q[None], K, K)[1].max().item() < threshold:
        c *= 2
    return c


MIN_SCALE = Case(check_min_scale, ref_min_scale, returns="number", wrong=[
    Wrong("hard_coded", lambda q, K, t: 4.0),
    Wrong("no_sqrt_d", lambda q, K, t: _bisect(lambda c: (c * (K @ q)).softmax(-1).max().item(), t), key="no_sqrt_d"),
    Wrong("not_minimal", _coarse, key="not_minimal"),
    Wrong("too_small", lambda q, K, t: ref_min_scale(q, K, t) / 2, key="too_small"),
])

CASES.append(MIN_SCALE)
