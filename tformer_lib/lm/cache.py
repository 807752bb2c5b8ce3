"""语言模型的 K/V 缓存（KV cache）：每层一个自注意力缓存，只存 K/V 头 ``(B, n_kv_heads, T, d_k)``。

分组查询注意力（GQA）省下的正是这里的内存：缓存的大小与 ``n_kv_heads`` 成正比，而不是与查询头数 h。
"""

import torch

from .._checks import non_negative_int, positive_int
from ..parts.kv_cache import AttentionCache
from .config import LMConfig


class LMCache:
    """整个仅解码器模型的缓存：``layers[i]`` 是第 i 块自注意力的 :class:`~tformer_lib.AttentionCache`。

    ``length`` 是已写入的位置数，下一个词元的默认位置就是它。
    """

    def __init__(self, n_layers: int):
        self.layers = [AttentionCache(static=False) for _ in range(n_layers)]
        self.length = 0

    def __len__(self) -> int:
        return self.length

    def reorder(self, index: torch.Tensor) -> None:
        """按 ``index`` 重排（或挑选）批次维。"""
        for cache in self.layers:
            cache.reorder(index)

    def crop(self, length: int) -> None:
        """只保留前 ``length`` 个位置（例如推测解码 speculative decoding 拒绝草稿之后回退）。"""
        length = non_negative_int("length", length)
        if length > self.length:
            raise ValueError(f"length 应是 [0, {self.length}] 内的整数，收到 {length!r}")
        for cache in self.layers:
            if cache.k is not None:
                cache.k = cache.k[:, :, :length]  # (B, h_kv, length, d_k)
                cache.v = cache.v[:, :, :length]  # (B, h_kv, length, d_k)
        self.length = length

    def nbytes(self) -> int:
        """缓存的 K 与 V 一共占多少字节。"""
        return sum(t.numel() * t.element_size() for c in self.layers for t in (c.k, c.v) if t is not None)


def lm_kv_cache_bytes_per_token(config: LMConfig, bytes_per_element: int = 4) -> int:
    """一条序列每多缓存一个词元，:class:`LMCache` 增加的字节数（只看配置，不必建模型）：

    每块存一份 K 与一份 V，各 ``n_kv_heads · d_k`` 个数：``2 · N · n_kv_heads · d_k · bytes``。
    与 ``LMCache.nbytes() / 词元数`` 逐字节相等（测试保证）；GQA 省下的正是 ``n_heads / n_kv_heads`` 这个倍数。
    """
    if not isinstance(config, LMConfig):
        raise TypeError(f"config 应是 LMConfig，收到 {type(config).__name__}")
    positive_int("bytes_per_element", bytes_per_element)
    return 2 * config.n_layers * config.kv_heads * config.d_k * bytes_per_element  # K 与 V，各 (h_kv, d_k)
