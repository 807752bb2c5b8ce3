"""第 6 章练习的检查器（checker）：带温度的 softmax、数值稳定的 log-softmax（找错：减了全局最大值）、top-k 分布、
由 logits 算交叉熵、带温度的交叉熵的梯度（推导并核对）、温度与“照抄贪心”的概率（动手实验）。

用 :mod:`tformer_lib.exercises._core` 的框架：桩 → “⏳ 尚未完成”（不抛异常）；通过 → ✅；
未通过 → ❌ 加一句点名常见错误的提示（温度乘反了、先 softmax 后除温度、log(softmax) 下溢成 −inf、
logsumexp 不减最大值而溢出、top-k 之后忘了重新归一化、交叉熵忘了负号或用了 sum……）。
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch

from tformer_lib.exercises._core import (
    CheckResult,
    Mistake,
    Variant,
    as_number,
    as_tensor,
    compare,
    draw_int,
    random_cases,
    randn,
    run_checks,
)

__all__ = [
    "check_softmax_temperature",
    "check_log_softmax",
    "check_top_k_probs",
    "check_cross_entropy",
    "check_temperature_grad",
    "check_greedy_agreement",
    "exact_greedy_agreement",
]


def _nonfinite_where_ref_finite(got: torch.Tensor, ref: torch.Tensor) -> bool:
    return got.shape == ref.shape and bool((~torch.isfinite(got) & torch.isfinite(ref)).any())


# ---- 练习：带温度的 softmax ---------------------------------------------------------------------------


def check_softmax_temperature(fn: Callable[[torch.Tensor, float], Any], *, verbose: bool = True) -> CheckResult:
    """检查 ``fn(logits, temperature) -> probs``：``softmax(logits / T)``，沿最后一维，形状与 ``logits`` 相同。

    认得的错误：乘以 T 而不是除以 T；先 softmax 再除以 T（不再归一化）；沿错了维度；
    没有减去最大值（T 很小时 ``logits / T`` 很大，exp 溢出）。
    """

    def variants(z: torch.Tensor, t: float) -> list[Variant]:
        return [
            Variant("multiply", f"温度用反了：应是 softmax(logits / T)，你算的是 softmax(logits × T)（T = {t:g} 时两者不同）",
                    (z * t).softmax(dim=-1)),
            Variant("after_softmax", "温度要除在 softmax 之前（softmax(logits / T)）；先 softmax 再除以 T，每行之和就不再是 1",
                    z.softmax(dim=-1) / t),
            Variant("wrong_axis", "沿错了维度：应沿最后一维（dim=-1，词表方向）归一化", (z / t).softmax(dim=0)),
            Variant("ignored", "结果和 T = 1 时一样：温度没有起作用", z.softmax(dim=-1)),
        ]

    def one_case(f, z: torch.Tensor, t: float, what: str) -> None:
        got = as_tensor(f(z.clone(), t), what)
        ref = (z.double() / t).softmax(dim=-1)
        if _nonfinite_where_ref_finite(got, ref):
            raise Mistake(f"出现了 NaN/inf：T = {t:g} 时 logits / T 大到上千，exp 溢出。先减去每行最大值再 exp"
                          "（softmax 对整行加减同一个常数不变）", key="overflow")
        compare(got, ref, what=what, variants=variants(z.double(), t))

    def plain(f):
        one_case(f, randn(3, 5, seed=61), 1.0, "T = 1 的输出")

    def sharp_and_flat(f):
        z = 2.0 * randn(2, 3, 6, seed=62)
        one_case(f, z, 0.5, "T = 0.5 的输出")
        one_case(f, z, 2.0, "T = 2 的输出")

    def tiny_temperature(f):
        one_case(f, torch.tensor([[10.0, 9.0, 0.0], [-3.0, 2.0, 1.5]]), 0.01, "T = 0.01 的输出")

    def random_sizes(f):
        for g in random_cases(4, seed=60):
            z = 3.0 * randn(draw_int(g, 1, 4), draw_int(g, 2, 9), generator=g)
            t = float(torch.empty(()).uniform_(0.2, 4.0, generator=g))
            one_case(f, z, t, f"随机大小、T = {t:.3g} 的输出")

    return run_checks("带温度的 softmax", fn, [
        ("T = 1 就是普通 softmax", plain),
        ("T = 0.5 与 T = 2（三维输入）", sharp_and_flat),
        ("很小的 T 不溢出", tiny_temperature),
        ("随机大小与随机温度", random_sizes),
    ], verbose=verbose)


# ---- 练习：数值稳定的 log-softmax -----------------------------------------------------------------------


def check_log_softmax(fn: Callable[[torch.Tensor], Any], *, verbose: bool = True) -> CheckResult:
    """检查 ``fn(logits) -> log_probs``：沿最后一维的 ``log softmax(z) = z − logsumexp(z)``。

    认得的错误：先 softmax 再取 log（小概率下溢成 0，log 0 = −inf）；logsumexp 里没减最大值（大 logits 溢出）；
    只减了最大值、忘了减 log Σ exp；忘了取 log；沿错了维度；符号反了。
    """

    def variants(z: torch.Tensor) -> list[Variant]:
        ref = z.log_softmax(dim=-1)
        return [
            Variant("no_logsumexp", "只减去了最大值：log softmax(z) = z − logsumexp(z)，还要再减去 log Σ_j exp(z_j − max)",
                    z - z.max(dim=-1, keepdim=True).values),
            Variant("forgot_log", "返回的是概率本身：还要取对数（结果应当 ≤ 0）", z.softmax(dim=-1)),
            Variant("wrong_axis", "沿错了维度：应沿最后一维（dim=-1）做 logsumexp", z.log_softmax(dim=0)),
            Variant("sign", "符号反了：对数概率应当 ≤ 0（−log p 是损失，不是 log p）", -ref),
        ]

    def one_case(f, z: torch.Tensor, what: str) -> None:
        got = as_tensor(f(z.clone()), what)
        ref = z.double().log_softmax(dim=-1)
        if z.dim() > 1 and z.shape[0] > 1 and got.shape == ref.shape and _close_with_inf(got, _global_max_log_softmax(z)) \
                and not _close_with_inf(got, ref):
            raise Mistake("减的是整个张量的最大值 logits.max()，不是每一行自己的最大值：分数比全局最大值小上百的那一行，"
                          "exp 全部下溢成 0，log 0 = −inf。改成 logits.max(dim=-1, keepdim=True).values", key="global_max")
        if _nonfinite_where_ref_finite(got, ref):
            if bool(torch.isfinite(z.softmax(dim=-1).log()).all()):
                raise Mistake("出现了 NaN/inf：logsumexp 里直接算 Σ exp(z)，z 上千时 exp 溢出成 inf。"
                              "先取 m = max(z)，再算 m + log Σ exp(z − m)", key="naive_logsumexp")
            raise Mistake("出现了 −inf：先 softmax 再取 log，很小的概率在 float32 里下溢成 0，log 0 = −inf。"
                          "直接算 z − logsumexp(z)（logsumexp 里先减最大值）", key="log_of_softmax")
        compare(got, ref, what=what, variants=variants(z.double()))

    def ordinary(f):
        one_case(f, randn(4, 6, seed=63), "普通 logits 的输出")

    def tiny_probability(f):
        one_case(f, torch.tensor([[0.0, -200.0, -5.0], [3.0, 2.0, -150.0]]), "含极小概率的输出")

    def huge_logits(f):
        one_case(f, torch.tensor([[1000.0, 999.0, 998.0], [-1000.0, -1001.0, -1003.0]]), "很大/很小 logits 的输出")

    def rows_of_different_scale(f):
        for g in random_cases(4, seed=64):
            B, V = draw_int(g, 2, 5), draw_int(g, 2, 8)
            z = randn(B, V, generator=g)
            z[draw_int(g, 0, B - 1)] += 500.0  # 一批里有一行的分数比其他行大几百
            one_case(f, z, f"一批 {B} 行、各行尺度不同的输出")

    return run_checks("数值稳定的 log-softmax", fn, [
        ("与 torch.log_softmax 一致", ordinary),
        ("极小概率不变成 −inf", tiny_probability),
        ("logits 上千也不溢出", huge_logits),
        ("一批里各行尺度不同（每行减自己的最大值）", rows_of_different_scale),
    ], verbose=verbose)


def _global_max_log_softmax(z: torch.Tensor) -> torch.Tensor:
    """找错题里的错误写法：减去整个张量的最大值（float32，和读者的计算一样会下溢）。"""
    m = z.max()
    return z - (m + (z - m).exp().sum(dim=-1, keepdim=True).log())


def _close_with_inf(a: torch.Tensor, b: torch.Tensor) -> bool:
    a, b = a.double(), b.double()
    if a.shape != b.shape:
        return False
    same_inf = torch.isinf(a) & torch.isinf(b) & (torch.sign(a) == torch.sign(b))
    return bool((torch.isclose(a, b, atol=1e-5, rtol=1e-4) | same_inf | (torch.isnan(a) & torch.isnan(b))).all())


# ---- 练习：top-k 截断后的分布 -----------------------------------------------------------------------------


def _top_k_ref(z: torch.Tensor, k: int, *, largest: bool = True, fill: float = float("-inf"),
               renormalize: bool = True) -> torch.Tensor:
    k = min(k, z.shape[-1])
    idx = z.topk(k, dim=-1, largest=largest).indices
    keep = torch.zeros_like(z, dtype=torch.bool).scatter(-1, idx, True)
    if not renormalize:
        return z.softmax(dim=-1).masked_fill(~keep, 0.0)
    return z.masked_fill(~keep, fill).softmax(dim=-1)


def check_top_k_probs(fn: Callable[[torch.Tensor, int], Any], *, verbose: bool = True) -> CheckResult:
    """检查 ``fn(logits, k) -> probs``：只保留每行分数最高的 ``k`` 个词，在它们之间重新做 softmax，其余概率为 0。

    这就是 top-k 采样（``sample_decode(..., top_k=k)``）真正抽样时用的分布。``k ≥ V`` 时等于普通 softmax。
    认得的错误：截断后没有重新归一化；把其余 logits 置 0 而不是 −inf；留下了最小的 k 个。
    """

    def variants(z: torch.Tensor, k: int) -> list[Variant]:
        return [
            Variant("not_renormalized", "截断之后没有重新归一化：把其余概率置 0 后，留下的 k 个概率之和小于 1；"
                    "应在这 k 个 logits 之间重新做 softmax（或除以它们的和）", _top_k_ref(z, k, renormalize=False)),
            Variant("fill_zero", "被截掉的词概率不是 0：其余 logits 要填 −inf（exp(−inf) = 0），填 0 并不能把它们去掉",
                    _top_k_ref(z, k, fill=0.0)),
            Variant("smallest", "留下的是分数最小的 k 个：topk 默认 largest=True，或用 sort(descending=True)",
                    _top_k_ref(z, k, largest=False)),
        ]

    def one_case(f, z: torch.Tensor, k: int, what: str) -> None:
        got = as_tensor(f(z.clone(), k), what)
        compare(got, _top_k_ref(z.double(), k), what=what, variants=variants(z.double(), k))

    def k3(f):
        one_case(f, 2.0 * randn(3, 8, seed=64), 3, "k = 3 的分布")

    def k1_is_greedy(f):
        z = randn(2, 5, seed=65)
        got = as_tensor(f(z.clone(), 1), "k = 1 的分布")
        compare(got, torch.nn.functional.one_hot(z.argmax(-1), 5).double(), what="k = 1 的分布",
                variants=variants(z.double(), 1), default_hint="k = 1 时应是一个 one-hot：全部概率给分数最高的词（贪心）")

    def k_at_least_v(f):
        one_case(f, randn(2, 4, seed=66), 4, "k = V 的分布")
        one_case(f, randn(2, 4, seed=67), 10, "k > V 的分布")

    def random_sizes(f):
        for g in random_cases(4, seed=69):
            V = draw_int(g, 3, 12)
            z = 2.0 * randn(draw_int(g, 1, 4), V, generator=g)
            k = draw_int(g, 2, V - 1)
            one_case(f, z, k, f"V = {V}、k = {k} 的分布")

    return run_checks("top-k 截断后的分布", fn, [
        ("k = 3：只剩 3 个词且和为 1", k3),
        ("k = 1 就是贪心的 one-hot", k1_is_greedy),
        ("k ≥ V 时等于普通 softmax", k_at_least_v),
        ("随机的 V 与 k", random_sizes),
    ], verbose=verbose)


# ---- 练习：由 logits 直接算交叉熵 --------------------------------------------------------------------------


def check_cross_entropy(fn: Callable[[torch.Tensor, torch.Tensor], Any], *, verbose: bool = True) -> CheckResult:
    """检查 ``fn(logits, targets) -> loss``：``logits`` ``(N, V)``、``targets`` ``(N,)`` 的平均交叉熵（标量），
    即 ``mean_n(−log softmax(logits_n)[targets_n])``，与 ``F.cross_entropy(logits, targets)`` 相同，且数值稳定。
    """

    def variants(z: torch.Tensor, y: torch.Tensor) -> list[Variant]:
        nll = -z.log_softmax(dim=-1).gather(-1, y[:, None]).squeeze(-1)  # (N,)
        p = z.softmax(dim=-1).gather(-1, y[:, None]).squeeze(-1)
        return [
            Variant("sign", "符号反了：交叉熵是 −log p(目标)，应当 ≥ 0", -nll.mean()),
            Variant("sum", "用了 sum：F.cross_entropy 默认对 N 个位置取平均（reduction='mean'）", nll.sum()),
            Variant("no_log", "用了概率本身：损失是 −log p(目标)，不是 −p(目标)", -p.mean()),
            Variant("raw_logits", "直接取了目标位置的 logit：要先把 logits 变成对数概率（log_softmax）再取目标位置",
                    -z.gather(-1, y[:, None]).squeeze(-1).mean()),
        ]

    def one_case(f, z: torch.Tensor, y: torch.Tensor, what: str) -> None:
        got = as_tensor(f(z.clone(), y.clone()), what)
        ref = torch.nn.functional.cross_entropy(z.double(), y)
        if got.numel() == 1 and got.dim() > 0:
            got = got.reshape(())
        if got.shape != ref.shape and got.shape == y.shape:
            raise Mistake("返回了每个位置各自的损失（形状 (N,)）：还要对 N 个位置取平均，返回一个标量", key="no_mean")
        if got.shape == ref.shape and not bool(torch.isfinite(got).all()):
            raise Mistake("出现了 NaN/inf：先 softmax 再 log 在概率极小或 logits 很大时会得到 log 0 或 inf/inf；"
                          "用 log_softmax（z − logsumexp(z)）", key="unstable")
        compare(got, ref, what=what, variants=variants(z.double(), y))

    def ordinary(f):
        g = torch.Generator().manual_seed(68)
        one_case(f, randn(5, 7, seed=68), torch.randint(0, 7, (5,), generator=g), "平均交叉熵")

    def confident_wrong(f):
        z = torch.tensor([[0.0, 120.0, -5.0], [2.0, 1.0, 0.5]])
        one_case(f, z, torch.tensor([0, 2]), "目标概率极小时的交叉熵")

    def huge_logits(f):
        z = torch.tensor([[1000.0, 999.0, 0.0], [0.0, -1000.0, 1.0]])
        one_case(f, z, torch.tensor([1, 2]), "logits 上千时的交叉熵")

    def random_sizes(f):
        for g in random_cases(4, seed=70):
            N, V = draw_int(g, 1, 6), draw_int(g, 2, 30)
            one_case(f, 3.0 * randn(N, V, generator=g), torch.randint(0, V, (N,), generator=g),
                     f"N = {N}、V = {V} 的平均交叉熵")

    return run_checks("由 logits 算交叉熵", fn, [
        ("与 F.cross_entropy 一致", ordinary),
        ("目标概率极小也不变成 inf", confident_wrong),
        ("logits 上千也不溢出", huge_logits),
        ("随机的 N 与 V", random_sizes),
    ], verbose=verbose)


# ---- 练习：带温度的交叉熵对 logits 的梯度（推导并核对） ---------------------------------------------------------


def _temperature_grad_ref(z: torch.Tensor, y: int, t: float) -> torch.Tensor:
    """自动求导得到的 ∂[−ln softmax(z / T)_y] / ∂z（float64）。"""
    z = z.double().clone().requires_grad_(True)
    loss = -(z / t).log_softmax(dim=-1)[y]
    (grad,) = torch.autograd.grad(loss, z)
    return grad


def check_temperature_grad(fn: Callable[[torch.Tensor, int, float], Any], *, verbose: bool = True) -> CheckResult:
    """检查 ``fn(logits, target, temperature) -> grad``：``−ln softmax(logits / T)[target]`` 对 ``logits`` 的梯度，
    ``logits`` 是一维 ``(V,)``，结果形状相同。闭式解是 ``(softmax(logits / T) − onehot(target)) / T``。

    检查器在几组随机的 V、T 上与自动求导（autograd）对照；认得忘了 1/T、乘了 T、用了 T = 1 的概率、符号反了等错误。
    """

    def variants(z: torch.Tensor, y: int, t: float) -> list[Variant]:
        p_t = (z / t).softmax(-1)
        onehot = torch.nn.functional.one_hot(torch.tensor(y), z.shape[-1]).double()
        return [
            Variant("no_inv_t", f"少了链式法则里的 1/T：损失对 z/T 的梯度是 p − onehot，z/T 对 z 的导数还要再乘 1/T"
                    f"（这次 T = {t:.3g}）", p_t - onehot),
            Variant("times_t", "乘了 T：z/T 对 z 的导数是 1/T，不是 T", (p_t - onehot) * t),
            Variant("p_at_t1", "概率用的是 softmax(z)（T = 1）：前向传播用的是 softmax(z / T)，梯度里的 p 也应是它",
                    (z.softmax(-1) - onehot) / t),
            Variant("sign", "符号反了：梯度是 p − onehot（正确词的分数被往上推，梯度在那里为负）",
                    (onehot - p_t) / t),
        ]

    def values(f):
        cases = [(torch.tensor([5.0, 4.0, 0.0]), 0, 1.0), (torch.tensor([5.0, 4.0, 0.0]), 0, 2.0)]
        for g in random_cases(5, seed=71):
            V = draw_int(g, 2, 10)
            t = float(torch.empty(()).uniform_(0.3, 3.0, generator=g))
            cases.append((2.0 * randn(V, generator=g), draw_int(g, 0, V - 1), t))
        for z, y, t in cases:
            what = f"V = {z.shape[0]}、目标 {y}、T = {t:.3g} 时的梯度"
            got = as_tensor(f(z.clone(), y, t), what)
            compare(got, _temperature_grad_ref(z, y, t), what=what, variants=variants(z.double(), y, t),
                    default_hint="先写前向：L = −(z_y / T) + logsumexp(z / T)，再对每个 z_i 求导")

    return run_checks("带温度的交叉熵的梯度", fn, [("与自动求导一致（几组随机的 V 与 T）", values)], verbose=verbose)


# ---- 练习：温度与“照抄贪心”的概率（动手实验） ---------------------------------------------------------------

_AGREEMENT_CASES = (("人工智能", 1.0, 11), ("狗 咬 人", 1.2, 12), ("人工智能", 1.5, 13))
_AGREEMENT_N = 300


@functools.lru_cache(maxsize=1)
def _toy_model():
    """第 5、6 章的玩具翻译模型（随库附带，读一次后缓存）。"""
    from tformer_lib.translation.pretrained import load_or_train_toy_model

    with torch.random.fork_rng(devices=[]):
        model, src_vocab, _, _ = load_or_train_toy_model()
    return model.eval(), src_vocab


def exact_greedy_agreement(model, src: torch.Tensor, temperature: float) -> float:
    """按温度 T 采样时，整句恰好等于贪心译文的精确概率：每一步选中贪心那个词的概率之积（教师强制一次算出）。"""
    from tformer_lib.translation.decoding import forbid_special_tokens, greedy_decode
    from tformer_lib.specials import BOS, EOS

    with torch.no_grad():
        ids = greedy_decode(model, src)[0].tolist()
        if EOS not in ids:
            raise ValueError("贪心译文在 max_len 之内没有结束，精确概率不好定义")
        seq = torch.tensor([ids[: ids.index(EOS) + 1]])  # (1, L)：含最后的 EOS
        tgt_in = torch.cat([torch.tensor([[BOS]]), seq[:, :-1]], dim=1)  # (1, L)
        logits = forbid_special_tokens(model(src, tgt_in)[0], [model.config.pad_id, BOS])  # (L, V)
        log_p = (logits.double() / temperature).log_softmax(dim=-1).gather(-1, seq[0][:, None])  # (L, 1)
    return float(log_p.sum().exp())


def check_greedy_agreement(fn: Callable[..., Any], *, verbose: bool = True) -> CheckResult:
    """检查 ``fn(model, src, temperature, n, generator) -> float``：用 ``sample_decode`` 按温度采 ``n`` 句译文，
    与贪心译文完全相同的比例。

    检查器在本章的玩具模型上、用几句原文和几个温度调用它，与 :func:`exact_greedy_agreement` 算出的精确概率比较，
    容许采样误差（约 4.5 个标准差）。认得：返回了次数而不是比例；温度没有起作用；比例写死。
    """
    def values(f):
        model, src_vocab = _toy_model()
        n = _AGREEMENT_N
        results = []
        for zh, t, seed in _AGREEMENT_CASES:
            model.eval()
            src = torch.tensor([src_vocab.encode(zh.split())])  # (1, S)
            call = f"greedy_agreement(model, “{zh}”, temperature={t:g}, n={n}, generator)"
            got = as_number(f(model, src.clone(), t, n, torch.Generator().manual_seed(seed)), f"{call} 的结果")
            results.append((call, src, t, got))
        if len({got for *_, got in results}) == 1:
            raise Mistake(f"原文和温度都换了，你的函数总是返回 {results[0][3]:g}：是不是写死了一个数？"
                          "要真的采样：sample_decode(model, src.expand(n, -1), temperature=…, generator=generator)。",
                          key="constant")
        for call, src, t, got in results:
            p = exact_greedy_agreement(model, src, t)
            tol = 4.5 * (p * (1 - p) / n) ** 0.5 + 2.0 / n
            if abs(got - p) <= tol:
                continue
            if got > 1 and abs(got / n - p) <= tol:
                raise Mistake(f"{call} 返回了 {got:g}：这是次数。要返回比例（相同的句数 ÷ n），在 0 和 1 之间。",
                              key="count")
            p1 = exact_greedy_agreement(model, src, 1.0)
            if t != 1.0 and abs(got - p1) <= 4.5 * (p1 * (1 - p1) / n) ** 0.5 + 2.0 / n:
                raise Mistake(f"{call} 的结果 {got:.3f} 像是 T = 1 时的比例（约 {p1:.3f}）：温度没有起作用。"
                              "把 temperature 传给 sample_decode。", key="temperature_ignored")
            raise Mistake(f"{call} 返回 {got:.3f}，按每一步概率算出的精确值是 {p:.3f}（{n} 次采样的误差约为 "
                          f"±{tol:.3f}）。一次采 n 句：sample_decode(model, src.expand(n, -1), temperature=…, "
                          "generator=generator)，再逐句与 greedy_decode 的结果比较（截到 EOS）。", key="values")

    return run_checks("温度与“照抄贪心”的概率", fn,
                      [("与精确概率相符（几句原文、几个温度，容许采样误差）", values)], verbose=verbose)
