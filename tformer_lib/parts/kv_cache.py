"""K/V 缓存（KV cache）：增量解码时，已生成位置的键和值不必每步重算。"""

import torch

from .._checks import positive_int


class AttentionCache:
    """一个注意力模块的缓存。

    - 自注意力（``static=False``）：每步把新位置的 K、V 接到末尾；
    - 交叉注意力（``static=True``）：K、V 来自编码器输出，第一次算好后原样复用。
    """

    def __init__(self, static: bool = False):
        self.static = static
        self.k: torch.Tensor | None = None  # (B, h, T_cached, d_k)
        self.v: torch.Tensor | None = None  # (B, h, T_cached, d_k)

    def cached_length(self) -> int:
        """已缓存的位置数（自注意力里新位置的编号从这里接着数）。"""
        return 0 if self.k is None else self.k.shape[2]

    def key_length(self, new: int) -> int:
        """送来 ``new`` 个新位置时，:meth:`update` 将返回的键的个数 T_k（注意力在投影之前用它检查掩码）。"""
        positive_int("new", new)
        cached = self.cached_length()
        return cached if self.static and cached else cached + new

    def update(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """存入新的 K、V，返回这一步应使用的完整 K、V：自注意力时与旧的拼接；交叉注意力只存第一次的，之后原样返回。"""
        if self.k is not None:
            if self.static:
                return self.k, self.v  # (B, h, T_src, d_k)：编码器输出的 K、V 不变
            k = torch.cat([self.k, k], dim=2)  # (B, h, T_cached + T_new, d_k)
            v = torch.cat([self.v, v], dim=2)  # (B, h, T_cached + T_new, d_k)
        self.k, self.v = k, v
        return k, v

    def reorder(self, index: torch.Tensor) -> None:
        """按 ``index`` 重排批次维（束搜索 beam search 在每步挑选存活的候选时用）。"""
        if self.k is not None:
            self.k = self.k.index_select(0, index)
            self.v = self.v.index_select(0, index)


class KVCache:
    """整个解码器的缓存：每层一个自注意力缓存和一个交叉注意力缓存，外加已解码的长度。"""

    def __init__(self, n_layers: int):
        self.self_attn = [AttentionCache(static=False) for _ in range(n_layers)]
        self.cross_attn = [AttentionCache(static=True) for _ in range(n_layers)]
        self.length = 0  # 已写入缓存的目标位置数；下一个词元的位置就是它

    def reorder(self, index: torch.Tensor) -> None:
        """按 ``index`` 重排所有层缓存的批次维。"""
        for cache in (*self.self_attn, *self.cross_attn):
            cache.reorder(index)
