"""推理到极限（第 14 章前半）：静态 K/V 缓存、编译的解码步、时间花在哪里、以及编译路径上的推测解码。

层次（只向下依赖 lm 与 serving）：static_cache → step → compiled → breakdown / floors → speculative。
"""

from .static_cache import StaticKVCache, StaticLayerCache
from .step import static_forward, static_positions_and_mask
from .compiled import StaticDecoder, generate_static

__all__ = ["StaticKVCache", "StaticLayerCache", "static_forward", "static_positions_and_mask",
           "StaticDecoder", "generate_static"]
