"""学习率预热（warm-up）调度与论文的 Adam 设置。

论文（Vaswani et al., 2017, §5.3）的学习率：

.. math:: lr(step) = d_{model}^{-0.5} \\cdot \\min(step^{-0.5},\\; step \\cdot warmup^{-1.5})

前 ``warmup`` 步线性上升，之后按 ``1/√step`` 衰减，峰值在 ``step = warmup``。
step 从 0 开始计时会出现 ``0^{-0.5}``，这里把 step 0 当作 step 1（"guarded"）。
"""

from __future__ import annotations

import math

import torch
from torch import nn

__all__ = ["noam_rate", "NoamLambda", "make_optimizer", "make_scheduler"]


def noam_rate(step: int, d_model: int, warmup: int, factor: float = 1.0) -> float:
    """第 ``step`` 步的学习率 ``factor · d_model^-0.5 · min(step^-0.5, step · warmup^-1.5)``。"""
    if not isinstance(d_model, int) or d_model < 1:
        raise ValueError(f"d_model 应为正整数，收到 {d_model!r}")
    if not isinstance(warmup, int) or warmup < 1:
        raise ValueError(f"warmup 应为正整数，收到 {warmup!r}")
    if step < 0:
        raise ValueError(f"step 应 ≥ 0，收到 {step!r}")
    step = max(int(step), 1)  # 守护 step 0：0^-0.5 无定义
    return factor * d_model ** -0.5 * min(step ** -0.5, step * warmup ** -1.5)


class NoamLambda:
    """可交给 ``torch.optim.lr_scheduler.LambdaLR`` 的倍率函数。

    ``LambdaLR`` 把优化器的基础学习率乘以本函数的返回值；我们把基础学习率设为 1，
    于是真正的学习率就是 :func:`noam_rate`。写成类而不是闭包，是为了让调度器的
    ``state_dict()`` 只含普通数字，能被 ``torch.load(weights_only=True)`` 读回。
    """

    def __init__(self, d_model: int, warmup: int, factor: float = 1.0):
        noam_rate(1, d_model, warmup, factor)  # 提前校验参数
        self.d_model = d_model
        self.warmup = warmup
        self.factor = float(factor)

    def __call__(self, step: int) -> float:
        return noam_rate(step, self.d_model, self.warmup, self.factor)

    def __repr__(self) -> str:
        return f"NoamLambda(d_model={self.d_model}, warmup={self.warmup}, factor={self.factor})"


def make_optimizer(model: nn.Module, lr: float = 1.0) -> torch.optim.Adam:
    """论文的 Adam：β=(0.9, 0.98)，ε=1e-9。配合 :func:`make_scheduler` 时 ``lr`` 保持 1。"""
    if not isinstance(model, nn.Module):
        raise TypeError(f"model 应是 torch.nn.Module，收到 {type(model).__name__}")
    if not (isinstance(lr, (int, float)) and lr > 0 and math.isfinite(lr)):
        raise ValueError(f"lr 应为正的有限数，收到 {lr!r}")
    return torch.optim.Adam(model.parameters(), lr=lr, betas=(0.9, 0.98), eps=1e-9)


def make_scheduler(
    optimizer: torch.optim.Optimizer, d_model: int, warmup: int = 4000, factor: float = 1.0
) -> torch.optim.lr_scheduler.LambdaLR:
    """论文的预热调度：每个训练步之后调用一次 ``scheduler.step()``。"""
    return torch.optim.lr_scheduler.LambdaLR(optimizer, NoamLambda(d_model, warmup, factor))
