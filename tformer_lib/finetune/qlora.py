"""QLoRA 的思路（Dettmers et al., 2023）：底座权重量化成 4 位并冻结，只训练浮点的 LoRA 支路。

全量微调要为每个参数存权重、梯度和 Adam 的两个矩（16 字节/参数，第 11 章）；LoRA 去掉了底座的梯度和优化器状态，
但底座权重仍是 4 字节/参数；QLoRA 再把底座压到约 0.5 字节/参数（int4，外加每组一个比例因子）。

在本书里是**模拟**：底座用第 14 章的分组对称 int4（:class:`~tformer_lib.quant.Int4Linear`），而不是论文的 NF4
（按正态分布分位点取的 16 个值）与“双重量化”（比例因子本身再量化）；矩阵乘法在 CPU 上用 float32 算（先反量化），
没有 bitsandbytes 的 CUDA 内核与分页优化器（paged optimizer）。省下的常驻字节是真的（:func:`~tformer_lib.quant.weight_bytes`
与实际张量相等），反向时底座的浮点权重当场重算、不为反向保存（:class:`~tformer_lib.finetune.lora.LoRALinear`）。
"""

from __future__ import annotations

from torch import nn

from .._checks import one_of
from ..quant.quantize import quantize_model
from .lora import apply_lora, check_lora_hyperparameters, check_model, check_no_lora, check_targets, find_targets

__all__ = ["QLORA_FORMATS", "apply_qlora"]

#: 底座可用的整数格式
QLORA_FORMATS = ("int4-g32", "int4-g64", "int4-g128", "int8")


def apply_qlora(model: nn.Module, rank: int, alpha: float, targets=("w_q", "w_v"), fmt: str = "int4-g64",
                dropout: float = 0.0) -> nn.Module:
    """原地把 ``model`` 的线性层量化成 ``fmt``（:func:`~tformer_lib.quant.quantize_model`，与词嵌入共享的输出层除外），
    再在 ``targets`` 上加 LoRA（:func:`~tformer_lib.finetune.apply_lora`）；返回 ``model``。

    训练完 :func:`~tformer_lib.finetune.merge_lora` 把目标层合并成 ``Ŵ + (α/r)·BA`` 的浮点层；其余线性层仍是量化的，
    整个模型要浮点时再调用 :func:`~tformer_lib.quant.dequantize_model`。
    """
    check_model(model)
    one_of("fmt", fmt, QLORA_FORMATS)
    check_lora_hyperparameters(rank, alpha, dropout)  # 先查完全部参数：出错时模型还没被量化
    check_no_lora(model)
    targets = check_targets(targets)
    find_targets(model, targets)
    return apply_lora(quantize_model(model, fmt), rank, alpha, targets=targets, dropout=dropout)
