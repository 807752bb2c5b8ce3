"""把整个模型换成某种权重格式：``quantize_model(model, fmt)``。

格式（:data:`WEIGHT_FORMATS`）：

- ``"fp32"``、``"bf16"``：整个模型转成 float32 / bfloat16（``model.to(dtype)``）；
- ``"int8"``：每个 ``nn.Linear`` 换成 :class:`~tformer_lib.quant.linear.Int8Linear`（逐通道对称 int8）；
- ``"int4-g32"``、``"int4-g64"``、``"int4-g128"``：换成组大小 32/64/128 的 :class:`~tformer_lib.quant.linear.Int4Linear`。

整数格式只量化**矩阵乘法的权重**：词嵌入、位置嵌入、归一化参数与偏置保持原来的浮点类型。与词嵌入共享权重
（weight tying）的输出层也不量化——词嵌入查表还要用这份浮点矩阵，再存一份整数版反而多占内存；没有共享时
输出层照样量化（gpt-fast 也量化它）。模型被原地修改并返回。
"""

from __future__ import annotations

import torch
from torch import nn

from .._checks import one_of
from .linear import Int4Linear, Int8Linear

__all__ = ["WEIGHT_FORMATS", "FLOAT_FORMATS", "quantize_model", "dequantize_model", "format_dtype", "int4_group_size"]

FLOAT_FORMATS = {"fp32": torch.float32, "bf16": torch.bfloat16}
WEIGHT_FORMATS = ("fp32", "bf16", "int8", "int4-g32", "int4-g64", "int4-g128")


def int4_group_size(fmt: str) -> int | None:
    """``"int4-g64"`` → 64；不是 int4 格式时返回 None。"""
    return int(fmt.split("-g")[1]) if fmt.startswith("int4-g") else None


def format_dtype(fmt: str) -> torch.dtype | None:
    """浮点格式的 dtype（``"bf16"`` → ``torch.bfloat16``）；整数格式返回 None。"""
    return FLOAT_FORMATS.get(fmt)


def _tied_linears(model: nn.Module) -> set[int]:
    """权重与某个 ``nn.Embedding`` 共用同一块存储的线性层（共享权重的输出层）。"""
    embedding_weights = {id(m.weight) for m in model.modules() if isinstance(m, nn.Embedding)}
    return {id(m) for m in model.modules() if isinstance(m, nn.Linear) and id(m.weight) in embedding_weights}


def quantize_model(model: nn.Module, fmt: str) -> nn.Module:
    """把 ``model`` 原地换成 ``fmt`` 格式（见模块说明）并返回它。"""
    if not isinstance(model, nn.Module):
        raise TypeError(f"model 应是 nn.Module，收到 {type(model).__name__}")
    one_of("fmt", fmt, WEIGHT_FORMATS)
    if isinstance(model, nn.Linear):
        raise TypeError("model 本身就是一个 nn.Linear：请直接用 Int8Linear.from_linear / Int4Linear.from_linear")
    already = sorted({type(m).__name__ for m in model.modules() if isinstance(m, (Int8Linear, Int4Linear))})
    if already:
        raise ValueError(f"model 已经量化过（含 {'、'.join(already)}）：quantize_model 只接受浮点模型，"
                         "请对原来的浮点模型（或它的 copy.deepcopy）调用")
    if fmt in FLOAT_FORMATS:
        return model.to(FLOAT_FORMATS[fmt])
    group_size = int4_group_size(fmt)
    tied = _tied_linears(model)
    targets = [(name, m) for name, m in model.named_modules() if isinstance(m, nn.Linear) and id(m) not in tied]
    if group_size is not None:  # 先全部检查，出错时模型还是原样
        bad = [f"{name}（in_features={m.in_features}）" for name, m in targets if m.in_features % group_size]
        if bad:
            raise ValueError(f"fmt={fmt!r}：这些层的 in_features 不是 {group_size} 的整数倍：{'、'.join(bad)}")
    for name, linear in targets:
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        new = Int8Linear.from_linear(linear) if group_size is None else Int4Linear.from_linear(linear, group_size)
        setattr(parent, child, new)
    return model


@torch.no_grad()
def dequantize_model(model: nn.Module) -> nn.Module:
    """:func:`quantize_model` 的整数格式的“逆”：把每个 Int8Linear/Int4Linear 原地换回取值为 ``Ŵ`` 的浮点
    ``nn.Linear``（量化的误差留在权重里，还原不了原来的 W）；返回 ``model``。QLoRA 合并后要存成普通检查点时用它。"""
    if not isinstance(model, nn.Module):
        raise TypeError(f"model 应是 nn.Module，收到 {type(model).__name__}")
    targets = [(name, m) for name, m in model.named_modules() if isinstance(m, (Int8Linear, Int4Linear))]
    if isinstance(model, (Int8Linear, Int4Linear)):
        raise TypeError("model 本身就是一个量化层：请直接用它的 dequantized_weight()")
    for name, layer in targets:
        weight = layer.dequantized_weight()  # (out, in)
        linear = nn.Linear(layer.in_features, layer.out_features, bias=layer.bias is not None,
                           dtype=weight.dtype, device=weight.device)
        linear.weight.copy_(weight)
        if layer.bias is not None:
            linear.bias.copy_(layer.bias)
        parent_name, _, child = name.rpartition(".")
        setattr(model.get_submodule(parent_name) if parent_name else model, child, linear.train(layer.training))
    return model
