"""第 6 章练习的检查器（checker）：带温度的 softmax、数值稳定的 log-softmax、top-k 分布、由 logits 算交叉熵。

用 :mod:`tformer_lib.exercises._core` 的框架：桩 → “⏳ 尚未完成”（不抛异常）；通过 → ✅；
未通过 → ❌ 加一句点名常见错误的提示（温度乘反了、先 softmax 后除温度、log(softmax) 下溢成 −inf、
logsumexp 不减最大值而溢出、top-k 之后忘了重新归一化、交叉熵忘了负号或用了 sum……）。
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from tformer_lib.exercises._core import CheckResult, Mistake, Variant, as_tensor, compare, randn, run_checks

__all__ = ["check_softmax_temperature", "check_log_softmax", "check_top_k_probs", "check_cross_entropy"]


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

    return run_checks("带温度的 softmax", fn, [
        ("T = 1 就是普通 softmax", plain),
        ("T = 0.5 与 T = 2（三维输入）", sharp_and_flat),
        ("很小的 T 不溢出", tiny_temperature),
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

    return run_checks("数值稳定的 log-softmax", fn, [
        ("与 torch.log_softmax 一致", ordinary),
        ("极小概率不变成 −inf", tiny_probability),
        ("logits 上千也不溢出", huge_logits),
    ], verbose=verbose)


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

    return run_checks("top-k 截断后的分布", fn, [
        ("k = 3：只剩 3 个词且和为 1", k3),
        ("k = 1 就是贪心的 one-hot", k1_is_greedy),
        ("k ≥ V 时等于普通 softmax", k_at_least_v),
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

    return run_checks("由 logits 算交叉熵", fn, [
        ("与 F.cross_entropy 一致", ordinary),
        ("目标概率极小也不变成 inf", confident_wrong),
        ("logits 上千也不溢出", huge_logits),
    ], verbose=verbose)
