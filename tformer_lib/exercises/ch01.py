"""第 1 章练习的检查器（checker）：编码与 UNK、“相加后还剩多少词义”的闭式、补齐函数找错、UNK 比例实验。

用 :mod:`tformer_lib.exercises._core` 的框架：桩 → “⏳ 尚未完成”（不抛异常）；通过 → ✅；
未通过 → ❌ 加一句点名常见错误的提示。每个检查器都用几组随机情形与大小（写死本章例子的答案不会通过），
读者返回的数可以是 Python/NumPy 标量或 0 维张量，返回字符串会被指出。检查器不改变读者的全局随机状态。
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import Any

import torch

from tformer_lib.exercises._core import (
    CheckResult,
    Mistake,
    Variant,
    compare,
    compare_number,
    draw_int,
    expect_dtype,
    expect_shape,
    random_cases,
    raised_by_student,
    run_checks,
)
from tformer_lib.parts.masks import padding_mask
from tformer_lib.specials import BOS, EOS, PAD, SPECIAL_TOKENS, UNK

__all__ = ["check_encode", "check_mixed_cosine", "check_pad_batch", "check_unk_rate"]


# ---- 练习 1：编码（BOS/EOS 与 UNK）-----------------------------------------------------------------
_WORDS = ("狗", "咬", "人", "猫", "追", "鱼", "马", "看见", "喜欢", "老师", "学生", "今天")
_UNKNOWN = ("熊", "狼", "熊猫", "长颈鹿", "老虎")


def _id_list(result: Any) -> list[int]:
    if isinstance(result, torch.Tensor):
        result = result.tolist()
    if isinstance(result, str):
        raise Mistake(f"my_encode 应返回 id 列表，你返回的是字符串 {result[:30]!r}", key="string")
    if not isinstance(result, (list, tuple)):
        raise Mistake(f"my_encode 应返回 id 列表，你返回的是 {type(result).__name__}", key="type")
    out = []
    for x in result:
        try:
            import numpy as np

            if isinstance(x, np.integer):
                x = int(x)
        except ImportError:  # pragma: no cover
            pass
        if isinstance(x, bool) or not isinstance(x, int):
            raise Mistake(f"my_encode 返回的列表里应全是整数 id，你返回的是 {list(result)!r}", key="type")
        out.append(x)
    return out


def _encode_cases() -> list[tuple[list[str], dict[str, int]]]:
    """几组随机词表（大小、顺序都不同）与随机句子（含 0–2 个未登录词，也有空句子）。"""
    cases = [(["狗", "咬", "熊"], None), ([], None)]
    out = []
    for k, g in enumerate(random_cases(6, seed=101)):
        n_vocab = draw_int(g, 3, len(_WORDS))
        order = torch.randperm(len(_WORDS), generator=g)[:n_vocab].tolist()
        vocab_words = [_WORDS[i] for i in order]
        stoi = {t: i for i, t in enumerate(list(SPECIAL_TOKENS) + vocab_words)}
        length = draw_int(g, 1, 6)
        sent = [vocab_words[draw_int(g, 0, n_vocab - 1)] for _ in range(length)]
        for _ in range(k % 3):  # 0、1、2 个未登录词插在随机位置
            sent.insert(draw_int(g, 0, len(sent)), _UNKNOWN[draw_int(g, 0, len(_UNKNOWN) - 1)])
        out.append((sent, stoi))
    first_stoi = out[0][1]
    return [(s, first_stoi) for s, _ in cases] + out


def _encode_all(f: Callable) -> None:
    for tokens, stoi in _encode_cases():
        try:
            got = _id_list(f(list(tokens), dict(stoi)))
        except KeyError as exc:
            if not raised_by_student(exc):
                raise
            raise Mistake(f"输入 {tokens}：查词表外的词元 {exc} 时出现 KeyError：用 stoi.get(token, UNK) "
                          "把未登录词映射为 UNK。", key="key_error") from exc
        with_unk = [stoi.get(t, UNK) for t in tokens]
        want = [BOS] + with_unk + [EOS]
        if got == want:
            continue
        wrong = [
            ("no_bos_eos", with_unk, "忘了在开头加 BOS、结尾加 EOS。"),
            ("no_eos", [BOS] + with_unk, "BOS 和 EOS 两端都要加：开头 BOS，结尾 EOS。"),
            ("no_bos", with_unk + [EOS], "BOS 和 EOS 两端都要加：开头 BOS，结尾 EOS。"),
            ("swapped", [EOS] + with_unk + [BOS], "BOS 与 EOS 放反了：BOS（序列开始）在最前，EOS（序列结束）在最后。"),
            ("dropped_unknown", [BOS] + [stoi[t] for t in tokens if t in stoi] + [EOS],
             "未登录词被丢掉了；它们应当变成 UNK，句子长度不变。"),
            ("unknown_as_pad", [BOS] + [stoi.get(t, PAD) for t in tokens] + [EOS],
             "未登录词应映射为 UNK，不是 PAD——PAD 只用于补齐，模型会忽略它。"),
        ]
        for key, value, hint in wrong:
            if got == value:
                raise Mistake(f"输入 {tokens}：{hint}", key=key)
        raise Mistake(f"输入 {tokens}：期望 {want}，你的是 {got}。（检查器每次换一张词表，id 要从 stoi 里查。）",
                      key="values")


def check_encode(fn: Callable[[list[str], dict[str, int]], list[int]]) -> CheckResult:
    """练习 1：``fn(tokens, stoi)`` 应返回 ``[BOS] + [stoi.get(t, UNK) …] + [EOS]``。"""
    return run_checks("编码（BOS/EOS 与 UNK）", fn, [("几张随机词表、含未登录词和空句子", _encode_all)])


# ---- 练习 2：相加之后还剩多少词义（推导并核对）------------------------------------------------------------
def _mixed_cosine_all(f: Callable) -> None:
    cases = [(1.0, 5.657), (8.0, 5.657)]
    for g in random_cases(6, seed=102):
        a = 0.1 + 30 * float(torch.rand((), generator=g))
        b = 0.1 + 30 * float(torch.rand((), generator=g))
        cases.append((round(a, 3), round(b, 3)))
    for a, b in cases:
        call = f"mixed_cosine({a}, {b})"
        want = a / math.hypot(a, b)
        compare_number(f(a, b), want, what=call, rtol=1e-6, variants=[
            Variant("ratio", f"{call}：这是长度之比 a/b，不是余弦。x+p 的长度是 √(a²+b²)（x ⟂ p 时的勾股定理）",
                    a / b),
            Variant("sum_of_norms", f"{call}：x+p 的长度不是 a+b——两者互相垂直，长度是 √(a²+b²)", a / (a + b)),
            Variant("swapped", f"{call}：你算的是 x+p 与位置编码 p 的余弦；题目问的是与词嵌入 x 的余弦",
                    b / math.hypot(a, b)),
            Variant("squared", f"{call}：余弦 = (x+p)·x / (‖x+p‖·‖x‖) = a² / (√(a²+b²)·a)，不要平方", a * a / (a * a + b * b)),
        ], default_hint=f"{call} 不对：cos = (x+p)·x / (‖x+p‖·‖x‖)；分子用 x ⟂ p 化简，‖x+p‖ 用勾股定理")


def check_mixed_cosine(fn: Callable[[float, float], float]) -> CheckResult:
    """练习 2：长度 ``a`` 的词嵌入 x 与长度 ``b`` 的位置编码 p 互相垂直时，``fn(a, b)`` 应返回 cos(x+p, x)。"""
    return run_checks("相加后还剩多少词义", fn, [("随机的长度 a、b", _mixed_cosine_all)])


# ---- 练习 3：补齐批次与填充掩码（找错）-----------------------------------------------------------------
def _pad_cases() -> list[list[list[int]]]:
    # 第一组：最长的句子字典序最小（len(max(seqs)) 会取错长度）；其余随机，含 BOS/EOS/UNK
    cases = [[[4, 5, 6, 7], [9, 8], [5]], [[BOS, 6, EOS], [UNK, 4, 5, 6, 7], [8]]]
    for g in random_cases(5, seed=103):
        batch = []
        for _ in range(draw_int(g, 2, 5)):
            length = draw_int(g, 1, 7)
            batch.append([draw_int(g, BOS, 20) for _ in range(length)])  # 不含 PAD
        cases.append(batch)
    cases.append([[4, 5], [6, 7]])  # 等长，不需要补齐
    return cases


def _pad_one(f: Callable, seqs: list[list[int]]) -> None:
    try:
        out = f([list(s) for s in seqs])
    except (RuntimeError, IndexError) as exc:
        if not raised_by_student(exc):
            raise
        longest = max(range(len(seqs)), key=lambda b: len(seqs[b]))
        raise Mistake(f"输入 {seqs}：你的函数出错了（{type(exc).__name__}）。这批里最长的是第 {longest} 句"
                      f"（长度 {len(seqs[longest])}）——检查 T_max 是怎么算出来的", key="t_max") from exc
    if not (isinstance(out, tuple) and len(out) == 2):
        raise Mistake("应返回两个张量组成的元组 (ids, keep)。", key="type")
    ids, keep = out
    t_max = max(len(s) for s in seqs)
    want_ids = torch.full((len(seqs), t_max), PAD, dtype=torch.long)  # (B, T_max)
    for b, s in enumerate(seqs):
        want_ids[b, : len(s)] = torch.tensor(s)
    want_keep = padding_mask(want_ids, PAD)[:, 0, 0, :]  # (B, T_max)
    expect_shape(ids, want_ids.shape, "ids", hint=f"输入 {seqs}：ids 形状应为 (B, T_max) = {tuple(want_ids.shape)}"
                                                  "（补到本批最长句的长度）——检查 T_max 是怎么算出来的")
    expect_dtype(ids, torch.long, "ids", hint=f"ids 的 dtype 应为 torch.long（嵌入层只接受整数 id），你的是 {ids.dtype}")
    left = torch.full_like(want_ids, PAD)
    for b, s in enumerate(seqs):
        left[b, t_max - len(s):] = torch.tensor(s)
    compare(ids, want_ids, what="ids", variants=[
        Variant("left_pad", "句子应放在左侧、在右侧补 PAD（本书的批处理约定），而不是在左侧补。", left),
        Variant("pad_value", "补齐位置用的值不对：应填 PAD，而不是 UNK。", want_ids.masked_fill(~want_keep, UNK)),
    ], default_hint=f"输入 {seqs}：ids 应为 {want_ids.tolist()}，你的是 {ids.tolist()}")
    expect_shape(keep, want_keep.shape, "keep", hint=f"keep 形状应为 (B, T_max) = {tuple(want_keep.shape)}")
    expect_dtype(keep, torch.bool, "keep", hint=f"keep 应是布尔张量（dtype=torch.bool），你的是 {keep.dtype}")
    compare(keep, want_keep, what="keep", variants=[
        Variant("polarity", "掩码极性反了：本书约定 True = 可以关注（真实词元），False = 填充。", ~want_keep),
        Variant("specials_masked", f"输入 {seqs}：BOS、EOS、UNK 也是真实位置，只有 PAD 才该是 False。",
                want_ids > UNK),
    ], default_hint=f"输入 {seqs}：keep 应为 {want_keep.int().tolist()}（1 = 真实词元），你的是 {keep.int().tolist()}")


def check_pad_batch(fn: Callable[[list[list[int]]], tuple[torch.Tensor, torch.Tensor]]) -> CheckResult:
    """练习 3：``fn(seqs)`` 应返回右侧补 PAD 的 ``ids (B, T_max)`` 与布尔掩码 ``keep``（True = 真实词元）。"""

    def all_cases(f: Callable) -> None:
        for seqs in _pad_cases():
            _pad_one(f, seqs)

    from tformer_lib.data.batching import make_batch, pad_sequences

    return run_checks("补齐批次与填充掩码", fn, [("几组随机批次（含特殊词元、最长句不在最前）", all_cases)],
                      forbidden=(pad_sequences, make_batch))


# ---- 练习 4：训练句越多，未登录词越少（动手实验）------------------------------------------------------------
@functools.lru_cache(maxsize=1)
def _toy_zh() -> tuple[tuple[tuple[str, ...], ...], tuple[tuple[str, ...], ...]]:
    from tformer_lib.data import make_toy_corpus, tokenize_zh

    corpus = make_toy_corpus()
    train = tuple(tuple(tokenize_zh(zh)) for zh, _ in corpus.train)
    test = tuple(tuple(tokenize_zh(zh)) for zh, _ in corpus.test)
    return train, test


def unk_rate_reference(n_train: int) -> dict[str, float]:
    """参考测量与几种常见错误测法的结果（检查器与测试共用）。"""
    from tformer_lib.data import Vocab

    train, test = _toy_zh()
    vocab = Vocab.build(train[:n_train])
    ids = [i for s in test for i in vocab.encode(list(s))]
    n_unk = sum(i == UNK for i in ids)
    types = {t for s in test for t in s}
    return {
        "ok": n_unk / len(ids),
        "types": sum(t not in vocab for t in types) / len(types),
        "with_bos_eos": n_unk / (len(ids) + 2 * len(test)),
        "percent": 100 * n_unk / len(ids),
        "all_train": 0.0 if n_train < len(train) else n_unk / len(ids),
    }


def _unk_rate_all(f: Callable) -> None:
    ns = [20]
    for g in random_cases(4, seed=104):
        ns.append(draw_int(g, 1, 40))
    for n in ns:
        call = f"unk_rate({n})"
        r = unk_rate_reference(n)
        variants = [
            Variant("types", f"{call}：你数的是“词型”（不同的词）里有多少没见过；题目要的是测试集所有词元里 UNK 占的比例",
                    r["types"]),
            Variant("with_bos_eos", f"{call}：分母只数句子里的词元，不要把 BOS/EOS 算进去", r["with_bos_eos"]),
            Variant("percent", f"{call}：请返回 0 到 1 之间的比例，不是百分数", r["percent"]),
        ]
        if r["all_train"] != r["ok"]:
            variants.append(Variant("all_train", f"{call}：词表只能从前 n_train 句训练句建立，你好像用了全部训练句",
                                    r["all_train"]))
        compare_number(f(n), r["ok"], what=call, rtol=1e-6, atol=1e-9, variants=variants,
                       default_hint=f"{call} 应为 {r['ok']:.4f}：词表用 Vocab.build 从前 n_train 句训练句的中文建立，"
                                    "再数测试集中文词元里有多少被编码成 UNK")


def check_unk_rate(fn: Callable[[int], float]) -> CheckResult:
    """练习 4：``fn(n_train)`` = 只用前 ``n_train`` 句训练句建词表时，测试集中文词元里 UNK 的比例。"""
    return run_checks("训练句越多，未登录词越少", fn, [("几个随机的 n_train", _unk_rate_all)])
