"""适配器文件（adapter file）：只存 LoRA 支路（A、B）与重建它所需的超参数，几百 KB，而不是整个模型。

文件是 ``torch.save`` 的字典，原子写入、``weights_only=True`` 读回::

    {"format": "tformer-lora-adapter", "version": 1, "rank": r, "alpha": α, "targets": [...],
     "base_config": {...},            # 底座模型的 LMConfig：装到别的模型上会被拒绝
     "base_format": "fp32" | "int4-g64" | …,  # 训练时底座的格式（QLoRA 的支路是对着量化底座学的）
     "state": {"blocks.0.self_attn.w_q.lora_A": …, …}, "extra": {...}}

:func:`apply_adapter` 在一个底座模型上重新加 LoRA 并填入 A、B；之后可以 :func:`~tformer_lib.finetune.merge_lora`
合并成普通模型，或交给 :mod:`~tformer_lib.finetune.multi_lora` 与其他适配器一起服务。
"""

from __future__ import annotations

import os
from pathlib import Path

import torch
from torch import nn

from ..quant.linear import Int4Linear, Int8Linear
from ..training.checkpoint import CheckpointError, atomic_torch_save
from .lora import LoRALinear, apply_lora

__all__ = ["ADAPTER_FORMAT", "ADAPTER_VERSION", "adapter_from_model", "save_adapter", "load_adapter",
           "check_adapter_fits", "apply_adapter"]

ADAPTER_FORMAT = "tformer-lora-adapter"
ADAPTER_VERSION = 1


def _lora_layers(model: nn.Module) -> dict[str, LoRALinear]:
    """``{模块名: LoRALinear}``（同一个层经两条路径到达时只记第一条）。"""
    seen, out = set(), {}
    for name, module in model.named_modules():
        if isinstance(module, LoRALinear) and id(module) not in seen:
            seen.add(id(module))
            out[name] = module
    return out


def _base_format(base: nn.Module) -> str:
    """底座层的权重格式名（与 :data:`~tformer_lib.quant.WEIGHT_FORMATS` 同一套写法）。"""
    if isinstance(base, Int8Linear):
        return "int8"
    if isinstance(base, Int4Linear):
        return f"int4-g{base.group_size}"
    return {torch.float32: "fp32", torch.bfloat16: "bf16"}.get(base.weight.dtype, str(base.weight.dtype))


def adapter_from_model(model: nn.Module, extra: dict | None = None) -> dict:
    """把加了 LoRA 的模型的支路取成适配器字典（张量是副本）。各层的秩与 α 必须相同。"""
    layers = _lora_layers(model) if isinstance(model, nn.Module) else {}
    if not layers:
        raise ValueError("model 里没有 LoRALinear：先 apply_lora(model, …) 并训练，再保存适配器")
    config = getattr(model, "config", None)
    if config is None or not hasattr(config, "to_dict"):
        raise TypeError(f"model 应是带 LMConfig 的语言模型（DecoderOnlyLM），收到 {type(model).__name__}")
    kinds = {(m.rank, m.alpha) for m in layers.values()}
    if len(kinds) != 1:
        raise ValueError(f"各层的 (rank, alpha) 不同：{sorted(kinds)}；一个适配器文件只记一组")
    (rank, alpha), = kinds
    formats = {_base_format(m.base) for m in layers.values()}
    if len(formats) != 1:
        raise ValueError(f"各层底座的格式不同：{sorted(formats)}")
    (base_format,) = formats
    return {
        "format": ADAPTER_FORMAT, "version": ADAPTER_VERSION, "rank": rank, "alpha": alpha,
        "targets": sorted({name.rsplit(".", 1)[-1] for name in layers}),
        "base_config": config.to_dict(), "base_format": base_format,
        "state": {f"{name}.{p}": getattr(m, p).detach().clone() for name, m in layers.items() for p in ("lora_A", "lora_B")},
        "extra": dict(extra or {}),
    }


def save_adapter(path: str | os.PathLike, model: nn.Module, extra: dict | None = None) -> Path:
    """原子地把 ``model`` 的 LoRA 支路存成适配器文件（:func:`adapter_from_model`），返回路径。"""
    return atomic_torch_save(adapter_from_model(model, extra), path)


def load_adapter(path: str | os.PathLike) -> dict:
    """读适配器文件（``weights_only=True``）并检查格式；文件不对时抛出一行的 :class:`~tformer_lib.training.checkpoint.CheckpointError`。"""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"找不到适配器文件 {str(path)!r}")
    try:
        data = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:
        raise CheckpointError(f"无法读取适配器文件 {str(path)!r}：已损坏或不是适配器（{type(exc).__name__}）") from exc
    if not isinstance(data, dict) or data.get("format") != ADAPTER_FORMAT:
        raise CheckpointError(f"{str(path)!r} 不是 LoRA 适配器文件（缺少 format={ADAPTER_FORMAT!r}）；"
                              "完整的模型检查点请用 --model / load_lm")
    if data.get("version") != ADAPTER_VERSION:
        raise CheckpointError(f"{str(path)!r} 的适配器版本是 {data.get('version')!r}，本库只能读取版本 {ADAPTER_VERSION}")
    missing = [k for k in ("rank", "alpha", "targets", "base_config", "state") if k not in data]
    if missing:
        raise CheckpointError(f"{str(path)!r} 缺少字段 {missing}，文件不完整")
    return data


def check_adapter_fits(model: nn.Module, adapter: dict, name: str = "adapter") -> None:
    """适配器的底座配置必须与 ``model`` 的相同（否则 A、B 的形状或含义对不上）。"""
    if not isinstance(adapter, dict) or adapter.get("format") != ADAPTER_FORMAT:
        raise TypeError(f"{name} 应是 load_adapter / adapter_from_model 返回的适配器字典，收到 {type(adapter).__name__}")
    config = getattr(model, "config", None)
    if config is None or not hasattr(config, "to_dict"):
        raise TypeError(f"model 应是带 LMConfig 的语言模型，收到 {type(model).__name__}")
    ours, theirs = config.to_dict(), adapter["base_config"]
    differ = sorted(k for k in set(ours) | set(theirs) if ours.get(k) != theirs.get(k) and k != "fast_attention")
    if differ:
        shown = "、".join(f"{k}（模型 {ours.get(k)!r}，适配器 {theirs.get(k)!r}）" for k in differ[:4])
        raise ValueError(f"{name} 是为另一个底座训练的，配置不同：{shown}")


def apply_adapter(model: nn.Module, adapter: dict) -> nn.Module:
    """在浮点底座 ``model`` 上原地加 LoRA（秩、α、目标取自适配器）并填入 A、B；返回 ``model``。"""
    check_adapter_fits(model, adapter)
    apply_lora(model, adapter["rank"], adapter["alpha"], targets=tuple(adapter["targets"]))
    layers = _lora_layers(model)
    want = {f"{name}.{p}" for name in layers for p in ("lora_A", "lora_B")}
    state = adapter["state"]
    if set(state) != want:
        extra, missing = sorted(set(state) - want), sorted(want - set(state))
        raise CheckpointError(f"适配器的张量与模型的 LoRA 层对不上：多出 {extra[:3]}，缺少 {missing[:3]}")
    with torch.no_grad():
        for name, module in layers.items():
            for p in ("lora_A", "lora_B"):
                value = state[f"{name}.{p}"]
                target = getattr(module, p)
                if not isinstance(value, torch.Tensor) or value.shape != target.shape:
                    raise CheckpointError(f"适配器的 {name}.{p} 形状是 {tuple(getattr(value, 'shape', ()))}，"
                                          f"模型要 {tuple(target.shape)}")
                target.copy_(value)
    return model
