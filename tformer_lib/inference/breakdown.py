"""一步解码的时间花在哪里：``torch.profiler`` 剖析，按算子名分成四份，四份之和就是测得的每步耗时。

- **矩阵乘法**（matmul）：``aten::mm``、``addmm``、``bmm``、``linear`` 与 oneDNN/MKL 的线性层内核——权重 × 激活；
- **注意力**（attention）：``scaled_dot_product_attention`` 的各个内核与 softmax（显式路径里 QKᵀ、AV 两次
  矩阵乘法是 ``bmm``，计入矩阵乘法）；
- **其他计算**：其余真正做运算的算子（加法、归一化、GELU、嵌入查表、写缓存的 ``index_copy_`` …），编译后
  还有 Inductor 生成的融合 C++ 内核（记在 ``CompiledFxGraph`` 区段自身的时间里）；
- **Python 与分派开销**（overhead）：每步的墙钟时间减去以上三份——Python 解释器、算子分派（dispatch）、
  ``torch.compile`` 的守卫检查（guard，剖析器里叫 ``TorchDynamo Cache Lookup``），以及只改张量元数据的
  算子（``view``、``transpose``、``empty`` …，它们不碰数据，纯属开销）。

剖析器本身会让每个算子变慢一点；同一次剖析里的比例可信，绝对值偏大。
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable

from .._checks import non_negative_int, positive_int

__all__ = ["CATEGORIES", "categorize_op", "profile_breakdown"]

CATEGORIES = ("overhead", "matmul", "attention", "other")
CATEGORY_NAMES = {"overhead": "Python 与分派开销", "matmul": "矩阵乘法", "attention": "注意力", "other": "其他计算"}

_MATMUL = ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::linear", "aten::matmul",
           "mkldnn::_linear_pointwise", "mkl::_mkl_linear", "aten::mkldnn_linear", "aten::_mkldnn_linear",
           "mkldnn::_linear", "aten::dot", "aten::mv", "aten::addmv")
_METADATA = ("aten::empty", "aten::empty_strided", "aten::empty_like", "aten::view", "aten::reshape",
             "aten::_reshape_alias", "aten::as_strided", "aten::transpose", "aten::t", "aten::expand",
             "aten::permute", "aten::unsqueeze", "aten::squeeze", "aten::select", "aten::slice", "aten::alias",
             "aten::detach", "detach", "aten::lift_fresh", "aten::resolve_conj", "aten::resolve_neg",
             "aten::_unsafe_view", "aten::unflatten", "aten::contiguous", "aten::result_type")


def categorize_op(name: str) -> str:
    """剖析器里一个事件名属于哪一份：``"matmul"``、``"attention"``、``"other"`` 或 ``"overhead"``。"""
    if name in _MATMUL or "linear" in name and name.startswith(("mkldnn", "mkl", "onednn")):
        return "matmul"
    if "scaled_dot_product" in name or "softmax" in name or "flash_attention" in name:
        return "attention"
    if name in _METADATA or not name.startswith(("aten::", "mkldnn::", "mkl::", "## Call CompiledFxGraph")):
        # 非 aten 的区段（Dynamo 的守卫检查、AOT 包装、Torch-Compiled Region 的外壳……）都是开销
        return "overhead"
    return "other"


def profile_breakdown(step: Callable[[], object], steps: int = 20, warmup: int = 3) -> dict:
    """剖析 ``steps`` 次 ``step()``（先热身 ``warmup`` 次），返回每步的秒数及其分解：

    ``{"total": 每步墙钟秒数, "matmul": …, "attention": …, "other": …, "overhead": …, "ops": {算子名: 每步自身秒数},
    "calls": {算子名: 每步调用次数}}``；``overhead`` = ``total`` 减其余三份，所以四份之和恰为 ``total``。
    """
    from torch.profiler import ProfilerActivity, profile

    positive_int("steps", steps)
    warmup = non_negative_int("warmup", warmup)
    if not callable(step):
        raise TypeError(f"step 应是无参数的可调用对象，收到 {type(step).__name__}")
    os.environ.setdefault("KINETO_LOG_LEVEL", "6")  # 别让 Kineto 的诊断行混进 stderr（同 profiling.profile_step）
    for _ in range(warmup):
        step()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        start = time.perf_counter()
        for _ in range(steps):
            step()
        total = (time.perf_counter() - start) / steps
    ops, calls = {}, {}
    parts = dict.fromkeys(CATEGORIES, 0.0)
    for event in prof.key_averages():
        seconds = event.self_cpu_time_total / 1e6 / steps
        if seconds <= 0:
            continue
        ops[event.key], calls[event.key] = seconds, event.count / steps
        kind = categorize_op(event.key)
        if kind != "overhead":
            parts[kind] += seconds
    measured = parts["matmul"] + parts["attention"] + parts["other"]
    parts["overhead"] = max(total - measured, 0.0)
    # 剖析器记下的算子时间偶尔比墙钟还多（计时粒度）：那时把三份按比例缩到墙钟之内，保证四份之和 = total
    if measured > total:
        scale = total / measured
        for kind in ("matmul", "attention", "other"):
            parts[kind] *= scale
    return {"total": total, **parts, "ops": ops, "calls": calls}
