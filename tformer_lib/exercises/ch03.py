"""第 3 章练习的检查器（checker）：朴素自注意力、注意力的熵、softmax 的雅可比矩阵。

用 :mod:`tformer_lib.exercises._core` 的框架：桩 → “⏳ 尚未完成”（不抛异常）；通过 → ✅；
未通过 → ❌ 加一句点名常见错误的提示（softmax 方向错、忘了 softmax、用了 XᵀX、忘了加权求和、
0·ln0 得到 NaN、用了 log2、雅可比漏了对角项……）。
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch

from tformer_lib.exercises._core import CheckResult, Mistake, Variant, as_tensor, compare, randn, run_checks

__all__ = ["check_simple_self_attention", "check_attention_entropy", "check_softmax_jacobian"]


# ---- 练习：朴素自注意力 softmax(X Xᵀ) X ------------------------------------------------------------


def _pair(out: Any) -> tuple[Any, Any]:
    if not (isinstance(out, (tuple, list)) and len(out) == 2):
        raise Mistake("请返回二元组 (output, weights)", key="type")
    return out[0], out[1]


def _gram(x: torch.Tensor) -> torch.Tensor:
    return x @ x.transpose(-2, -1)  # (..., T, T)


def check_simple_self_attention(fn: Callable[[torch.Tensor], Any], *, verbose: bool = True) -> CheckResult:
    """检查 ``fn(X) -> (output, weights)``：不带参数、不缩放的自注意力。

    ``X`` 形状 ``(..., T, d)``；应返回 ``weights = softmax(X Xᵀ)``（沿最后一维，``(..., T, T)``）
    与 ``output = weights @ X``（``(..., T, d)``）。
    """

    def weight_variants(x: torch.Tensor) -> list[Variant]:
        g = _gram(x)
        return [
            Variant("wrong_axis", "softmax 的方向不对：现在是每一列和为 1；应沿最后一维（键的方向，dim=-1）归一化，"
                    "让每一行和为 1", g.softmax(dim=-2)),
            Variant("no_softmax", "weights 就是原始分数 X Xᵀ：忘了做 softmax", g),
            Variant("scaled", "这里练的是不带缩放的朴素版本 softmax(X Xᵀ)，不要除以 √d",
                    (g / math.sqrt(x.shape[-1])).softmax(dim=-1)),
        ]

    def output_variants(x: torch.Tensor) -> list[Variant]:
        w = _gram(x).softmax(dim=-1)
        return [
            Variant("no_weighted_sum", "output 等于输入 X：忘了按权重加权求和（output = weights @ X）", x),
            Variant("transposed_weights", "output 用了权重的转置：第 i 行输出应是 Σ_j w[i, j] · x_j，即 weights @ X",
                    w.transpose(-2, -1) @ x),
            Variant("wrong_axis", "softmax 的方向不对：应沿最后一维（dim=-1）归一化，让每一行和为 1",
                    _gram(x).softmax(dim=-2) @ x),
        ]

    def one_case(f, x: torch.Tensor) -> None:
        x = x.double()
        out, weights = _pair(f(x.clone()))
        t, d = x.shape[-2], x.shape[-1]
        w = as_tensor(weights, "weights")
        if w.shape[-2:] == (d, d) and (d, d) != (t, t):
            raise Mistake(f"weights 的最后两维是 (d, d) = {(d, d)}：你算的是 Xᵀ X；打分表应是词元两两之间的点积 "
                          "X Xᵀ，形状 (T, T)", key="gram_transposed")
        w_ref = _gram(x).softmax(dim=-1)
        compare(w, w_ref, what="weights", variants=weight_variants(x))
        compare(out, w_ref @ x, what="output", variants=output_variants(x))

    def single(f):
        one_case(f, randn(4, 3, seed=31))

    def rectangular(f):
        one_case(f, randn(5, 2, seed=32))  # T ≠ d：能区分 X Xᵀ 与 Xᵀ X

    def batched(f):
        one_case(f, randn(2, 3, 4, seed=33))  # (B, T, d)：要用 transpose(-2, -1) 而不是 .T

    return run_checks("朴素自注意力", fn, [
        ("单句 (T, d)", single),
        ("T ≠ d 的输入", rectangular),
        ("带批量维 (B, T, d)", batched),
    ], verbose=verbose)


# ---- 练习：注意力的熵 ------------------------------------------------------------------------------


def _entropy(w: torch.Tensor, dim: int = -1) -> torch.Tensor:
    return -torch.special.xlogy(w, w).sum(dim=dim)  # xlogy(0, 0) = 0


def check_attention_entropy(fn: Callable[[torch.Tensor], Any], *, verbose: bool = True) -> CheckResult:
    """检查 ``fn(weights) -> entropy``：每个查询那一行权重的熵 ``-Σ_j a_ij ln a_ij``。

    ``weights`` 形状 ``(..., T_q, T_k)``，每行和为 1，可能含有恰好为 0 的权重（被屏蔽、或 softmax 饱和）；
    应返回 ``(..., T_q)``，用自然对数，并约定 ``0 · ln 0 = 0``（结果里不能有 NaN）。
    """

    def variants(w: torch.Tensor) -> list[Variant]:
        ref = _entropy(w)
        return [
            Variant("sign", "符号反了：熵是 −Σ a ln a，应当 ≥ 0", -ref),
            Variant("log2", "你用的是以 2 为底的对数（单位是比特）；本章约定用自然对数 ln（torch.log）", ref / math.log(2)),
            Variant("mean", "用了 mean 而不是 sum：熵是对一行所有项求和", ref / w.shape[-1]),
        ]

    def one_case(f, w: torch.Tensor, what: str) -> None:
        w = w.double()
        got = as_tensor(f(w.clone()), what)
        t_q, t_k = w.shape[-2], w.shape[-1]
        if tuple(got.shape) == tuple(w.shape[:-2]) + (t_k,) and t_q != t_k:
            raise Mistake("结果的形状像是沿查询方向（dim=-2）求和；熵是对每一行、沿键的方向（dim=-1）求和的",
                          key="wrong_axis")
        if got.shape == w.shape[:-1] and not bool(torch.isfinite(got).all()):
            raise Mistake("结果里有 NaN：权重为 0 时 0 · ln 0 会算成 0 · (−∞) = NaN；可以用 torch.special.xlogy(p, p)，"
                          "或先把 p 夹到一个极小正数（clamp_min）再取对数", key="nan")
        compare(got, _entropy(w), what=what, variants=variants(w))

    def softmax_rows(f):
        one_case(f, randn(2, 3, 4, 6, seed=41).softmax(dim=-1), "(B, h, T_q, T_k) 权重的熵")

    def uniform(f):
        one_case(f, torch.full((3, 5), 0.2), "均匀权重的熵（应为 ln 5）")

    def with_zeros(f):
        one_case(f, torch.tensor([[0.5, 0.5, 0.0, 0.0], [0.2, 0.3, 0.5, 0.0], [1.0, 0.0, 0.0, 0.0]]),
                 "含 0 权重的熵")

    return run_checks("注意力的熵", fn, [
        ("多头四维权重", softmax_rows),
        ("均匀分配 = ln T_k", uniform),
        ("权重为 0 时 0·ln0 = 0", with_zeros),
    ], verbose=verbose)


# ---- 练习：softmax 的雅可比矩阵 -------------------------------------------------------------------


def check_softmax_jacobian(fn: Callable[[torch.Tensor], Any], *, verbose: bool = True) -> CheckResult:
    """检查 ``fn(s) -> J``：一维分数 ``s`` 形状 ``(n,)``，返回 softmax 的雅可比 ``J[i, j] = ∂a_i/∂s_j``（``(n, n)``）。

    正确答案是 ``J = diag(a) − a aᵀ``，其中 ``a = softmax(s)``；检查器用自动求导（autograd）的结果对比。
    """

    def one_case(f, s: torch.Tensor) -> None:
        s = s.double()
        ref = torch.autograd.functional.jacobian(lambda x: x.softmax(dim=-1), s)
        a = s.softmax(dim=-1)
        compare(f(s.clone()), ref, what="雅可比 J", atol=1e-6, variants=[
            Variant("no_diag", "少了对角项：∂a_i/∂s_i = a_i(1 − a_i)，所以 J = diag(a) − a aᵀ，而不只是 −a aᵀ",
                    -torch.outer(a, a)),
            Variant("scores", "公式里的 a 应是 softmax(s) 之后的权重，而不是原始分数 s",
                    torch.diag(s) - torch.outer(s, s)),
            Variant("sign", "符号反了：对角线上的 a_i(1 − a_i) 应当 ≥ 0", -ref),
            Variant("diag_only", "只写了 diag(a)：还要减去 a aᵀ（改变 s_j 也会通过分母影响其他的 a_i）", torch.diag(a)),
        ], default_hint="与自动求导得到的雅可比不一致；提示：J = diag(a) − a aᵀ，a = softmax(s)")

    def small(f):
        one_case(f, torch.tensor([1.0, 0.5, -0.3, 2.0]))

    def random(f):
        one_case(f, 3.0 * randn(6, seed=51))

    def uniform(f):
        one_case(f, torch.zeros(3))

    return run_checks("softmax 的雅可比矩阵", fn, [
        ("4 个分数", small),
        ("较大的随机分数", random),
        ("全相等的分数", uniform),
    ], verbose=verbose)
