"""第 7 章练习的检查器（checker）：预热学习率、标签平滑的目标分布与损失、束搜索的长度惩罚得分。

用 :mod:`tformer_lib.exercises._core` 的框架：桩 → “⏳ 尚未完成”（不抛异常）；通过 → ✅；
未通过 → ❌ 加一句点名常见错误的提示（min/max 写反、指数写错、step 0 除零、ε 分给 V−1 个类、
PAD 位置算进平均、长度惩罚乘而不是除……）。
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from tformer_lib.exercises._core import CheckResult, Mistake, Variant, as_tensor, compare, randn, run_checks
from tformer_lib.specials import PAD

__all__ = ["check_noam_rate", "check_smoothed_targets", "check_smoothed_loss", "check_beam_score"]


def _number(x: Any, what: str) -> float:
    """读者返回的一个数（Python 数、0 维张量或只含一个元素的张量）→ float。"""
    if isinstance(x, torch.Tensor):
        if x.numel() != 1:
            raise Mistake(f"{what}应是一个数，你返回了形状为 {tuple(x.shape)} 的张量", key="shape")
        return float(x)
    if isinstance(x, (int, float)) and not isinstance(x, bool):
        return float(x)
    raise Mistake(f"{what}应是一个数（float），收到 {type(x).__name__}", key="type")


def _close(a: float, b: float, rel: float = 1e-6) -> bool:
    return math.isfinite(a) and abs(a - b) <= rel * max(abs(b), 1e-12)


# ---- 练习：预热学习率 ----------------------------------------------------------------------------


def _noam(step: int, d_model: int, warmup: int) -> float:
    step = max(step, 1)
    return d_model ** -0.5 * min(step ** -0.5, step * warmup ** -1.5)


def check_noam_rate(fn: Callable[[int, int, int], float], *, verbose: bool = True) -> CheckResult:
    """检查 ``fn(step, d_model, warmup) -> lr``：论文的 ``d_model^-0.5 · min(step^-0.5, step · warmup^-1.5)``，
    并且 step = 0 时按 step = 1 计算（不能除以零）。"""

    def variants(step: int, d: int, w: int) -> list[tuple[str, str, float]]:
        s = max(step, 1)
        return [
            ("max", "把 min 写成了 max：预热阶段应取两者中较小的 step · warmup^-1.5（线性上升），之后才轮到 step^-0.5",
             d ** -0.5 * max(s ** -0.5, s * w ** -1.5)),
            ("warmup_exponent", "warmup 的指数应是 −1.5：这样两段在 step = warmup 处相接（step · warmup^-1.5 = warmup^-0.5）",
             d ** -0.5 * min(s ** -0.5, s * w ** -0.5)),
            ("d_model_sign", "d_model 的指数应是 −0.5（模型越宽，学习率越小），你用了 +0.5",
             d ** 0.5 * min(s ** -0.5, s * w ** -1.5)),
            ("no_d_model", "少了 d_model^-0.5 这个因子", min(s ** -0.5, s * w ** -1.5)),
            ("sqrt_missing", "衰减段应按 1/√step 下降（step^-0.5），你写成了 1/step",
             d ** -0.5 * min(s ** -1.0, s * w ** -1.5)),
        ]

    def one(f, step: int, d: int, w: int) -> None:
        try:
            got = _number(f(step, d, w), f"step={step} 的学习率")
        except ZeroDivisionError:
            raise Mistake("step = 0 时 0 ** -0.5 除以零：先把 step 换成 max(step, 1) 再代入公式", key="step_zero") from None
        ref = _noam(step, d, w)
        if _close(got, ref):
            return
        if not math.isfinite(got):
            raise Mistake(f"step={step} 时得到 {got}：step = 0 要按 step = 1 计算（0^-0.5 是无穷大）", key="step_zero")
        for key, hint, value in variants(step, d, w):
            if _close(got, value):
                raise Mistake(hint, key=key)
        raise Mistake(f"step={step}, d_model={d}, warmup={w} 时学习率应为 {ref:.6g}，你的是 {got:.6g}", key="values")

    def warmup_phase(f):
        for step in (1, 10, 199):
            one(f, step, 64, 200)

    def decay_phase(f):
        for step in (200, 201, 752, 10_000):
            one(f, step, 64, 200)

    def paper(f):
        for step in (100, 4000, 20_000):
            one(f, step, 512, 4000)

    def step_zero(f):
        one(f, 0, 64, 200)

    return run_checks("预热学习率", fn, [
        ("预热阶段（step < warmup）", warmup_phase),
        ("衰减阶段（step ≥ warmup）", decay_phase),
        ("论文的设置 d_model=512, warmup=4000", paper),
        ("step = 0", step_zero),
    ], verbose=verbose)


# ---- 练习：标签平滑的目标分布 -----------------------------------------------------------------------


def _targets(target: torch.Tensor, vocab_size: int, eps: float, pad_id: int) -> torch.Tensor:
    q = torch.full((*target.shape, vocab_size), eps / vocab_size, dtype=torch.float64)
    q.scatter_add_(-1, target.unsqueeze(-1), torch.full((*target.shape, 1), 1.0 - eps, dtype=torch.float64))
    return q * (target != pad_id).unsqueeze(-1)


def check_smoothed_targets(fn: Callable[[torch.Tensor, int, float, int], torch.Tensor], *,
                           verbose: bool = True) -> CheckResult:
    """检查 ``fn(target, vocab_size, smoothing, pad_id) -> q``：``target`` 形状 ``(N,)``，返回 ``(N, V)`` 的目标分布。

    约定与 ``F.cross_entropy(label_smoothing=ε)`` 相同：正确类得 ``1 − ε + ε/V``，其余每类 ``ε/V``（ε 平均分给全部 V 类）；
    ``target == pad_id`` 的行全为 0（填充位不参与训练）。
    """

    def variants(t: torch.Tensor, V: int, eps: float, pad: int) -> list[Variant]:
        keep = (t != pad).unsqueeze(-1).double()
        onehot = F.one_hot(t, V).double()
        ref = _targets(t, V, eps, pad)
        other = eps / (V - 1) * (1 - onehot) + (1 - eps) * onehot
        return [
            Variant("no_pad", "target 为 PAD 的行应全为 0：填充位不是真正的词，不该有训练目标", _targets(t, V, eps, pad - 10**6)),
            Variant("v_minus_1", "ε 分给了其余 V−1 个类（正确类恰好 1−ε）。这也是一种常见写法，但本书与 "
                    "F.cross_entropy(label_smoothing=ε) 一致：ε 平均分给全部 V 个类，正确类得 1−ε+ε/V", other * keep),
            Variant("no_one_minus_eps", "正确类应得 1−ε+ε/V：你给了 1+ε/V，每行之和变成 1+ε，不再是概率分布",
                    ref + eps * onehot * keep),
            Variant("onehot", "这还是 one-hot：ε 没有分出去", onehot * keep),
            Variant("forgot_uniform_on_correct", "正确类只得了 1−ε：ε/V 的那一份也属于它，每行之和应为 1",
                    ref - eps / V * onehot * keep),
        ]

    def one(f, t: torch.Tensor, V: int, eps: float, pad: int) -> None:
        got = f(t.clone(), V, eps, pad)
        compare(got, _targets(t, V, eps, pad), what="目标分布 q", variants=variants(t, V, eps, pad), atol=1e-6)

    def basic(f):
        one(f, torch.tensor([4, 6, 5]), 8, 0.1, PAD)

    def with_pad(f):
        one(f, torch.tensor([5, 7, 2, PAD, PAD]), 10, 0.2, PAD)

    def other_pad(f):
        one(f, torch.tensor([3, 9, 1, 9]), 12, 0.1, 9)

    return run_checks("标签平滑的目标分布", fn, [
        ("ε = 0.1，V = 8", basic),
        ("带 PAD 的目标（pad_id = 0）", with_pad),
        ("pad_id = 9", other_pad),
    ], verbose=verbose)


# ---- 练习：标签平滑损失 --------------------------------------------------------------------------


def check_smoothed_loss(fn: Callable[[torch.Tensor, torch.Tensor, float, int], torch.Tensor], *,
                        verbose: bool = True) -> CheckResult:
    """检查 ``fn(logits, target, smoothing, pad_id) -> loss``：``logits (..., V)``、``target (...)``，
    返回对所有非 PAD 位置平均的标签平滑交叉熵 ``−Σ_v q_v log p_v``（一个数），
    应等于 ``F.cross_entropy(logits.reshape(-1, V), target.reshape(-1), label_smoothing=ε, ignore_index=pad_id)``。
    """

    def ref(logits, t, eps, pad):
        V = logits.shape[-1]
        return F.cross_entropy(logits.reshape(-1, V), t.reshape(-1), label_smoothing=eps, ignore_index=pad)

    def variants(logits, t, eps, pad) -> list[Variant]:
        V = logits.shape[-1]
        flat, tf = logits.reshape(-1, V), t.reshape(-1)
        logp = flat.log_softmax(-1)
        q = _targets(tf, V, eps, pad)
        per = -(q * logp).sum(-1)
        keep = tf != pad
        q_all = _targets(tf, V, eps, pad - 10**6)
        return [
            Variant("pad_in_mean", "PAD 位置也算进了平均：应只对 target ≠ pad_id 的位置求平均（分母是真实词元数）",
                    per.sum() / tf.numel()),
            Variant("pad_not_masked", "PAD 位置也有了训练目标：target 为 pad_id 的位置应完全不计入损失",
                    -(q_all * logp).sum(-1).mean()),
            Variant("sum", "用了总和：应除以真实（非 PAD）词元的个数，取平均", per.sum()),
            Variant("no_smoothing", "这是不带平滑的交叉熵：还要加上 ε · 平均的 −log p_v 那一项",
                    F.cross_entropy(flat, tf, ignore_index=pad)),
            Variant("v_minus_1", "ε 分给了其余 V−1 个类；本书与 F.cross_entropy 一致，ε 平均分给全部 V 个类",
                    (-(((eps / (V - 1)) * (1 - F.one_hot(tf, V).double()) + (1 - eps) * F.one_hot(tf, V).double())
                       * logp).sum(-1) * keep).sum() / keep.sum()),
            Variant("softmax_not_log", "要对概率取对数：用 log_softmax，而不是 softmax 本身",
                    (-(q * flat.softmax(-1)).sum(-1)).sum() / keep.sum()),
            Variant("sign", "符号反了：交叉熵是 −Σ q log p，应当 ≥ 0", -per.sum() / keep.sum()),
        ]

    def one(f, logits, t, eps, pad) -> None:
        logits = logits.double()
        got = f(logits.clone(), t.clone(), eps, pad)
        got_t = as_tensor(got, "损失")
        if got_t.numel() != 1:
            raise Mistake(f"损失应是一个数（对所有真实词元取平均），你返回了形状 {tuple(got_t.shape)}", key="not_reduced")
        compare(got_t.reshape(()), ref(logits, t, eps, pad), what="损失", variants=variants(logits, t, eps, pad), atol=1e-8)

    def flat(f):
        one(f, randn(5, 7, seed=71), torch.tensor([1, 4, 6, 2, 3]), 0.1, PAD)

    def batched_with_pad(f):
        t = torch.tensor([[5, 7, 2, 0, 0], [4, 4, 6, 8, 2]])
        one(f, 2.0 * randn(2, 5, 9, seed=72), t, 0.1, PAD)

    def bigger_eps(f):
        t = torch.tensor([[3, 1, 9, 9], [2, 9, 9, 9]])
        one(f, randn(2, 4, 11, seed=73), t, 0.3, 9)

    return run_checks("标签平滑损失", fn, [
        ("一维目标，无填充", flat),
        ("(B, T) 目标，带 PAD", batched_with_pad),
        ("ε = 0.3，pad_id = 9", bigger_eps),
    ], verbose=verbose)


# ---- 练习：束搜索的长度惩罚得分 -------------------------------------------------------------------


def _beam_score(logps: list[float], alpha: float) -> float:
    return sum(logps) / ((5.0 + len(logps)) / 6.0) ** alpha


def check_beam_score(fn: Callable[[list[float], float], float], *, verbose: bool = True) -> CheckResult:
    """检查 ``fn(token_log_probs, alpha) -> score``：候选译文（含 EOS）每个词元的 log 概率 → GNMT 得分
    ``Σ log p / ((5 + |y|) / 6)^α``，``|y|`` 是词元个数（含 EOS）。"""

    def variants(lp: list[float], a: float) -> list[tuple[str, str, float]]:
        n, s = len(lp), sum(lp)
        return [
            ("multiply", "长度惩罚应当除：得分 = Σ log p / lp(|y|)；乘上去会让长句更吃亏", s * ((5 + n) / 6) ** a),
            ("prob_product", "要对 log 概率求和（Σ log p），而不是把概率连乘或对概率求和",
             math.prod(math.exp(x) for x in lp) / ((5 + n) / 6) ** a),
            ("plain_length", "这是 Σ log p / |y|^α；本题用 GNMT 的 ((5 + |y|) / 6)^α", s / n ** a),
            ("no_penalty", "忘了除以长度惩罚 ((5 + |y|) / 6)^α", s),
            ("len_without_eos", "|y| 要把 EOS 也算进去（它也是模型生成的一个词元）", s / ((4 + n) / 6) ** a),
            ("mean", "这是平均 log 概率 Σ log p / |y|；本题的长度惩罚是 ((5 + |y|) / 6)^α", s / n),
        ]

    def one(f, lp: list[float], a: float) -> None:
        got = _number(f(list(lp), a), "得分")
        ref = _beam_score(lp, a)
        if _close(got, ref):
            return
        for key, hint, value in variants(lp, a):
            if _close(got, value):
                raise Mistake(hint, key=key)
        raise Mistake(f"log 概率 {lp}、α={a} 的得分应为 {ref:.6g}，你的是 {got:.6g}", key="values")

    def short(f):
        one(f, [-0.1, -0.2, -0.05], 0.6)

    def long(f):
        one(f, [-0.3, -0.01, -1.2, -0.4, -0.02, -0.7, -0.1], 0.6)

    def alpha_zero(f):
        one(f, [-0.5, -1.5, -0.25, -0.3], 0.0)

    def alpha_one(f):
        one(f, [-0.9, -0.2, -0.4, -0.6, -0.1], 1.0)

    return run_checks("束搜索的长度惩罚得分", fn, [
        ("3 个词元，α = 0.6", short),
        ("7 个词元，α = 0.6", long),
        ("α = 0（不惩罚）", alpha_zero),
        ("α = 1", alpha_one),
    ], verbose=verbose)
