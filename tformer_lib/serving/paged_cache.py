"""分页 K/V 缓存（paged KV cache）：把缓存切成固定大小的块（block），每条序列一张块表（block table）。

连续缓存（contiguous cache）要为每条序列预留到最大长度，序列短时大半空着；分页缓存按需一块一块地分配，
序列结束就把块还回去，每条序列最多浪费不满的最后一块。提示前缀相同的序列还能**共用**已经写满的块
（前缀缓存 prefix caching），共用的块只算一次。三样东西各在一处（与 nano-vllm 的分工相同）：

- 账本 :class:`~.block_manager.BlockManager`（:mod:`.block_manager`）：空闲块、块表、引用计数、前缀块的查找表；
- 存储 :class:`PagedKVCache`（本模块）：每层一个 ``(num_blocks·block_size + 1, h_kv, d_k)`` 的 K 与 V，
  “槽位”（slot）= 块号 × block_size + 块内偏移，最后一个是草稿槽；
- 给模型的输入（:mod:`.paged_inputs`）：:meth:`PagedKVCache.decode_view` 与 :meth:`PagedKVCache.packed_view`
  给一批序列造一个 :class:`~tformer_lib.lm.LMCache` 的视图、位置与掩码，模型照常调用它。
"""

from __future__ import annotations

import torch

from .._checks import language_model, positive_int
from ..lm.cache import LMCache
from .block_manager import BlockManager, OutOfBlocksError
from .paged_inputs import decode_inputs, packed_inputs

__all__ = ["BlockManager", "PagedKVCache", "OutOfBlocksError"]


class PagedKVCache:
    """按块存放的 K/V（所有层），配一个 :class:`~.block_manager.BlockManager`。

    ``num_blocks``：块数；``None`` 时取放得下 ``sequences`` 条满长（``max_len``）序列的块数。
    """

    def __init__(self, model, num_blocks: int | None, block_size: int = 16, prefix_caching: bool = True, *,
                 sequences: int = 1):
        c = language_model("model", model).config
        block_size = positive_int("block_size", block_size)
        if num_blocks is None:
            num_blocks = positive_int("sequences", sequences) * -(-c.max_len // block_size)
        self.manager = BlockManager(num_blocks, block_size, prefix_caching)
        self.max_len = c.max_len
        dtype = next(model.parameters()).dtype
        device = next(model.parameters()).device
        # 块里的槽位之后多留一个草稿槽（scratch slot）：固定形状的解码步里空着的行把 K/V 写到这里，不碰任何块
        self.scratch_slot = num_blocks * block_size
        shape = (num_blocks * block_size + 1, c.kv_heads, c.d_k)  # (槽位, h_kv, d_k)
        self.k = [self._new_store(shape, dtype, device) for _ in range(c.n_layers)]
        self.v = [self._new_store(shape, dtype, device) for _ in range(c.n_layers)]
        # K 与 V、每层、一块的字节（不算草稿槽）
        self.bytes_per_block = 2 * c.n_layers * self.k[0].nbytes // shape[0] * block_size

    def _new_store(self, shape, dtype, device) -> torch.Tensor:
        """一层的 K（或 V）存储 ``(槽位, h_kv, d_k)``。子类可以换成别的格式（int8 见 :mod:`tformer_lib.quant.kv_cache`）。"""
        return torch.zeros(shape, dtype=dtype, device=device)

    def held_bytes(self) -> int:
        """此刻真正被占用的缓存字节数（已分配的块 × 每块字节）。"""
        return self.manager.used_blocks * self.bytes_per_block

    def decode_view(self, seq_ids: list[int]) -> tuple[LMCache, torch.Tensor, torch.Tensor]:
        """解码步：每条序列写 1 个新位置，返回 ``(cache, positions (B, 1), attn_mask)``（见 :func:`.paged_inputs.decode_inputs`）。"""
        return decode_inputs(self, seq_ids)

    def packed_view(self, seq_ids: list[int], n_new: list[int]) -> tuple[LMCache, torch.Tensor, torch.Tensor, torch.Tensor]:
        """一次前向写第 b 条序列的 ``n_new[b]`` 个新位置，新词元排成一行 ``(1, N)``：返回
        ``(cache, positions, attn_mask, last)``（见 :func:`.paged_inputs.packed_inputs`）。"""
        return packed_inputs(self, seq_ids, n_new)
