"""Triton 内核一章的练习检查器，和“找错”题里那个掩码写错的内核。

- :func:`buggy_softmax` + :func:`check_softmax_launch`（找错）：逐行 softmax 内核把越界的列读成 0 而不是
  ``-inf``——读者抄下内核改好，检查器在行长不是 2 的幂、行之间还有别的数据的缓冲区上运行它，
  与 ``torch.softmax`` 比较，并检查行外的内存一个字节也没被写；
- :func:`check_attention_hbm_bytes`（推导并核对）：朴素注意力与 FlashAttention 前向各读写多少字节的显存——
  与 :func:`tformer_lib.kernels.attention_io_bytes`（它又与内核里数出的字节逐字节相等）比较，库里的公式禁用；
- :func:`check_decoding_partial_bytes`（预测再验证）：FlashDecoding 各段运行量 ``(m, l, acc)`` 的一写一读有多少字节——
  检查器真的在解释器里跑一次 float16 的 FlashDecoding，数出 float32 的读写与读者的预测对照；
- :func:`check_combine_splits`（实现）：把各段的 ``(m, l, acc)`` 合并成注意力输出（FlashDecoding 的第二个内核做的事），
  与 SDPA 比较；有空段、有大分数。

每个检查器都在多组随机情形上调用读者的函数，桩（stub）→ “⏳ 尚未完成”，不抛异常。
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from tformer_lib.exercises._core import (
    CheckResult,
    Mistake,
    Variant,
    as_tensor,
    compare,
    compare_number,
    draw_choice,
    draw_int,
    randn,
    random_cases,
    run_checks,
)
from tformer_lib.kernels._runtime import load_triton

triton, tl = load_triton()

__all__ = ["buggy_softmax", "check_softmax_launch", "check_attention_hbm_bytes", "check_decoding_partial_bytes",
           "check_combine_splits"]


# ---- 找错：逐行 softmax 的掩码 ------------------------------------------------------------------------


@triton.jit
def buggy_softmax_kernel(x_ptr, out_ptr, n_cols, stride, BLOCK_N: tl.constexpr):
    row = tl.program_id(0)  # 一个程序实例 = 一行
    cols = tl.arange(0, BLOCK_N)  # (BLOCK_N,) ≥ n_cols
    in_row = cols < n_cols
    x = tl.load(x_ptr + row * stride + cols, mask=in_row, other=0.0)  # 越界的列不读，补一个数
    m = tl.max(x, axis=0)
    num = tl.exp(x - m)
    tl.store(out_ptr + row * stride + cols, num / tl.sum(num, axis=0), mask=in_row)


def buggy_softmax(x: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """一个有错的逐行 softmax（找错练习用，不要在别处使用）：``x``、``out`` 是 ``(R, N)``、行步长相同的 float32 张量。"""
    n_rows, n_cols = x.shape
    buggy_softmax_kernel[(n_rows,)](x, out, n_cols, x.stride(0), BLOCK_N=triton.next_power_of_2(n_cols))
    return out


_FILL = 3.0  # 行与行之间的“别人的数据”


def _distinct(variants: list[Variant], want: Any) -> list[Variant]:
    """只留与正确答案不同、也与其他错误写法不同的那些：两种错误在某组情形里同值时，提示说不清是哪一种，这组不用它们。"""

    def same(a, b):
        if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
            a, b = torch.as_tensor(a, dtype=torch.float64), torch.as_tensor(b, dtype=torch.float64)
            return a.shape == b.shape and bool(torch.allclose(a, b, rtol=1e-4, atol=1e-5, equal_nan=True))
        return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-9)

    return [v for v in variants if not same(v.value, want)
            and not any(same(v.value, o.value) for o in variants if o is not v)]


def check_softmax_launch(fn: Callable[..., Any], *, verbose: bool = True) -> CheckResult:
    """检查改好的 ``fn(x, out) -> out``：用读者自己的 Triton 内核对 ``x``（``(R, N)``，行步长 ``x.stride(0)`` 可能大于 N）
    逐行做 softmax，写进 ``out``（同样的形状与步长）并返回它。"""

    def rows(f):
        for i, g in enumerate(random_cases(5, seed=151)):
            n_rows, n_cols = draw_int(g, 1, 5), (37, 5, 1)[i] if i < 3 else draw_int(g, 2, 40)
            block = triton.next_power_of_2(n_cols)
            width = 2 * block + 3  # 行步长：每行后面还有别的数据
            scale = 100.0 if i == 0 else 1.0  # 第一组分数很大（e^x 超出 float32）：不减最大值会上溢
            buf = torch.full((n_rows, width), _FILL)
            buf[:, :n_cols] = randn(n_rows, n_cols, generator=g) * scale
            x = buf[:, :n_cols]  # (R, N) 视图，行步长 width
            obuf = torch.full((n_rows, width), float("nan"))
            out = obuf[:, :n_cols]
            call = f"在 {n_rows} 行、每行 {n_cols} 列（BLOCK_N={block}，行步长 {width}）的输入上"
            with np.errstate(over="ignore", invalid="ignore"):  # 不减最大值的内核在解释器里上溢：由下面的检查报告
                raw = f(x, out)
            if not torch.isnan(obuf[:, n_cols:]).all():
                raise Mistake(f"{call}：行外（第 {n_cols} 列之后）的内存被写了——tl.store 也要带 mask=cols < n_cols，"
                              "越界的列不能写（那里是别人的数据）", key="store_unmasked")
            want = x.softmax(dim=-1)
            if torch.isnan(out).all():
                raise Mistake(f"{call}：out 里一个数也没写——内核要把结果 tl.store 到 out_ptr，函数再 return out",
                              key="not_written")
            if not torch.isfinite(out).all():
                raise Mistake(f"{call}：输出里有 inf 或 NaN——分数很大时 e^x 会上溢，先减去行最大值再取 exp", key="overflow")
            padded_zero = torch.cat([x, torch.zeros(n_rows, block - n_cols)], dim=1).softmax(-1)[:, :n_cols]
            unmasked = buf[:, :block].softmax(-1)[:, :n_cols]
            variants = [
                Variant("other_zero", "越界的列读成了 0：e^(0 − m) 不是 0，它们混进了分母（还可能抬高最大值）。"
                        "越界处应读成 -inf（other=float('-inf')），e^(-inf) = 0", padded_zero),
                Variant("load_unmasked", "tl.load 没带掩码：BLOCK_N 大于行长时读进了行后面别人的数据", unmasked),
            ]
            if n_cols == block:  # 行长恰是 2 的幂时这些错误不显形，别拿它们当提示
                variants = []
            compare(out, want, variants=_distinct(variants, want), what=f"{call}写进 out 的结果", atol=1e-6, rtol=1e-5)
            if not torch.equal(as_tensor(raw, f"{call}你的函数的返回值"), out.double()):
                raise Mistake(f"{call}：返回的张量与 out 里写下的不同——内核把结果写进 out，函数再 return out", key="not_out")

    from tformer_lib.kernels.softmax import softmax_kernel, softmax_rows

    return run_checks("逐行 softmax 内核的掩码", fn, [("5 组行长不是 2 的幂、行后还有别的数据的输入", rows)],
                      verbose=verbose, forbidden=(softmax_rows, softmax_kernel, torch.softmax))


# ---- 推导并核对：朴素注意力与 FlashAttention 的显存字节 ------------------------------------------------------


def _matmul_read(m, k, n, bm, bn, ceil=math.ceil):
    return m * k * ceil(n / bn) + k * n * ceil(m / bm)


def _naive(t, d, bm, bn, e, ceil=math.ceil, p_reads=None):
    p_reads = ceil(d / bn) if p_reads is None else p_reads
    reads = _matmul_read(t, d, t, bm, bn, ceil) + t * t + (t * t * p_reads + t * d * ceil(t / bm))
    return e * (reads + t * t + t * t + t * d)


def _tiled(t, d, bm, causal, e, ceil=math.ceil, exact_causal=False, kv_once=False):
    n_q = ceil(t / bm)
    if kv_once:
        keys = t
    elif exact_causal and causal:
        keys = t * (t + 1) // 2 / bm
    else:
        keys = sum(min(t, (i + 1) * bm) for i in range(n_q)) if causal else n_q * t
    return e * (t * d + 2 * keys * d + t * d)


def _pair(x: Any, what: str) -> tuple[Any, Any]:
    if isinstance(x, dict) and {"naive", "tiled"} <= set(x):
        x = (x["naive"], x["tiled"])
    if not isinstance(x, (tuple, list)) or len(x) != 2:
        raise Mistake(f"{what}应是 (朴素的总字节, FlashAttention 的总字节) 两个数，你返回的是 {type(x).__name__}",
                      key="type")
    return x[0], x[1]


def check_attention_hbm_bytes(fn: Callable[..., Any], *, verbose: bool = True) -> CheckResult:
    """检查 ``fn(t, d, block_m, block_n, causal, element_bytes) -> (naive, tiled)``：一个头、长 ``t`` 的自注意力，
    朴素路径（两次分块矩阵乘 + 逐行 softmax，块 ``block_m × block_n``）与 FlashAttention 前向（查询块 ``block_m``）
    各读写多少字节。与 :func:`tformer_lib.kernels.attention_io_bytes` 比较。"""
    from tformer_lib import kernels
    from tformer_lib.kernels import io_bytes

    def cases(f):
        for i, g in enumerate(random_cases(8, seed=152)):
            bm, bn = draw_choice(g, (16, 32, 64)), draw_choice(g, (16, 32, 64))
            t = (bm * draw_int(g, 1, 4), 5 * bm + 3)[i] if i < 2 else draw_int(g, 17, 300)
            d = draw_choice(g, (16, 20, 64, 96))
            causal = bool(i % 2) if i >= 2 else i == 1
            e = draw_choice(g, (4, 2))
            want = io_bytes.attention_io_bytes(t, d, bm, bn, causal=causal, element_bytes=e)
            call = f"attention_hbm_bytes(t={t}, d={d}, block_m={bm}, block_n={bn}, causal={causal}, element_bytes={e})"
            naive, tiled = _pair(f(t, d, bm, bn, causal, e), f"{call} 的返回值")
            nv = [Variant("p_read_once", f"O = PV 的分块矩阵乘按 d 方向切成 ⌈d/BLOCK_N⌉ = {math.ceil(d / bn)} 个列块，"
                          "P 的每一行块被读了这么多遍，不是一遍", _naive(t, d, bm, bn, e, p_reads=1)),
                  Variant("no_scores", "朴素路径的 S 要写回显存、softmax 再读 S 写 P、第二次矩阵乘再读 P："
                          "别漏了 S、P 的这几趟", want["naive"]["total"] - want["naive"]["scores_and_weights"]),
                  Variant("floor", "块数要向上取整：最后一块不满也要启动一个程序实例、读一遍",
                          _naive(t, d, bm, bn, e, ceil=lambda x: max(1, math.floor(x)))),
                  Variant("elements", f"算出的是元素个数，还要乘每个元素的 {e} 字节", want["naive"]["total"] // e)]
            compare_number(naive, want["naive"]["total"], what=f"{call} 的朴素字节数",
                           variants=_distinct(nv, want["naive"]["total"]),
                           default_hint=f"{call} 的朴素路径应为 {want['naive']['total']} 字节"
                                        f"（读 {want['naive']['read']}、写 {want['naive']['write']}）")
            tv = [Variant("kv_once", f"每一块查询（共 ⌈T/BLOCK_M⌉ = {math.ceil(t / bm)} 块）都要把它看得见的键和值"
                          "从头读一遍：K、V 不止读一遍", _tiled(t, d, bm, causal, e, kv_once=True)),
                  Variant("exact_causal", "因果时内核按整块跳过：第 m 块查询读前 min(T, (m+1)·BLOCK_M) 个键，"
                          "对角线上的块整块读进来再逐元素屏蔽——不是恰好一个三角形", _tiled(t, d, bm, causal, e, exact_causal=True)),
                  Variant("block_n", "决定 K、V 重读几遍的是查询块 BLOCK_M；BLOCK_N 只决定每次读多少",
                          _tiled(t, d, bn, causal, e)),
                  Variant("causal_ignored", "因果时更靠后的键整块不读：第 m 块查询只读到 min(T, (m+1)·BLOCK_M)",
                          _tiled(t, d, bm, False, e)),
                  Variant("floor", "块数要向上取整：最后一块查询不满也要读一遍键",
                          _tiled(t, d, bm, causal, e, ceil=lambda x: max(1, math.floor(x)))),
                  Variant("elements", f"算出的是元素个数，还要乘每个元素的 {e} 字节", want["tiled"]["total"] // e)]
            compare_number(tiled, want["tiled"]["total"], what=f"{call} 的 FlashAttention 字节数",
                           variants=_distinct(tv, want["tiled"]["total"]),
                           default_hint=f"{call} 的 FlashAttention 应为 {want['tiled']['total']} 字节"
                                        f"（读 {want['tiled']['read']}、写 {want['tiled']['write']}）")

    forbidden = tuple(getattr(io_bytes, name) for name in io_bytes.__all__) + (
        kernels.count_hbm_bytes, kernels.flash_attention, kernels.naive_attention)
    return run_checks("朴素注意力与 FlashAttention 的显存字节", fn, [("8 组随机的 T、d、块大小、因果与精度", cases)],
                      verbose=verbose, forbidden=forbidden)


# ---- 预测再验证：FlashDecoding 各段运行量的字节 ------------------------------------------------------------


def check_decoding_partial_bytes(fn: Callable[..., Any], *, verbose: bool = True) -> CheckResult:
    """检查 ``fn(batch, n_heads, t_max, d, split_size, element_bytes) -> int``：FlashDecoding 各段写下、合并内核再读回的
    运行量 ``(m, l, acc)`` 一共多少字节（K/V 缓存每个元素 ``element_bytes`` 字节）。先与闭式公式比，再在解释器里真跑一次
    float16 的 FlashDecoding，数出 float32 的读写（恰好就是这些运行量）对照。"""
    from tformer_lib.kernels import count_hbm_bytes, flash_decoding, flash_decoding_io_bytes

    def formula(f):
        for i, g in enumerate(random_cases(8, seed=153)):
            split = draw_choice(g, (16, 32, 64))
            t_max = (split * 3, split * 2 + 1)[i] if i < 2 else draw_int(g, 1, 300)
            batch, heads, d = draw_int(g, 1, 4), draw_int(g, 1, 8), draw_choice(g, (16, 20, 64, 128))
            e = (1, 2, 4)[i % 3]  # int8、float16、float32 的缓存
            n = math.ceil(t_max / split)
            want = 2 * batch * heads * n * (d + 2) * 4
            call = (f"decoding_partial_bytes(batch={batch}, n_heads={heads}, t_max={t_max}, d={d}, split_size={split}, "
                    f"element_bytes={e})")
            variants = [
                Variant("write_only", "各段写下的运行量，合并内核还要再读回来一遍：一写一读", want // 2),
                Variant("acc_only", "每段除了 d 个数的 acc，还有最大值 m 和分母 l 两个数：每段 d + 2 个", want * d // (d + 2)),
                Variant("element_bytes", "运行量总以 float32 存放（4 字节），与 K/V 缓存的精度无关",
                        want * e // 4),
                Variant("floor", f"段数向上取整：⌈T_max / split_size⌉ = {n}", want * (t_max // split) // n),
                Variant("no_batch_heads", f"每个（批, 头）各有自己的 {n} 段：还要乘 batch·n_heads = {batch * heads}",
                        want // (batch * heads)),
            ]
            compare_number(f(batch, heads, t_max, d, split, e), want, what=f"{call} 的返回值",
                           variants=_distinct(variants, want), default_hint=f"{call} 应为 {want} 字节")

    def counted(f):
        g = random_cases(1, seed=154)[0]
        batch, heads, t_max, d, split = 2, 2, draw_int(g, 20, 50), 20, 16
        q = randn(batch, heads, d, generator=g).half()
        k, v = (randn(batch, heads, t_max, d, generator=g).half() for _ in range(2))
        with count_hbm_bytes() as traffic:
            flash_decoding(q, k, v, torch.tensor([t_max, t_max // 2]), split_size=split, block_n=8)
        measured = traffic.by_dtype.get("fp32", 0)
        compare_number(f(batch, heads, t_max, d, split, 2), measured,
                       what=f"T_max={t_max}、d={d}、split_size={split} 的一次真实运行（float16 缓存）",
                       default_hint=f"解释器里数出的 float32 读写是 {measured} 字节")

    return run_checks("FlashDecoding 运行量的字节", fn,
                      [("8 组随机的形状与段长", formula), ("与解释器里数出的 float32 读写相同", counted)],
                      verbose=verbose, forbidden=(flash_decoding_io_bytes, count_hbm_bytes, flash_decoding))


# ---- 实现：合并各段的运行量 ------------------------------------------------------------------------------


def _partials(q, k, n_valid, split, scale, v):
    """每段的 (m, l, acc)：与 FlashDecoding 的第一个内核相同的量（这里用 PyTorch 直接算）。"""
    t_max = k.shape[0]
    ms, ls, accs = [], [], []
    for start in range(0, t_max, split):
        end = min(n_valid, start + split)
        if end <= start:  # 空段
            ms.append(torch.tensor(float("-inf")))
            ls.append(torch.tensor(0.0))
            accs.append(torch.zeros(k.shape[1]))
            continue
        s = (k[start:end] @ q) * scale  # (n,)
        m = s.max()
        p = torch.exp(s - m)
        ms.append(m)
        ls.append(p.sum())
        accs.append(p @ v[start:end])
    return torch.stack(ms), torch.stack(ls), torch.stack(accs)  # (S,), (S,), (S, d)


def check_combine_splits(fn: Callable[..., Any], *, verbose: bool = True) -> CheckResult:
    """检查 ``fn(m, l, acc) -> (d,)``：``m``、``l`` 形如 ``(S,)``，``acc`` 形如 ``(S, d)``，是 S 段各自的运行最大值、
    分母与未归一化的累加器（空段 ``m = -inf``、``l = 0``、``acc = 0``）；返回整条序列的注意力输出。与 SDPA 比较。"""
    import torch.nn.functional as F

    def cases(f):
        for i, g in enumerate(random_cases(6, seed=155)):
            split, d = draw_choice(g, (4, 8, 16)), draw_int(g, 2, 24)
            t_max = draw_int(g, split + 1, 6 * split)
            n_valid = (t_max, split + 1)[i] if i < 2 else draw_int(g, 1, t_max)
            big = 300.0 if i == 2 else 1.0  # 第三组分数很大：e^m 会上溢
            q, k, v = randn(d, generator=g) * big, randn(t_max, d, generator=g), randn(t_max, d, generator=g)
            scale = 1.0 / math.sqrt(d)
            m, l, acc = _partials(q, k, n_valid, split, scale, v)
            want = F.scaled_dot_product_attention(q[None, None, None], k[None, None, :n_valid],
                                                  v[None, None, :n_valid])[0, 0, 0]
            keep = torch.isfinite(m)
            variants = [
                Variant("unweighted_mean", "各段的输出 acc_s / l_s 不能平均：段的权重是它的分母 l_s·e^(m_s − M)",
                        (acc[keep] / l[keep, None]).mean(0)),
                Variant("no_correction", "各段的 acc、l 是以各自的最大值 m_s 为基准算的：相加之前先乘修正因子 e^(m_s − M)",
                        acc.sum(0) / l.sum()),
            ]
            call = f"{m.numel()} 段（有效键 {n_valid}/{t_max}，段长 {split}，d={d}{'，分数很大' if i == 2 else ''}）"
            got = as_tensor(f(m.clone(), l.clone(), acc.clone()), f"{call}时你的函数的返回值")
            if got.shape == want.shape and not torch.isfinite(got).all():
                hint = ("输出里有 NaN 或 inf：空段的 m = -inf，e^(m_s − M) 应当是 0——先求 M = max m_s，再算 e^(m_s − M)；"
                        "直接算 e^(m_s) 会在分数大时上溢") if i == 2 or not keep.all() else "输出里有 NaN 或 inf"
                raise Mistake(f"{call}：{hint}", key="not_finite")
            compare(got, want, variants=_distinct(variants, want), what=f"{call}时的输出", atol=1e-5, rtol=1e-4)

    from tformer_lib.kernels import decoding_reference, flash_decoding
    from tformer_lib.kernels.flash_forward import attention_reference

    return run_checks("合并 FlashDecoding 的各段", fn, [("6 组随机的段（含空段、分数很大）", cases)], verbose=verbose,
                      forbidden=(flash_decoding, decoding_reference, attention_reference, F.scaled_dot_product_attention,
                                 _partials))
