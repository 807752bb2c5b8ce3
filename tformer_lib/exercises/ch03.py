"""第 3 章练习的检查器（checker）与“找错”题里那段有错的代码。

- :func:`check_self_weight`（预测再验证）：两两正交的向量做朴素自注意力时，“自己给自己”的权重；
- :func:`check_unit_variance_scale`（推导并核对）：让分数方差回到 1 的缩放系数；
- :func:`buggy_attention` + :func:`check_fixed_attention`（找错）：一处只在“方阵”上看不出来的错；
- :func:`check_softmax_backward`（推导并核对）：不构造雅可比矩阵的 softmax 反向传播；
- :func:`check_min_scale`（动手实验）：问题放大多少倍，注意力才几乎只借一本书。

每个检查器都在多组随机尺寸上调用读者的函数（写死的答案过不了），接受任何正确的数值类型
（Python int/float、NumPy 标量、0 维张量），桩（stub）→ “⏳ 尚未完成”，不抛异常。
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch

from tformer_lib.parts.attention import fast_scaled_dot_product_attention, scaled_dot_product_attention
from tformer_lib.exercises._core import (
    CheckResult,
    Mistake,
    Variant,
    as_number,
    compare,
    compare_number,
    generator,
    run_checks,
    student_code,
)

__all__ = [
    "check_self_weight",
    "self_weight_experiment",
    "check_unit_variance_scale",
    "buggy_attention",
    "check_fixed_attention",
    "check_softmax_backward",
    "check_min_scale",
]


# ---- 练习：预测“自己给自己”的权重 -----------------------------------------------------------------------


def self_weight_experiment(T: int, r: float, d: int | None = None, seed: int = 0) -> torch.Tensor:
    """实验：T 个两两正交、长度都是 r 的 d 维向量（随机方向），算朴素自注意力 softmax(X Xᵀ) 的对角线。"""
    d = T + 3 if d is None else d
    if d < T:
        raise ValueError(f"d={d} 不能小于 T={T}：d 维空间里最多只有 d 个两两正交的向量")
    g = generator(seed)
    basis, _ = torch.linalg.qr(torch.randn(d, T, generator=g, dtype=torch.float64))  # (d, T)，列两两正交、长度 1
    X = r * basis.T  # (T, d)
    return (X @ X.T).softmax(dim=-1).diagonal()  # (T,)


def check_self_weight(fn: Callable[..., Any], *, verbose: bool = True) -> CheckResult:
    """检查 ``fn(T, r) -> w``：T 个两两正交、长度都是 r 的向量做朴素自注意力 ``softmax(X Xᵀ)`` 时，
    每个词元分给自己的权重，即 ``e^{r²} / (e^{r²} + T − 1)``；检查器用 :func:`self_weight_experiment` 核对。"""

    def cases(f):
        g = generator(30)
        for _ in range(8):
            T = int(torch.randint(2, 12, (1,), generator=g))
            r = round(float(0.3 + 2.2 * torch.rand(1, generator=g)), 2)
            call = f"self_weight(T={T}, r={r})"
            want = self_weight_experiment(T, r, seed=T)
            e = math.exp(r * r)
            compare_number(f(T, r), float(want[0]), what=f"{call} 的返回值", rtol=1e-5, atol=1e-9, variants=[
                Variant("forgot_square", "x_i · x_i = ‖x_i‖² = r²，不是 r：长度放大 r 倍，点积放大 r² 倍",
                        math.exp(r) / (math.exp(r) + T - 1)),
                Variant("uniform", "不是均匀的 1/T：别的词元与它正交（点积 0），但它与自己的点积是 r²",
                        1 / T),
                Variant("denominator_T", "分母多算了一项：自己那一项是 e^{r²}，其余 T − 1 个词元各贡献 e⁰ = 1",
                        e / (e + T)),
                Variant("forgot_others", "别忘了分母里还有其余 T − 1 个词元：它们的分数是 0，但 e⁰ = 1，不是 0", 1.0),
                Variant("score_not_weight", "这是分数 x_i · x_i，不是 softmax 之后的权重", r * r),
            ], default_hint=f"实验中自己给自己的权重是 {float(want[0]):.6g}。提示：先写出这一行的分数"
                            "（对自己是多少？对别人是多少？），再做 softmax")

    return run_checks("预测“自己给自己”的权重", fn, [("8 组随机的 T 与 r，与实测的注意力权重比较", cases)], verbose=verbose)


# ---- 练习：让分数方差回到 1 的缩放系数 ----------------------------------------------------------------


def check_unit_variance_scale(fn: Callable[..., Any], *, verbose: bool = True) -> CheckResult:
    """检查 ``fn(d_k, sigma_q, sigma_k) -> c``：q、k 的分量独立、均值 0、标准差分别为 σ_q、σ_k 时，
    使 ``Var(c · q·k) = 1`` 的正数 ``c``，即 ``1 / (√d_k · σ_q · σ_k)``。
    """

    def want(d_k, sq, sk):
        return 1.0 / (math.sqrt(d_k) * sq * sk)

    def variants(d_k, sq, sk) -> list[tuple[float, str, str]]:
        return [
            (1 / math.sqrt(d_k), "sigma_ignored", "σ_q、σ_k 被忽略了：1/√d_k 只在分量方差为 1 时成立；"
             "每项 q_t k_t 的方差是 σ_q² σ_k²"),
            (1 / (d_k * sq * sk), "variance_not_std", "除的是 d_k 而不是 √d_k：Var(c·X) = c²·Var(X)，"
             "所以 c 要取标准差的倒数，而不是方差的倒数"),
            (1 / (d_k * sq**2 * sk**2), "variance_not_std", "这是方差的倒数：Var(c·X) = c²·Var(X)，c 应取标准差的倒数"),
            (1 / (math.sqrt(d_k) * sq**2 * sk**2), "sigma_squared", "σ 多了一次平方：Var(q_t k_t) = σ_q² σ_k²，"
             "开方之后标准差里是 σ_q σ_k"),
            (math.sqrt(d_k) * sq * sk, "reciprocal", "结果颠倒了：这是点积的标准差本身，缩放系数是它的倒数"),
            (1 / (math.sqrt(d_k) * (sq + sk)), "sum_of_sigmas", "两个独立量之积的方差是方差之积 σ_q² σ_k²，不是和"),
            (-1 / (math.sqrt(d_k) * sq * sk), "negative", "方差对了，但题目要的是正数 c（负号会把分数的大小顺序倒过来）"),
        ]

    def cases(f):
        g = generator(17)
        for _ in range(8):
            d_k = int(torch.randint(1, 1025, (1,), generator=g))
            sq, sk = (round(float(x), 3) for x in 0.2 + 4.8 * torch.rand(2, generator=g))
            call = f"unit_variance_scale({d_k}, {sq}, {sk})"
            c = as_number(f(d_k, sq, sk), f"{call} 的返回值")
            ref = want(d_k, sq, sk)
            if math.isclose(c, ref, rel_tol=1e-4):
                continue
            for value, key, hint in variants(d_k, sq, sk):
                if math.isclose(c, value, rel_tol=1e-4):
                    raise Mistake(f"{call} 返回 {c:.6g}，应为 {ref:.6g}。{hint}", key=key)
            raise Mistake(f"{call} 返回 {c:.6g}，应为 {ref:.6g}。提示：先求 Var(q·k)，再想 c 取多少时 "
                          "c²·Var(q·k) = 1", key="values")

    def empirical(f):  # 推导出的公式也要在实验里成立（对照读者的 c 做一次蒙特卡洛）
        g = generator(18)
        d_k, sq, sk = 48, 2.5, 0.4
        c = as_number(f(d_k, sq, sk), f"unit_variance_scale({d_k}, {sq}, {sk}) 的返回值")
        q = sq * torch.randn(20000, d_k, generator=g, dtype=torch.float64)
        k = sk * torch.randn(20000, d_k, generator=g, dtype=torch.float64)
        var = float((c * (q * k).sum(-1)).var())
        if not 0.9 < var < 1.1:
            raise Mistake(f"用你的 c 缩放 20000 对随机向量，分数的方差是 {var:.3f}，不是 1", key="values")

    return run_checks("让分数方差回到 1 的缩放系数", fn, [
        ("8 组随机的 d_k、σ_q、σ_k", cases),
        ("蒙特卡洛实验：缩放后方差 ≈ 1", empirical),
    ], verbose=verbose)


# ---- 练习（找错）：只在方阵上看不出来的错 ---------------------------------------------------------------


#: 找错题的答案就是这些库函数：读者的函数调用它们就不算自己改对了
_ATTENTION_ANSWERS = (scaled_dot_product_attention, fast_scaled_dot_product_attention,
                      torch.nn.functional.scaled_dot_product_attention)


def buggy_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """一个有一处错误的缩放点积注意力（第 3 章“找错”练习用，不要在别处使用）。

    形状：``q`` 为 ``(..., T_q, d_k)``，``k`` 为 ``(..., T_k, d_k)``，``v`` 为 ``(..., T_k, d_v)``；
    返回 ``(output, weights)``。
    """
    scale = math.sqrt(q.shape[-2])
    scores = q @ k.transpose(-2, -1) / scale  # (..., T_q, T_k)
    weights = scores.softmax(dim=-1)  # 每行和为 1
    return weights @ v, weights  # (..., T_q, d_v), (..., T_q, T_k)


def _pair(out: Any, call: str) -> tuple[Any, Any]:
    if not (isinstance(out, (tuple, list)) and len(out) == 2):
        raise Mistake(f"{call} 应返回二元组 (output, weights)", key="type")
    return out[0], out[1]


def check_fixed_attention(fn: Callable[..., Any], *, verbose: bool = True) -> CheckResult:
    """检查改好的 ``fn(q, k, v) -> (output, weights)`` 是否与库里的 ``scaled_dot_product_attention`` 一致。"""

    def one(f, shape_q, T_k, d_v, seed) -> None:
        g = generator(seed)
        *lead, T_q, d_k = shape_q
        q = torch.randn(*shape_q, generator=g, dtype=torch.float64)
        k = torch.randn(*lead, T_k, d_k, generator=g, dtype=torch.float64)
        v = torch.randn(*lead, T_k, d_v, generator=g, dtype=torch.float64)
        call = f"fixed_attention(q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)})"
        out, weights = _pair(f(q.clone(), k.clone(), v.clone()), call)
        ref_out, ref_w = scaled_dot_product_attention(q, k, v)
        raw = q @ k.transpose(-2, -1)  # (..., T_q, T_k)

        def w_variant(key, hint, s, dim=-1):
            return Variant(key, hint, s.softmax(dim=dim))

        bug = "缩放用的是 √T_q（查询的个数，q.shape[-2]），应是 √d_k（每个向量的维度，q.shape[-1]）。" \
              "在 T = d_k 的方阵例子里两者相等，所以看不出来"
        w_variants = [
            w_variant("sqrt_T", bug, raw / math.sqrt(T_q)),
            w_variant("sqrt_T", "缩放用的是 √T_k（键的个数），应是 √d_k（向量维度 q.shape[-1]）", raw / math.sqrt(T_k)),
            w_variant("no_scale", "把缩放整个删掉了：要除以 √d_k，不是不除", raw),
            w_variant("divide_d_k", "除的是 d_k 而不是 √d_k", raw / d_k),
            w_variant("wrong_axis", "softmax 的方向不对：应沿最后一维（键的方向，dim=-1）",
                      raw / math.sqrt(d_k), dim=-2),
        ]
        compare(weights, ref_w, what=f"{call} 的 weights", variants=w_variants)
        compare(out, ref_out, what=f"{call} 的 output",
                default_hint="weights 对了，output 不对：output 应是 weights @ v")

    def square(f):  # 和“人工智能”一样 T = d_k：原来的错在这里看不出来
        one(f, (1, 4, 4), 4, 4, seed=60)

    def rectangular(f):
        for i, (shape_q, T_k, d_v) in enumerate((((5, 16), 7, 3), ((2, 3, 6, 8), 9, 5), ((2, 9, 4), 2, 6))):
            one(f, shape_q, T_k, d_v, seed=61 + i)

    return run_checks("找错：缩放点积注意力", fn, [
        ("T = d_k 的方阵输入", square),
        ("T ≠ d_k、带批量维与头维的随机输入", rectangular),
    ], verbose=verbose, forbidden=_ATTENTION_ANSWERS)


# ---- 练习：不构造雅可比矩阵的 softmax 反向传播 ---------------------------------------------------------


def check_softmax_backward(fn: Callable[..., Any], *, verbose: bool = True) -> CheckResult:
    """检查 ``fn(s, g) -> ∂L/∂s``：``a = softmax(s)`` 沿最后一维，``g = ∂L/∂a`` 与 ``s`` 同形状。

    正确答案是 ``a ⊙ (g − Σ_j a_j g_j)``（每行的和沿最后一维），检查器用自动求导（autograd）对答案。
    """

    def one(f, s: torch.Tensor, g: torch.Tensor) -> None:
        s, g = s.double(), g.double()
        x = s.clone().requires_grad_(True)
        (x.softmax(dim=-1) * g).sum().backward()
        ref = x.grad
        a = s.softmax(dim=-1)
        dot = (a * g).sum(dim=-1, keepdim=True)
        call = f"softmax_backward(s {tuple(s.shape)}, g)"
        compare(f(s.clone(), g.clone()), ref, what=f"{call} 的结果", atol=1e-8, rtol=1e-6, variants=[
            Variant("no_subtract", "少了减去 Σ_j a_j g_j 这一项：J = diag(a) − a aᵀ 里 −a aᵀ 那一半贡献的是 "
                    "−a (aᵀ g)", a * g),
            Variant("no_outer_a", "减去的那一项前面也要乘 a：Jᵀg = a ⊙ g − a (aᵀg) = a ⊙ (g − aᵀg)", a * g - dot),
            Variant("forgot_a", "整体少乘了 a：∂a_i/∂s_j = a_i(δ_ij − a_j)，每一项都带着 a_i", g - dot),
            Variant("scores", "公式里的 a 应是 softmax(s)，不是原始分数 s",
                    s * (g - (s * g).sum(dim=-1, keepdim=True))),
            Variant("sign", "符号反了", -ref),
            Variant("mean", "Σ_j a_j g_j 是加权和（权重 a），不是 g 的平均值", a * (g - g.mean(dim=-1, keepdim=True))),
            Variant("wrong_axis", "求和的方向不对：softmax 沿最后一维，Σ_j a_j g_j 也要沿最后一维（dim=-1）",
                    a * (g - (a * g).sum(dim=0, keepdim=True))),
        ], default_hint="与自动求导的结果不一致。提示：∂L/∂s_j = Σ_i g_i ∂a_i/∂s_j，再把 ∂a_i/∂s_j = a_i(δ_ij − a_j) 代进去")

    def vector(f):
        g = generator(70)
        one(f, torch.randn(6, generator=g), torch.randn(6, generator=g))

    def batched(f):
        g = generator(71)
        one(f, 3 * torch.randn(5, 7, generator=g), torch.randn(5, 7, generator=g))
        one(f, torch.randn(2, 3, 4, 9, generator=g), torch.randn(2, 3, 4, 9, generator=g))

    def saturated(f):  # 分数很大时梯度几乎为 0：这里也不能出 NaN
        g = generator(72)
        one(f, 40 * torch.randn(3, 8, generator=g), torch.randn(3, 8, generator=g))

    return run_checks("softmax 的反向传播", fn, [
        ("一维分数", vector),
        ("批量、多头的四维分数", batched),
        ("饱和的大分数", saturated),
    ], verbose=verbose)


# ---- 练习（动手实验）：问得多“坚决”，才能只借一本书 --------------------------------------------------------


def _top_weight(c: float, q: torch.Tensor, K: torch.Tensor) -> float:
    _, w = scaled_dot_product_attention(c * q[None], K, K)  # (1, n)
    return float(w.max())


def _min_scale_reference(q: torch.Tensor, K: torch.Tensor, threshold: float) -> float:
    lo, hi = 0.0, 1.0
    while _top_weight(hi, q, K) < threshold:
        hi *= 2
    for _ in range(60):  # 二分到浮点精度
        mid = (lo + hi) / 2
        lo, hi = (lo, mid) if _top_weight(mid, q, K) >= threshold else (mid, hi)
    return hi


def check_min_scale(fn: Callable[..., Any], *, verbose: bool = True) -> CheckResult:
    """检查 ``fn(q, K, threshold) -> c``：最小的放大倍数 c > 0，使 ``scaled_dot_product_attention(c·q, K, K)``
    给最匹配的键的权重 ≥ ``threshold``（``q`` 形状 ``(d,)``，``K`` 形状 ``(n, d)``）。允许 0.1% 的相对误差。"""

    def cases(f):
        g = generator(90)
        for _ in range(6):
            n, d = int(torch.randint(3, 8, (1,), generator=g)), int(torch.randint(3, 9, (1,), generator=g))
            q = torch.randn(d, generator=g, dtype=torch.float64)
            K = torch.randn(n, d, generator=g, dtype=torch.float64)
            threshold = round(float(0.55 + 0.4 * torch.rand(1, generator=g)), 3)
            call = f"min_scale(q {tuple(q.shape)}, K {tuple(K.shape)}, threshold={threshold})"
            with student_code():
                got = f(q.clone(), K.clone(), threshold)
            c = as_number(got, f"{call} 的返回值")
            want = _min_scale_reference(q, K, threshold)
            if math.isclose(c, want, rel_tol=1e-3):
                continue
            if c > 0 and math.isclose(c, want / math.sqrt(d), rel_tol=1e-3):
                raise Mistake(f"{call} 返回 {c:.5g}，应为 {want:.5g}：你算的是 softmax(c·K q)，"
                              "而 scaled_dot_product_attention 还要除以 √d_k", key="no_sqrt_d")
            reached = c > 0 and _top_weight(c, q, K) >= threshold
            hint = ("这个 c 已经够了，但不是最小的：把区间继续二分下去" if reached else
                    "用这个 c，最匹配的键的权重还不到 threshold")
            raise Mistake(f"{call} 返回 {c:.5g}，应为 {want:.5g}。{hint}", key="not_minimal" if reached else "too_small")

    return run_checks("最小的放大倍数", fn, [("6 组随机的查询、键与阈值", cases)], verbose=verbose)
