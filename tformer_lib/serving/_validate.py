"""推理服务各部件共用的参数检查（通用的在 :mod:`tformer_lib._checks`）：坏输入给出点名参数的中文错误。"""

from __future__ import annotations

import numbers

from torch import nn

from .._checks import check_suppress_ids

__all__ = ["check_model", "check_suppress_ids", "non_negative_int"]


def check_model(name: str, model) -> nn.Module:
    """要求 ``model`` 是带 ``config``（``vocab_size``、``max_len``）的语言模型，例如 :class:`~tformer_lib.lm.DecoderOnlyLM`。"""
    config = getattr(model, "config", None)
    if not isinstance(model, nn.Module) or not all(hasattr(config, a) for a in ("vocab_size", "max_len")):
        raise TypeError(f"{name} 应是语言模型（带 .config 的 DecoderOnlyLM，如 make_lm(config) 的结果），"
                        f"收到 {type(model).__name__}")
    return model


def non_negative_int(name: str, value) -> int:
    """要求 ``value`` 是非负整数（NumPy 整数也可以）。"""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} 应是整数，收到 {type(value).__name__} {value!r}")
    if value < 0:
        raise ValueError(f"{name} 应是非负整数，收到 {value}")
    return int(value)
