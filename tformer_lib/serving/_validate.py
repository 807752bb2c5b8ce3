"""推理服务各部件共用的参数检查（通用的在 :mod:`tformer_lib._checks`）：坏输入给出点名参数的中文错误。"""

from __future__ import annotations

import numbers
from collections.abc import Sequence

from torch import nn

__all__ = ["check_model", "check_suppress_ids", "non_negative_int"]


def check_model(name: str, model) -> nn.Module:
    """要求 ``model`` 是带 ``config``（``vocab_size``、``max_len``）的语言模型，例如 :class:`~tformer_lib.lm.DecoderOnlyLM`。"""
    config = getattr(model, "config", None)
    if not isinstance(model, nn.Module) or not all(hasattr(config, a) for a in ("vocab_size", "max_len")):
        raise TypeError(f"{name} 应是语言模型（带 .config 的 DecoderOnlyLM，如 make_lm(config) 的结果），"
                        f"收到 {type(model).__name__}")
    return model


def check_suppress_ids(suppress_ids, vocab_size: int | None = None) -> tuple[int, ...]:
    """要求 ``suppress_ids`` 是整数 id 的序列（可以为空），例如 ``(PAD, BOS)``；返回元组。一维张量或数组也行。"""
    if hasattr(suppress_ids, "tolist") and getattr(suppress_ids, "ndim", None) == 1:  # torch 张量、NumPy 数组
        suppress_ids = suppress_ids.tolist()
    if isinstance(suppress_ids, (str, bytes)) or not isinstance(suppress_ids, (Sequence, set, frozenset)):
        raise TypeError(f"suppress_ids 应是整数 id 的序列（如 (PAD, BOS) 或 ()），收到 "
                        f"{type(suppress_ids).__name__} {suppress_ids!r:.40}")
    ids = tuple(suppress_ids)
    for t in ids:
        if isinstance(t, bool) or not isinstance(t, numbers.Integral):
            raise TypeError(f"suppress_ids 里应全是整数 id，收到 {t!r}")
        if vocab_size is not None and not 0 <= t < vocab_size:
            raise ValueError(f"suppress_ids 里的 id 应在 [0, {vocab_size}) 内，收到 {t}")
    return tuple(int(t) for t in ids)


def non_negative_int(name: str, value) -> int:
    """要求 ``value`` 是非负整数（NumPy 整数也可以）。"""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} 应是整数，收到 {type(value).__name__} {value!r}")
    if value < 0:
        raise ValueError(f"{name} 应是非负整数，收到 {value}")
    return int(value)
