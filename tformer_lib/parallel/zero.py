"""ZeRO（Zero Redundancy Optimizer）的显存公式：数据并行的 p 个进程各存一份完整的“模型状态”是浪费，
把它切成 p 份，每个进程只存 1/p。

N 个参数、AdamW、全 float32 时每个参数 16 字节：参数 4 + 梯度 4 + 两个矩 8。各阶段每个进程存：

==========  =========  =========  ==========  =====================
阶段         参数        梯度        优化器状态    合计（字节）
==========  =========  =========  ==========  =====================
0（DDP）     4N         4N         8N          16N
1           4N         4N         8N/p        8N + 8N/p
2           4N         4N/p       8N/p        4N + 12N/p
3（FSDP）    4N/p       4N/p       8N/p        16N/p
==========  =========  =========  ==========  =====================

激活不在其中（它随批大小变，见第 11 章）；阶段 3 在前向/反向时还要临时收齐一层的完整参数（all-gather）。
"""

from __future__ import annotations

import math
import numbers

from .._checks import positive_int

__all__ = ["zero_bytes_per_rank", "ZERO_STAGES"]

ZERO_STAGES = (0, 1, 2, 3)


def zero_bytes_per_rank(n_params: int, world_size: int, stage: int, *, param_bytes: int = 4, grad_bytes: int = 4,
                        optimizer_bytes: int = 8) -> dict[str, float]:
    """ZeRO 阶段 ``stage`` 下每个进程的模型状态字节数：``parameters``、``gradients``、``optimizer``、``total``。

    默认是 float32 + AdamW（4 + 4 + 8 字节/参数）；混合精度时传 ``param_bytes=2, grad_bytes=2, optimizer_bytes=12``
    （16 位参数与梯度，float32 的主权重与两个矩），即 ZeRO 论文的 2 + 2 + K，K = 12。
    """
    n_params, p = positive_int("n_params", n_params), positive_int("world_size", world_size)
    # True == 1、1.0 == 1 都会混进 ``in ZERO_STAGES``：阶段号只收整数
    if isinstance(stage, bool) or not isinstance(stage, numbers.Integral) or stage not in ZERO_STAGES:
        raise ValueError(f"stage 应是 {ZERO_STAGES} 之一（整数），收到 {stage!r}")
    for name, value in (("param_bytes", param_bytes), ("grad_bytes", grad_bytes), ("optimizer_bytes", optimizer_bytes)):
        if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value) or value <= 0:
            raise ValueError(f"{name} 应是正的有限字节数，收到 {value!r}")
    stage = int(stage)
    params = param_bytes * n_params / (p if stage >= 3 else 1)
    grads = grad_bytes * n_params / (p if stage >= 2 else 1)
    optim = optimizer_bytes * n_params / (p if stage >= 1 else 1)
    return {"parameters": params, "gradients": grads, "optimizer": optim, "total": params + grads + optim}
