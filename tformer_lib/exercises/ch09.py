"""第 9 章（从翻译模型到语言模型）练习的检查器，和“找错”题里那段有错的代码。

- :func:`check_initial_loss`（预测再验证）：没训练过的语言模型，损失应该是多少；
- :func:`buggy_lm_loss` + :func:`check_fixed_lm_loss`（找错）：打包的块里有填充时，损失算错了；
- :func:`check_char_perplexity`（推导并核对）：不同分词器的困惑度怎样换算成“每个字”的困惑度；
- :func:`check_min_p`（扩展）：本章只提到的 min-p 采样过滤。

每个检查器都在多组随机尺寸上调用读者的函数（写死的答案过不了），接受任何正确的数值类型，
桩（stub）→ “⏳ 尚未完成”，不抛异常。
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
    compare_number,
    draw_int,
    random_cases,
    run_checks,
)
from tformer_lib.lm.config import LMConfig
from tformer_lib.lm.data import loss_targets
from tformer_lib.lm.model import make_lm
from tformer_lib.specials import BOS, EOS, PAD

__all__ = ["check_initial_loss", "buggy_lm_loss", "check_fixed_lm_loss", "check_char_perplexity", "check_min_p"]


def _tiny_lm(g: torch.Generator, vocab_size: int):
    heads = draw_int(g, 1, 4)
    config = LMConfig(vocab_size, d_model=heads * 2 * draw_int(g, 2, 6), n_heads=heads, n_layers=draw_int(g, 1, 2),
                      d_ff=draw_int(g, 8, 48), max_len=40)
    torch.manual_seed(draw_int(g, 0, 10_000))
    return make_lm(config).eval()


# ---- 预测再验证：没训练过的模型的损失 -------------------------------------------------------------------


def check_initial_loss(fn: Callable[..., Any], *, verbose: bool = True) -> CheckResult:
    """检查 ``fn(vocab_size) -> float``：刚初始化（没训练）的语言模型在随机文本上的平均交叉熵（容差 0.05）。"""

    def cases(f):
        for g in random_cases(5, seed=91):
            V = draw_int(g, 20, 3000)
            model = _tiny_lm(g, V)
            tokens = torch.randint(4, V, (4, 24), generator=g)  # (B, T)
            with torch.no_grad():
                logits = model(tokens[:, :-1])  # (B, T-1, V)
            measured = float(F.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten()))
            got = as_number(f(V), f"predict_initial_loss({V}) 的返回值")
            if abs(got - measured) <= 0.05:
                continue
            if math.isclose(got, math.log2(V), rel_tol=1e-3):
                raise Mistake(f"V={V}：你给的是 log₂V = {got:.3f}；交叉熵用的是自然对数，实测 {measured:.3f}", key="log2")
            if math.isclose(got, V, rel_tol=1e-3):
                raise Mistake(f"V={V}：{got:.0f} 是困惑度（perplexity），题目问的是损失（交叉熵）= ln(困惑度)，实测 {measured:.3f}",
                              key="perplexity")
            raise Mistake(f"V={V}：你预测 {got:.3f}，实测 {measured:.3f}。初始化时 logits 都很接近 0，"
                          "softmax 给每个词的概率差不多是多少？", key="values")

    return run_checks("未训练模型的损失", fn, [("5 个随机词表大小的随机小模型，与实测的损失比较", cases)], verbose=verbose)


# ---- 找错：有填充的块 ------------------------------------------------------------------------------------


def buggy_lm_loss(model, block):
    """一个有一处错误的语言模型损失（第 9 章“找错”练习用，不要在别处使用）。

    ``block`` ``(B, L+1)`` 是打包好的块（可能以 PAD 结尾）；返回平均交叉熵（0 维张量）。
    """
    inputs, targets = loss_targets(block)  # (B, L), (B, L)：右移一位，BOS 目标记为 PAD
    logits = model(inputs)  # (B, L, V)
    return F.cross_entropy(logits.flatten(0, 1), targets.flatten())  # 所有位置的平均


def _random_block(g: torch.Generator, V: int, B: int, L: int) -> torch.Tensor:
    """几篇随机“文档”（BOS … EOS）首尾相接装进块里，块尾补 PAD；至少一行有填充。"""
    rows = []
    for b in range(B):
        row: list[int] = []
        budget = L + 1 - (draw_int(g, 2, max(2, L // 2)) if b == 0 else draw_int(g, 0, L // 3))
        while len(row) < budget:
            n = draw_int(g, 3, 10)
            doc = [BOS] + torch.randint(4, V, (n,), generator=g).tolist() + [EOS]
            row += doc[: budget - len(row)]
        rows.append(row + [PAD] * (L + 1 - len(row)))
    return torch.tensor(rows)  # (B, L+1)


def check_fixed_lm_loss(fn: Callable[..., Any], *, verbose: bool = True) -> CheckResult:
    """检查改好的 ``fn(model, block) -> 0 维张量或数``：只对真实词元的目标求平均（PAD 与 BOS 目标不计）。"""

    def cases(f):
        for g in random_cases(5, seed=92):
            V = draw_int(g, 12, 60)
            model = _tiny_lm(g, V)
            block = _random_block(g, V, draw_int(g, 2, 4), draw_int(g, 12, 30))
            inputs, targets = loss_targets(block)
            with torch.no_grad():
                logits = model(inputs)  # (B, L, V)
                flat = logits.flatten(0, 1)
                want = float(F.cross_entropy(flat, targets.flatten(), ignore_index=PAD))
                bug = float(F.cross_entropy(flat, targets.flatten()))
                raw = block[:, 1:]
                with_bos = float(F.cross_entropy(flat, raw.flatten(), ignore_index=PAD))
                unshifted = float(F.cross_entropy(flat, inputs.flatten(), ignore_index=PAD))
                got = f(model, block.clone())
            compare_number(got, want, what="损失", rtol=1e-4, atol=1e-5, variants=[
                Variant("counts_pad", "块尾的 PAD 也被当成了要预测的目标：F.cross_entropy 要加 ignore_index=PAD", bug),
                Variant("bos_counted", "下一篇文档开头的 BOS 也被当成了目标：BOS 不是文本，目标里的 BOS 要记作 PAD", with_bos),
                Variant("not_shifted", "目标没有右移一位：位置 t 的目标应是第 t+1 个词元，否则模型只要抄输入", unshifted),
            ], default_hint=f"块 {tuple(block.shape)} 上应得 {want:.5f}，你的是 {as_number(got, '损失'):.5f}")

    from tformer_lib.lm.quality import lm_perplexity

    return run_checks("有填充的块上的语言模型损失", fn, [("5 个随机小模型、随机打包的块（块尾有 PAD）", cases)],
                      verbose=verbose, forbidden=(lm_perplexity,))


# ---- 推导并核对：每个字的困惑度 ------------------------------------------------------------------------


def check_char_perplexity(fn: Callable[..., Any], *, verbose: bool = True) -> CheckResult:
    """检查 ``fn(token_ppl, tokens_per_char) -> float``：按词元算的困惑度换算成按字算的困惑度。"""

    def cases(f):
        for g in random_cases(6, seed=93):
            ppl = 2 + 400 * float(torch.rand((), generator=g))
            tpc = 0.5 + 1.5 * float(torch.rand((), generator=g))
            want = ppl ** tpc
            compare_number(f(ppl, tpc), want, what=f"char_perplexity({ppl:.3f}, {tpc:.3f})", rtol=1e-6, variants=[
                Variant("multiplied", "困惑度不能直接乘压缩率：先换回总的负对数似然（ln 困惑度 × 词元数），再按字数平均", ppl * tpc),
                Variant("divided", "困惑度不能直接除以压缩率：先换回总的负对数似然，再按字数平均", ppl / tpc),
                Variant("inverse", "指数放反了：每个字对应 tokens_per_char 个词元，每个字的损失 = 每个词元的损失 × tokens_per_char",
                        ppl ** (1 / tpc)),
                Variant("unchanged", "按词元和按字的困惑度只有在一字一词元时才相同", ppl),
            ])

    return run_checks("按字的困惑度", fn, [("6 组随机的困惑度与压缩率", cases)], verbose=verbose)


# ---- 扩展：min-p 过滤 ------------------------------------------------------------------------------------


def _min_p_reference(logits: torch.Tensor, min_p: float) -> torch.Tensor:
    probs = logits.softmax(dim=-1)  # (B, V)
    keep = probs >= min_p * probs.max(dim=-1, keepdim=True).values
    return logits.masked_fill(~keep, float("-inf"))


def check_min_p(fn: Callable[..., Any], *, verbose: bool = True) -> CheckResult:
    """检查 ``fn(logits (B, V), min_p) -> (B, V)``：概率低于“最大概率 × min_p”的词置为 −∞，其余 logits 原样保留。"""

    def cases(f):
        for g in random_cases(6, seed=94):
            B, V = draw_int(g, 1, 4), draw_int(g, 5, 60)
            logits = 3 * torch.randn(B, V, generator=g, dtype=torch.float64)
            min_p = 0.02 + 0.5 * float(torch.rand((), generator=g))
            original = logits.clone()
            call = f"min_p_filter(logits {tuple(logits.shape)}, min_p={min_p:.3f})"
            out = as_tensor(f(logits, min_p), f"{call} 的返回值")
            if not torch.equal(logits, original):
                raise Mistake(f"{call} 改动了传入的 logits：返回一个新张量，别原地修改", key="in_place")
            if tuple(out.shape) != (B, V):
                raise Mistake(f"{call} 的形状应是 {(B, V)}，收到 {tuple(out.shape)}", key="shape")
            want = _min_p_reference(original, min_p)
            keep = torch.isfinite(want)
            got_keep = torch.isfinite(out)
            if torch.equal(got_keep, keep) and torch.allclose(out[keep].double(), want[keep], atol=1e-6):
                continue
            probs = original.softmax(-1)
            if torch.equal(got_keep, probs >= min_p):
                raise Mistake(f"{call}：阈值是相对的——与这一行**最大**的概率比（p ≥ min_p · p_max），不是与 min_p 本身比",
                              key="absolute")
            if torch.equal(got_keep, original >= min_p * original.max(-1, keepdim=True).values):
                raise Mistake(f"{call}：比较的应是概率（softmax 之后），不是 logits", key="on_logits")
            if bool(((out >= 0) & (out <= 1)).all()) and not bool(torch.isinf(out).any()):
                raise Mistake(f"{call}：应返回过滤后的 logits（被丢掉的词为 −∞），不是概率", key="probs")
            raise Mistake(f"{call}：保留的词不对：应保留 {int(keep.sum())} 个，你保留了 {int(got_keep.sum())} 个；"
                          "保留下来的词 logits 应原样不变", key="values")

    return run_checks("min-p 过滤", fn, [("6 组随机 logits 与 min_p", cases)], verbose=verbose)
