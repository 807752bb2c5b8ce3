"""分页 K/V 缓存的账本（block manager）：空闲块、每条序列的块表、引用计数与前缀块的查找表。

它只记账、不碰张量：K/V 的存储在 :mod:`.paged_cache`，给模型的输入（槽位、位置、掩码）由 :mod:`.paged_inputs`
按这里的块表造出来。与 nano-vllm 的 ``BlockManager`` 同一个分工。
"""

from __future__ import annotations

import numbers

import torch

from .._checks import flag, non_negative_int, positive_int

__all__ = ["BlockManager", "OutOfBlocksError"]


class OutOfBlocksError(RuntimeError):
    """没有足够的空闲块了（调度器据此让请求排队等待）。"""


class BlockManager:
    """块的账本。``block_size`` 个位置一块，共 ``num_blocks`` 块。"""

    def __init__(self, num_blocks: int, block_size: int, prefix_caching: bool = True):
        self.num_blocks = positive_int("num_blocks", num_blocks)
        self.block_size = positive_int("block_size", block_size)
        self.prefix_caching = flag("prefix_caching", prefix_caching)
        self.free_blocks = list(range(num_blocks - 1, -1, -1))  # 栈：pop() 取块号最小的
        self.ref_count = [0] * num_blocks
        self.tables: dict[int, list[int]] = {}  # 序列 id → 块表
        self.lengths: dict[int, int] = {}  # 序列 id → 已写入的位置数
        self._prompts: dict[int, tuple[int, ...]] = {}  # 序列 id → allocate 时的提示（登记前缀块时核对）
        # 前缀的查找表（像 vLLM 的 哈希 → 块）：前缀键 → 内容是这段前缀的块，新请求共用第一块。同一前缀的请求在
        # 共用之前可能各算了一份，它们都记在表里：第一块被释放时，下一块接着供人共用。
        self._cached: dict[tuple, list[int]] = {}
        self._key_of: dict[int, tuple] = {}  # 登记过的块 → 它的前缀键

    # ---------------------------------------------------------------- 查询
    @property
    def prefix_blocks(self) -> list[int]:
        """此刻可供新请求共用的前缀块（每段前缀一块），按块号排序。"""
        return sorted(blocks[0] for blocks in self._cached.values())

    @property
    def used_blocks(self) -> int:
        """正被占用的块数（共用的块只算一次）。"""
        return self.num_blocks - len(self.free_blocks)

    def blocks_needed(self, n_tokens: int) -> int:
        """放下 ``n_tokens`` 个位置要几块。"""
        n_tokens = non_negative_int("n_tokens", n_tokens)
        return -(-n_tokens // self.block_size)

    def can_allocate(self, n_tokens: int) -> bool:
        """此刻的空闲块放不放得下 ``n_tokens`` 个位置（不算可共用的前缀块）。"""
        return self.blocks_needed(n_tokens) <= len(self.free_blocks)

    def table(self, seq_id: int) -> list[int]:
        """序列 ``seq_id`` 的块表；没有登记时 KeyError 列出已登记的序列。"""
        if seq_id not in self.tables:
            raise KeyError(f"seq_id={seq_id!r} 没有登记（先 allocate，或它已经 free 了）；已登记的有 {sorted(self.tables)}")
        return self.tables[seq_id]

    def slot(self, seq_id: int, position: int) -> int:
        """序列 ``seq_id`` 的第 ``position`` 个位置在存储里的槽位号（``position`` 应落在已分配的块里）。"""
        capacity = len(self.table(seq_id)) * self.block_size
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
    def _tokens(prompt) -> tuple[int, ...]:
        """提示 → Python int 的元组（列表、元组或一维整数张量都行）；空的、或含非整数的 ValueError。"""
        if isinstance(prompt, torch.Tensor):
            prompt = prompt.tolist() if prompt.dim() == 1 and not prompt.is_floating_point() else None
        if isinstance(prompt, (str, bytes)) or not isinstance(prompt, (list, tuple)) or len(prompt) == 0 or any(
                isinstance(t, bool) or not isinstance(t, numbers.Integral) for t in prompt):
            raise ValueError(f"prompt 应是非空的词元 id 列表（整数），收到 {prompt!r:.40}")
        return tuple(int(t) for t in prompt)

    @staticmethod
    def _key(prompt: tuple[int, ...], n_tokens: int, namespace) -> tuple:
        """前缀块的键：前 ``n_tokens`` 个词元；``namespace``（如适配器名）不同的序列即使词元相同也不共用。"""
        tokens = tuple(prompt[:n_tokens])
        return tokens if namespace is None else (namespace, tokens)

    def allocate(self, seq_id: int, prompt: list[int], namespace=None) -> int:
        """为新序列登记块表并分配放下提示所需的块；返回可直接复用的前缀长度（这些位置不必再算）。

        只共用**写满**的块，而且至少留最后一个提示词元去计算（它的输出是第一个新词元的 logits）。
        ``namespace``：只与同一命名空间的前缀共用（不同的 LoRA 适配器算出的 K/V 不同）。
        ``prompt``：整数词元 id 的列表、元组或一维整数张量。块是分配了，复用长度之后的位置却还没写：
        它们的槽位由 :meth:`append_slots`（或 :meth:`~.paged_cache.PagedKVCache.packed_view`）交出，再由前向写入。
        """
        if seq_id in self.tables:
            raise ValueError(f"seq_id={seq_id} 已经登记过")
        prompt = self._tokens(prompt)
        table: list[int] = []
        reused = 0
        if self.prefix_caching:
            for i in range((len(prompt) - 1) // self.block_size):
                blocks = self._cached.get(self._key(prompt, (i + 1) * self.block_size, namespace))
                if blocks is None:
                    break
                table.append(blocks[0])
                reused += self.block_size
        fresh = self.blocks_needed(len(prompt)) - len(table)
        if fresh > len(self.free_blocks):
            raise OutOfBlocksError(f"序列 {seq_id} 需要 {fresh} 个新块，只剩 {len(self.free_blocks)} 个")
        for block in table:
            self.ref_count[block] += 1
        table += [self._take_block() for _ in range(fresh)]
        self.tables[seq_id], self.lengths[seq_id], self._prompts[seq_id] = table, reused, prompt
        return reused

    def register_prefix(self, seq_id: int, prompt: list[int], namespace=None) -> None:
        """把序列 ``seq_id`` 的提示写满的块登记为可共用的前缀块。

        引擎在 :meth:`allocate` 之后、本步前向*之前*就登记：同一步里后接纳的同前缀请求也能共用。这是安全的，
        因为每一层都先把本步所有新 K/V 写进槽位、再按块表收集（见 :class:`_PackedLayer`），读到的已是本步写好的值。
        同一前缀已有登记的块时，这条序列自己算出的那块排在它后面：前面的块被释放时由它接着供人共用。
        """
        table = self.table(seq_id)
        if self._tokens(prompt) != self._prompts[seq_id]:
            raise ValueError(f"prompt 与 allocate(seq_id={seq_id}) 时给的提示不同：前缀块里的 K/V 只属于那段提示")
        if not self.prefix_caching:
            return
        for i in range(len(self._prompts[seq_id]) // self.block_size):
            block = table[i]
            if block in self._key_of:
                continue  # 这块本来就是共用来的（或已登记）
            key = self._key(self._prompts[seq_id], (i + 1) * self.block_size, namespace)
            self._cached.setdefault(key, []).append(block)
            self._key_of[block] = key

    def append_slots(self, seq_id: int, n_tokens: int) -> list[int]:
        """序列要再写 ``n_tokens`` 个位置：需要时分配新块，返回这些位置的槽位号。"""
        self.table(seq_id)
        non_negative_int("n_tokens", n_tokens)
        start = self.lengths[seq_id]
        missing = self.blocks_needed(start + n_tokens) - len(self.tables[seq_id])
        if missing > len(self.free_blocks):  # 先检查再分配：失败时不留下分了一半的块
            raise OutOfBlocksError(f"序列 {seq_id} 还要 {missing} 个块，只剩 {len(self.free_blocks)} 个")
        for _ in range(max(0, missing)):
            self.tables[seq_id].append(self._take_block())
        self.lengths[seq_id] = start + n_tokens
        table, size = self.tables[seq_id], self.block_size  # 这些位置都落在刚分好的块里：不必逐个经过 slot 的检查
        return [table[p // size] * size + p % size for p in range(start, start + n_tokens)]

    def free(self, seq_id: int) -> None:
        """序列结束：引用计数减一，降到 0 的块回到空闲栈。

        回到空闲栈的块从前缀查找表里撤下（同一前缀还有别的块时，由排在它后面的那块供人共用）：只要还有序列
        持有这段前缀的块，后来的请求就能共用它。
        """
        for block in self.table(seq_id):
            self.ref_count[block] -= 1
            if self.ref_count[block] == 0:
                self._forget(block)
                self.free_blocks.append(block)
        del self.tables[seq_id], self.lengths[seq_id], self._prompts[seq_id]

    def _forget(self, block: int) -> None:
        """块 ``block`` 不再被任何序列引用：把它从前缀查找表里撤下。"""
        key = self._key_of.pop(block, None)
        if key is None:
            return
        blocks = self._cached[key]
        blocks.remove(block)
        if not blocks:
            del self._cached[key]
