"""第 1 章练习的检查器（checker）：编码与 UNK、one-hot 查表、×√d_model 缩放、补齐与掩码。

用 :mod:`tformer_lib.exercises._core` 的框架：桩 → “⏳ 尚未完成”（不抛异常）；通过 → ✅；
未通过 → ❌ 加一句点名常见错误的提示（忘了 BOS/EOS、把未知词丢掉或记成 PAD、one-hot 没给 num_classes、
忘了乘 √d_model 或乘错了因子、在左侧补齐、掩码极性反了……）。检查器不改变读者的全局随机状态。
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch

from tformer_lib.embedding import TokenEmbedding
from tformer_lib.exercises._core import (
    CheckResult,
    Mistake,
    Variant,
    compare,
    expect_dtype,
    expect_shape,
    generator,
    run_checks,
)
from tformer_lib.masks import padding_mask
from tformer_lib.specials import BOS, EOS, PAD, SPECIAL_TOKENS, UNK

__all__ = ["check_encode", "check_one_hot_lookup", "check_token_embedding", "check_pad_batch"]


def _shape(x: Any) -> str:
    shape = getattr(x, "shape", None)
    return str(tuple(shape)) if shape is not None else type(x).__name__


# ---- 练习 1：编码（BOS/EOS 与 UNK）-----------------------------------------------------------------
_VOCAB_TOKENS = ("狗", "咬", "人", "猫", "追")


def _stoi() -> dict[str, int]:
    return {t: i for i, t in enumerate(list(SPECIAL_TOKENS) + list(_VOCAB_TOKENS))}


def _id_list(result: Any) -> list[int]:
    if isinstance(result, torch.Tensor):
        result = result.tolist()
    if not isinstance(result, (list, tuple)):
        raise Mistake(f"my_encode 应返回 id 列表，你返回的是 {type(result).__name__}", key="type")
    if not all(isinstance(x, int) and not isinstance(x, bool) for x in result):
        raise Mistake(f"my_encode 返回的列表里应全是整数 id，你返回的是 {list(result)!r}", key="type")
    return list(result)


def _encode_case(tokens: list[str]) -> Callable[[Callable], None]:
    def check(f: Callable) -> None:
        stoi = _stoi()
        try:
            got = _id_list(f(list(tokens), dict(stoi)))
        except KeyError as exc:
            raise Mistake(f"查词表外的词元 {exc} 时出现 KeyError：用 stoi.get(token, UNK) 把未登录词映射为 UNK。",
                          key="key_error") from exc
        with_unk = [stoi.get(t, UNK) for t in tokens]
        want = [BOS] + with_unk + [EOS]
        if got == want:
            return
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
        raise Mistake(f"输入 {tokens}：期望 {want}，你的是 {got}。", key="values")

    return check


def check_encode(fn: Callable[[list[str], dict[str, int]], list[int]]) -> CheckResult:
    """练习 1：``fn(tokens, stoi)`` 应返回 ``[BOS] + [stoi.get(t, UNK) …] + [EOS]``。"""
    return run_checks("练习 1 编码（BOS/EOS 与 UNK）", fn, [
        ("词表内的句子", _encode_case(["狗", "咬", "人"])),
        ("换个顺序", _encode_case(["人", "咬", "狗"])),
        ("含一个未登录词", _encode_case(["狗", "咬", "熊"])),
        ("含两个未登录词", _encode_case(["熊", "追", "狼", "猫"])),
        ("空句子", _encode_case([])),
    ])


# ---- 练习 2：one-hot 乘法 = 查表 -----------------------------------------------------------------------
_LOOKUP_V, _LOOKUP_D = 11, 6


def _lookup_case(ids: torch.Tensor) -> Callable[[Callable], None]:
    def check(f: Callable) -> None:
        weight = torch.randn(_LOOKUP_V, _LOOKUP_D, generator=generator(1))
        try:
            got = f(ids.clone(), weight.clone())
        except RuntimeError as exc:
            if any(w in str(exc) for w in ("shape", "size", "match")):
                raise Mistake("矩阵乘法的形状对不上（RuntimeError）。one-hot 的最后一维必须等于词表大小 V："
                              "F.one_hot(ids, num_classes=weight.shape[0])，再直接乘 weight (V, d_model)（不要转置）。",
                              key="num_classes") from exc
            raise
        want = weight[ids]  # (B, T, d_model)
        expect_shape(got, want.shape, "输出", hint=f"ids 形状 {tuple(ids.shape)}：输出形状应为 (B, T, d_model) = "
                                                  f"{tuple(want.shape)}，你的是 {_shape(got)}")
        compare(got, want, what="输出", atol=1e-6,
                default_hint="形状对了但数值不对：one-hot 向量 e_i 乘 weight 应恰好取出第 i 行。")

    return check


def check_one_hot_lookup(fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]) -> CheckResult:
    """练习 2：``fn(ids (B, T), weight (V, d))`` 应返回 ``weight[ids]``，形状 ``(B, T, d)``。"""
    # 批次里最大的 id（7）小于 V-1：不给 num_classes 的 one_hot 会少几列
    return run_checks("练习 2 one-hot 乘法 = 查表", fn, [
        ("两句话的批次", _lookup_case(torch.tensor([[4, 5, 6], [6, 5, 4]]))),
        ("含特殊词元、最大 id 小于 V-1", _lookup_case(torch.tensor([[7, PAD, UNK, 4]]))),
    ])


# ---- 练习 3：×√d_model ------------------------------------------------------------------------------------
def _embedding_case(V: int, d: int) -> Callable[[Callable], None]:
    def check(f: Callable) -> None:
        weight = torch.randn(V, d, generator=generator(d)) * d**-0.5
        with torch.random.fork_rng(devices=[]), torch.no_grad():  # 建层时的随机初始化不动全局随机状态
            emb = TokenEmbedding(V, d)
            emb.lut.weight.copy_(weight)
            ids = torch.tensor([[4, 5, 6, PAD], [8, 7, BOS, EOS]])
            want = emb(ids)  # (B, T, d)
        got = f(ids.clone(), weight.clone())
        expect_shape(got, want.shape, "输出", hint=f"输出形状应为 (B, T, d_model) = {tuple(want.shape)}，"
                                                  f"你的是 {_shape(got)}")
        base = weight[ids]
        compare(got, want, what="输出", variants=[
            Variant("no_scale", f"d_model={d}：忘了缩放，查表之后还要乘以 √d_model。", base),
            Variant("divided", f"d_model={d}：缩放方向反了，是乘以 √d_model，不是除以。", base / math.sqrt(d)),
            Variant("times_d", f"d_model={d}：缩放因子是 √d_model，不是 d_model。", base * d),
            Variant("sqrt_vocab", f"d_model={d}：缩放因子用的是 d_model（weight.shape[1]），"
                                  "不是词表大小 V（weight.shape[0]）。", base * math.sqrt(V)),
        ], default_hint=f"d_model={d}：结果与 TokenEmbedding 不同（应为 weight[ids] * √d_model）。")

    return check


def check_token_embedding(fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]) -> CheckResult:
    """练习 3：``fn(ids, weight)`` 应与 ``TokenEmbedding``（查表后 ×√d_model）输出相同。"""
    return run_checks("练习 3 词嵌入乘 √d_model", fn, [
        ("V=10, d_model=16", _embedding_case(10, 16)),
        ("V=9, d_model=64", _embedding_case(9, 64)),
    ])


# ---- 练习 4：补齐批次与填充掩码 -----------------------------------------------------------------------------
def _pad_case(seqs: list[list[int]]) -> Callable[[Callable], None]:
    def check(f: Callable) -> None:
        out = f([list(s) for s in seqs])
        if not (isinstance(out, tuple) and len(out) == 2):
            raise Mistake("应返回两个张量组成的元组 (ids, keep)。", key="type")
        ids, keep = out
        t_max = max(len(s) for s in seqs)
        want_ids = torch.full((len(seqs), t_max), PAD, dtype=torch.long)  # (B, T_max)
        for b, s in enumerate(seqs):
            want_ids[b, : len(s)] = torch.tensor(s)
        want_keep = padding_mask(want_ids, PAD)[:, 0, 0, :]  # (B, T_max)
        expect_shape(ids, want_ids.shape, "ids", hint=f"ids 形状应为 (B, T_max) = {tuple(want_ids.shape)}"
                                                      "（补到本批最长句的长度）")
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
        ], default_hint=f"keep 应为 {want_keep.int().tolist()}（1 = 真实词元），你的是 {keep.int().tolist()}")

    return check


def check_pad_batch(fn: Callable[[list[list[int]]], tuple[torch.Tensor, torch.Tensor]]) -> CheckResult:
    """练习 4：``fn(seqs)`` 应返回右侧补 PAD 的 ``ids (B, T_max)`` 与布尔掩码 ``keep``（True = 真实词元）。"""
    return run_checks("练习 4 补齐批次与填充掩码", fn, [
        ("长度 3/2/1", _pad_case([[4, 5, 6], [7, 8], [9]])),
        ("最长的在中间", _pad_case([[5], [4, 6, 7, 8, 9], [10, 11]])),
        ("等长，不需要补齐", _pad_case([[4, 5], [6, 7]])),
    ])
