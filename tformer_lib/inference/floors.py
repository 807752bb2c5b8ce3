"""一步解码的下限（floor）：FLOPs ÷ 实测矩阵乘法速率，与 字节 ÷ 实测内存带宽；两者取大者。

FLOPs 与字节用第 13 章的闭式公式（:func:`tformer_lib.serving.roofline.decode_cost`）；这台机器的两个速率现场测：
带宽用一个远大于缓存的复制内核（:func:`~tformer_lib.serving.roofline.measure_memory_bandwidth`），
矩阵乘法速率用一个大方阵乘法（:func:`~tformer_lib.measurement.profiling.matmul_peak_flops`）。
权重每步都从主内存读时，任何实现都不可能比这两个下限更快；实测每步耗时 ÷ 下限 = “离极限还有几倍”。

小模型的权重（1.38 M 参数 × 4 字节 ≈ 5.5 MB）能放进 CPU 的末级缓存，那时真正的字节下限比按主内存带宽算的还低：
对这样的小模型，字节下限偏高，不是严格的下限，而是“权重从主内存读”这一情形的下限。
"""

from __future__ import annotations

from .._checks import finite_positive
from ..serving.roofline import decode_cost

__all__ = ["decode_floors", "times_above_floor"]


def decode_floors(config, batch: int, context: int, *, peak_flops: float, bandwidth: float,
                  bytes_per_element: int = 4) -> dict:
    """``batch`` 条序列各解码 1 个词元（各看 ``context`` 个位置）的下限：

    ``{"flops", "bytes", "flop_floor_s" = flops/peak_flops, "byte_floor_s" = bytes/bandwidth, "floor_s" = 两者之大}``。
    """
    finite_positive("peak_flops", peak_flops)
    finite_positive("bandwidth", bandwidth)
    cost = decode_cost(config, batch, context, bytes_per_element)
    flop_floor, byte_floor = cost["flops"] / peak_flops, cost["bytes"] / bandwidth
    return {"batch": batch, "context": context, "flops": cost["flops"], "bytes": cost["bytes"],
            "flop_floor_s": flop_floor, "byte_floor_s": byte_floor, "floor_s": max(flop_floor, byte_floor)}


def times_above_floor(seconds: float, floors: dict) -> dict:
    """实测每步 ``seconds`` 是 FLOP 下限、字节下限各自的几倍：``{"vs_flops", "vs_bytes"}``。"""
    finite_positive("seconds", seconds)
    return {"vs_flops": seconds / floors["flop_floor_s"], "vs_bytes": seconds / floors["byte_floor_s"]}
