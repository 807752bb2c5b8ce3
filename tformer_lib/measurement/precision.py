r"""混合精度（mixed precision）：三种浮点格式、bf16 自动混合精度（autocast），以及 fp16 失败的两种方式与损失缩放。

=========  ======  ======  ===============  =====================  ============
格式        指数位    尾数位    最大值             最小正规数（下溢界）        机器精度 ε
=========  ======  ======  ===============  =====================  ============
float32     8       23      3.4·10³⁸          1.2·10⁻³⁸               1.2·10⁻⁷
bfloat16    8       7       3.4·10³⁸          1.2·10⁻³⁸               7.8·10⁻³
float16     5       10      65504             6.1·10⁻⁵（次正规到 6·10⁻⁸）  9.8·10⁻⁴
=========  ======  ======  ===============  =====================  ============

（表中数字由 :func:`float_formats` 从 ``torch.finfo`` 现算。）bfloat16 保留了 float32 的指数范围、牺牲精度，
所以几乎不会上溢或下溢；float16 精度更高但范围窄：大的激活会**上溢**成 inf（:func:`fp16_overflow`），
小的梯度会**下溢**成 0（:func:`gradient_underflow`）。后者的补救是损失缩放（loss scaling）：
把损失乘以 S（如 2¹⁶）再反向，梯度整体放大 S 倍躲开下溢区，更新前再在 float32 里除回去——
``torch.amp.GradScaler`` 做的就是这件事，并在出现 inf 时跳过这一步、减小 S。
"""

from __future__ import annotations

import copy

import contextlib
import math

import torch
import torch.nn.functional as F
from torch import nn

__all__ = [
    "DTYPES",
    "float_formats",
    "autocast",
    "fp16_overflow",
    "gradient_underflow",
    "compare_autocast_training",
]

#: 名字 → dtype
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def _dtype(name: str) -> torch.dtype:
    if name not in DTYPES:
        raise ValueError(f"dtype 应是 {tuple(DTYPES)} 之一，收到 {name!r}")
    return DTYPES[name]


def float_formats() -> dict[str, dict[str, float]]:
    """每种格式的位数与范围：``bits``、``exponent_bits``、``mantissa_bits``、``max``、``tiny``（最小正规数）、
    ``smallest_subnormal``、``eps``，都由 ``torch.finfo`` 得出。"""
    out = {}
    for name, dtype in DTYPES.items():
        info = torch.finfo(dtype)
        mantissa = -round(math.log2(info.eps))  # ε = 2^(-尾数位)
        out[name] = {
            "bits": info.bits,
            "exponent_bits": info.bits - 1 - mantissa,
            "mantissa_bits": mantissa,
            "max": float(info.max),
            "tiny": float(info.tiny),
            "smallest_subnormal": float(info.smallest_normal * info.eps),
            "eps": float(info.eps),
        }
    return out


def autocast(device_type: str | torch.device = "cpu", dtype: str = "bf16", enabled: bool = True):
    """``torch.autocast`` 的薄包装：``dtype`` 用名字（"bf16"/"fp16"），``"fp32"`` 或 ``enabled=False`` 时什么也不做。

    在它里面，矩阵乘法等算子以 16 位计算；哪些算子升回 float32 由 PyTorch 的 autocast 算子表决定，CPU 与 CUDA
    不同：CUDA 上 softmax、交叉熵、归一化等对精度敏感的算子用 float32；CPU 上交叉熵用 float32，而 softmax、
    LayerNorm、GELU 的输出仍是 bfloat16（第 11 章打印了这张对照）。参数本身保持 float32。
    """
    dt = _dtype(dtype)
    device_type = torch.device(device_type).type
    if not enabled or dt == torch.float32:
        return contextlib.nullcontext()
    return torch.autocast(device_type, dtype=dt)


def fp16_overflow(value: float = 40.0, d_k: int = 64) -> dict[str, dict[str, float | bool]]:
    r"""上溢：两个分量都是 ``value`` 的 ``d_k`` 维向量做点积（注意力分数 :math:`q\cdot k`），
    结果 ``value²·d_k``（默认 102400）超过 float16 的最大值 65504 就成了 inf，softmax 随之给出 NaN。

    返回每种格式的 ``score``（点积结果）、``finite`` 与 ``softmax_nan``（把这个分数与一个 0 分数一起做 softmax）。
    改用 bfloat16 能避免它；先除以 √d_k 再相乘（本书注意力的做法是乘后再除）只把上限放宽 √d_k 倍（第 11 章练习 4）。
    """
    out = {}
    for name, dtype in DTYPES.items():
        q = torch.full((d_k,), float(value), dtype=dtype)
        k = torch.full((d_k,), float(value), dtype=dtype)
        score = q @ k  # 0 维：value² · d_k
        weights = torch.stack([score, torch.zeros((), dtype=dtype)]).softmax(dim=0)  # (2,)
        out[name] = {"score": float(score), "finite": bool(torch.isfinite(score)),
                     "softmax_nan": bool(weights.isnan().any())}
    return out


def gradient_underflow(
    model: nn.Module, tokens: torch.Tensor, targets: torch.Tensor, loss_scale: float = 2.0**16, pad_id: int = 0
) -> dict[str, dict[str, float]]:
    r"""下溢：语言模型对 logits 的梯度是 :math:`(p_j - [j = y])/n`（n = 目标词元数），训练好的模型里
    大多数 :math:`p_j` 很小，除以 n 后常低于 float16 能表示的 6·10⁻⁸，于是变成 0。

    在同一批数据上算四次梯度：``fp32``（参照）、``fp16``（autocast）、``fp16+scaler``（autocast + 
    ``torch.amp.GradScaler(init_scale=loss_scale)``）与 ``bf16``；每种返回

    * ``logit_grad_zero``：非 PAD 位置上 logits 梯度恰为 0 的比例；
    * ``param_grad_zero``：参数梯度恰为 0 的比例；
    * ``extra_zero``：多出来的恰为 0 的参数梯度——这里为 0、而 float64 参照里不为 0 的比例。
      批里没出现的字的嵌入行在任何精度下都恰为 0（结构性的零），它们不算；float32 自己偶尔也会因相消
      得到几个 0（随 CPU 指令集而变），在 float64 里不会，所以用 float64 作参照，这个比例在各种 CPU 上都稳定；
    * ``rel_error``：参数梯度与 fp32 的相对误差 :math:`\lVert g - g_{32}\rVert / \lVert g_{32}\rVert`；
    * ``loss``：损失。

    函数会清空并改写 ``model`` 的 ``.grad``，不更新参数。
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model 应是 nn.Module，收到 {type(model).__name__}")
    if not (isinstance(loss_scale, (int, float)) and loss_scale > 0):
        raise ValueError(f"loss_scale 应为正数，收到 {loss_scale!r}")
    device_type = next(model.parameters()).device.type
    keep = (targets != pad_id).flatten()  # (B·T,)
    twin = copy.deepcopy(model).double()  # float64 参照：哪些参数梯度“本该”不为 0
    F.cross_entropy(twin(tokens).flatten(0, 1), targets.flatten(), ignore_index=pad_id).backward()
    nonzero64 = torch.cat([p.grad.flatten() for p in twin.parameters()]) != 0
    del twin
    results, reference = {}, None
    for mode in ("fp32", "fp16", "fp16+scaler", "bf16"):
        model.zero_grad(set_to_none=True)
        captured = {}
        with autocast(device_type, mode.split("+")[0]):
            logits = model(tokens)  # (B, T, V)
        logits.register_hook(lambda g: captured.__setitem__("grad", g))
        loss = F.cross_entropy(logits.float().flatten(0, 1), targets.flatten(), ignore_index=pad_id)
        if mode == "fp16+scaler":
            scaler = torch.amp.GradScaler(device_type, init_scale=float(loss_scale))
            scaler.scale(loss).backward()  # 反向的是 S·loss
            scaler.unscale_(torch.optim.SGD(model.parameters(), lr=0.0))  # 在 float32 里除回 S
        else:
            loss.backward()
        grads = torch.cat([p.grad.flatten() for p in model.parameters()])
        if reference is None:
            reference = grads
        logit_grad = captured["grad"].flatten(0, 1)[keep]  # (非 PAD 数, V)
        results[mode] = {
            "loss": float(loss.detach()),
            "logit_grad_zero": float((logit_grad == 0).float().mean()),
            "param_grad_zero": float((grads == 0).float().mean()),
            "extra_zero": float(((grads == 0) & nonzero64).float().mean()),
            "rel_error": float((grads - reference).norm() / reference.norm()),
        }
    model.zero_grad(set_to_none=True)
    return results


def compare_autocast_training(steps: int = 30, modes=("fp32", "bf16"), seed: int = 0, batch_size: int = 8,
                              **model_overrides) -> dict[str, list[float]]:
    """在唐诗数据上从同一初始化各训 ``steps`` 步（每种 ``modes`` 一次，``LMTrainer(autocast=…)``），返回每步损失。

    ``model_overrides`` 替换配方里的模型配置（测试用更小的模型）。学习率调度按 ``steps`` 的全长。
    """
    from ..lm.model import make_lm
    from ..lm.pretrained import POEM_RECIPE, poem_data, poem_model_config
    from ..lm.training import LMTrainer

    data = poem_data()
    out = {}
    for mode in modes:
        _dtype(mode)
        torch.manual_seed(seed)
        model = make_lm(poem_model_config(data["tokenizer"].vocab_size, **model_overrides))
        trainer = LMTrainer(
            model, data["train_blocks"], batch_size=batch_size, lr=POEM_RECIPE["lr"], warmup=max(1, steps // 5),
            total_steps=steps, seed=seed, autocast=None if mode == "fp32" else mode, progress=False,
        )
        trainer.fit()
        out[mode] = list(trainer.history["step_loss"])
    return out
