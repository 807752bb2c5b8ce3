"""Triton 内核一章检查器的用例：参考答案（与 notebooks/solutions/15_solutions.ipynb 一致）和已知错误答案。"""

import math

import torch

from checkers import Case, Wrong
from tformer_lib.exercises.ch15 import (
    buggy_softmax,
    check_attention_hbm_bytes,
    check_combine_splits,
    check_decoding_partial_bytes,
    check_softmax_launch,
)
from tformer_lib.kernels import attention_io_bytes, flash_decoding_io_bytes, softmax_rows
from tformer_lib.kernels._runtime import load_triton

triton, tl = load_triton()


# ---- 练习 1（找错）：越界的列读成 -inf ----
@triton.jit
def _fixed_kernel(x_ptr, out_ptr, n_cols, stride, BLOCK_N: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK_N)
    in_row = cols < n_cols
    x = tl.load(x_ptr + row * stride + cols, mask=in_row, other=float("-inf"))  # e^(-inf) = 0
    m = tl.max(x, axis=0)
    num = tl.exp(x - m)
    tl.store(out_ptr + row * stride + cols, num / tl.sum(num, axis=0), mask=in_row)


@triton.jit
def _unmasked_store_kernel(x_ptr, out_ptr, n_cols, stride, BLOCK_N: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK_N)
    x = tl.load(x_ptr + row * stride + cols, mask=cols < n_cols, other=float("-inf"))
    num = tl.exp(x - tl.max(x, axis=0))
    tl.store(out_ptr + row * stride + cols, num / tl.sum(num, axis=0))  # 越界的列也写了


@triton.jit
def _unmasked_load_kernel(x_ptr, out_ptr, n_cols, stride, BLOCK_N: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK_N)
    x = tl.load(x_ptr + row * stride + cols)  # 读进了行后面的数据
    num = tl.exp(x - tl.max(x, axis=0))
    tl.store(out_ptr + row * stride + cols, num / tl.sum(num, axis=0), mask=cols < n_cols)


@triton.jit
def _no_max_kernel(x_ptr, out_ptr, n_cols, stride, BLOCK_N: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK_N)
    x = tl.load(x_ptr + row * stride + cols, mask=cols < n_cols, other=float("-inf"))
    num = tl.exp(x)  # 不减最大值：分数大时上溢
    tl.store(out_ptr + row * stride + cols, num / tl.sum(num, axis=0), mask=cols < n_cols)


def _launcher(kernel):
    def launch(x, out):
        kernel[(x.shape[0],)](x, out, x.shape[1], x.stride(0), BLOCK_N=triton.next_power_of_2(x.shape[1]))
        return out

    return launch


ref_softmax_launch = _launcher(_fixed_kernel)


def _returns_copy(x, out):
    ref_softmax_launch(x, out)
    return out.clone()  # 内容相同的另一个张量：也对


def _forgets_out(x, out):
    return x.softmax(-1) * 0 + 1  # 没写 out


SOFTMAX = Case(check_softmax_launch, ref_softmax_launch, also_correct=[_returns_copy], wrong=[
    Wrong("hard_coded", lambda x, out: torch.full_like(x, 0.2)),
    Wrong("the_bug", buggy_softmax, key="other_zero"),
    Wrong("unmasked_store", _launcher(_unmasked_store_kernel), key="store_unmasked"),
    Wrong("unmasked_load", _launcher(_unmasked_load_kernel), key="load_unmasked"),
    Wrong("no_max", _launcher(_no_max_kernel), key="overflow"),
    Wrong("writes_nothing", _forgets_out, key="not_written"),
    Wrong("torch_softmax", lambda x, out: out.copy_(torch.softmax(x, -1)), key="library_call"),
    Wrong("library_kernel", lambda x, out: out.copy_(softmax_rows(x.contiguous())), key="library_call"),
])


# ---- 练习 2（推导并核对）：朴素 = 两次分块矩阵乘 + softmax；FlashAttention = Q 一遍 + K、V 各 Σ end_m 行 + O ----
def ref_attention_hbm_bytes(t, d, block_m, block_n, causal, element_bytes):
    def matmul(m, k, n):  # 读 A ⌈N/B_N⌉ 遍、B ⌈M/B_M⌉ 遍，写 C 一遍
        return m * k * math.ceil(n / block_n) + k * n * math.ceil(m / block_m) + m * n

    naive = matmul(t, d, t) + 2 * t * t + matmul(t, t, d)  # S = QKᵀ；softmax 读 S 写 P；O = PV
    n_q = math.ceil(t / block_m)
    ends = [min(t, (i + 1) * block_m) if causal else t for i in range(n_q)]  # 第 i 块查询读到哪个键
    tiled = t * d + 2 * sum(ends) * d + t * d  # Q、K、V、O
    return naive * element_bytes, tiled * element_bytes


def _tiled_kv_once(t, d, bm, bn, causal, e):
    naive, _ = ref_attention_hbm_bytes(t, d, bm, bn, causal, e)
    return naive, e * 4 * t * d


def _exact_triangle(t, d, bm, bn, causal, e):
    naive, tiled = ref_attention_hbm_bytes(t, d, bm, bn, causal, e)
    return naive, (e * (2 * t * d + 2 * d * t * (t + 1) / 2 / bm) if causal else tiled)


def _p_read_once(t, d, bm, bn, causal, e):
    naive, tiled = ref_attention_hbm_bytes(t, d, bm, bn, causal, e)
    return naive - e * t * t * (math.ceil(d / bn) - 1), tiled


BYTES = Case(check_attention_hbm_bytes, ref_attention_hbm_bytes, also_correct=[
    lambda *a: dict(zip(("naive", "tiled"), ref_attention_hbm_bytes(*a))),
    lambda *a: [float(x) for x in ref_attention_hbm_bytes(*a)],
], wrong=[
    Wrong("hard_coded", lambda *a: (1_000_000, 100_000)),
    Wrong("kv_once", _tiled_kv_once, key="kv_once"),
    Wrong("exact_triangle", _exact_triangle, key="exact_causal"),
    Wrong("p_read_once", _p_read_once, key="p_read_once"),
    Wrong("block_n_for_queries", lambda t, d, bm, bn, c, e: (ref_attention_hbm_bytes(t, d, bm, bn, c, e)[0],
                                                             ref_attention_hbm_bytes(t, d, bn, bn, c, e)[1]), key="block_n"),
    Wrong("elements", lambda t, d, bm, bn, c, e: ref_attention_hbm_bytes(t, d, bm, bn, c, 1), key="elements"),
    Wrong("one_number", lambda *a: sum(ref_attention_hbm_bytes(*a)), key="type"),
    Wrong("library", lambda t, d, bm, bn, c, e: (attention_io_bytes(t, d, bm, bn, causal=c, element_bytes=e)["naive"]["total"],
                                                 attention_io_bytes(t, d, bm, bn, causal=c, element_bytes=e)["tiled"]["total"]),
          key="library_call"),
])


# ---- 练习 3（预测再验证）：每个（批, 头）⌈T_max/split⌉ 段，每段 d + 2 个 float32，一写一读 ----
def ref_decoding_partial_bytes(batch, n_heads, t_max, d, split_size, element_bytes):
    n_splits = math.ceil(t_max / split_size)
    return 2 * batch * n_heads * n_splits * (d + 2) * 4  # 与 element_bytes 无关


PARTIALS = Case(check_decoding_partial_bytes, ref_decoding_partial_bytes, returns="int", wrong=[
    Wrong("hard_coded", lambda *a: 3168),
    Wrong("write_only", lambda *a: ref_decoding_partial_bytes(*a) // 2, key="write_only"),
    Wrong("acc_only", lambda b, h, t, d, s, e: 2 * b * h * math.ceil(t / s) * d * 4, key="acc_only"),
    Wrong("cache_precision", lambda b, h, t, d, s, e: 2 * b * h * math.ceil(t / s) * (d + 2) * e, key="element_bytes"),
    Wrong("floor", lambda b, h, t, d, s, e: 2 * b * h * max(1, t // s) * (d + 2) * 4),
    Wrong("library", lambda b, h, t, d, s, e: flash_decoding_io_bytes([t] * b, t, d, s, n_heads=h,
                                                                       element_bytes=e)["partials"], key="library_call"),
])


# ---- 练习 4（实现）：M = max m_s，w_s = e^(m_s − M)，o = Σ w_s acc_s / Σ w_s l_s ----
def ref_combine_splits(m, l, acc):
    top = m.max()
    w = torch.exp(m - top)  # (S,)：空段 e^(-inf) = 0
    return (w[:, None] * acc).sum(0) / (w * l).sum()


def _exp_without_max(m, l, acc):
    w = torch.exp(m)  # 分数大时上溢
    return (w[:, None] * acc).sum(0) / (w * l).sum()


def _normalise_each_split_first(m, l, acc):
    w = torch.exp(m - m.max()) * l  # 段的权重
    return (w[:, None] * (acc / l[:, None])).sum(0) / w.sum()  # 空段 0/0 = NaN，乘 0 仍是 NaN


COMBINE = Case(check_combine_splits, ref_combine_splits, also_correct=[
    lambda m, l, acc: (torch.softmax(m, 0)[:, None] * acc).sum(0) / (torch.softmax(m, 0) * l).sum(),
    lambda m, l, acc: ref_combine_splits(m, l, acc).numpy(),
], wrong=[
    Wrong("hard_coded", lambda m, l, acc: torch.zeros(acc.shape[1])),
    Wrong("unweighted_mean", lambda m, l, acc: (acc[l > 0] / l[l > 0, None]).mean(0), key="unweighted_mean"),
    Wrong("no_correction", lambda m, l, acc: acc.sum(0) / l.sum(), key="no_correction"),
    Wrong("exp_without_max", _exp_without_max, key="not_finite"),
    Wrong("nan_for_empty", _normalise_each_split_first, key="not_finite"),
])

CASES = [SOFTMAX, BYTES, PARTIALS, COMBINE]
