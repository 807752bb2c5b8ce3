"""采样温度（temperature）：``softmax(logits / T)``，以及它在 T → 0 时的极限——贪心（greedy）。

两条解码路径（编码器–解码器的 :func:`~tformer_lib.translation.decoding.sample_decode` 与语言模型的
:func:`~tformer_lib.lm.generate`）共用这里的约定：

* ``temperature=0`` 表示贪心：每步取分数最高的词（与 OpenAI 风格客户端的约定相同）；
* 很小的正温度（如 ``1e-40``）不会让 ``logits / T`` 溢出成 ±inf、再被 softmax 变成 NaN：
  先减去每行最大值再除以 T，分数最高的词得到 0、其余趋于 −∞，分布收敛到贪心的独热分布
  （并列第一的几个词平分概率，这正是 T → 0 的极限）。
"""

from __future__ import annotations

import math
import numbers

import torch

__all__ = ["check_temperature", "is_greedy_temperature", "apply_temperature"]


def check_temperature(name: str, value) -> float:
    """``value`` 应是 ≥ 0 的有限数（0 = 贪心）；返回 float。布尔值、负数、inf、NaN 报错。"""
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value) or value < 0:
        raise ValueError(f"{name} 应是 ≥ 0 的有限数（0 表示贪心），收到 {value!r}")
    return float(value)


def is_greedy_temperature(temperature: float, dtype: torch.dtype = torch.float32) -> bool:
    """温度为 0，或小到在 ``dtype`` 里就是 0（如 float32 的 1e-46）时，采样就是贪心。"""
    return float(torch.tensor(float(temperature), dtype=dtype)) == 0.0


def apply_temperature(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """返回 ``logits / temperature`` ``(..., V)``，对任何 ≥ 0 的温度都不含 NaN、不溢出成 +inf。

    ``temperature`` 为 0（或在 logits 的 dtype 里等于 0）时返回贪心的极限：每行只有第一个最大值为 0，其余为 −∞。
    温度很小、直接相除会溢出时，改为 ``(logits − 行最大值) / temperature``（softmax 不受平移影响，结果相同）。
    """
    temperature = check_temperature("temperature", temperature)
    if is_greedy_temperature(temperature, logits.dtype):
        best = logits.argmax(dim=-1, keepdim=True)  # (..., 1)
        out = torch.full_like(logits, float("-inf"))
        return out.scatter(-1, best, 0.0)  # (..., V) 只有最大者为 0
    scaled = logits / temperature
    if bool((torch.isinf(scaled) & torch.isfinite(logits)).any()):  # 温度太小：相除溢出
        scaled = (logits - logits.amax(dim=-1, keepdim=True)) / temperature  # 最大者为 0，其余 ≤ 0
    return scaled
