r"""剖析（profiling）一个训练步：时间花在哪些算子上，以及算力利用率 MFU（model FLOPs utilization）。

* :func:`profile_step` 用 ``torch.profiler`` 跑一步，按算子的自身耗时（self time）排出前几名与各自占比；
* :func:`lm_training_flops` 是一个训练步矩阵乘法 FLOPs 的闭式公式：反向传播对每个矩阵乘法要算两次
  （对输入的梯度、对权重的梯度），所以一步 = 3 × 前向（测试用 ``FlopCounterMode`` 核对）；
* :func:`matmul_peak_flops` 在这台机器上实测一个大方阵乘法能达到的 FLOP/s，当作“峰值”；
* MFU = 实际达到的 FLOP/s ÷ 峰值（:func:`mfu`）。

耗时随机器负载而变：这里的秒数与比例只适合画进图里、在同一次运行中比较，不要写进结论文字。
"""

from __future__ import annotations

import os

import statistics
import time
from collections.abc import Callable

import torch

from .._checks import positive_int
from .costs import attention_flops, feedforward_flops

__all__ = ["profile_step", "lm_training_flops", "count_training_flops", "matmul_peak_flops", "mfu"]


def profile_step(step: Callable[[], object], row_limit: int = 10, warmup: int = 1) -> list[dict]:
    """先热身 ``warmup`` 次，再在 ``torch.profiler.profile`` 下运行 ``step()`` 一次。

    返回自身耗时最多的 ``row_limit`` 个算子，每行 ``{"name", "calls", "self_seconds", "share"}``，
    ``share`` = 该算子自身耗时 ÷ 所有算子自身耗时之和（从大到小排列）。
    """
    from torch.profiler import ProfilerActivity, profile

    positive_int("row_limit", row_limit)
    # Kineto 默认往 stderr 打印 “USDT … profiler_start/stop” 之类的诊断行：笔记本里它们会混进输出（nbval 也比较 stderr）
    os.environ.setdefault("KINETO_LOG_LEVEL", "6")
    for _ in range(warmup):
        step()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        step()
    events = [e for e in prof.key_averages() if e.self_cpu_time_total > 0]
    total = sum(e.self_cpu_time_total for e in events) or 1.0
    events.sort(key=lambda e: e.self_cpu_time_total, reverse=True)
    return [
        {"name": e.key, "calls": int(e.count), "self_seconds": e.self_cpu_time_total / 1e6,
         "share": e.self_cpu_time_total / total}
        for e in events[:row_limit]
    ]


def lm_training_flops(config, batch: int, length: int) -> dict[str, int]:
    """仅解码器模型一个训练步（前向 + 反向）的矩阵乘法 FLOPs：``forward`` 与 ``total`` = 3 × ``forward``。

    前向 = N × [注意力（:func:`~tformer_lib.measurement.costs.attention_flops`）+ 前馈（SwiGLU 多一个矩阵，× 1.5）]
    + 输出层 ``2·B·T·d·V``。GQA 时 K、V 投影按 ``n_kv_heads`` 缩小。词嵌入是查表，不计。
    """
    from ..lm.config import LMConfig

    if not isinstance(config, LMConfig):
        raise TypeError(f"config 应是 LMConfig，收到 {type(config).__name__}")
    positive_int("batch", batch)
    positive_int("length", length)
    c = config
    attn = attention_flops(batch, length, length, c.d_model, c.n_heads)
    attn["kv_proj"] = attn["kv_proj"] * c.kv_heads // c.n_heads  # W^K、W^V 只投影到 n_kv_heads·d_k 维
    ffn = feedforward_flops(batch, length, c.d_model, c.d_ff)
    if c.activation == "swiglu":
        ffn = ffn * 3 // 2  # W_1、W_3、W_2 三个矩阵
    block = sum(v for k, v in attn.items() if k != "total") + ffn
    head = 2 * batch * length * c.d_model * c.vocab_size  # (B·T, d) @ (d, V)
    forward = c.n_layers * block + head
    return {"block": block, "head": head, "forward": forward, "backward": 2 * forward, "total": 3 * forward}


def count_training_flops(step: Callable[[], object]) -> int:
    """用 ``torch.utils.flop_counter.FlopCounterMode`` 数 ``step()``（含反向）里的矩阵乘法 FLOPs。

    CPU 上 SDPA 的融合内核不在计数表里：要与公式对照，请用显式注意力路径。
    """
    from torch.utils.flop_counter import FlopCounterMode

    with FlopCounterMode(display=False) as counter:
        step()
    return int(counter.get_total_flops())


def matmul_peak_flops(n: int = 512, repeats: int = 5, dtype: torch.dtype = torch.float32) -> float:
    """实测 ``(n×n) @ (n×n)`` 的 FLOP/s（取 ``repeats`` 次的中位数），作为这台机器、当前线程数下的“峰值”。"""
    positive_int("n", n)
    positive_int("repeats", repeats)
    a, b = torch.randn(n, n, dtype=dtype), torch.randn(n, n, dtype=dtype)
    a @ b  # 热身
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        a @ b
        samples.append(time.perf_counter() - start)
    return 2 * n**3 / statistics.median(samples)


def mfu(flops: int | float, seconds: float, peak_flops: float) -> float:
    """MFU = (flops / seconds) ÷ peak_flops：模型实际用上了峰值算力的几成。"""
    for name, value in (("flops", flops), ("seconds", seconds), ("peak_flops", peak_flops)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
            raise ValueError(f"{name} 应为正数，收到 {value!r}")
    return flops / seconds / peak_flops
