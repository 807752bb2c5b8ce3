"""标签平滑损失（label smoothing loss）：直接从 logits 计算，忽略填充位（PAD）。

把 one-hot 目标换成「正确类得 1−ε，其余 ε 平均分给全部 V 个类」的软目标：

.. math:: \\mathcal{L} = (1-\\varepsilon)\\,(-\\log p_y) + \\varepsilon \\cdot \\frac{1}{V}\\sum_{v=1}^{V} (-\\log p_v)

这与 ``torch.nn.functional.cross_entropy(logits, y, label_smoothing=ε, ignore_index=PAD)``
的定义完全一致（测试中逐位核对）。论文用 ε = 0.1：它让模型「不那么确信」，
困惑度（perplexity）略差，但 BLEU 更好。
"""

from __future__ import annotations

import numbers

import torch
import torch.nn.functional as F
from torch import nn

from .._checks import check_values, one_of, token_ids
from ..specials import PAD

__all__ = ["LabelSmoothingLoss", "label_smoothing_loss"]


def label_smoothing_loss(
    logits: torch.Tensor,
    target: torch.Tensor,
    smoothing: float = 0.1,
    pad_id: int = PAD,
    reduction: str = "mean",
) -> torch.Tensor:
    """标签平滑交叉熵。

    参数
    ----
    logits: ``(..., V)`` 未归一化分数。
    target: ``(...)`` 目标 id；等于 ``pad_id`` 的位置不计入损失。
    smoothing: ε ∈ [0, 1)。
    reduction: ``"mean"``（按真实词元平均）、``"sum"`` 或 ``"none"``（逐位置，PAD 处为 0）。
    """
    check_smoothing(smoothing)
    one_of("reduction", reduction, REDUCTIONS)
    if not isinstance(logits, torch.Tensor) or not logits.dtype.is_floating_point:
        raise TypeError(f"logits 应是浮点 torch.Tensor (..., V)，收到 {getattr(logits, 'dtype', type(logits).__name__)}")
    if not isinstance(target, torch.Tensor):
        raise TypeError(f"target 应是由词元 id 组成的 torch.Tensor，收到 {type(target).__name__}")
    if logits.shape[:-1] != target.shape:
        raise ValueError(
            f"logits 的形状 {tuple(logits.shape)} 去掉最后一维应等于 target 的形状 {tuple(target.shape)}"
        )
    if check_values(target):  # 不看 PAD 位；其余 id 须在 [0, V) 内（布尔索引与取值都要读出张量）
        token_ids("target", target[target != pad_id], logits.shape[-1])
    log_p = F.log_softmax(logits.float(), dim=-1)  # (..., V)
    keep = target != pad_id  # (...)
    safe_target = target.masked_fill(~keep, 0)  # PAD 位随便取一个合法 id，稍后乘 0
    nll = -log_p.gather(-1, safe_target.unsqueeze(-1)).squeeze(-1)  # (...) 正确类的 −log p_y
    smooth = -log_p.mean(dim=-1)  # (...) 平均到全部 V 类的 −log p_v
    loss = ((1.0 - smoothing) * nll + smoothing * smooth) * keep  # (...)
    if reduction == "none":
        return loss
    if reduction == "sum":
        return loss.sum()
    return loss.sum() / keep.sum().clamp(min=1)


REDUCTIONS = ("mean", "sum", "none")


def check_smoothing(smoothing) -> None:
    if isinstance(smoothing, bool) or not isinstance(smoothing, numbers.Real) or not 0.0 <= smoothing < 1.0:
        raise ValueError(f"smoothing 应在 [0, 1) 内，收到 {smoothing!r}")


class LabelSmoothingLoss(nn.Module):
    """:func:`label_smoothing_loss` 的模块版：``LabelSmoothingLoss(0.1)(logits, target)``。"""

    def __init__(self, smoothing: float = 0.1, pad_id: int = PAD, reduction: str = "mean"):
        super().__init__()
        check_smoothing(smoothing)
        one_of("reduction", reduction, REDUCTIONS)  # 构造时就检查，不要等到第一次调用
        self.smoothing = float(smoothing)
        self.pad_id = pad_id
        self.reduction = reduction

    def forward(self, logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return label_smoothing_loss(logits, target, self.smoothing, self.pad_id, self.reduction)

    def extra_repr(self) -> str:
        return f"smoothing={self.smoothing}, pad_id={self.pad_id}, reduction={self.reduction!r}"
