"""第 8 章练习的检查器（checker）：FlashAttention 一步更新（找错）、解码器层的交叉点长度（推导）、
逐块注意力的最大中间张量（预测再验证）、分组查询注意力的 K/V 缓存（扩展）。

用 :mod:`tformer_lib.exercises._core` 的框架：桩 → “⏳ 尚未完成”（不抛异常）；通过 → ✅；
未通过 → ❌ 加一句点名常见错误的提示。每个检查器都在几组随机的大小上运行（写死书中例子的答案不会通过），
读者返回的数可以是 Python 数、NumPy 标量或 0 维张量。
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch

from ..measurement.costs import decoder_layer_flops, largest_tensor_bytes
from ..parts.flash import tiled_attention
from ..translation.config import TransformerConfig
from ._core import (
    CheckResult,
    Mistake,
    Variant,
    as_tensor,
    compare,
    compare_number,
    draw_choice,
    draw_int,
    random_cases,
    run_checks,
)

__all__ = ["check_flash_step", "check_decoder_crossover", "check_tiled_peak_bytes", "check_gqa_kv_bytes"]


# ---- 练习（找错）：FlashAttention 的一步更新 ---------------------------------------------------------


def _flash_step_reference(m, l, acc, s, v):
    m_new = torch.maximum(m, s.max(-1).values)  # (T_q,)
    p = torch.exp(s - m_new[:, None])  # (T_q, b)
    corr = torch.exp(m - m_new)  # (T_q,)
    return m_new, l * corr + p.sum(-1), acc * corr[:, None] + p @ v


def _triple(out: Any) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    if not isinstance(out, (tuple, list)) or len(out) != 3:
        raise Mistake(f"应返回三个张量组成的元组 (m_new, l_new, acc_new)，你返回的是 {type(out).__name__}", key="type")
    return tuple(as_tensor(x, name) for x, name in zip(out, ("m_new", "l_new", "acc_new")))  # type: ignore[return-value]


def check_flash_step(fn: Callable, *, verbose: bool = True) -> CheckResult:
    """检查 ``fn(m, l, acc, s, v) -> (m_new, l_new, acc_new)``：读入一块键/值后的更新。

    形状：``m``、``l`` ``(T_q,)``，``acc`` ``(T_q, d_v)``，``s`` 是这一块的分数 ``(T_q, b)``（已除以 √d_k），
    ``v`` 是这一块的值 ``(b, d_v)``。从 ``m=-inf、l=0、acc=0`` 开始反复调用它读完所有块后，
    ``acc / l`` 应等于注意力输出 ``softmax(s) v``。大小随机，后面的块里故意放进更大的分数（逼出修正因子）。
    """

    def one(f, g: torch.Generator) -> None:
        t_q, t_k, d, b = draw_int(g, 1, 5), draw_int(g, 4, 13), draw_int(g, 1, 6), draw_int(g, 2, 5)
        q = torch.randn(t_q, d, generator=g, dtype=torch.float64)
        k = torch.randn(t_k, d, generator=g, dtype=torch.float64)
        v = torch.randn(t_k, d, generator=g, dtype=torch.float64)
        k[t_k - 1] = 3 * q.sum(0) / max(1.0, float(q.sum(0).norm()))  # 最后一块里的分数更大
        scores = q @ k.T / math.sqrt(d)  # (T_q, T_k)
        scores[:, -1] += 4.0
        m = torch.full((t_q,), float("-inf"), dtype=torch.float64)
        l = torch.zeros(t_q, dtype=torch.float64)
        acc = torch.zeros(t_q, d, dtype=torch.float64)
        for start in range(0, t_k, b):
            s_blk, v_blk = scores[:, start:start + b], v[start:start + b]
            m_new, l_new, acc_new = _triple(f(m.clone(), l.clone(), acc.clone(), s_blk.clone(), v_blk.clone()))
            m_ref, l_ref, acc_ref = _flash_step_reference(m, l, acc, s_blk, v_blk)
            p = torch.exp(s_blk - m_ref[:, None])
            where = f"T_q={t_q}、块宽 {b}：读入第 {start // b + 1} 块（键 {start}–{min(start + b, t_k) - 1}）后"
            compare(m_new, m_ref, what=f"{where}的 m_new", atol=1e-9, default_hint=f"{where}：m_new 应是 max(m, 这一块每行的最大分数)")
            compare(l_new, l_ref, what=f"{where}的 l_new", atol=1e-9, variants=[
                Variant("no_l_rescale", f"{where}：l_new 不对——旧的 l 要先乘修正因子 e^(m − m_new)", l + p.sum(-1)),
                Variant("inverted_correction", f"{where}：修正因子写反了，应是 e^(m − m_new)（≤ 1），不是 e^(m_new − m)",
                        torch.nan_to_num(l * torch.exp(m_ref - m), nan=0.0) + p.sum(-1)),
            ], default_hint=f"{where}：l_new 应为 l·e^(m − m_new) + Σ_j e^(s_j − m_new)")
            compare(acc_new, acc_ref, what=f"{where}的 acc_new", atol=1e-9, variants=[
                Variant("no_acc_rescale", f"{where}：acc_new 不对——l 修正了，但累加器 acc 也要乘同一个修正因子 e^(m − m_new)",
                        acc + p @ v_blk),
                Variant("normalised_acc", f"{where}：acc_new 里不要除以 l——归一化留到最后一步（acc / l）",
                        acc_ref / l_ref[:, None]),
                Variant("inverted_correction", f"{where}：修正因子写反了，应是 e^(m − m_new)（≤ 1），不是 e^(m_new − m)",
                        torch.nan_to_num(acc * torch.exp(m_ref - m)[:, None], nan=0.0) + p @ v_blk),
            ], default_hint=f"{where}：acc_new 应为 acc·e^(m − m_new) + P·v，P = e^(s − m_new)")
            m, l, acc = m_new, l_new, acc_new
        assert torch.allclose(acc / l[:, None], scores.softmax(-1) @ v, atol=1e-8)  # 参考答案的自检

    def values(f):
        for g in random_cases(6, seed=81):
            one(f, g)

    return run_checks("FlashAttention 的一步更新", fn, [("随机大小，逐块更新 m、l、acc", values)], verbose=verbose)


# ---- 练习（推导并核对）：解码器层的交叉点长度 ---------------------------------------------------------


def _split_flops(d: int, d_ff: int, T: int) -> tuple[int, int]:
    """解码器层（S = T）的 FLOPs 拆成 (随长度平方增长的部分, 线性部分)。"""
    cfg = TransformerConfig(10, 10, d_model=d, n_heads=1, d_ff=d_ff)
    parts = decoder_layer_flops(cfg, 1, T, T)
    quad = sum(v for k, v in parts.items() if k.endswith(("scores", "weighted_sum")))
    return quad, parts["total"] - quad


def check_decoder_crossover(fn: Callable[[int, int], Any], *, verbose: bool = True) -> CheckResult:
    """检查 ``fn(d_model, d_ff) -> T*``：源句与目标一样长（S = T）时，解码器层里随长度平方增长的 FLOPs
    （自注意力与交叉注意力的 QKᵀ、AV）等于线性部分（各个投影与前馈网络）的长度。答案 ``2·d_model + d_ff/2``。"""

    def one(f, d: int, d_ff: int) -> None:
        ref = 2 * d + d_ff / 2
        if d_ff % 2 == 0:  # 参考答案的自检：在 T* 处两部分恰好相等
            quad, lin = _split_flops(d, d_ff, int(ref))
            assert quad == lin, (d, d_ff, quad, lin)
        compare_number(f(d, d_ff), ref, what=f"d_model={d}、d_ff={d_ff} 时的交叉点", rtol=1e-9, atol=1e-6, variants=[
            Variant("encoder_formula", "这是编码器层的交叉点 2d + d_ff；解码器层还有交叉注意力：它的 QKᵀ、AV 也随长度平方增长"
                    "（S = T 时），投影也多了四个", 2 * d + d_ff),
            Variant("missed_cross_quadratic", "只算了交叉注意力的投影，没算它的 QKᵀ 与 AV：S = T 时它们同样 ∝ T²",
                    4 * d + d_ff),
            Variant("cross_kv_constant", "交叉注意力的 K、V 投影作用在 S = T 个源词元上，也随长度线性增长，要算进线性部分",
                    1.5 * d + d_ff / 2),
            Variant("no_factor_two_ffn", "前馈网络是两个线性层 d → d_ff → d，共 4·B·T·d·d_ff FLOPs", 2 * d + d_ff / 4),
        ])

    def values(f):
        for g in random_cases(6, seed=82):
            one(f, 8 * draw_int(g, 2, 256), 2 * draw_int(g, 16, 4096))

    def odd_ff(f):
        one(f, 96, 257)

    return run_checks("解码器层的交叉点长度", fn, [
        ("随机的 d_model 与 d_ff", values),
        ("d_ff 为奇数（交叉点不是整数）", odd_ff),
    ], verbose=verbose)


# ---- 练习（预测再验证）：逐块注意力的最大中间张量 -----------------------------------------------------


def check_tiled_peak_bytes(fn: Callable[[int, int, int, int, int], Any], *, verbose: bool = True) -> CheckResult:
    """检查 ``fn(batch, heads, n, d_k, block_size) -> bytes``：对 float32 的自注意力输入 ``(B, h, n, d_k)``
    （``d_v = d_k``）运行 ``tiled_attention(q, k, v, block_size=…)`` 时，途中最大的一个张量占多少字节。
    检查器用 :func:`~tformer_lib.measurement.costs.largest_tensor_bytes` 实测后比较。"""

    def one(f, B: int, h: int, n: int, d_k: int, b: int) -> None:
        g = torch.Generator().manual_seed(B * 1000 + h * 100 + n)
        q, k, v = (torch.randn(B, h, n, d_k, generator=g) for _ in range(3))  # (B, h, n, d_k)
        measured = largest_tensor_bytes(lambda: tiled_attention(q, k, v, block_size=b))
        tile, full = 4 * B * h * n * min(b, n), 4 * B * h * n * n
        compare_number(f(B, h, n, d_k, b), measured, what=f"(B={B}, h={h}, n={n}, d_k={d_k}, 块宽 {b}) 的最大张量字节数",
                       rtol=0, atol=0.5, variants=[
                           Variant("full_table", "这是整张分数表 (B, h, n, n) 的大小；逐块计算时只有 (B, h, n, 块宽) 的一小条",
                                   full),
                           Variant("tile_only", "分数块不一定是最大的：块宽小于 d_k 时，累加器 acc 与输出 (B, h, n, d_k) 更大",
                                   tile),
                           Variant("block_over_n", "块宽比 n 还大时，最后（也是唯一）一块只有 n 列", 4 * B * h * n * max(b, d_k)),
                           Variant("no_bytes", "float32 每个数 4 个字节：元素个数还要乘 4", measured / 4),
                           Variant("no_batch_heads", "分数块与累加器对每个句子、每个头各有一份：要乘 B·h", measured / (B * h)),
                       ])

    def values(f):
        for g in random_cases(6, seed=83):
            one(f, draw_int(g, 1, 3), draw_int(g, 1, 4), draw_int(g, 8, 96), draw_choice(g, [4, 8, 16, 32]),
                draw_choice(g, [2, 5, 8, 16, 32, 64, 128]))

    def corners(f):
        one(f, 1, 2, 40, 8, 64)  # 块宽比 n 大
        one(f, 2, 2, 50, 32, 8)  # 块宽比 d_k 小

    return run_checks("逐块注意力的最大中间张量", fn, [
        ("随机大小，与实测比较", values),
        ("块宽比 n 大、比 d_k 小", corners),
    ], verbose=verbose)


# ---- 练习（扩展）：分组查询注意力的 K/V 缓存 -----------------------------------------------------------


def check_gqa_kv_bytes(fn: Callable[[int, int, int, int, int], Any], *, verbose: bool = True) -> CheckResult:
    """检查 ``fn(n_layers, d_model, n_heads, n_kv_heads, bytes_per_element) -> bytes``：分组查询注意力
    （grouped-query attention, GQA）的解码器每生成一个词元、一条序列的自注意力 K/V 缓存增加多少字节。
    答案 ``2 · n_layers · n_kv_heads · (d_model / n_heads) · bytes``；``n_kv_heads == n_heads`` 时就是普通多头注意力。"""

    def one(f, L: int, d: int, h: int, kv: int, e: int) -> None:
        d_k = d // h
        ref = 2 * L * kv * d_k * e
        compare_number(f(L, d, h, kv, e), ref, what=f"(层数 {L}, d_model={d}, h={h}, n_kv_heads={kv}, {e} 字节/数)",
                       rtol=0, atol=0.5, variants=[
                           Variant("mha", "这是普通多头注意力的缓存：GQA 只为 n_kv_heads 个 K/V 头存缓存，"
                                   "每个 K/V 头由 n_heads / n_kv_heads 个查询头共用", 2 * L * d * e),
                           Variant("no_factor_2", "K 和 V 是两份，要乘 2", L * kv * d_k * e),
                           Variant("no_layers", "每个解码器层都有自己的 K/V 缓存，要乘层数", 2 * kv * d_k * e),
                           Variant("d_model_per_kv_head", "每个 K/V 头的维度是 d_k = d_model / n_heads，不是 d_model",
                                   2 * L * kv * d * e),
                           Variant("group_size", "缓存的是 n_kv_heads 个头，不是组大小 n_heads / n_kv_heads 个",
                                   2 * L * (h // kv) * d_k * e),
                           Variant("no_bytes", "忘了乘每个数的字节数 bytes_per_element", 2 * L * kv * d_k),
                       ])

    def values(f):
        for g in random_cases(6, seed=84):
            h = draw_choice(g, [8, 16, 32, 64])
            kv = draw_choice(g, [x for x in (1, 2, 4, 8) if h % x == 0 and x < h])
            one(f, draw_int(g, 2, 48), h * draw_choice(g, [32, 64, 128]), h, kv, draw_choice(g, [1, 2, 4]))

    def mha_case(f):
        one(f, 6, 512, 8, 8, 4)  # n_kv_heads = n_heads：退化成普通多头注意力

    return run_checks("分组查询注意力的 K/V 缓存", fn, [
        ("随机的层数、头数与 K/V 头数", values),
        ("n_kv_heads = n_heads", mha_case),
    ], verbose=verbose)
