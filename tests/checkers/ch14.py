"""第 14 章（编译与量化）检查器的用例：参考答案（与 notebooks/solutions/14_solutions.ipynb 一致）和已知错误答案。"""

import torch
from torch import nn

from checkers import Case, Wrong
from tformer_lib.exercises.ch14 import (
    buggy_quantize_per_channel,
    check_int4_weight_bytes,
    check_pack_int4,
    check_quantize_per_channel,
    check_speculative_speedup,
)
from tformer_lib.quant import Int4Linear, linear_weight_bytes, pack_int4, quantize_symmetric


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


def _drops_last(q):
    u = (q.to(torch.int16) + 8).to(torch.uint8)
    n = u.shape[-1] // 2 * 2
    return u[..., 0:n:2] | (u[..., 1:n:2] << 4)


PACK = Case(check_pack_int4, ref_pack_int4, also_correct=[_loop_pack], wrong=[
    Wrong("hard_coded", lambda q: torch.zeros(4, dtype=torch.uint8)),
    Wrong("swapped", _swapped, key="swapped"),
    Wrong("no_offset", _no_offset, key="no_offset"),
    Wrong("drops_last", _drops_last, key="odd_length"),
    Wrong("int16", lambda q: ref_pack_int4(q).to(torch.int16), key="dtype"),
    Wrong("library", pack_int4, key="library_call"),
])


# ---- 练习 4（预测再验证）：(1 − α^(k+1)) / ((1 − α)(k·c + r))，α = 1 时取 k + 1 ----
def ref_speculative_speedup(alpha, k, c, r):
    tokens = k + 1 if alpha == 1 else (1 - alpha ** (k + 1)) / (1 - alpha)
    return tokens / (k * c + r)


def _sum_form(a, k, c, r):  # 几何级数逐项加：α = 1 时自然得到 k + 1，也对
    return sum(a**n for n in range(k + 1)) / (k * c + r)


SPEEDUP = Case(check_speculative_speedup, ref_speculative_speedup, returns="number", also_correct=[_sum_form], wrong=[
    Wrong("hard_coded", lambda a, k, c, r: 0.85),
    Wrong("no_r", lambda a, k, c, r: _sum_form(a, k, c, 1), key="no_r"),
    Wrong("no_draft_cost", lambda a, k, c, r: _sum_form(a, k, 0, r)),
    Wrong("k_plus_one_drafts", lambda a, k, c, r: _sum_form(a, k, c, r) * (k * c + r) / ((k + 1) * c + r)),
    Wrong("expected_accepted", lambda a, k, c, r: (_sum_form(a, k, c, r) * (k * c + r) - 1) / (k * c + r),
          key="expected_accepted"),
    Wrong("zero_division_at_one", lambda a, k, c, r: (1 - a ** (k + 1)) / (1 - a) / (k * c + r), key="exception"),
])

CASES = [INT4_BYTES, QUANTIZE, PACK, SPEEDUP]
