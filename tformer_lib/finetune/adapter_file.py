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

import io
import os
from pathlib import Path

import torch
from torch import nn

from ..quant.linear import Int4Linear, Int8Linear
from ..quant.quantize import quantize_model
from ..training.checkpoint import CheckpointError, atomic_torch_save
from .lora import QUANTIZED_BASES, LoRALinear, apply_lora, check_lora_hyperparameters, check_no_lora, check_targets

__all__ = ["ADAPTER_FORMAT", "ADAPTER_VERSION", "adapter_from_model", "save_adapter", "load_adapter",
           "check_adapter_fits", "quantize_base_for", "apply_adapter"]

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


def _check_extra(extra) -> dict:
    """``extra`` 是 ``None`` 或字典，而且每一项都能被 ``torch.load(weights_only=True)`` 读回
    （数字、字符串、列表、字典、张量……；NumPy 标量、Path、自定义对象不行）：否则存下的文件读不回来。"""
    if extra is None:
        return {}
    if not isinstance(extra, dict):
        raise TypeError(f"extra 应是字典（或 None），收到 {type(extra).__name__}")
    for key, value in extra.items():
        buffer = io.BytesIO()
        try:
            torch.save({key: value}, buffer)
            buffer.seek(0)
            torch.load(buffer, weights_only=True)
        except Exception:
            raise TypeError(f"extra[{key!r}] 是 {type(value).__name__}，weights_only 读不回来；"
                            "请换成 Python 的数字、字符串、列表、字典或张量（如 float(x)、str(path)）") from None
    return dict(extra)


def adapter_from_model(model: nn.Module, extra: dict | None = None) -> dict:
    """把加了 LoRA 的模型的支路取成适配器字典（张量是副本）。各层的秩与 α 必须相同；``extra`` 见 :func:`_check_extra`。"""
    extra = _check_extra(extra)
    if not isinstance(model, nn.Module):
        raise TypeError(f"model 应是加了 LoRA 的 nn.Module，收到 {type(model).__name__}")
    layers = _lora_layers(model)
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
        "extra": extra,
    }


def save_adapter(path: str | os.PathLike, model: nn.Module, extra: dict | None = None) -> Path:
    """原子地把 ``model`` 的 LoRA 支路存成适配器文件（:func:`adapter_from_model`），返回路径。"""
    return atomic_torch_save(adapter_from_model(model, extra), path)


def _fields_problem(adapter: dict) -> str | None:
    """适配器字典缺了哪个字段、哪个超参数不合法（:func:`load_adapter` 与 :func:`check_adapter_fits` 共用）；都对时 ``None``。"""
    missing = [k for k in ("rank", "alpha", "targets", "base_config", "state") if k not in adapter]
    if missing:
        return f"缺少字段 {missing}，不完整"
    try:
        check_lora_hyperparameters(adapter["rank"], adapter["alpha"], 0.0)
        check_targets(adapter["targets"])
    except (TypeError, ValueError) as exc:
        return f"的超参数不对：{exc}"
    return None


def load_adapter(path: str | os.PathLike) -> dict:
    """读适配器文件（``weights_only=True``）并检查格式；文件不对时抛出一行的 :class:`~tformer_lib.training.checkpoint.CheckpointError`。"""
    path = Path(path)
    if path.is_dir():
        raise IsADirectoryError(f"{str(path)!r} 是目录，不是适配器文件（lm-finetune --adapter-out 写的 .pt 文件）")
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
    problem = _fields_problem(data)
    if problem:
        raise CheckpointError(f"{str(path)!r} {problem}")
    return data


def _is_float_format(fmt: str) -> bool:
    return not fmt.startswith("int")


def _target_layers(model: nn.Module, targets: tuple[str, ...]) -> dict[str, nn.Module]:
    """``{模块名: 线性层}``：属性名在 ``targets`` 里的线性层（浮点或量化的），同一层经两条路径到达时只记第一条
    （与 :func:`apply_lora` 之后 :func:`_lora_layers` 的命名相同）。"""
    return {name: m for name, m in model.named_modules()
            if name.rsplit(".", 1)[-1] in targets and isinstance(m, (nn.Linear, *QUANTIZED_BASES))}


def check_adapter_fits(model: nn.Module, adapter: dict, name: str = "adapter") -> None:
    """在动 ``model`` 之前查完：``adapter`` 是完整的适配器字典（秩、α、目标合法），底座配置与 ``model`` 的相同，
    底座格式对得上（QLoRA 的支路是对着量化底座学的：``base_format`` 为整数格式时，``model`` 的目标层必须是同一格式，
    见 :func:`quantize_base_for`），张量的名字与形状与 ``model`` 的目标层一一对应。出错时指名是哪一项。"""
    if not isinstance(adapter, dict) or adapter.get("format") != ADAPTER_FORMAT:
        raise TypeError(f"{name} 应是 load_adapter / adapter_from_model 返回的适配器字典，收到 {type(adapter).__name__}")
    problem = _fields_problem(adapter)
    if problem:
        raise ValueError(f"{name} {problem}")
    targets = tuple(adapter["targets"])
    if not isinstance(adapter["base_config"], dict) or not isinstance(adapter["state"], dict):
        raise ValueError(f"{name} 的 base_config 与 state 应是字典")
    config = getattr(model, "config", None)
    if not isinstance(model, nn.Module) or config is None or not hasattr(config, "to_dict"):
        raise TypeError(f"model 应是带 LMConfig 的语言模型，收到 {type(model).__name__}")
    ours, theirs = config.to_dict(), adapter["base_config"]
    differ = sorted(k for k in set(ours) | set(theirs) if ours.get(k) != theirs.get(k) and k != "fast_attention")
    if differ:
        shown = "、".join(f"{k}（模型 {ours.get(k)!r}，适配器 {theirs.get(k)!r}）" for k in differ[:4])
        raise ValueError(f"{name} 是为另一个底座训练的，配置不同：{shown}")
    layers = _target_layers(model, targets)
    wanted = adapter.get("base_format", "fp32")
    have = sorted({_base_format(m) for m in layers.values()})
    if any(not (_is_float_format(f) and _is_float_format(wanted)) and f != wanted for f in have):
        fix = (f"先 quantize_base_for(model, [adapter])（即 quantize_model(model, {wanted!r})）再装"
               if _is_float_format(have[0]) else "请从浮点的底座开始")
        raise ValueError(f"{name} 是对着 {wanted} 的底座训练的，model 的目标层是 {'、'.join(have)}：{fix}"
                         "（换了底座的格式，支路学到的修正就不再对应训练时的那个函数）")
    r = adapter["rank"]
    want = {f"{n}.{p}": shape for n, m in layers.items()
            for p, shape in (("lora_A", (r, m.in_features)), ("lora_B", (m.out_features, r)))}
    state = adapter["state"]
    if set(state) != set(want):
        extra, absent = sorted(set(state) - set(want)), sorted(set(want) - set(state))
        raise CheckpointError(f"{name} 的张量与模型的目标层对不上：多出 {extra[:3]}，缺少 {absent[:3]}")
    for key, shape in want.items():
        value = state[key]
        if not isinstance(value, torch.Tensor) or tuple(value.shape) != shape:
            raise CheckpointError(f"{name} 的 {key} 形状是 {tuple(getattr(value, 'shape', ()))}，模型要 {shape}")


def quantize_base_for(model: nn.Module, adapters) -> nn.Module:
    """``adapters``（适配器字典的列表）若是对着整数格式的底座训练的（QLoRA），先把浮点的 ``model`` 原地量化成同一格式
    （:func:`~tformer_lib.quant.quantize_model`），这样装上支路后算的就是训练时的那个函数；返回 ``model``。
    适配器的底座格式不一致时报错（同一个底座只能是一种格式；浮点格式之间不转换，fp32 与 bf16 的支路都装在浮点底座上）。"""
    if isinstance(adapters, (dict, str, bytes)) or not hasattr(adapters, "__iter__"):
        raise TypeError(f"adapters 应是适配器字典的列表（一个也要放进列表：[adapter]），收到 {type(adapters).__name__}")
    adapters = list(adapters)
    for i, a in enumerate(adapters):
        if not isinstance(a, dict) or a.get("format") != ADAPTER_FORMAT or not isinstance(a.get("base_format", "fp32"), str):
            raise TypeError(f"adapters[{i}] 应是 load_adapter / adapter_from_model 返回的适配器字典，收到 {type(a).__name__}")
    if not isinstance(model, nn.Module):
        raise TypeError(f"model 应是 nn.Module，收到 {type(model).__name__}")
    formats = {a.get("base_format", "fp32") for a in adapters}
    quantized = sorted(f for f in formats if not _is_float_format(f))
    if len(quantized) > 1 or (quantized and len(formats) > 1):
        raise ValueError(f"这些适配器的底座格式不同：{sorted(formats)}；一个底座只能是一种格式")
    if quantized and not any(isinstance(m, QUANTIZED_BASES) for m in model.modules()):
        quantize_model(model, quantized[0])
    return model


def apply_adapter(model: nn.Module, adapter: dict) -> nn.Module:
    """在底座 ``model`` 上原地加 LoRA（秩、α、目标取自适配器）并填入 A、B；返回 ``model``。

    ``model`` 的格式要与训练时的底座相同（浮点，或 QLoRA 的同一整数格式，:func:`quantize_base_for`）；
    一切检查（:func:`check_adapter_fits`）都在改动模型之前做完，出错时 ``model`` 原样不动。"""
    check_no_lora(model)
    check_adapter_fits(model, adapter)
    apply_lora(model, adapter["rank"], adapter["alpha"], targets=tuple(adapter["targets"]))
    state = adapter["state"]
    with torch.no_grad():
        for name, module in _lora_layers(model).items():
            for p in ("lora_A", "lora_B"):
                getattr(module, p).copy_(state[f"{name}.{p}"])
    return model
