"""第 8 章检查器的用例：参考答案（与 notebooks/solutions/08_solutions.ipynb 一致）与已知错误答案。"""

import torch

from checkers import Case, Wrong
from tformer_lib.measurement.costs import largest_tensor_bytes
from tformer_lib.exercises.ch08 import (
    check_decoder_crossover,
    check_flash_step,
    check_gqa_kv_bytes,
    check_tiled_peak_bytes,
)
from tformer_lib.parts.flash import tiled_attention

# ---- 练习 1（找错）：FlashAttention 的一步更新 -------------------------------------------------------


def flash_ref(m, l, acc, s, v):
    m_new = torch.maximum(m, s.max(dim=-1).values)  # (T_q,)
    p = torch.exp(s - m_new[:, None])  # (T_q, b)
    correction = torch.exp(m - m_new)  # (T_q,)
    l_new = l * correction + p.sum(dim=-1)  # (T_q,)
    acc_new = acc * correction[:, None] + p @ v  # (T_q, d_v)
    return m_new, l_new, acc_new


def flash_chapter_bug(m, l, acc, s, v):
    # 章节里给读者的有错版本：累加器没乘修正因子
    m_new = torch.maximum(m, s.max(dim=-1).values)
    p = torch.exp(s - m_new[:, None])
    correction = torch.exp(m - m_new)
    l_new = l * correction + p.sum(dim=-1)
    acc_new = acc + p @ v
    return m_new, l_new, acc_new


def flash_no_l_rescale(m, l, acc, s, v):
    m_new, _, acc_new = flash_ref(m, l, acc, s, v)
    return m_new, l + torch.exp(s - m_new[:, None]).sum(-1), acc_new


def flash_normalised_acc(m, l, acc, s, v):
    m_new, l_new, acc_new = flash_ref(m, l, acc, s, v)
    return m_new, l_new, acc_new / l_new[:, None]


def flash_inverted(m, l, acc, s, v):
    m_new = torch.maximum(m, s.max(dim=-1).values)
    p = torch.exp(s - m_new[:, None])
    c = torch.nan_to_num(torch.exp(m_new - m), nan=0.0, posinf=0.0)
    return m_new, torch.nan_to_num(l * c, nan=0.0) + p.sum(-1), torch.nan_to_num(acc * c[:, None], nan=0.0) + p @ v


def flash_wrong_max(m, l, acc, s, v):
    m_new = s.max(dim=-1).values  # 忘了与旧的 m 取最大
    p = torch.exp(s - m_new[:, None])
    c = torch.exp(m - m_new)
    return m_new, l * c + p.sum(-1), acc * c[:, None] + p @ v


# ---- 练习 2（推导并核对）：解码器层的交叉点 -----------------------------------------------------------


def crossover_ref(d_model, d_ff):
    # 平方部分 8·B·T²·d（自注意力 + 交叉注意力各 4·B·T²·d）；
    # 线性部分 16·B·T·d² + 4·B·T·d·d_ff（8 个投影 + 前馈）
    return 2 * d_model + d_ff / 2


# ---- 练习 3（预测再验证）：逐块注意力的最大中间张量 --------------------------------------------------


def peak_ref(batch, heads, n, d_k, block_size):
    tile = min(block_size, n)  # 最后一块可能更短；块宽比 n 大时只有一块、n 列
    return 4 * batch * heads * n * max(tile, d_k)  # 分数块 (B, h, n, b) 与累加器 (B, h, n, d_k) 取大者


def peak_measured(batch, heads, n, d_k, block_size):
    q = torch.zeros(batch, heads, n, d_k)
    return largest_tensor_bytes(lambda: tiled_attention(q, q, q, block_size=block_size))


# ---- 练习 4（扩展）：GQA 的 K/V 缓存 -------------------------------------------------------------------


def gqa_ref(n_layers, d_model, n_heads, n_kv_heads, bytes_per_element):
    d_k = d_model // n_heads
    return 2 * n_layers * n_kv_heads * d_k * bytes_per_element


CASES = [
    Case(check_flash_step, flash_ref, wrong=[
        Wrong("hard_coded", lambda m, l, acc, s, v: (torch.zeros(4), torch.ones(4), torch.zeros(4, 3))),
        Wrong("chapter_bug", flash_chapter_bug, key="no_acc_rescale"),
        Wrong("no_l_rescale", flash_no_l_rescale, key="no_l_rescale"),
        Wrong("normalised_acc", flash_normalised_acc, key="normalised_acc"),
        Wrong("inverted_correction", flash_inverted, key="inverted_correction"),
        Wrong("wrong_max", flash_wrong_max),
        Wrong("two_values", lambda m, l, acc, s, v: flash_ref(m, l, acc, s, v)[:2], key="type"),
    ]),
    Case(check_decoder_crossover, crossover_ref, returns="number", wrong=[
        Wrong("hard_coded", lambda d, f: 2048),
        Wrong("encoder_formula", lambda d, f: 2 * d + f, key="encoder_formula"),
        Wrong("missed_cross_quadratic", lambda d, f: 4 * d + f, key="missed_cross_quadratic"),
        Wrong("cross_kv_constant", lambda d, f: 1.5 * d + f / 2, key="cross_kv_constant"),
        Wrong("integer_division", lambda d, f: 2 * d + f // 2),
    ]),
    Case(check_tiled_peak_bytes, peak_ref, returns="int", also_correct=[peak_measured], wrong=[
        Wrong("hard_coded", lambda B, h, n, d, b: 2 ** 20),
        Wrong("full_table", lambda B, h, n, d, b: 4 * B * h * n * n, key="full_table"),
        Wrong("tile_only", lambda B, h, n, d, b: 4 * B * h * n * min(b, n), key="tile_only"),
        Wrong("block_over_n", lambda B, h, n, d, b: 4 * B * h * n * max(b, d), key="block_over_n"),
        Wrong("no_bytes", lambda B, h, n, d, b: B * h * n * max(min(b, n), d), key="no_bytes"),
    ]),
    Case(check_gqa_kv_bytes, gqa_ref, returns="int", wrong=[
        Wrong("hard_coded", lambda L, d, h, kv, e: 131072),
        Wrong("mha", lambda L, d, h, kv, e: 2 * L * d * e, key="mha"),
        Wrong("no_factor_2", lambda L, d, h, kv, e: L * kv * (d // h) * e, key="no_factor_2"),
        Wrong("no_layers", lambda L, d, h, kv, e: 2 * kv * (d // h) * e, key="no_layers"),
        Wrong("d_model_per_kv_head", lambda L, d, h, kv, e: 2 * L * kv * d * e, key="d_model_per_kv_head"),
        Wrong("group_size", lambda L, d, h, kv, e: 2 * L * (h // kv) * (d // h) * e, key="group_size"),
        Wrong("no_bytes", lambda L, d, h, kv, e: 2 * L * kv * (d // h), key="no_bytes"),
    ]),
]
