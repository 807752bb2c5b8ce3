"""``tformer_lib.exercises.checks`` 里经典检查器的用例（没有一章专门用到的那几个；softmax 见 ch06.py，
正弦余弦位置编码见 ch02.py）：注意力、因果/填充掩码、拆分/合并多头、学习率调度、标签平滑。"""

import math

import torch

from checkers import Case, Wrong
from tformer_lib import causal_mask, padding_mask, scaled_dot_product_attention
from tformer_lib.exercises import (
    check_attention,
    check_causal_mask,
    check_label_smoothing,
    check_lr_schedule,
    check_merge_heads,
    check_padding_mask,
    check_split_heads,
)
from tformer_lib.training.schedule import noam_rate


# ---- 注意力 ----
def _attn(q, k, v, mask=None, *, scale=None, axis=-1, flip=False, fill=None, use_mask=True):
    d_k = q.shape[-1]
    s = q @ k.transpose(-2, -1) / (math.sqrt(d_k) if scale is None else scale)  # (..., T_q, T_k)
    if mask is not None and use_mask:
        s = s.masked_fill(mask if flip else ~mask, float("-inf") if fill is None else fill)
    w = s.softmax(dim=axis)
    return w @ v, w


ATTENTION = Case(check_attention, lambda q, k, v, mask=None: _attn(q, k, v, mask), also_correct=[
    scaled_dot_product_attention,
    lambda q, k, v, mask=None: _attn(q, k, v, mask)[0],  # 只返回 output 也行
], wrong=[
    Wrong("hard_coded", lambda q, k, v, mask=None: _attn(torch.ones(2, 3, 16), torch.ones(2, 5, 16),
                                                         torch.ones(2, 5, 6))),
    Wrong("no_scale", lambda q, k, v, mask=None: _attn(q, k, v, mask, scale=1.0), key="no_scale"),
    Wrong("scale_by_dk", lambda q, k, v, mask=None: _attn(q, k, v, mask, scale=q.shape[-1]), key="scale_by_dk"),
    Wrong("wrong_axis", lambda q, k, v, mask=None: _attn(q, k, v, mask, axis=-2), key="wrong_axis"),
    Wrong("mask_polarity", lambda q, k, v, mask=None: _attn(q, k, v, mask, flip=True), key="mask_polarity"),
    Wrong("mask_fill_zero", lambda q, k, v, mask=None: _attn(q, k, v, mask, fill=0.0), key="mask_fill_zero"),
    Wrong("mask_ignored", lambda q, k, v, mask=None: _attn(q, k, v, mask, use_mask=False), key="mask_ignored"),
    # 写死 transpose(1, 2)：三维输入时碰巧对，四维 (B, h, T, d_k) 时错
    Wrong("hard_coded_transpose", lambda q, k, v, mask=None: _attn(q, k.transpose(1, 2).transpose(-2, -1), v, mask)),
])


# ---- 掩码 ----
CAUSAL = Case(check_causal_mask, causal_mask, wrong=[
    Wrong("hard_coded", lambda n: torch.ones(4, 4, dtype=torch.bool).tril()),
    Wrong("diagonal_excluded", lambda n: torch.ones(n, n, dtype=torch.bool).tril(-1), key="diagonal_excluded"),
    Wrong("polarity", lambda n: torch.ones(n, n, dtype=torch.bool).triu(1), key="polarity"),
    Wrong("upper_triangle", lambda n: torch.ones(n, n, dtype=torch.bool).triu(), key="upper_triangle"),
    Wrong("float", lambda n: torch.ones(n, n).tril(), key="dtype"),
    Wrong("shape", lambda n: torch.ones(n, n + 1, dtype=torch.bool).tril(), key="shape"),
])

PADDING = Case(check_padding_mask, padding_mask, wrong=[
    Wrong("hard_coded", lambda t, p: (torch.tensor([[5, 6, 7, 9], [8, 9, 9, 9]]) != 9)[:, None, None, :]),
    Wrong("polarity", lambda t, p: (t == p)[:, None, None, :], key="polarity"),
    Wrong("shape_2d", lambda t, p: t != p, key="shape_2d"),
    Wrong("shape_query_axis", lambda t, p: (t != p)[:, None, :, None], key="shape_query_axis"),
    Wrong("shape_3d", lambda t, p: (t != p)[:, None, :], key="shape_3d"),
    Wrong("pad_id_ignored", lambda t, p: (t != 0)[:, None, None, :], key="pad_id_ignored"),
    Wrong("float", lambda t, p: (t != p)[:, None, None, :].float(), key="dtype"),
])


# ---- 多头的拆分与合并 ----
def _split_ok(x, h):
    B, T, d = x.shape
    return x.view(B, T, h, d // h).transpose(1, 2)  # (B, h, T, d_k)


SPLIT = Case(check_split_heads, _split_ok, wrong=[
    Wrong("hard_coded", lambda x, h: x.view(2, 3, 2, 4).transpose(1, 2), key="exception"),  # 其他尺寸时 view 报错
    Wrong("view_wrong_order", lambda x, h: x.reshape(x.shape[0], h, x.shape[1], x.shape[2] // h),
          key="view_wrong_order"),
    Wrong("no_transpose", lambda x, h: x.view(x.shape[0], x.shape[1], h, x.shape[2] // h), key="no_transpose"),
    Wrong("interleaved", lambda x, h: x.view(x.shape[0], x.shape[1], x.shape[2] // h, h).permute(0, 3, 1, 2),
          key="interleaved"),
])

MERGE = Case(check_merge_heads, lambda x: x.transpose(1, 2).reshape(x.shape[0], x.shape[2], -1), wrong=[
    Wrong("hard_coded", lambda x: x.transpose(1, 2).reshape(2, 3, 8)),
    Wrong("no_transpose", lambda x: x.reshape(x.shape[0], x.shape[2], -1), key="no_transpose"),
    Wrong("view_not_contiguous", lambda x: x.transpose(1, 2).view(x.shape[0], x.shape[2], -1), key="exception"),
])


# ---- 学习率调度与标签平滑 ----
def _noam_ok(step, d_model, warmup):
    return d_model ** -0.5 * min(step ** -0.5, step * warmup ** -1.5)


LR = Case(check_lr_schedule, _noam_ok, returns="number", also_correct=[noam_rate], wrong=[
    Wrong("hard_coded", lambda s, d, w: 7e-4),
    Wrong("max_instead_of_min", lambda s, d, w: d ** -0.5 * max(s ** -0.5, s * w ** -1.5), key="max_instead_of_min"),
    Wrong("warmup_exponent", lambda s, d, w: d ** -0.5 * min(s ** -0.5, s * w ** -0.5), key="warmup_exponent"),
    Wrong("no_d_model_factor", lambda s, d, w: min(s ** -0.5, s * w ** -1.5), key="no_d_model_factor"),
    Wrong("list", lambda s, d, w: [0.001], key="type"),
])


def _smooth(target, V, eps, *, true=None, other=None):
    d = torch.full((len(target), V), eps / V if other is None else other(eps, V), dtype=torch.float64)  # (N, V)
    d[torch.arange(len(target)), target] = 1 - eps + eps / V if true is None else true(eps, V)
    return d


def _smooth_library(t, V, e):
    from tformer_lib.plotting import label_smoothing_targets

    return torch.from_numpy(label_smoothing_targets(t.tolist(), V, e))


SMOOTHING = Case(check_label_smoothing, _smooth, also_correct=[_smooth_library], wrong=[
    Wrong("hard_coded", lambda t, V, e: _smooth(torch.tensor([2, 0, 4]), 5, 0.1)),
    Wrong("vocab_from_targets", lambda t, V, e: _smooth(t, int(t.max()) + 1, e), key="shape"),
    Wrong("spread_over_others", lambda t, V, e: _smooth(t, V, e, true=lambda e, V: 1 - e,
                                                        other=lambda e, V: e / (V - 1)), key="spread_over_others"),
    Wrong("rows_do_not_sum_to_one", lambda t, V, e: _smooth(t, V, e, true=lambda e, V: 1 - e),
          key="rows_do_not_sum_to_one"),
    Wrong("swapped", lambda t, V, e: _smooth(t, V, e, true=lambda e, V: e / V, other=lambda e, V: 1 - e + e / V),
          key="swapped"),
    Wrong("transposed", lambda t, V, e: _smooth(t, V, e).T, key="shape"),
])

CASES = [ATTENTION, CAUSAL, PADDING, SPLIT, MERGE, LR, SMOOTHING]
