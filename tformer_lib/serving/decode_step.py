"""引擎的固定形状步（fixed-shape step）：把第 14 章 ``StaticDecoder`` 的编译配方用到分页缓存上。

连续批处理的每一步，运行中的序列数、各自的长度和块表都在变；形状一变，``torch.compile`` 捕获的图就不能复用。
这里让形状只取少数几种，变的只是张量里的数：

- **解码**：``max_batch`` 行、每行 1 个新词元——``tokens``/``positions`` ``(max_batch, 1)``。空着的槽位也占一行，
  送 PAD，写进缓存专留的草稿槽（scratch slot，:attr:`~.paged_cache.PagedKVCache.scratch_slot`），输出直接丢掉；
  每行收集的块数按批里最长的序列取 2 的幂（:func:`read_blocks`），短序列的步不必按满长的上下文去收集与注意；
- **预填充**：一条新请求一行，提示（前缀缓存没覆盖的部分）右侧补齐到 2 的幂 ``P``（至少 8、至多 ``max_len``）——
  ``(1, P)``；补齐的词元同样写进草稿槽，只取最后一个真实词元的 logits。

两种都由同一个函数 :func:`paged_forward` 算：每行的块表 ``tables (B, n_blocks)`` 补齐到同样的块数（预填充补到一条
满长序列要的块数），图里由它算出要收集的槽位 ``(B, W)``（``W = n_blocks × block_size``）与掩码“键的位置 ≤ 查询的位置”；
贪心选择（屏蔽特殊词后取 argmax）也在图里，与 :func:`~tformer_lib.lm.generate.greedy_tokens` 是同一个算法。

每行多看的那些键（没写到的位置、补齐的块）都被掩码挡住，softmax 之后权重恰好是 0：生成的词元与引擎的 eager 步相同
（测试核对）。多算的是：空着的解码行、注意力里的 ``W`` 而不是实际长度、预填充补齐的几个词元——对短上下文的小模型，
这比省下的每算子 Python 开销便宜；``max_batch`` 远大于实际在跑的条数时就未必了（第 13 章与 ``transformers`` 的对照）。
"""

from __future__ import annotations

import threading

import torch

from .._checks import check_suppress_ids, flag, non_negative_int, positive_int
from ..specials import PAD
from .paged_cache import PagedKVCache
from .paged_inputs import PagedLayer

__all__ = ["PagedDecodeStep", "paged_forward", "prefill_width", "read_blocks"]

MIN_PREFILL_WIDTH = 8
RECOMPILE_LIMIT = 256  # 编译时允许 paged_forward 有多少张图（Dynamo 默认 8；同一进程里所有引擎共用这一份）
# 跳过守卫的设置（set_stance）是整个进程的：几个线程里的编译引擎要轮流调用，另一个线程才能安全地编译新形状
_COMPILED_CALLS = threading.Lock()


def paged_forward(model, stores_k: list[torch.Tensor], stores_v: list[torch.Tensor], tokens: torch.Tensor,
                  positions: torch.Tensor, tables: torch.Tensor, write_slots: torch.Tensor, last: torch.Tensor,
                  banned: torch.Tensor, block_size: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """固定形状的一次前向（纯张量运算，可以整段编译）：返回每行最后一个真实词元的 logits ``(B, V)``、贪心选择 ``(B,)``
    与“这一行屏蔽后的最大 logit 有限”``(B,)``（否则这一行没有可选的词，调用者应报错）。

    ``tokens``/``positions`` ``(B, T)``；``tables`` ``(B, n_blocks)`` 块号；``write_slots`` ``(B·T,)`` 各新词元写入的槽位；
    ``last`` ``(B,)`` 每行最后一个真实词元的下标；``banned`` ``(V,)`` 布尔：贪心时屏蔽的词。
    """
    offsets = torch.arange(block_size, device=tables.device)  # (block_size,)
    read_slots = (tables[:, :, None] * block_size + offsets).flatten(1)  # (B, W)：位置 p 的槽位
    keys = torch.arange(read_slots.shape[1], device=tables.device)  # (W,)
    mask = (keys[None, None, :] <= positions[:, :, None])[:, None]  # (B, 1, T, W)：只看见不在自己之后的位置
    x = model.embed(tokens, positions)  # (B, T, d_model)
    c = model.config
    rope = model.rope_tables(positions) if c.positional == "rope" else None  # 各层共用的旋转表
    for block, k, v in zip(model.blocks, stores_k, stores_v):
        x = block(x, mask, PagedLayer(k, v, write_slots, read_slots), rope)  # (B, T, d_model)
    x = x[torch.arange(x.shape[0], device=x.device), last]  # (B, d_model)：只有最后一个真实词元要过输出层
    logits = model.lm_head(model.norm(x))  # (B, V)
    masked = logits.masked_fill(banned, float("-inf"))  # (B, V)
    # 与 greedy_tokens 相同的检查：屏蔽后每行的最大值必须有限（NaN、+inf 或全被屏蔽的行没有可选的词）
    return logits, masked.argmax(dim=-1), torch.isfinite(masked.amax(dim=-1))  # (B, V), (B,), (B,)


def prefill_width(n: int, max_len: int) -> int:
    """``n`` 个新词元的预填充补齐到几个：不小于 ``n`` 的 2 的幂，至少 :data:`MIN_PREFILL_WIDTH`，至多 ``max_len``（``n ≤ max_len``）。"""
    positive_int("n", n)
    if positive_int("max_len", max_len) < n:
        raise ValueError(f"n={n} 个新词元超过了上下文长度 max_len={max_len}")
    return min(max_len, max(MIN_PREFILL_WIDTH, 1 << (n - 1).bit_length()))


def read_blocks(length: int, block_size: int, limit: int) -> int:
    """解码步每行收集几块：放得下 ``length`` 个位置的块数，向上取到 2 的幂（至少 2 块、至多 ``limit``）。

    批里最长的序列决定它；取 2 的幂，是为了只有少数几种形状（几张图），又不必每步都按满长的上下文去收集与注意。
    """
    for name, value in (("length", length), ("block_size", block_size), ("limit", limit)):
        positive_int(name, value)
    needed = -(-length // block_size)
    if needed > limit:
        raise ValueError(f"length={length} 要 {needed} 块（每块 {block_size}），超过了 limit={limit}")
    return min(limit, max(2, 1 << (needed - 1).bit_length()))


class PagedDecodeStep:
    """引擎的固定形状步：解码 ``max_batch`` 行 × 1 个词元（收集的块数取几种 2 的幂），预填充 1 行 × ``P`` 个词元
    （``P`` 取几种 2 的幂）。

    ``compile=True`` 时每种形状编译一张 ``torch.compile`` 图，之后每步复用；``suppress_ids``：贪心时不许选的词。
    编译选项与 ``StaticDecoder`` 相同：冻结权重（freezing）、C++ 包装（cpp_wrapper），每种形状第一次调用之后跳过
    守卫（guard）检查——形状由这里保证只取这几种，模型由引擎保持在 eval 模式。冻结后的图可能把权重当常量；本机的
    torch 2.13 上原地改权重之后图仍读到新值，但这不是 torch 承诺的行为：改了权重最好新建一个引擎。
    同一进程里所有编译的引擎共用一份图的缓存（至多 :data:`RECOMPILE_LIMIT` 种形状），调用彼此串行（跳过守卫的设置是整个进程的）。
    """

    def __init__(self, model, max_batch: int, suppress_ids, *, compile: bool = False):
        positive_int("max_batch", max_batch)
        flag("compile", compile)
        suppress_ids = check_suppress_ids(suppress_ids, model.config.vocab_size)
        self.model, self.max_batch, self.compile = model, max_batch, compile
        device = model.lm_head.weight.device
        self.banned = torch.zeros(model.config.vocab_size, dtype=torch.bool, device=device)  # (V,)
        self.banned[list(suppress_ids)] = True
        options = {"freezing": True, "cpp_wrapper": True}
        self._step = (torch.compile(paged_forward, fullgraph=True, dynamic=False, options=options)
                      if compile else paged_forward)
        self._warm: set[tuple[int, int, int]] = set()  # 已经编译过（调用过）的形状 (B, T, n_blocks)

    def _run(self, cache: PagedKVCache, tokens, positions, tables, write, last):
        if not all(isinstance(t, torch.Tensor) for t in cache.k + cache.v):
            raise TypeError(f"固定形状的步要普通张量的 K/V 存储，收到 {type(cache.k[0]).__name__}"
                            "（量化的缓存请用 decode_step='eager'）")
        device = self.banned.device
        shape = (len(tokens), len(tokens[0]), len(tables[0]))
        args = (self.model, cache.k, cache.v, torch.tensor(tokens, device=device),
                torch.tensor(positions, device=device), torch.tensor(tables, device=device),  # (B, T), (B, T), (B, n)
                torch.tensor(write, device=device), torch.tensor(last, device=device),  # (B·T,), (B,)
                self.banned, cache.manager.block_size)
        if not self.compile:
            return self._step(*args)
        with _COMPILED_CALLS:
            if shape in self._warm:  # 这个形状编译过了，其余条件由我们保证不变（见类的说明）
                with torch.compiler.set_stance("default", skip_guard_eval_unsafe=True):
                    return self._step(*args)
            # 每种形状一张图：几种解码宽度 × 几种预填充长度（换了模型或 max_batch 还有另一组），会超过 Dynamo 默认
            # 每个函数 8 张图的上限；上限只在编译新形状时检查，所以只在这里放宽
            try:
                with torch._dynamo.config.patch(recompile_limit=RECOMPILE_LIMIT):
                    out = self._step(*args)
            except torch._dynamo.exc.FailOnRecompileLimitHit as exc:
                raise RuntimeError(f"这个进程里 paged_forward 已编译了 {RECOMPILE_LIMIT} 种形状（所有引擎共用）："
                                   "换 decode_step='eager'，或在新进程里运行") from exc
            self._warm.add(shape)  # 编译成功之后才记下：编译失败或被打断时，下次重新编译
            return out

    def _blocks_per_seq(self, cache: PagedKVCache) -> int:
        return -(-self.model.config.max_len // cache.manager.block_size)  # 一条满长序列要的块数

    @torch.no_grad()
    def decode(self, cache: PagedKVCache, rows: dict[int, tuple[int, int, int, list[int]]]
               ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``rows``：槽位号 → ``(新词元, 它的位置, 写入的槽位, 块表)``；K/V 写进 ``cache``；返回所有 ``max_batch``
        行的 ``(logits (max_batch, V), 贪心选择 (max_batch,), 有限 (max_batch,))``（见 :func:`paged_forward`）。

        空着的槽位送 PAD、位置 0，写进草稿槽，读块 0 的第 0 个位置（可见的只有它，结果不用）。
        """
        block, b = cache.manager.block_size, self.max_batch
        longest = max((position for _, position, _, _ in rows.values()), default=0) + 1
        n = read_blocks(longest, block, self._blocks_per_seq(cache))
        tokens, positions, write, tables = [[PAD]] * b, [[0]] * b, [cache.scratch_slot] * b, [[0] * n] * b
        for slot, (token, position, write_slot, table) in rows.items():
            if non_negative_int("rows 的键", slot) >= b:
                raise ValueError(f"rows 的键应是 [0, max_batch={b}) 内的槽位号，收到 {slot!r}")
            tokens[slot], positions[slot], write[slot] = [token], [position], write_slot
            tables[slot] = table + [0] * (n - len(table))  # 补齐的块号被掩码挡住
        return self._run(cache, tokens, positions, tables, write, [0] * b)

    @torch.no_grad()
    def prefill(self, cache: PagedKVCache, tokens: list[int], start: int, write: list[int], table: list[int]
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """一条请求的预填充：``tokens`` 从位置 ``start`` 起写进槽位 ``write``；返回最后一个词元的
        ``(logits (1, V), 贪心选择 (1,), 有限 (1,))``。补齐的词元写进草稿槽，位置截在上下文之内（它们的输出不用）。"""
        max_len = self.model.config.max_len
        if not tokens or start + len(tokens) > max_len or len(write) != len(tokens):
            raise ValueError(f"预填充应有 1 个以上的词元、每个一个写入槽位，且位置 start={start} 起的 {len(tokens)} 个"
                             f"不超出上下文 max_len={max_len}，收到 {len(tokens)} 个词元、{len(write)} 个槽位")
        width, n = prefill_width(len(tokens), max_len), self._blocks_per_seq(cache)
        pad = width - len(tokens)
        positions = [min(start + i, max_len - 1) for i in range(width)]
        return self._run(cache, [tokens + [PAD] * pad], [positions], [table + [0] * (n - len(table))],
                         write + [cache.scratch_slot] * pad, [len(tokens) - 1])
