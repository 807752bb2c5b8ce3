"""第 14 章（编译与量化）检查器的用例：参考答案（与 notebooks/solutions/14_solutions.ipynb 一致）和已知错误答案。"""

import torch
from torch import nn

from checkers import Case, Wrong
from tformer_lib.exercises.ch14 import (
    buggy_quantize_per_channel,
    check_int4_weight_bytes,
    check_pack_int4,
    check_quantize_per_channel,
    check_break_even_alpha,
)
from tformer_lib.quant import Int4Linear, linear_weight_bytes, pack_int4, quantize_symmetric
from tformer_lib.serving.speculative import expected_speedup


# ---- 练习 1（推导并核对）：out·in/2 字节的整数权重 + 每组一个 float32 比例因子 ----
def ref_int4_weight_bytes(out_features, in_features, group_size):
    return out_features * in_features // 2 + 4 * out_features * (in_features // group_size)


def _measured(o, i, g):  # 造一个真的层去数：数对，但绕过了推导
    layer = Int4Linear.from_linear(nn.Linear(i, o, bias=False), g)
    return layer.packed.nbytes + layer.scale.nbytes


INT4_BYTES = Case(check_int4_weight_bytes, ref_int4_weight_bytes, returns="int",
                  also_correct=[lambda o, i, g: o * ((i + 1) // 2) + 4 * o * i // g], wrong=[
    Wrong("hard_coded", lambda o, i, g: 8650752),
    Wrong("no_scales", lambda o, i, g: o * i // 2, key="no_scales"),
    Wrong("byte_per_weight", lambda o, i, g: o * i + 4 * o * i // g, key="byte_per_weight"),
    Wrong("bits", lambda o, i, g: o * i * 4 + 32 * o * i // g, key="bits"),
    Wrong("half_scales", lambda o, i, g: o * i // 2 + 2 * o * i // g, key="half_scales"),
    Wrong("scale_per_row", lambda o, i, g: o * i // 2 + 4 * o, key="scale_per_row"),
    Wrong("library_formula", lambda o, i, g: linear_weight_bytes(o, i, f"int4-g{g}"), key="library_call"),
    Wrong("builds_a_layer", _measured, key="library_call"),
])


# ---- 练习 2（找错）：比例因子用最大绝对值 ----
def ref_quantize_per_channel(w):
    scale = (w.abs().amax(dim=1, keepdim=True) / 127.5).clamp(min=torch.finfo(torch.float32).eps)  # (out, 1)
    q = torch.round(w / scale).clamp(-128, 127)  # (out, in)
    return q.to(torch.int8), scale


def _over_127(w):
    scale = (w.abs().amax(dim=1) / 127).clamp(min=1e-12)  # (out,)：另一种常见约定，也对
    return torch.round(w / scale[:, None]).clamp(-127, 127).to(torch.int8), scale


def _trunc(w):
    q, scale = ref_quantize_per_channel(w)
    return (w / scale).clamp(-128, 127).to(torch.int8), scale  # .to(int8) 向零截断


def _per_column(w):
    scale = (w.abs().amax(dim=0, keepdim=True) / 127.5).clamp(min=1e-12)  # (1, in)
    return torch.round(w / scale).clamp(-128, 127).to(torch.int8), scale


def _per_tensor(w):
    scale = (w.abs().max() / 127.5).clamp(min=1e-12).reshape(1)
    return torch.round(w / scale).clamp(-128, 127).to(torch.int8), scale


def _no_eps(w):
    scale = w.abs().amax(dim=1, keepdim=True) / 127.5  # 全零的行 → 0
    return torch.round(w / scale).nan_to_num(0).clamp(-128, 127).to(torch.int8), scale


def _coarse(w):
    scale = (w.abs().amax(dim=1, keepdim=True) / 100).clamp(min=1e-12)  # 只用了 [−100, 100]
    return torch.round(w / scale).clamp(-128, 127).to(torch.int8), scale


def _float_q(w):
    q, scale = ref_quantize_per_channel(w)
    return q.float(), scale


QUANTIZE = Case(check_quantize_per_channel, ref_quantize_per_channel, also_correct=[_over_127], wrong=[
    Wrong("hard_coded", lambda w: (torch.zeros(4, 8, dtype=torch.int8), torch.ones(4, 1))),
    Wrong("the_bug", buggy_quantize_per_channel, key="no_abs"),
    Wrong("truncates", _trunc, key="truncates"),
    Wrong("per_column", _per_column, key="wrong_axis"),
    Wrong("per_tensor", _per_tensor, key="per_tensor"),
    Wrong("zero_row", _no_eps, key="zero_row"),
    Wrong("too_coarse", _coarse, key="too_coarse"),
    Wrong("float_q", _float_q, key="dtype"),
    Wrong("library", lambda w: quantize_symmetric(w, 8), key="library_call"),
])


# ---- 练习 3（实现）：加 8、偶数下标在低 4 位、奇数长度补半个字节 ----
def ref_pack_int4(q):
    u = (q.to(torch.int16) + 8).to(torch.uint8)  # (..., n)，取值 [0, 15]
    if u.shape[-1] % 2:
        u = torch.cat([u, torch.zeros_like(u[..., :1])], dim=-1)  # (..., n + 1)
    return u[..., 0::2] | (u[..., 1::2] << 4)  # (..., ⌈n/2⌉)


def _loop_pack(q):  # 逐字节的写法，也对
    flat = (q.to(torch.int16) + 8).reshape(-1, q.shape[-1]).tolist()
    rows = [[r[j] | ((r[j + 1] if j + 1 < len(r) else 0) << 4) for j in range(0, len(r), 2)] for r in flat]
    return torch.tensor(rows, dtype=torch.uint8).reshape(*q.shape[:-1], (q.shape[-1] + 1) // 2)


def _swapped(q):
    p = ref_pack_int4(q)
    return (p >> 4) | ((p & 0x0F) << 4)


def _no_offset(q):
    u = (q.to(torch.int16) & 0x0F).to(torch.uint8)
    if u.shape[-1] % 2:
        u = torch.cat([u, torch.zeros_like(u[..., :1])], dim=-1)
    return u[..., 0::2] | (u[..., 1::2] << 4)


def _cast(q):
    u = q.to(torch.uint8)  # 没加 8：−8 → 248
    if u.shape[-1] % 2:
        u = torch.cat([u, torch.zeros_like(u[..., :1])], dim=-1)
    return u[..., 0::2] | (u[..., 1::2] << 4)


def _drops_last(q):
    u = (q.to(torch.int16) + 8).to(torch.uint8)
    n = u.shape[-1] // 2 * 2
    return u[..., 0:n:2] | (u[..., 1:n:2] << 4)


PACK = Case(check_pack_int4, ref_pack_int4, also_correct=[_loop_pack], wrong=[
    Wrong("hard_coded", lambda q: torch.zeros(4, dtype=torch.uint8)),
    Wrong("swapped", _swapped, key="swapped"),
    Wrong("no_offset", _no_offset, key="no_offset"),
    Wrong("drops_last", _drops_last, key="odd_length"),
    Wrong("pads_q_zero", lambda q: ref_pack_int4(torch.cat([q, torch.zeros_like(q[..., :1])], -1)) if q.shape[-1] % 2
          else ref_pack_int4(q), key="pad_nibble"),
    Wrong("cast", lambda q: _cast(q), key="cast_without_offset"),
    Wrong("int16", lambda q: ref_pack_int4(q).to(torch.int16), key="dtype"),
    Wrong("library", pack_int4, key="library_call"),
])


# ---- 练习 4（推导并核对）：(1 − α^(k+1)) / ((1 − α)(k·c + r)) ≥ target 的最小 α ----
def _speedup(a, k, c, r):
    return sum(a**n for n in range(k + 1)) / (k * c + r)  # 等比级数逐项加：α = 1 时自然是 k + 1


def ref_break_even_alpha(k, c, r, target):
    if _speedup(0.0, k, c, r) >= target:
        return 0.0
    lo, hi = 0.0, 1.0
    for _ in range(50):  # 加速比随 α 单调增：二分
        mid = (lo + hi) / 2
        lo, hi = (lo, mid) if _speedup(mid, k, c, r) >= target else (mid, hi)
    return hi


def _grid(k, c, r, target):  # 足够细的网格，也对
    return next(a / 10000 for a in range(10001) if _speedup(a / 10000, k, c, r) >= target)


def _solve_with(speedup):
    def solve(k, c, r, target):
        if speedup(0.0, k, c, r) >= target:
            return 0.0
        lo, hi = 0.0, 1.0
        for _ in range(50):
            mid = (lo + hi) / 2
            lo, hi = (lo, mid) if speedup(mid, k, c, r) >= target else (mid, hi)
        return hi
    return solve


BREAK_EVEN = Case(check_break_even_alpha, ref_break_even_alpha, returns="number", also_correct=[_grid], wrong=[
    Wrong("hard_coded", lambda k, c, r, t: 0.91),
    Wrong("no_r", _solve_with(lambda a, k, c, r: _speedup(a, k, c, 1.0)), key="no_r"),
    Wrong("no_draft_cost", _solve_with(lambda a, k, c, r: _speedup(a, k, 0.0, r)), key="no_draft_cost"),
    Wrong("untruncated", _solve_with(lambda a, k, c, r: (1 / (1 - a) if a < 1 else 1e9) / (k * c + r)),
          key="untruncated"),
    Wrong("returns_speedup", lambda k, c, r, t: t, key="speedup_not_alpha"),
    Wrong("coarse_grid", lambda k, c, r, t: next(a / 20 for a in range(21) if _speedup(a / 20, k, c, r) >= t)),
    Wrong("library", lambda k, c, r, t: next(a / 10000 for a in range(10001)
                                              if expected_speedup(a / 10000, k, c) * (k * c + 1) / (k * c + r) >= t),
          key="library_call"),
])

CASES = [INT4_BYTES, QUANTIZE, PACK, BREAK_EVEN]
