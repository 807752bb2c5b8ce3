"""分页缓存给模型的输入：一步要写的槽位、要收集的槽位、每个新词元的位置与注意力掩码。

账本（:mod:`.block_manager`）说每条序列的块在哪里，存储（:mod:`.paged_cache`）存着 K/V；这里把两者翻译成
模型认识的 ``(cache, positions, attn_mask)``，模型照常调用（它只见到一个 :class:`~tformer_lib.lm.LMCache`）：

- :func:`decode_inputs`：解码步，每条序列 1 个新词元，排成 ``(B, 1)``；
- :func:`packed_inputs`：有预填充的步，所有新词元首尾相接排成一行 ``(1, N)``，不补齐。

真实的推理引擎用专门的注意力内核直接按块表读块；这里为了复用本书唯一的注意力实现，每步把一批序列的
K/V 按块表 *收集*（gather）成临时的连续张量再做注意力——算出的结果相同，省下的是**长期持有**的内存。
"""

from __future__ import annotations

import torch

from .._checks import positive_int
from ..lm.cache import LMCache
from ..parts.kv_cache import AttentionCache

__all__ = ["PagedLayer", "decode_inputs", "packed_inputs"]


class PagedLayer(AttentionCache):
    """一层注意力眼中的分页缓存：``update`` 把新 K/V 写进槽位，再按块表收集出整批的 K/V。"""

    def __init__(self, store_k, store_v, write_slots, read_slots):
        super().__init__(static=False)
        self.store_k, self.store_v = store_k, store_v
        self.write_slots, self.read_slots = write_slots, read_slots  # (B·T_new,), (B, T_k)

    def key_length(self, new: int) -> int:
        """:meth:`update` 按块表收集 ``read_slots`` 列出的位置：T_k 是它的列数。"""
        return self.read_slots.shape[1]

    def cached_length(self) -> int:
        """各序列已缓存的长度各不相同（在块表里）：调用者要显式给出位置。"""
        raise ValueError("分页缓存里各序列的长度不同：请给 MultiHeadAttention 显式的 positions")

    def update(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        batch, heads, length, d_k = k.shape
        flat_k = k.transpose(1, 2).reshape(batch * length, heads, d_k)  # (B·T_new, h_kv, d_k)
        flat_v = v.transpose(1, 2).reshape(batch * length, heads, d_k)  # (B·T_new, h_kv, d_k)
        self.store_k.index_copy_(0, self.write_slots, flat_k.to(self.store_k.dtype))
        self.store_v.index_copy_(0, self.write_slots, flat_v.to(self.store_v.dtype))
        shape = (*self.read_slots.shape, heads, d_k)  # (B, T_k, h_kv, d_k)
        full_k = self.store_k.index_select(0, self.read_slots.flatten()).view(shape).transpose(1, 2)  # (B, h_kv, T_k, d_k)
        full_v = self.store_v.index_select(0, self.read_slots.flatten()).view(shape).transpose(1, 2)  # (B, h_kv, T_k, d_k)
        return full_k.to(k.dtype), full_v.to(v.dtype)


class _PackedLayer(AttentionCache):
    """打包（packed）布局下一层的分页缓存：一步里所有序列的新词元排成一行 ``(1, N)``，没有填充。

    ``update`` 把 N 个新 K/V 写进各自的槽位，再一次收集 ``read_slots`` = [各序列已缓存的位置, 本步的 N 个新位置]。
    """

    def __init__(self, store_k, store_v, write_slots, read_slots):
        super().__init__(static=False)
        self.store_k, self.store_v = store_k, store_v
        self.write_slots, self.read_slots = write_slots, read_slots  # (N,), (T_k,)

    def key_length(self, new: int) -> int:
        """:meth:`update` 收集 ``read_slots`` 列出的位置：T_k 是它的长度。"""
        return self.read_slots.shape[0]

    def cached_length(self) -> int:
        """打包的一行里混着几条序列：调用者要显式给出位置。"""
        raise ValueError("打包的分页缓存里混着几条序列：请给 MultiHeadAttention 显式的 positions")

    def update(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        flat_k = k[0].transpose(0, 1)  # (N, h_kv, d_k)
        flat_v = v[0].transpose(0, 1)  # (N, h_kv, d_k)
        self.store_k.index_copy_(0, self.write_slots, flat_k.to(self.store_k.dtype))
        self.store_v.index_copy_(0, self.write_slots, flat_v.to(self.store_v.dtype))
        full_k = self.store_k.index_select(0, self.read_slots).transpose(0, 1)[None]  # (1, h_kv, T_k, d_k)
        full_v = self.store_v.index_select(0, self.read_slots).transpose(0, 1)[None]  # (1, h_kv, T_k, d_k)
        return full_k.to(k.dtype), full_v.to(v.dtype)



def check_batch(paged, seq_ids, n_new=None) -> None:
    """``seq_ids`` 是非空、不重复的列表，每条序列都已登记；``n_new``（默认每条 1 个）与它一样长、每项是正整数，
    写完不超过模型的上下文 ``max_len``。"""
    if not isinstance(seq_ids, (list, tuple)) or not seq_ids:
        raise ValueError(f"seq_ids 应是非空的列表，收到 {seq_ids!r:.40}")
    if len(set(seq_ids)) != len(seq_ids):
        raise ValueError(f"seq_ids 里有重复的序列：{list(seq_ids)!r:.60}（一条序列一步只能出现一次）")
    for s in seq_ids:
        paged.manager.table(s)
    n_new = [1] * len(seq_ids) if n_new is None else n_new
    if not isinstance(n_new, (list, tuple)) or len(seq_ids) != len(n_new):
        raise ValueError(f"n_new 应是与 seq_ids（{len(seq_ids)} 条）一样长的列表，收到 {n_new!r:.40}")
    for s, n in zip(seq_ids, n_new):
        positive_int("n_new 里每项（这一步要写的新位置数）", n)
        if paged.manager.lengths[s] + n > paged.max_len:
            raise ValueError(f"序列 {s} 已有 {paged.manager.lengths[s]} 个位置，再写 {n} 个就超过了模型的上下文 "
                             f"max_len={paged.max_len}")


def decode_inputs(paged, seq_ids: list[int]) -> tuple[LMCache, torch.Tensor, torch.Tensor]:
    """解码步：每条序列恰好写 1 个新位置。返回交给模型的 ``(cache, positions (B, 1), attn_mask (B, 1, 1, T_k))``，
    调用方把 B 个新词元排成 ``(B, 1)`` 送进模型。

    收集后的 K/V 长度 ``T_k = max(已缓存长度) + 1``，``cache.length = T_k − 1``：模型自带的因果掩码对每一行都不多挡，
    第 b 行只看见位置 ``≤ start_b`` 的键由 ``attn_mask`` 给出。
    """
    check_batch(paged, seq_ids)
    m, block = paged.manager, paged.manager.block_size
    starts = [m.lengths[s] for s in seq_ids]
    write = [m.append_slots(s, 1)[0] for s in seq_ids]
    width = max(starts) + 1
    n_blocks = -(-width // block)
    tables = torch.tensor([m.tables[s] + [0] * (n_blocks - len(m.tables[s])) for s in seq_ids])  # (B, n_blocks)
    # 位置 p 的槽位 = 块号 × block_size + p % block_size；超出各行长度的槽位无所谓，会被掩码挡住
    read = (tables[:, :, None] * block + torch.arange(block)).flatten(1)[:, :width]  # (B, T_k)
    start = torch.tensor(starts)  # (B,)
    valid = torch.arange(width)[None, :] <= start[:, None]  # (B, T_k)：只看见自己已缓存的位置与这个新位置
    device = paged.k[0].device
    write_slots, read = torch.tensor(write, device=device), read.to(device)  # (B,), (B, T_k)
    cache = LMCache(len(paged.k))
    cache.layers = [PagedLayer(k, v, write_slots, read) for k, v in zip(paged.k, paged.v)]
    cache.length = width - 1
    return cache, start[:, None].to(device), valid[:, None, None].to(device)  # (B, 1), (B, 1, 1, T_k)


def packed_inputs(paged, seq_ids: list[int], n_new: list[int]) -> tuple[LMCache, torch.Tensor, torch.Tensor, torch.Tensor]:
    """一步只做**一次**前向：第 b 条序列要写 ``n_new[b]`` 个新位置（解码 1 个，预填充整段提示），
    所有新词元首尾相接排成一行 ``(1, N)``、``N = sum(n_new)``，既不补齐，解码与预填充也能同批（与 Orca 一样把新词元拼成一行；Orca 的注意力按请求分开算，这里用同序列掩码）。

    返回 ``(cache, positions (1, N), attn_mask (1, 1, N, T_k), last (B,))``；``last[b]`` 是第 b 条最后一个新词元
    在这一行里的下标（取它的 logits 得到下一个词元）。收集出的键依次是各序列已缓存的位置（共 ``T_old`` 个），
    再接本步的 N 个新位置，``cache.length = T_old``：模型自带的因果掩码让第 j 个新词元只看见 ``≤ T_old + j`` 的键，
    ``attn_mask`` 再要求“键与查询属于同一条序列”——两者相与，恰好是每条序列各自的因果注意力。
    真实引擎的变长注意力内核（varlen / paged attention）按块表直接读块，不必把这个 (N, T_k) 掩码造出来。
    """
    check_batch(paged, seq_ids, n_new)
    m = paged.manager
    starts = [m.lengths[s] for s in seq_ids]
    write = [slot for s, n in zip(seq_ids, n_new) for slot in m.append_slots(s, n)]  # N 个新位置的槽位
    block, n_blocks = m.block_size, max(len(m.tables[s]) for s in seq_ids)
    tables = torch.tensor([m.tables[s] + [0] * (n_blocks - len(m.tables[s])) for s in seq_ids])  # (B, n_blocks)
    slots = (tables[:, :, None] * block + torch.arange(block)).flatten(1)  # (B, n_blocks·block)：每个位置的槽位
    start = torch.tensor(starts)  # (B,)
    old = slots[torch.arange(n_blocks * block)[None, :] < start[:, None]]  # (T_old,)：逐条序列、按位置排好
    owner = torch.arange(len(seq_ids))  # (B,)
    count = torch.tensor(n_new)  # (B,)
    query_seq = owner.repeat_interleave(count)  # (N,)：每个新词元属于哪条序列
    key_seq = torch.cat([owner.repeat_interleave(start), query_seq])  # (T_k,)
    last = count.cumsum(0) - 1  # (B,)
    first = last - count + 1  # (B,)：第 b 条的新词元从这一行的第 first[b] 个开始
    positions = (start - first).repeat_interleave(count) + torch.arange(len(query_seq))  # (N,)：start_b + i
    device = paged.k[0].device
    write_slots = torch.tensor(write)  # (N,)
    read_slots = torch.cat([old, write_slots]).to(device)  # (T_k,)
    write_slots = write_slots.to(device)
    cache = LMCache(len(paged.k))
    cache.layers = [_PackedLayer(k, v, write_slots, read_slots) for k, v in zip(paged.k, paged.v)]
    cache.length = len(old)
    mask = (query_seq[:, None] == key_seq[None, :])[None, None]  # (1, 1, N, T_k)
    return cache, positions[None].to(device), mask.to(device), last.to(device)
