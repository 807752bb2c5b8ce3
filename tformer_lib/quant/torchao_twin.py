"""与 torchao 对照：同一个 ``nn.Linear`` 经 torchao 的 ``Int8WeightOnlyConfig`` 量化后的整数权重与比例因子。

torchao 是可选依赖（``notebooks``、``book`` 与 ``test`` 几组 extra 里有它），只在调用这里的函数时才导入。它导入时会往 stderr 写几行
与本书无关的日志（CUDA 扩展加载失败、一条 torch.compile 的弃用提示），这里在导入期间把这些日志压下去。

两边的比例因子逐位相同（float32 权重时：都是 ``max|w| / 127.5``、下限 float32 的 eps）；整数权重只在一处可能不同：
我们按公式算 ``round(w / s)``，torchao 算 ``round(w * (1 / s))``。:func:`reciprocal_rounding_differs` 事先算出这些位置。
"""

from __future__ import annotations

import copy
import logging

import torch
from torch import nn

from .affine import int_range

__all__ = ["torchao_int8_weight_only", "reciprocal_rounding_differs"]

_NOISY_LOGGERS = ("torchao", "torch.utils._pytree")


def _import_torchao_quietly():
    loggers = [logging.getLogger(name) for name in _NOISY_LOGGERS]
    levels = [lg.level for lg in loggers]
    try:
        for lg in loggers:
            lg.setLevel(logging.ERROR)
        from torchao.quantization import Int8WeightOnlyConfig, quantize_
    except ImportError as exc:  # pragma: no cover - 取决于环境
        raise ImportError("需要 torchao：pip install torchao（本书的 notebooks、book 与 test 这几组可选依赖里都有它）") from exc
    finally:
        for lg, level in zip(loggers, levels):
            lg.setLevel(level)
    return Int8WeightOnlyConfig, quantize_


def torchao_int8_weight_only(linear: nn.Linear) -> tuple[torch.Tensor, torch.Tensor]:
    """torchao 对 ``linear`` 的一份拷贝做 ``Int8WeightOnlyConfig`` 量化，返回它的整数权重 int8 ``(out, in)``
    与比例因子 float32 ``(out,)``（``linear`` 本身不变）。"""
    if not isinstance(linear, nn.Linear):
        raise TypeError(f"linear 应是 nn.Linear，收到 {type(linear).__name__}")
    if linear.weight.dtype not in (torch.float32, torch.bfloat16):
        raise TypeError(f"linear 的权重应是 float32 或 bfloat16（torchao 的 Int8WeightOnlyConfig 支持的），收到 {linear.weight.dtype}")
    config, quantize_ = _import_torchao_quietly()
    theirs = copy.deepcopy(linear)
    try:
        quantize_(theirs, config())
    except (RuntimeError, AssertionError) as exc:  # torchao 自己的报错不点名参数：说清是哪个层
        raise ValueError(f"torchao 量化不了这个 nn.Linear（in={linear.in_features}, out={linear.out_features}）："
                         f"{type(exc).__name__}: {exc}") from exc
    weight = theirs.weight
    return weight.qdata.detach().clone(), weight.scale.detach().reshape(-1).clone()  # (out, in), (out,)


def reciprocal_rounding_differs(w: torch.Tensor, scale: torch.Tensor, bits: int = 8) -> torch.Tensor:
    """``round(w / s)`` 与 ``round(w · (1/s))`` 截到 b 位范围后不同的位置（布尔，形状同 ``w``）。

    ``scale`` 能广播到 ``w``（逐通道时是 ``(out, 1)``）。两种算法只在 ``w / s`` 恰好落在半步附近时差一个台阶。
    """
    q_min, q_max = int_range(bits)
    w, scale = w.detach().float(), scale.detach().float()
    divide = torch.round(w / scale).clamp(q_min, q_max)
    multiply = torch.round(w * (1.0 / scale)).clamp(q_min, q_max)
    return divide != multiply
