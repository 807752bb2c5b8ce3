"""引擎的固定形状步（fixed-shape step）：把第 14 章 ``StaticDecoder`` 的编译配方用到分页缓存上。

连续批处理的每一步，运行中的序列数、各自的长度和块表都在变；形状一变，``torch.compile`` 捕获的图就不能复用。
这里让形状只取少数几种，变的只是张量里的数。每一步——解码与预填充一起——只做**一次**前向，所有新词元
各占一行、每行 1 个词元，排成 ``(R, 1)``：

- **前** ``max_batch`` **行**：一个槽位一行。解码的序列放它的新词元；这一步预填充的序列放它提示的**最后一个**
  词元；空着的槽位放 PAD、写进缓存专留的草稿槽（scratch slot，:attr:`~.paged_cache.PagedKVCache.scratch_slot`），
  输出直接丢掉。于是 logits 的第 s 行总是槽位 s 的下一个词元，只有这 ``max_batch`` 行过输出层；
- **其后的行**：这一步预填充的提示里其余的词元（最后一个之前的那些），总数补齐到 2 的幂（:func:`prefill_rows`，
  至少 8；没有预填充时是 0 行），补齐的行与空槽位一样写草稿槽；
- 每行收集的块数按这一步最长的序列取 2 的幂（:func:`read_blocks`）：短序列的步不必按满长的上下文去收集与注意。

一行一个词元，行与行之间却有依赖（同一条提示里后面的词元要看见前面的）：每一层都是先把这一步所有行的 K/V 写进
缓存、再按块表收集（:class:`~.paged_inputs.PagedLayer`），掩码只要求“键的位置 ≤ 这一行的位置”——同一步写下的
前面的词元就在收集出的键里。这与 vLLM、nano-vllm 的做法同理：把一步的词元摊平，每个词元按自己序列的块表读缓存。

所有行都由 :func:`paged_forward` 算；贪心选择（屏蔽特殊词后取 argmax）也在图里，与
:func:`~tformer_lib.lm.generate.greedy_tokens` 是同一个算法。每行多看的那些键（没写到的位置、补齐的块）都被掩码
挡住，softmax 之后权重恰好是 0：生成的词元与引擎的 eager 步相同（测试核对）。多算的是：空着的槽位行、补齐的
预填充行、注意力里按 2 的幂取的块数——对短上下文的小模型，这比省下的每算子 Python 开销便宜；``max_batch`` 远大于
实际在跑的条数时就未必了（第 13 章与 ``transformers`` 的对照）。
"""

from __future__ import annotations

import threading

import torch

from .._checks import check_suppress_ids, flag, non_negative_int, positive_int
from ..specials import PAD
from .paged_cache import PagedKVCache
from .paged_inputs import PagedLayer

__all__ = ["PagedDecodeStep", "paged_forward", "prefill_rows", "read_blocks"]

MIN_PREFILL_ROWS = 8
RECOMPILE_LIMIT = 256  # 编译时允许 paged_forward 有多少张图（Dynamo 默认 8；同一进程里所有引擎共用这一份）
# 跳过守卫的设置（set_stance）是整个进程的：几个线程里的编译引擎要轮流调用，另一个线程才能安全地编译新形状
_COMPILED_CALLS = threading.Lock()


def paged_forward(model, stores_k: list[torch.Tensor], stores_v: list[torch.Tensor], tokens: torch.Tensor,
                  positions: torch.Tensor, tables: torch.Tensor, write_slots: torch.Tensor, banned: torch.Tensor,
                  block_size: int, outputs: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """固定形状的一次前向（纯张量运算，可以整段编译）：返回前 ``outputs`` 行的 logits ``(outputs, V)``、贪心选择
    ``(outputs,)`` 与“这一行屏蔽后的最大 logit 有限”``(outputs,)``（否则这一行没有可选的词，调用者应报错）。

    ``tokens``/``positions`` ``(R, 1)``；``tables`` ``(R, n_blocks)`` 每行所属序列的块号；``write_slots`` ``(R,)``
    各行写入的槽位；``banned`` ``(V,)`` 布尔：贪心时屏蔽的词。
    """
    offsets = torch.arange(block_size, device=tables.device)  # (block_size,)
    read_slots = (tables[:, :, None] * block_size + offsets).flatten(1)  # (R, W)：位置 p 的槽位
    keys = torch.arange(read_slots.shape[1], device=tables.device)  # (W,)
    mask = (keys[None, None, :] <= positions[:, :, None])[:, None]  # (R, 1, 1, W)：只看见不在自己之后的位置
    x = model.embed(tokens, positions)  # (R, 1, d_model)
    c = model.config
    rope = model.rope_tables(positions) if c.positional == "rope" else None  # 各层共用的旋转表
    for block, k, v in zip(model.blocks, stores_k, stores_v):
        x = block(x, mask, PagedLayer(k, v, write_slots, read_slots), rope)  # (R, 1, d_model)
    logits = model.lm_head(model.norm(x[:outputs, 0]))  # (outputs, V)：只有槽位行过输出层
    masked = logits.masked_fill(banned, float("-inf"))  # (outputs, V)
    # 与 greedy_tokens 相同的检查：屏蔽后每行的最大值必须有限（NaN、+inf 或全被屏蔽的行没有可选的词）
    return logits, masked.argmax(dim=-1), torch.isfinite(masked.amax(dim=-1))  # (outputs, V), (outputs,), (outputs,)


def prefill_rows(n: int) -> int:
    """一步里预填充的提示除去各自最后一个词元还剩 ``n`` 个词元，占几行：0 个占 0 行，否则补齐到不小于 ``n`` 的
    2 的幂，至少 :data:`MIN_PREFILL_ROWS`。"""
    if non_negative_int("n", n) == 0:
        return 0
    return max(MIN_PREFILL_ROWS, 1 << (n - 1).bit_length())


def read_blocks(length: int, block_size: int, limit: int) -> int:
    """每行收集几块：放得下 ``length`` 个位置的块数，向上取到 2 的幂（至少 2 块、至多 ``limit``；``limit`` 不是 2 的幂时
    可能取到它本身）。

    这一步最长的序列决定它；取 2 的幂，是为了只有少数几种形状（几张图），又不必每步都按满长的上下文去收集与注意。
    """
    for name, value in (("length", length), ("block_size", block_size), ("limit", limit)):
        positive_int(name, value)
    needed = -(-length // block_size)
    if needed > limit:
        raise ValueError(f"length={length} 要 {needed} 块（每块 {block_size}），超过了 limit={limit}")
    return min(limit, max(2, 1 << (needed - 1).bit_length()))


class PagedDecodeStep:
    """引擎的固定形状步：一步一次前向，``max_batch`` 个槽位行加上补齐到 2 的幂的预填充行（见模块说明），
    收集的块数取几种 2 的幂。

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
        self._warm: set[tuple[int, int]] = set()  # 已经编译过（调用过）的形状 (R, n_blocks)
        self.forward_rows = 0  # 算完的步送进模型的行数之和（含空槽位与补齐的行）

    def _run(self, cache: PagedKVCache, tokens, positions, tables, write):
        if len(cache.k) != len(self.model.blocks):
            raise ValueError(f"cache 有 {len(cache.k)} 层 K/V，模型有 {len(self.model.blocks)} 块：请用这个模型建的 PagedKVCache")
        if not all(isinstance(t, torch.Tensor) for t in cache.k + cache.v):
            raise TypeError(f"固定形状的步要普通张量的 K/V 存储，收到 {type(cache.k[0]).__name__}"
                            "（量化的缓存请用 decode_step='eager'）")
        device = self.banned.device
        shape = (len(tokens), len(tables[0]))
        args = (self.model, cache.k, cache.v, torch.tensor(tokens, device=device)[:, None],
                torch.tensor(positions, device=device)[:, None], torch.tensor(tables, device=device),  # (R, 1), (R, 1), (R, n)
                torch.tensor(write, device=device), self.banned, cache.manager.block_size, self.max_batch)  # (R,)
        if not self.compile:
            return self._step(*args)
        with _COMPILED_CALLS:
            if shape in self._warm:  # 这个形状编译过了，其余条件由我们保证不变（见类的说明）
                with torch.compiler.set_stance("default", skip_guard_eval_unsafe=True):
                    return self._step(*args)
            # 每种形状一张图：几种预填充行数 × 几种收集块数（换了模型或 max_batch 还有另一组），会超过 Dynamo 默认
            # 每个函数 8 张图的上限；上限只在编译新形状时检查，所以只在这里放宽
            try:
                with torch._dynamo.config.patch(recompile_limit=RECOMPILE_LIMIT):
                    out = self._step(*args)
            except torch._dynamo.exc.FailOnRecompileLimitHit as exc:
                raise RuntimeError(f"这个进程里 paged_forward 已编译了 {RECOMPILE_LIMIT} 种形状（所有引擎共用）："
                                   "换 decode_step='eager'，或在新进程里运行") from exc
            self._warm.add(shape)  # 编译成功之后才记下：编译失败或被打断时，下次重新编译
            return out

    @torch.no_grad()
    def step(self, cache: PagedKVCache, rows: dict[int, tuple[list[int], int, list[int], list[int]]]
             ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """一步：``rows`` 是槽位号 → ``(新词元, 第一个新词元的位置, 各新词元写入的槽位, 块表)``——解码 1 个新词元，
        预填充是提示里还没缓存的那些。K/V 写进 ``cache``；返回 ``max_batch`` 行（第 s 行是槽位 s 最后一个新词元的
        输出）的 ``(logits (max_batch, V), 贪心选择 (max_batch,), 有限 (max_batch,))``（见 :func:`paged_forward`）。

        空着的槽位与补齐的行送 PAD、位置 0，写进草稿槽，读块 0 的第 0 个位置（可见的只有它，结果不用）。
        """
        b, max_len = self.max_batch, self.model.config.max_len
        idle = (PAD, 0, cache.scratch_slot, [])
        slot_rows, extra_rows = [idle] * b, []  # 每行 (词元, 位置, 写入的槽位, 块表)
        for slot, (tokens, start, write, table) in rows.items():
            if non_negative_int("rows 的键", slot) >= b:
                raise ValueError(f"rows 的键应是 [0, max_batch={b}) 内的槽位号，收到 {slot!r}")
            if not tokens or len(write) != len(tokens) or start + len(tokens) > max_len:
                raise ValueError(f"槽位 {slot} 应有 1 个以上的新词元、每个一个写入槽位，且位置 start={start} 起的 "
                                 f"{len(tokens)} 个不超出上下文 max_len={max_len}，收到 {len(tokens)} 个词元、{len(write)} 个槽位")
            lines = [(token, start + i, w, table) for i, (token, w) in enumerate(zip(tokens, write))]
            extra_rows += lines[:-1]
            slot_rows[slot] = lines[-1]  # 最后一个新词元放在槽位自己的行：它的输出就是槽位 s 的下一个词元
        extra_rows += [idle] * (prefill_rows(len(extra_rows)) - len(extra_rows))
        lines = slot_rows + extra_rows
        longest = max(position for _, position, _, _ in lines) + 1
        n = read_blocks(longest, cache.manager.block_size, -(-max_len // cache.manager.block_size))
        tables = [table + [0] * (n - len(table)) for _, _, _, table in lines]  # 补齐的块号被掩码挡住
        out = self._run(cache, [t for t, _, _, _ in lines], [p for _, p, _, _ in lines], tables,
                        [w for _, _, w, _ in lines])
        self.forward_rows += len(lines)
        return out
