"""第 7 章练习的检查器（checker）：预热调度的半峰步数、标签平滑的目标分布与损失（找错）、
初始损失为什么比 ln V 高、束搜索的长度惩罚得分。

用 :mod:`tformer_lib.exercises._core` 的框架：桩 → “⏳ 尚未完成”（不抛异常）；通过 → ✅；
未通过 → ❌ 加一句点名常见错误的提示。每个检查器都在几组随机的大小与参数上运行（写死书中例子的答案不会通过），
读者返回的数可以是 Python 数、NumPy 标量或 0 维张量。
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from tformer_lib.exercises._core import (
    CheckResult,
    Mistake,
    Variant,
    as_number,
    as_tensor,
    compare,
    compare_number,
    draw_choice,
    draw_int,
    random_cases,
    randn,
    run_checks,
)
from tformer_lib.specials import PAD

__all__ = ["check_half_peak_step", "check_smoothed_targets", "check_smoothed_loss", "check_initial_loss",
           "check_beam_score"]


# ---- 练习：学习率何时降到峰值的一半 --------------------------------------------------------------


def _noam(step: float, d_model: int, warmup: float) -> float:
    step = max(step, 1)
    return d_model ** -0.5 * min(step ** -0.5, step * warmup ** -1.5)


def check_half_peak_step(fn: Callable[[int, float], Any], *, verbose: bool = True) -> CheckResult:
    """检查 ``fn(d_model, peak_lr) -> step``：论文的预热调度峰值为 ``peak_lr`` 时，
    衰减阶段的学习率在第几步降到峰值的一半。答案 ``4 · warmup = 4 / (d_model · peak_lr²)``。"""

    def one(f, d: int, w: int) -> None:
        peak = _noam(w, d, w)  # = (d · w)^-0.5
        ref = 4.0 / (d * peak ** 2)
        assert math.isclose(_noam(ref, d, ref / 4), peak / 2, rel_tol=1e-9)  # 参考答案本身的自检
        warm = 1.0 / (d * peak ** 2)
        compare_number(f(d, peak), ref, what=f"d_model={d}、峰值 {peak:.6g} 时的步数", atol=1.0, rtol=1e-6, variants=[
            Variant("peak_step", "这是学习率到达峰值的那一步（warmup）；峰值之后学习率 ∝ step^-0.5，还要再往后走", warm),
            Variant("inverse_step", "峰值之后学习率按 1/√step 衰减，不是 1/step：降到一半要走到 warmup 的 4 倍，不是 2 倍",
                    2 * warm),
            Variant("sqrt_two", "降到一半时 √(warmup/step) = 1/2，所以 step = 4·warmup，不是 √2·warmup", math.sqrt(2) * warm),
            Variant("rising_side", "这是预热阶段（学习率还在上升时）到达峰值一半的那一步；题目问的是峰值之后的衰减阶段",
                    warm / 2),
            Variant("no_square", "由峰值 (d_model · warmup)^-0.5 = peak_lr 反推 warmup 时要平方：warmup = 1/(d_model · peak_lr²)",
                    4.0 / (d * peak)),
        ])

    def values(f):
        for g in random_cases(6, seed=71):
            one(f, draw_choice(g, [32, 64, 128, 256, 512, 768, 1024, 4096]), draw_int(g, 10, 8000))

    def paper(f):
        one(f, 512, 4000)

    return run_checks("学习率何时降到峰值的一半", fn, [
        ("随机的 d_model 与峰值", values),
        ("论文的设置 d_model=512, warmup=4000", paper),
    ], verbose=verbose)


# ---- 练习：标签平滑的目标分布 -----------------------------------------------------------------------


def _targets(target: torch.Tensor, vocab_size: int, eps: float, pad_id: int) -> torch.Tensor:
    q = torch.full((*target.shape, vocab_size), eps / vocab_size, dtype=torch.float64)
    q.scatter_add_(-1, target.unsqueeze(-1), torch.full((*target.shape, 1), 1.0 - eps, dtype=torch.float64))
    return q * (target != pad_id).unsqueeze(-1)


def _random_targets(g: torch.Generator, n: int, V: int, pad: int, n_pad: int) -> torch.Tensor:
    """n 个目标 id，其中 n_pad 个是 pad（放在末尾，像真实批次那样），其余是不等于 pad 的随机 id。"""
    ids = torch.randint(0, V - 1, (n,), generator=g)
    ids = ids + (ids >= pad).long()  # 跳过 pad
    ids[n - n_pad:] = pad
    return ids


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
            Variant("no_pad", "target 为 PAD 的行应全为 0：填充位不是真正的词，不该有训练目标", _targets(t, V, eps, -1)),
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
        compare(got, _targets(t, V, eps, pad), what=f"目标分布 q（V={V}，ε={eps}，pad_id={pad}）",
                variants=variants(t, V, eps, pad), atol=1e-6)

    def values(f):
        for g in random_cases(5, seed=72):
            V = draw_int(g, 5, 40)
            n = draw_int(g, 2, 9)
            pad = draw_choice(g, [PAD, PAD, V - 1, 3])
            eps = draw_choice(g, [0.05, 0.1, 0.2, 0.3])
            one(f, _random_targets(g, n, V, pad, draw_int(g, 1, n - 1)), V, eps, pad)

    def no_padding(f):
        g = random_cases(1, seed=73)[0]
        one(f, _random_targets(g, 6, 11, PAD, 0), 11, 0.1, PAD)

    return run_checks("标签平滑的目标分布", fn, [
        ("随机的 V、ε、pad_id，带填充", values),
        ("没有填充", no_padding),
    ], verbose=verbose)


# ---- 练习（找错）：标签平滑损失 ---------------------------------------------------------------------


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
        q_all = _targets(tf, V, eps, -1)
        onehot = F.one_hot(tf, V).double()
        return [
            Variant("pad_in_mean", "PAD 位置也算进了平均：应只对 target ≠ pad_id 的位置求平均（分母是真实词元数）",
                    per.sum() / tf.numel()),
            Variant("pad_not_masked", "PAD 位置也有了训练目标：target 为 pad_id 的位置应完全不计入损失",
                    -(q_all * logp).sum(-1).mean()),
            Variant("sum", "用了总和：应除以真实（非 PAD）词元的个数，取平均", per.sum()),
            Variant("no_smoothing", "这是不带平滑的交叉熵：还要加上 ε · 平均的 −log p_v 那一项",
                    F.cross_entropy(flat, tf, ignore_index=pad)),
            Variant("v_minus_1", "ε 分给了其余 V−1 个类；本书与 F.cross_entropy 一致，ε 平均分给全部 V 个类",
                    (-(((eps / (V - 1)) * (1 - onehot) + (1 - eps) * onehot) * logp).sum(-1) * keep).sum() / keep.sum()),
            Variant("uniform_sum", "均匀分布那一项应是 ε · (1/V) Σ_v (−log p_v)（对 V 个词取平均），你用了求和，少除了 V",
                    (((1 - eps) * -logp.gather(-1, tf.clamp(min=0)[:, None])[:, 0] - eps * logp.sum(-1)) * keep).sum()
                    / keep.sum()),
            Variant("softmax_not_log", "要对概率取对数：用 log_softmax，而不是 softmax 本身",
                    (-(q * flat.softmax(-1)).sum(-1)).sum() / keep.sum()),
            Variant("wrong_axis", "log_softmax 沿错了维度：应沿最后一维（词表，dim=-1）归一化",
                    (-(q * flat.log_softmax(0)).sum(-1)).sum() / keep.sum()),
            Variant("sign", "符号反了：交叉熵是 −Σ q log p，应当 ≥ 0", -per.sum() / keep.sum()),
        ]

    def one(f, logits, t, eps, pad) -> None:
        logits = logits.double()
        got = f(logits.clone(), t.clone(), eps, pad)
        if isinstance(got, torch.Tensor) and got.numel() != 1:
            raise Mistake(f"损失应是一个数（对所有真实词元取平均），你返回了形状 {tuple(got.shape)}", key="not_reduced")
        expected = ref(logits, t, eps, pad)
        got_t = as_tensor(got, "损失").reshape(())
        compare(got_t, expected, what=f"损失（ε={eps}，pad_id={pad}）", variants=variants(logits, t, eps, pad),
                atol=1e-8)

    def values(f):
        for g in random_cases(5, seed=74):
            B, T, V = draw_int(g, 1, 4), draw_int(g, 2, 7), draw_int(g, 5, 30)
            pad = draw_choice(g, [PAD, PAD, V - 1])
            eps = draw_choice(g, [0.1, 0.2, 0.3])
            t = torch.stack([_random_targets(g, T, V, pad, draw_int(g, 0, T - 1)) for _ in range(B)])  # (B, T)
            t[0, 0] = (pad + 1) % V  # 至少有一个真实词元
            one(f, 2.0 * randn(B, T, V, generator=g), t, eps, pad)

    def flat(f):
        g = random_cases(1, seed=75)[0]
        one(f, randn(6, 9, generator=g), _random_targets(g, 6, 9, PAD, 2), 0.1, PAD)

    return run_checks("标签平滑损失", fn, [
        ("随机的 (B, T, V)、ε、pad_id，带填充", values),
        ("一维目标 (N,)", flat),
    ], verbose=verbose)


# ---- 练习：第 1 步的损失为什么比 ln V 高 --------------------------------------------------------------


def _expected_initial_loss(V: int, sigma: float, samples: int) -> float:
    """logits 每个分量独立 ~ N(0, σ²) 时交叉熵的期望：E[logsumexp(z)] − E[z_y] = E[logsumexp(z)]（蒙特卡洛估计）。"""
    g = torch.Generator().manual_seed(1000 * V + int(100 * sigma))
    z = sigma * torch.randn(samples, V, generator=g, dtype=torch.float64)
    return float(torch.logsumexp(z, dim=-1).mean())


def check_initial_loss(fn: Callable[[int, float], Any], *, verbose: bool = True) -> CheckResult:
    """检查 ``fn(vocab_size, sigma) -> loss``：logits 的每个分量独立服从 ``N(0, σ²)`` 时，
    交叉熵（带不带标签平滑都一样）的期望近似值。答案 ``ln V + σ²/2``（V 大时）；
    检查器与蒙特卡洛估计的真实期望比较，容差 0.015。"""

    def one(f, V: int, sigma: float) -> None:
        truth = _expected_initial_loss(V, sigma, max(400, 400_000 // V))
        lnv = math.log(V)
        got = as_number(f(V, sigma), f"V={V}、σ={sigma} 时的损失")
        if abs(got - truth) <= 0.015:
            return
        for key, hint, value in [
            ("ln_v", "ln V 只在 logits 全相等（σ = 0）时成立：logits 有散布时，logsumexp 会被大的那几项拉高", lnv),
            ("sigma_squared", "多出来的一截是 σ²/2，不是 σ²：E[e^z] = e^{σ²/2}（正态分布的矩母函数）", lnv + sigma ** 2),
            ("sigma", "多出来的一截与 σ² 成正比（E[e^z] = e^{σ²/2}），不是与 σ 成正比", lnv + sigma / 2),
            ("sign", "符号反了：logits 的散布让损失变大（−log p_y 的期望 ≥ ln V），应加上 σ²/2", lnv - sigma ** 2 / 2),
            ("log10", "交叉熵用自然对数 ln，不是 log10", math.log10(V) + sigma ** 2 / 2),
        ]:
            if abs(got - value) <= 1e-6 * max(1.0, abs(value)):
                raise Mistake(hint, key=key)
        if not math.isfinite(got):
            raise Mistake(f"V={V}、σ={sigma} 时得到 {got}", key="nonfinite")
        raise Mistake(f"V={V}、σ={sigma} 时交叉熵的期望约为 {truth:.3f}，你的是 {got:.3f}（ln V = {lnv:.3f}）",
                      key="values")

    def values(f):
        for V, sigma in ((77, 0.6), (128, 1.0), (300, 0.8), (1000, 0.3), (5000, 1.0), (64, 0.5)):
            one(f, V, sigma)

    return run_checks("logits 的散布把初始损失抬高多少", fn, [("多组 (V, σ)，与蒙特卡洛估计比较", values)], verbose=verbose)


# ---- 练习：束搜索的长度惩罚得分 -------------------------------------------------------------------


def _beam_score(logps: list[float], alpha: float) -> float:
    return sum(logps) / ((5.0 + len(logps)) / 6.0) ** alpha


def check_beam_score(fn: Callable[[list[float], float], float], *, verbose: bool = True) -> CheckResult:
    """检查 ``fn(token_log_probs, alpha) -> score``：候选译文（含 EOS）每个词元的 log 概率 → GNMT 得分
    ``Σ log p / ((5 + |y|) / 6)^α``，``|y|`` 是词元个数（含 EOS）。"""

    def one(f, lp: list[float], a: float) -> None:
        n, s = len(lp), sum(lp)
        compare_number(f(list(lp), a), _beam_score(lp, a), what=f"{n} 个词元、α={a} 的得分", variants=[
            Variant("multiply", "长度惩罚应当除：得分 = Σ log p / lp(|y|)；乘上去会让长句更吃亏", s * ((5 + n) / 6) ** a),
            Variant("prob_product", "要对 log 概率求和（Σ log p），而不是把概率连乘或对概率求和",
                    math.prod(math.exp(x) for x in lp) / ((5 + n) / 6) ** a),
            Variant("plain_length", "这是 Σ log p / |y|^α；本题用 GNMT 的 ((5 + |y|) / 6)^α", s / n ** a),
            Variant("no_penalty", "忘了除以长度惩罚 ((5 + |y|) / 6)^α", s),
            Variant("len_without_eos", "|y| 要把 EOS 也算进去（它也是模型生成的一个词元）", s / ((4 + n) / 6) ** a),
            Variant("mean", "这是平均 log 概率 Σ log p / |y|；本题的长度惩罚是 ((5 + |y|) / 6)^α", s / n),
        ])

    def values(f):
        for g in random_cases(6, seed=76):
            n = draw_int(g, 1, 12)
            lp = [round(-float(x), 4) for x in torch.rand(n, generator=g, dtype=torch.float64) * 2.0 + 1e-3]
            one(f, lp, draw_choice(g, [0.0, 0.6, 1.0, 1.5]))

    return run_checks("束搜索的长度惩罚得分", fn, [("随机的候选长度与 α", values)], verbose=verbose)
