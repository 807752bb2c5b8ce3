"""分页 K/V 缓存（paged KV cache）：把缓存切成固定大小的块（block），每条序列一张块表（block table）。

连续缓存（contiguous cache）要为每条序列预留到最大长度，序列短时大半空着；分页缓存按需一块一块地分配，
序列结束就把块还回去，每条序列最多浪费不满的最后一块。提示前缀相同的序列还能**共用**已经写满的块
（前缀缓存 prefix caching），共用的块只算一次。

- :class:`BlockManager` 只管账：空闲块、每条序列的块表与长度、块的引用计数、前缀块的查找表；
- :class:`PagedKVCache` 管数据：每层一个 ``(num_blocks·block_size, h_kv, d_k)`` 的 K 与 V 存储，
  “槽位”（slot）= 块号 × block_size + 块内偏移；
- :meth:`PagedKVCache.view` 给一批序列造一个 :class:`~tformer_lib.lm.LMCache` 的视图，模型照常调用它。

说明：真实的推理引擎用专门的注意力内核直接按块表读块；这里为了复用本书唯一的注意力实现，每步把一批序列的
K/V 按块表 *收集*（gather）成临时的连续张量再做注意力——算出的结果相同，省下的是**长期持有**的内存。
"""

from __future__ import annotations

import torch

from .._checks import flag, language_model, non_negative_int
from ..lm.cache import LMCache
from ..parts.kv_cache import AttentionCache

__all__ = ["BlockManager", "PagedKVCache", "OutOfBlocksError"]


class OutOfBlocksError(RuntimeError):
    """没有足够的空闲块了（调度器据此让请求排队等待）。"""


class BlockManager:
    """块的账本。``block_size`` 个位置一块，共 ``num_blocks`` 块。"""

    def __init__(self, num_blocks: int, block_size: int, prefix_caching: bool = True):
        for name, value in (("num_blocks", num_blocks), ("block_size", block_size)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} 应为正整数，收到 {value!r}")
        flag("prefix_caching", prefix_caching)
        self.num_blocks, self.block_size, self.prefix_caching = num_blocks, block_size, prefix_caching
        self.free_blocks = list(range(num_blocks - 1, -1, -1))  # 栈：pop() 取块号最小的
        self.ref_count = [0] * num_blocks
        self.tables: dict[int, list[int]] = {}  # 序列 id → 块表
        self.lengths: dict[int, int] = {}  # 序列 id → 已写入的位置数
        self._prefix: dict[tuple, int] = {}  # 写满的前缀块：前缀词元（及命名空间）→ 块号（新请求共用的那一块）
        self._block_key: dict[int, tuple[int, ...]] = {}  # 登记过的块 → 前缀词元
        # 内容相同、但各自算出来的块（同一前缀的请求在共用之前已各算了一份）：登记的那块被释放时接替它
        self._spare: dict[tuple[int, ...], list[int]] = {}
        self._spare_key: dict[int, tuple[int, ...]] = {}

    # ---------------------------------------------------------------- 查询
    @property
    def used_blocks(self) -> int:
        """正被占用的块数（共用的块只算一次）。"""
        return self.num_blocks - len(self.free_blocks)

    def blocks_needed(self, n_tokens: int) -> int:
        """放下 ``n_tokens`` 个位置要几块。"""
        n_tokens = non_negative_int("n_tokens", n_tokens)
        return -(-n_tokens // self.block_size)

    def can_allocate(self, n_tokens: int) -> bool:
        return self.blocks_needed(n_tokens) <= len(self.free_blocks)

    def _table(self, seq_id: int) -> list[int]:
        if seq_id not in self.tables:
            raise KeyError(f"seq_id={seq_id!r} 没有登记（先 allocate，或它已经 free 了）；已登记的有 {sorted(self.tables)}")
        return self.tables[seq_id]

    def slot(self, seq_id: int, position: int) -> int:
        """序列 ``seq_id`` 的第 ``position`` 个位置在存储里的槽位号（``position`` 应落在已分配的块里）。"""
        capacity = len(self._table(seq_id)) * self.block_size
        if non_negative_int("position", position) >= capacity:
            raise ValueError(f"position={position} 超出了序列 {seq_id} 已分配的 {capacity} 个位置"
                             f"（{len(self.tables[seq_id])} 块 × {self.block_size}）")
        block = self.tables[seq_id][position // self.block_size]
        return block * self.block_size + position % self.block_size

    # ---------------------------------------------------------------- 分配与释放
    def _take_block(self) -> int:
        if not self.free_blocks:
            raise OutOfBlocksError(f"{self.num_blocks} 个块已全部占用")
        block = self.free_blocks.pop()
        self.ref_count[block] = 1
        return block

    @staticmethod
    def _key(prompt: list[int], n_tokens: int, namespace) -> tuple:
        """前缀块的键：前 ``n_tokens`` 个词元；``namespace``（如适配器名）不同的序列即使词元相同也不共用。"""
        tokens = tuple(prompt[:n_tokens])
        return tokens if namespace is None else (namespace, tokens)

    def allocate(self, seq_id: int, prompt: list[int], namespace=None) -> int:
        """为新序列登记块表并分配放下提示所需的块；返回可直接复用的前缀长度（这些位置不必再算）。

        只共用**写满**的块，而且至少留最后一个提示词元去计算（它的输出是第一个新词元的 logits）。
        ``namespace``：只与同一命名空间的前缀共用（不同的 LoRA 适配器算出的 K/V 不同）。
        """
        if seq_id in self.tables:
            raise ValueError(f"seq_id={seq_id} 已经登记过")
        if isinstance(prompt, (str, bytes)) or not hasattr(prompt, "__len__") or len(prompt) == 0:
            raise ValueError(f"prompt 应是非空的词元 id 列表，收到 {prompt!r:.40}")
        table: list[int] = []
        reused = 0
        if self.prefix_caching:
            for i in range((len(prompt) - 1) // self.block_size):
                block = self._prefix.get(self._key(prompt, (i + 1) * self.block_size, namespace))
                if block is None:
                    break
                table.append(block)
                reused += self.block_size
        fresh = self.blocks_needed(len(prompt)) - len(table)
        if fresh > len(self.free_blocks):
            raise OutOfBlocksError(f"序列 {seq_id} 需要 {fresh} 个新块，只剩 {len(self.free_blocks)} 个")
        for block in table:
            self.ref_count[block] += 1
        table += [self._take_block() for _ in range(fresh)]
        self.tables[seq_id], self.lengths[seq_id] = table, reused
        return reused

    def register_prefix(self, seq_id: int, prompt: list[int], namespace=None) -> None:
        """把序列 ``seq_id`` 的提示写满的块登记为可共用的前缀块。

        引擎在 :meth:`allocate` 之后、本步前向*之前*就登记：同一步里后接纳的同前缀请求也能共用。这是安全的，
        因为每一层都先把本步所有新 K/V 写进槽位、再按块表收集（见 :class:`_PackedLayer`），读到的已是本步写好的值。
        同一前缀已有登记块时，这条序列自己算出的那块记作“备用”：登记块被释放时由仍被占着的备用块接替，
        后来的请求照样能共用。
        """
        if not self.prefix_caching:
            return
        for i in range(len(prompt) // self.block_size):
            key = self._key(prompt, (i + 1) * self.block_size, namespace)
            block = self.tables[seq_id][i]
            if block in self._block_key or block in self._spare_key:
                continue  # 这块本来就是共用来的（或已登记）
            if key not in self._prefix:
                self._prefix[key], self._block_key[block] = block, key
            else:
                self._spare.setdefault(key, []).append(block)
                self._spare_key[block] = key

    def append_slots(self, seq_id: int, n_tokens: int) -> list[int]:
        """序列要再写 ``n_tokens`` 个位置：需要时分配新块，返回这些位置的槽位号。"""
        self._table(seq_id)
        non_negative_int("n_tokens", n_tokens)
        start = self.lengths[seq_id]
        missing = self.blocks_needed(start + n_tokens) - len(self.tables[seq_id])
        if missing > len(self.free_blocks):  # 先检查再分配：失败时不留下分了一半的块
            raise OutOfBlocksError(f"序列 {seq_id} 还要 {missing} 个块，只剩 {len(self.free_blocks)} 个")
        for _ in range(max(0, missing)):
            self.tables[seq_id].append(self._take_block())
        self.lengths[seq_id] = start + n_tokens
        return [self.slot(seq_id, p) for p in range(start, start + n_tokens)]

    def free(self, seq_id: int) -> None:
        """序列结束：引用计数减一，降到 0 的块回到空闲栈。

        回到空闲栈的块若登记为前缀块，登记转给一块内容相同、仍被占着的备用块（没有就作废）；只要还有序列
        持有这段前缀的块，后来的请求就能共用它。
        """
        if seq_id not in self.tables:
            raise KeyError(f"seq_id={seq_id} 没有登记（先 allocate，或它已经 free 了）")
        for block in self.tables.pop(seq_id):
            self.ref_count[block] -= 1
            if self.ref_count[block] == 0:
                self._forget(block)
                self.free_blocks.append(block)
        del self.lengths[seq_id]

    def _forget(self, block: int) -> None:
        """块 ``block`` 不再被任何序列引用：撤下它的前缀登记（由备用块接替）或备用记录。"""
        key = self._spare_key.pop(block, None)
        if key is not None:
            self._spare[key].remove(block)
            if not self._spare[key]:
                del self._spare[key]
            return
        key = self._block_key.pop(block, None)
        if key is None:
            return
        spares = self._spare.pop(key, None)
        if spares:
            heir = spares.pop(0)
            del self._spare_key[heir]
            self._prefix[key], self._block_key[heir] = heir, key
            if spares:
                self._spare[key] = spares
        else:
            del self._prefix[key]


class PagedLayer(AttentionCache):
    """一层注意力眼中的分页缓存：``update`` 把新 K/V 写进槽位，再按块表收集出整批的 K/V。"""

    def __init__(self, store_k, store_v, new_index, write_slots, read_slots):
        super().__init__(static=False)
        self.store_k, self.store_v = store_k, store_v
        self.new_index = new_index  # (N_new,)：(B·T_new) 展平后哪些是真实的新词元（其余是右侧填充）；None = 没有填充
        self.write_slots, self.read_slots = write_slots, read_slots  # (N_new,), (B, T_k)

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
        if self.new_index is not None:  # 去掉右侧填充
            flat_k = flat_k.index_select(0, self.new_index)  # (N_new, h_kv, d_k)
            flat_v = flat_v.index_select(0, self.new_index)  # (N_new, h_kv, d_k)
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


class PagedKVCache:
    """按块存放的 K/V（所有层），配一个 :class:`BlockManager`。"""

    def __init__(self, model, num_blocks: int, block_size: int = 16, prefix_caching: bool = True):
        c = language_model("model", model).config
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

    def _check_batch(self, seq_ids, n_new) -> None:
        """``seq_ids`` 与 ``n_new`` 一样长、非空，每条序列都已登记，每条至少写 1 个新位置。"""
        if not isinstance(seq_ids, (list, tuple)) or not isinstance(n_new, (list, tuple)) or not seq_ids:
            raise ValueError(f"seq_ids 与 n_new 应是非空的列表，收到 {seq_ids!r:.40} 与 {n_new!r:.40}")
        if len(seq_ids) != len(n_new):
            raise ValueError(f"seq_ids 有 {len(seq_ids)} 条，n_new 有 {len(n_new)} 项：两者必须一样多")
        for s in seq_ids:
            self.manager._table(s)
        for n in n_new:
            if isinstance(n, bool) or not isinstance(n, int) or n < 1:
                raise ValueError(f"n_new 里每项应是正整数（这一步要写的新位置数），收到 {n!r}")

    def held_bytes(self) -> int:
        """此刻真正被占用的缓存字节数（已分配的块 × 每块字节）。"""
        return self.manager.used_blocks * self.bytes_per_block

    def view(self, seq_ids: list[int], n_new: list[int]) -> tuple[LMCache, torch.Tensor, torch.Tensor]:
        """第 b 条序列要写 ``n_new[b]`` 个新位置（解码时 1 个，预填充时整段提示）：返回交给模型的
        ``(cache, positions, attn_mask)``。调用方把各行的新词元右侧补齐到 ``T_new = max(n_new)`` 再送进模型。

        收集后的 K/V 长度取 ``T_k = max(已缓存长度) + T_new``，``cache.length = T_k − T_new``，这样模型自带的
        因果掩码对每一行都不会多挡；真正的可见范围由 ``attn_mask`` ``(B, 1, T_new, T_k)`` 给出：
        第 b 行第 i 个新词元（位置 ``start_b + i``）只看见位置 ``≤ start_b + i`` 的键，填充处一律挡住。
        """
        self._check_batch(seq_ids, n_new)
        m = self.manager
        if max(n_new) == 1:
            return self._decode_view(seq_ids)
        starts = [m.lengths[s] for s in seq_ids]
        write = [m.append_slots(s, n) for s, n in zip(seq_ids, n_new)]
        t_new = max(n_new)
        width = max(starts) + t_new
        n_blocks = -(-width // m.block_size)
        tables = torch.tensor([m.tables[s] + [0] * (n_blocks - len(m.tables[s])) for s in seq_ids])  # (B, n_blocks)
        position = torch.arange(width)  # (T_k,)
        # 位置 p 在块 p // block_size 的第 p % block_size 格；超出各行长度的槽位无所谓，会被掩码挡住
        read = tables[:, position // m.block_size] * m.block_size + position % m.block_size  # (B, T_k)
        start = torch.tensor(starts)[:, None, None]  # (B, 1, 1)
        step = torch.arange(t_new)[None, :, None]  # (1, T_new, 1)
        real_query = step < torch.tensor(n_new)[:, None, None]  # (B, T_new, 1)
        valid = (torch.arange(width)[None, None, :] <= start + step) & real_query  # (B, T_new, T_k)
        device = self.k[0].device
        new_index = None  # 解码步每行都是 1 个新词元：没有填充，不必挑
        if min(n_new) < t_new:
            new_index = torch.tensor([b * t_new + i for b, n in enumerate(n_new) for i in range(n)]).to(device)  # (N_new,)
        write_slots = torch.tensor([slot for row in write for slot in row], device=device)  # (N_new,)
        read = read.to(device)
        cache = LMCache(len(self.k))
        cache.layers = [PagedLayer(k, v, new_index, write_slots, read) for k, v in zip(self.k, self.v)]
        cache.length = width - t_new
        positions = (start[:, :, 0] + step[:, :, 0]).clamp(max=self.max_len - 1)  # (B, T_new)；填充处截在上下文内
        return cache, positions.to(device), valid[:, None].to(device)

    def _decode_view(self, seq_ids: list[int]) -> tuple[LMCache, torch.Tensor, torch.Tensor]:
        """:meth:`view` 在解码步（每条序列恰好 1 个新位置）的写法：没有填充，张量运算少一半，结果相同。"""
        m, block = self.manager, self.manager.block_size
        starts = [m.lengths[s] for s in seq_ids]
        write = [m.append_slots(s, 1)[0] for s in seq_ids]
        width = max(starts) + 1
        n_blocks = -(-width // block)
        tables = torch.tensor([m.tables[s] + [0] * (n_blocks - len(m.tables[s])) for s in seq_ids])  # (B, n_blocks)
        # 位置 p 的槽位 = 块号 × block_size + p % block_size；超出各行长度的槽位无所谓，会被掩码挡住
        read = (tables[:, :, None] * block + torch.arange(block)).flatten(1)[:, :width]  # (B, T_k)
        start = torch.tensor(starts)  # (B,)
        valid = torch.arange(width)[None, :] <= start[:, None]  # (B, T_k)：只看见自己已缓存的位置与这个新位置
        device = self.k[0].device
        write_slots, read = torch.tensor(write, device=device), read.to(device)  # (B,), (B, T_k)
        cache = LMCache(len(self.k))
        cache.layers = [PagedLayer(k, v, None, write_slots, read) for k, v in zip(self.k, self.v)]
        cache.length = width - 1
        return cache, start[:, None].to(device), valid[:, None, None].to(device)  # (B, 1), (B, 1, 1, T_k)

    def packed_view(self, seq_ids: list[int], n_new: list[int]) -> tuple[LMCache, torch.Tensor, torch.Tensor, torch.Tensor]:
        """一步只做**一次**前向：第 b 条序列要写 ``n_new[b]`` 个新位置（解码 1 个，预填充整段提示），
        所有新词元首尾相接排成一行 ``(1, N)``、``N = sum(n_new)``，既不补齐，解码与预填充也能同批（与 Orca 一样把新词元拼成一行；Orca 的注意力按请求分开算，这里用同序列掩码）。

        返回 ``(cache, positions (1, N), attn_mask (1, 1, N, T_k), last (B,))``；``last[b]`` 是第 b 条最后一个新词元
        在这一行里的下标（取它的 logits 得到下一个词元）。收集出的键依次是各序列已缓存的位置（共 ``T_old`` 个），
        再接本步的 N 个新位置，``cache.length = T_old``：模型自带的因果掩码让第 j 个新词元只看见 ``≤ T_old + j`` 的键，
        ``attn_mask`` 再要求“键与查询属于同一条序列”——两者相与，恰好是每条序列各自的因果注意力。
        真实引擎的变长注意力内核（varlen / paged attention）按块表直接读块，不必把这个 (N, T_k) 掩码造出来。
        """
        self._check_batch(seq_ids, n_new)
        m = self.manager
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
        device = self.k[0].device
        write_slots = torch.tensor(write)  # (N,)
        read_slots = torch.cat([old, write_slots]).to(device)  # (T_k,)
        write_slots = write_slots.to(device)
        cache = LMCache(len(self.k))
        cache.layers = [_PackedLayer(k, v, write_slots, read_slots) for k, v in zip(self.k, self.v)]
        cache.length = len(old)
        mask = (query_seq[:, None] == key_seq[None, :])[None, None]  # (1, 1, N, T_k)
        return cache, positions[None].to(device), mask.to(device), last.to(device)
