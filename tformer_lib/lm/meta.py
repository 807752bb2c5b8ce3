"""在 meta 设备上搭模型：只有形状、没有数值，不占内存——70B 的模型也能“搭出来”，按部件数参数。

参数按部件分账用的就是模型自己的 ``named_parameters()``：没有第二份会与代码走样的公式。
"""

from __future__ import annotations

import torch
from torch import nn

from .config import LMConfig
from .model import DecoderOnlyLM, make_lm

__all__ = ["meta_lm", "PARAMETER_COMPONENTS", "parameter_component", "parameter_breakdown"]

#: 参数的部件：词嵌入、位置嵌入、注意力（W^Q/W^K/W^V/W^O 及偏置）、前馈网络、归一化、（不共享时的）输出层
PARAMETER_COMPONENTS = ("embedding", "positional", "attention", "ffn", "norms", "head")


def meta_lm(config: LMConfig) -> DecoderOnlyLM:
    """在 meta 设备上按 ``config`` 搭一个 :class:`~tformer_lib.lm.DecoderOnlyLM`（不分配任何数据）。"""
    with torch.device("meta"):
        return make_lm(config)


def parameter_component(name: str) -> str:
    """参数名（``model.named_parameters()`` 里的）属于哪个部件（:data:`PARAMETER_COMPONENTS` 之一）。"""
    if name.startswith("tok_embed."):
        return "embedding"
    if name.startswith("pos_embed."):
        return "positional"
    if ".self_attn." in name:
        return "attention"
    if ".feed_forward." in name:
        return "ffn"
    if ".residual_" in name or name.startswith("norm."):
        return "norms"
    if name.startswith("lm_head."):
        return "head"
    raise ValueError(f"参数 {name!r} 不属于 {PARAMETER_COMPONENTS} 中的任何一个部件")


def parameter_breakdown(model_or_config: nn.Module | LMConfig) -> dict[str, int]:
    """按部件数参数：``{"embedding", "positional", "attention", "ffn", "norms", "head", "total"}``。

    给配置时先在 meta 设备上搭模型（:func:`meta_lm`）。共享的矩阵只算一次（``named_parameters`` 已去重：
    权重共享时输出层算在 ``embedding`` 里，``head`` 为 0）。``total`` 与 :func:`~tformer_lib.count_parameters` 相等。
    """
    if isinstance(model_or_config, LMConfig):
        model = meta_lm(model_or_config)
    elif isinstance(model_or_config, DecoderOnlyLM):
        model = model_or_config
    else:
        raise TypeError(f"model_or_config 应是 DecoderOnlyLM 或 LMConfig，收到 {type(model_or_config).__name__}")
    out = dict.fromkeys(PARAMETER_COMPONENTS, 0)
    for name, param in model.named_parameters():
        out[parameter_component(name)] += param.numel()
    out["total"] = sum(out.values())
    return out
