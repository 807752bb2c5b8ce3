"""引擎里每个请求自己的取词方式：贪心，或按温度（temperature）与 top-p 采样。

连续批处理的一批里，各行来自不同的请求，取词方式也各不相同：:func:`pick_tokens` 对贪心的行取 argmax，
对采样的行用**它自己的**随机数生成器（``torch.Generator``）抽一个词元。同一个种子、同一个提示，抽到的词元与
``generate(..., method="sample", generator=torch.Generator().manual_seed(seed))`` 相同（测试核对），
与它和谁同批无关。

温度很小（如 1e-40）时，``logits / temperature`` 会溢出成 inf，softmax 得到 NaN。这里先减去每行（屏蔽特殊词后）
的最大值再除以温度：最大者恒为 0，其余 ≤ 0，除以再小的温度也只会变成 −∞，于是温度 → 0 的极限正是贪心。
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from ..lm.generate import banned_ids, greedy_tokens, next_token_distribution

__all__ = ["Sampling", "pick_tokens"]


@dataclass(frozen=True)
class Sampling:
    """一个请求的取词方式。``temperature=0``（或 ``top_p=0``）为贪心；否则按温度与 top-p 采样。

    ``generator`` 是这个请求独用的随机数生成器（``torch.Generator().manual_seed(seed)`` 让结果可复现）；
    不给时用 PyTorch 的全局生成器。
    """

    temperature: float = 0.0
    top_p: float | None = None
    generator: torch.Generator | None = None

    def __post_init__(self):
        t = self.temperature
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not (math.isfinite(t) and t >= 0):
            raise ValueError(f"temperature 应是非负的有限数（0 = 贪心），收到 {t!r}")
        p = self.top_p
        if p is not None and (isinstance(p, bool) or not isinstance(p, (int, float)) or not 0 <= p <= 1):
            raise ValueError(f"top_p 应是 [0, 1] 内的数或 None（0 = 只留最可能的词元，即贪心），收到 {p!r}")
        if self.generator is not None and not isinstance(self.generator, torch.Generator):
            raise TypeError(f"generator 应是 torch.Generator 或 None，收到 {type(self.generator).__name__}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0 or self.top_p == 0


GREEDY = Sampling()


def pick_tokens(logits: torch.Tensor, samplings: Sequence[Sampling | None], suppress_ids: Sequence[int]) -> list[int]:
    """``logits`` ``(B, V)`` 的每一行按 ``samplings[b]``（``None`` = 贪心）取一个词元，返回 B 个 id。"""
    tokens = greedy_tokens(logits, suppress_ids).tolist()  # 同时检查了 logits 与 suppress_ids
    banned = banned_ids(suppress_ids, logits.shape[-1])
    for b, sampling in enumerate(samplings):
        if sampling is None or sampling.greedy:
            continue
        masked = logits[b : b + 1].float().clone()  # (1, V)
        masked[:, banned] = float("-inf")
        shifted = masked - masked.max(dim=-1, keepdim=True).values  # (1, V)：最大者为 0，除以小温度不会溢出
        row = next_token_distribution(shifted, sampling.temperature, None, sampling.top_p, ())  # (1, V)
        tokens[b] = int(torch.multinomial(row, 1, generator=sampling.generator))
    return tokens
