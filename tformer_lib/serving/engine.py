"""连续批处理（continuous batching）引擎：按“迭代”调度，每一步都有序列离开、有请求加入。

静态批处理（static batching）把一批请求一起跑到*最长*的那条结束，先结束的行只能空转陪跑，新来的请求要等整批
结束；连续批处理在每一步（iteration）之后就把结束的序列移出、把等待的请求补进来，批里的槽位几乎总是满的。

每一步 :meth:`Engine.step` 做三件事：

1. 接纳（admit）：在槽位（``max_batch``）、空闲块与本步词元预算（``token_budget``）允许的范围内，
   按到达顺序接纳等待的请求，这一步为它们**预填充**（prefill）——整段提示过一遍模型，得到第一个新词元；
2. 一次前向：运行中的序列各送一个新词元（解码 decode），新接纳的送整段提示（预填充），所有新词元首尾相接
   排成一行、不补齐（见 :meth:`~.paged_cache.PagedKVCache.packed_view`），所以解码与预填充同在一次前向里；
3. 退出：生成了 EOS 或到达自己 ``max_new_tokens`` 的序列离开，块还给 :class:`~.block_manager.BlockManager`。

默认贪心解码，输出与逐条调用 ``generate(..., method="greedy")`` 逐词元相同（测试核对）；每个请求也可以带自己的
:class:`~.sampling.Sampling`（温度、top-p、随机数生成器）改为采样。:meth:`Engine.cancel` 让请求提前离开
（如命中停止串、客户端断开），它的块立即归还。
"""

from __future__ import annotations

import contextlib
import itertools
import math
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from torch import nn

from ..lm.generate import check_eos_id
from ..specials import BOS, PAD
from .._checks import check_suppress_ids, flag, language_model, positive_int
from .decode_step import PagedDecodeStep
from .paged_cache import PagedKVCache
from .ragged import check_prompts
from .sampling import Sampling, pick_tokens

__all__ = ["Request", "Engine", "DECODE_STEPS"]

DECODE_STEPS = ("eager", "fixed", "compiled")


@dataclass
class Request:
    """一个生成请求及其记录：到达、第一个词元与结束的时刻（秒，``time.perf_counter``），以及每一步所在的批槽位。"""

    prompt: list[int]
    max_new_tokens: int
    request_id: int = -1
    arrival: float = 0.0
    output: list[int] = field(default_factory=list)
    first_token_time: float | None = None
    finish_time: float | None = None
    slot_steps: list[tuple[int, int]] = field(default_factory=list)  # (引擎步号, 槽位号)
    sampling: Sampling | None = None  # None = 贪心
    adapter: str | None = None  # LoRA 适配器的名字；None = 底座

    @property
    def done(self) -> bool:
        return self.finish_time is not None


class Engine:
    """连续批处理 + 分页 K/V 缓存的生成引擎（默认贪心，单个请求可以采样）。

    ``max_batch``：同时运行的序列上限；``token_budget``：一步里送进模型的词元总数上限（预填充 + 解码）；
    ``num_blocks``/``block_size``：分页缓存的大小（默认够 ``max_batch`` 条满长序列）；``prefix_caching``：共用前缀块。
    ``min_prefill``：至少空出这么多槽位（或没有序列在跑、或已无更多请求在等）才接纳新请求，让几条提示攒在同一步
    预填充；预填充与解码本来就在同一次前向里（见 :meth:`step`），默认 1 = 一有空槽位就补进来。
    ``adapters``：装在 ``model`` 上的 :class:`~tformer_lib.finetune.multi_lora.AdapterSet`（请求用 ``adapter=`` 选）。
    ``decode_step``：每一步的前向怎么算——``"eager"``（默认）按这一步的实际行数与长度逐算子执行，解码与预填充
    打包在一次前向里；``"compiled"`` 用 :class:`~.decode_step.PagedDecodeStep` 的固定形状图：也是一步一次前向，
    一个新词元一行，总是 ``max_batch`` 个槽位行、预填充的其余词元补齐到 2 的幂行（收集的块数取几种 2 的幂），
    每种形状编译一张图、之后每步复用（第一次遇到一种形状时要先编译，几秒到几十秒）；``"fixed"`` 是同一个
    固定形状的函数但不编译（核对用）。三者生成的词元相同（测试核对）。有带适配器的请求的步总是走 eager。
    引擎只做推理，第一步时会把模型切到 eval 模式。
    """

    def __init__(self, model: nn.Module, *, max_batch: int = 8, token_budget: int | None = None,
                 block_size: int = 16, num_blocks: int | None = None, prefix_caching: bool = True,
                 eos_id: int | None = None, suppress_ids: Sequence[int] = (PAD, BOS), min_prefill: int = 1,
                 adapters=None, decode_step: str = "eager"):
        language_model("model", model)
        if getattr(model.config, "positional", None) == "alibi":
            raise ValueError("Engine 不支持 positional='alibi'：分页缓存里键的槽位不按序排列，ALiBi 的距离算不对；"
                             "请用 tformer_lib.lm.generate")
        if adapters is not None:  # 只用它的 index/route/model（不 import 第四部分的 finetune：层次只向下）
            if not all(hasattr(adapters, a) for a in ("index", "route", "model")):
                raise TypeError("adapters 应是装在这个 model 上的 AdapterSet（AdapterSet(model, {名字: 适配器})），"
                                f"收到 {type(adapters).__name__}")
            if adapters.model is not model:
                raise ValueError("adapters 装在另一个模型上：AdapterSet 要装在交给 Engine 的同一个 model 对象上")
        flag("prefix_caching", prefix_caching)
        suppress_ids = check_suppress_ids(suppress_ids, model.config.vocab_size)
        max_batch, min_prefill = positive_int("max_batch", max_batch), positive_int("min_prefill", min_prefill)
        if min_prefill > max_batch:
            raise ValueError(f"min_prefill 应是 [1, max_batch={max_batch}] 内的整数，收到 {min_prefill!r}")
        max_len = model.config.max_len
        token_budget = max_len + max_batch if token_budget is None else token_budget
        token_budget = positive_int("token_budget", token_budget)
        if token_budget < max_len:
            raise ValueError(f"token_budget 应是不小于 max_len={max_len} 的整数（否则长提示永远进不来），收到 {token_budget!r}")
        check_eos_id(eos_id, model.config.vocab_size, suppress_ids)
        self.model, self.max_batch, self.token_budget = model, max_batch, token_budget
        self.eos_id, self.suppress_ids, self.min_prefill = eos_id, tuple(suppress_ids), min_prefill
        self.adapters = adapters
        self.cache = PagedKVCache(model, num_blocks, block_size, prefix_caching, sequences=max_batch)
        if decode_step not in DECODE_STEPS:
            raise ValueError(f"decode_step 应是 {DECODE_STEPS} 之一，收到 {decode_step!r}")
        self.decode_step = decode_step
        self._fixed = None if decode_step == "eager" else \
            PagedDecodeStep(model, max_batch, self.suppress_ids, compile=decode_step == "compiled")
        self.waiting: deque[Request] = deque()
        self.running: dict[int, Request] = {}  # 槽位号 → 请求
        self.steps = 0
        self._rows = 0  # 做完的步送进模型的行数（见 forward_rows）
        self.peak_held_bytes = 0
        self.prefill_tokens_saved = 0  # 前缀缓存省下的预填充词元数
        self._ids = itertools.count()

    # ---------------------------------------------------------------- 提交
    def add_request(self, prompt, max_new_tokens: int, arrival: float | None = None, *,
                    sampling: Sampling | None = None, adapter: str | None = None) -> Request:
        """排队一个请求（检查方式与 :func:`~.ragged.greedy_batch` 相同），返回它的 :class:`Request`。

        ``sampling``：这个请求的取词方式（:class:`~.sampling.Sampling`）；``None`` 为贪心。
        ``adapter``：LoRA 适配器的名字（引擎要带 ``adapters``）；``None`` 为底座。
        """
        if adapter is not None:
            if self.adapters is None:
                raise ValueError(f"adapter={adapter!r}，但这个引擎没有装适配器（Engine(..., adapters=AdapterSet(...))）")
            self.adapters.index(adapter)  # 名字不对时指出可选的名字
        (prompt,) = check_prompts(self.model, [prompt], [max_new_tokens])
        if sampling is not None and not isinstance(sampling, Sampling):
            raise TypeError(f"sampling 应是 Sampling（如 Sampling(temperature=0.8)）或 None，收到 {type(sampling).__name__}")
        manager = self.cache.manager
        if manager.blocks_needed(len(prompt) + max_new_tokens) > manager.num_blocks:
            raise ValueError(
                f"提示长度 {len(prompt)} 加 max_new_tokens={max_new_tokens} 需要 "
                f"{manager.blocks_needed(len(prompt) + max_new_tokens)} 个块，缓存一共只有 num_blocks={manager.num_blocks} 个"
                f"（每块 {manager.block_size} 个位置）：这个请求永远排不上"
            )
        if arrival is not None and not math.isfinite(arrival):
            raise ValueError(f"arrival 应是有限的时刻（秒），收到 {arrival!r}")
        request = Request(prompt, max_new_tokens, next(self._ids), time.perf_counter() if arrival is None else arrival,
                          sampling=sampling, adapter=adapter)
        if max_new_tokens == 0:  # 不生成词元：立即结束，没有“第一个词元”（TTFT 不计它）
            request.finish_time = request.arrival
        else:
            self.waiting.append(request)
        return request

    def _new_requests(self, requests) -> list[Request]:
        """:meth:`run` 的 ``requests``：检查类型，去掉已经在这个引擎里的请求。"""
        if requests is None:
            return []
        if isinstance(requests, Request) or not isinstance(requests, Sequence):
            raise TypeError(f"requests 应是 Request 的列表或 None，收到 {type(requests).__name__}")
        queued = [*self.waiting, *self.running.values()]
        out = []
        for i, r in enumerate(requests):
            if not isinstance(r, Request):
                raise TypeError(f"requests[{i}] 应是 Request（如 Request([2, 3], 5)），收到 {type(r).__name__} {r!r:.40}")
            if any(r is q for q in queued) or any(r is q for q in out):
                continue
            if r.done or r.output:
                raise ValueError(f"requests[{i}] 已经跑过（output={r.output!r:.40}）：请新建一个 Request")
            out.append(r)
        return out

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def cancel(self, request: Request) -> None:
        """让一个请求提前离开（已经生成的 ``output`` 保留）：移出等待队列或槽位，归还它的块；已结束的请求不变。"""
        if not isinstance(request, Request):
            raise TypeError(f"request 应是 Request，收到 {type(request).__name__}")
        if request.done:
            return
        for i, queued in enumerate(self.waiting):
            if queued is request:
                del self.waiting[i]
                break
        else:
            slot = next((s for s, r in self.running.items() if r is request), None)
            if slot is None:
                raise ValueError(f"request（request_id={request.request_id}）不在这个引擎里")
            self.cache.manager.free(request.request_id)
            del self.running[slot]
        request.finish_time = time.perf_counter()

    # ---------------------------------------------------------------- 一步
    def _next_tokens(self, logits: torch.Tensor, requests: list[Request]) -> list[int]:
        return pick_tokens(logits, [r.sampling for r in requests], self.suppress_ids)

    def _emit(self, slot: int, request: Request, token: int, now: float) -> None:
        request.output.append(token)
        if request.first_token_time is None:
            request.first_token_time = now
        if len(request.output) >= request.max_new_tokens or token == self.eos_id:
            request.finish_time = now
            self.cache.manager.free(request.request_id)
            del self.running[slot]

    def _admit(self) -> list[tuple[int, Request, list[int]]]:
        """按到达顺序接纳等待的请求，直到槽位、块或本步词元预算不够；返回 ``(槽位, 请求, 要预填充的词元)``。"""
        manager = self.cache.manager
        used = len(self.running)  # 本步每条运行中的序列要解码一个词元
        admitted = []
        free_slots = self.max_batch - len(self.running)
        now = time.perf_counter()
        if not self.waiting or free_slots == 0 or self.waiting[0].arrival > now:
            return admitted
        if self.running and free_slots < self.min_prefill and sum(r.arrival <= now for r in self.waiting) >= free_slots:
            return admitted  # 攒一攒：等空出 min_prefill 个槽位再一起预填充
        # 块按“最终长度”预留：运行中的序列以后还要长（growth 块），新请求只能用剩下的块，解码中途才不会缺块
        growth = sum(manager.blocks_needed(len(r.prompt) + r.max_new_tokens) - len(manager.tables[r.request_id])
                     for r in self.running.values())
        free = sorted(set(range(self.max_batch)) - set(self.running), reverse=True)  # 空槽位，pop() 取最小的
        while self.waiting and free:
            request = self.waiting[0]
            if request.arrival > now:
                break
            final = manager.blocks_needed(len(request.prompt) + request.max_new_tokens)
            if final + growth > len(manager.free_blocks) or used + len(request.prompt) > self.token_budget:
                break
            self.waiting.popleft()
            reused = manager.allocate(request.request_id, request.prompt, request.adapter)
            # 马上登记它写满的提示块：本步前向里每层先写后读，同一步后接纳的同前缀请求也能共用
            manager.register_prefix(request.request_id, request.prompt, request.adapter)
            growth += final - len(manager.tables[request.request_id])  # 增量地记账，不必每接纳一条就重算全部
            self.prefill_tokens_saved += reused
            slot = free.pop()
            self.running[slot] = request
            admitted.append((slot, request, request.prompt[reused:]))
            used += len(request.prompt) - reused
        return admitted

    def _forward(self, work: list[tuple[int, Request, list[int]]]) -> None:
        """一次前向，取每行最后一个新词元的 logits 得到它的下一个词元。

        只有解码时每行恰好一个新词元，排成 ``(B, 1)`` 最省（注意力只在各自的行里算）；有预填充时，所有新词元
        首尾相接成 ``(1, N)``（:meth:`~.paged_cache.PagedKVCache.packed_view`），不为对齐最长的提示补齐。
        """
        seq_ids, lengths = [r.request_id for _, r, _ in work], [len(tokens) for _, _, tokens in work]
        if max(lengths) == 1:
            cache, positions, mask = self.cache.decode_view(seq_ids)
            batch = torch.tensor([tokens for _, _, tokens in work], device=positions.device)  # (B, 1)
            with self._routed(work, batch):
                logits = self.model(batch, cache=cache, positions=positions, attn_mask=mask)[:, -1]  # (B, V)
        else:
            cache, positions, mask, last = self.cache.packed_view(seq_ids, lengths)
            batch = torch.tensor([[t for _, _, tokens in work for t in tokens]], device=positions.device)  # (1, N)
            with self._routed(work, batch):
                logits = self.model(batch, cache=cache, positions=positions, attn_mask=mask)[0, last]  # (B, V)
        self.peak_held_bytes = max(self.peak_held_bytes, self.cache.held_bytes())
        now = time.perf_counter()
        for (slot, request, _), token in zip(work, self._next_tokens(logits, [r for _, r, _ in work])):
            request.slot_steps.append((self.steps, slot))
            self._emit(slot, request, token, now)

    def _routed(self, work: list[tuple[int, Request, list[int]]], batch: torch.Tensor):
        """有适配器时：每个送进模型的词元标上它所属请求的适配器编号，与 ``batch`` 同形（(B, 1) 或 (1, N)）。"""
        if self.adapters is None:
            return contextlib.nullcontext()
        per_token = [self.adapters.index(r.adapter) for _, r, tokens in work for _ in tokens]
        ids = torch.tensor(per_token, device=batch.device).view(batch.shape)  # 与 batch 的词元一一对应
        return self.adapters.route(ids)

    @torch.no_grad()
    def step(self) -> None:
        """调度一步：先接纳新请求，再让运行中的序列（各解码一个词元）与新请求（预填充）一起做**一次**前向。

        有预填充时打包成一行、不补齐，所以预填充不会让解码行陪着算到最长提示那么长，也不必为预填充另做一次前向
        （每次前向都有固定开销，小模型在 CPU 上尤其明显）。``decode_step`` 不是 ``"eager"`` 时改走固定形状的一支
        （:meth:`_fixed_forward`）：仍是一次前向，但形状要固定才能复用编译好的图，所以每个新词元一行、行数补齐到几种固定的值。
        """
        if self.model.training:  # 引擎只做推理：切到 eval 模式（每步都调用 eval() 本身就要遍历所有子模块）
            self.model.eval()
        work = [(slot, r, [r.output[-1]]) for slot, r in sorted(self.running.items())]  # 解码：每行送入上一个词元
        admitted = self._admit()  # 预填充：送入提示中没被前缀缓存覆盖的部分
        lengths = {r.request_id: self.cache.manager.lengths[r.request_id] for _, r, _ in work}
        rows = 0
        try:
            if self._fixed is not None and all(r.adapter is None for _, r, _ in work + admitted):
                before = self._fixed.forward_rows
                self._fixed_forward(work, admitted)
                rows = self._fixed.forward_rows - before
            elif work or admitted:
                self._forward(work + admitted)
                rows = sum(len(tokens) for _, _, tokens in work + admitted)
        except BaseException:  # 前向出错或被打断（Ctrl-C）：撤回这一步，引擎仍可接着用（不留下没有输出的“运行中”请求）
            self._undo_step(lengths, admitted)
            raise
        self.steps += 1
        self._rows += rows

    @property
    def forward_rows(self) -> int:
        """到目前为止做完的步（与 :attr:`steps` 数的是同样的步；出错撤回的步不算）送进模型的词元行数（每个词元在每层里都是
        矩阵乘法的一行）：eager 步只有真实的词元；固定形状的步
        每步 ``max_batch`` 个槽位行（空槽位也算）加上补齐到 2 的幂的预填充行。与 :attr:`steps` 一起看一步的用时随行数
        怎样变（第 13 章与 ``transformers`` 的对照）。"""
        return self._rows

    def _undo_step(self, lengths: dict[int, int], admitted: list[tuple[int, Request, list[int]]]) -> None:
        """撤回没做完的一步：运行中的序列退回这一步之前的长度（多分的块留在它的块表里，下一步接着用），
        这一步接纳的请求归还块、按原来的次序回到等待队列的最前面。"""
        manager = self.cache.manager
        for request_id, length in lengths.items():
            if request_id in manager.lengths:
                manager.lengths[request_id] = length
        for slot, request, tokens in reversed(admitted):
            self.prefill_tokens_saved -= len(request.prompt) - len(tokens)
            manager.free(request.request_id)
            del self.running[slot]
            self.waiting.appendleft(request)

    def _fixed_forward(self, work: list[tuple[int, Request, list[int]]],
                       admitted: list[tuple[int, Request, list[int]]]) -> None:
        """用固定形状的 :class:`~.decode_step.PagedDecodeStep`：运行中的序列（各解码一个词元）与新接纳的请求（预填充）
        一起做一次前向，每个槽位一行、空槽位也算，预填充的其余词元排在后面（同一步后接纳的请求共用的前缀块，
        每层都先写后读，前面的请求在同一步里写好）。"""
        manager = self.cache.manager
        rows = {}
        for slot, request, tokens in work + admitted:
            start = manager.lengths[request.request_id]
            write = manager.append_slots(request.request_id, len(tokens))
            rows[slot] = (tokens, start, write, manager.tables[request.request_id])
        logits, greedy, finite = self._fixed.step(self.cache, rows)  # (max_batch, V)、(max_batch,)、(max_batch,)
        greedy, finite = greedy.tolist(), finite.tolist()  # 一次搬成 Python 的数，不必逐行取
        picked = [(slot, request) for slot, request, _ in work + admitted]
        chosen = []  # 先给每个请求选好词元（可能报错），再一起送出：出错时这一步整个撤回，不会只送出一半
        for slot, request in picked:
            if request.sampling is None and finite[slot]:
                chosen.append(greedy[slot])  # 图里已按同样的屏蔽取了 argmax
            else:  # 采样；或这一行没有可选的词（NaN、+inf），由 greedy_tokens 报出与 eager 相同的错误
                (token,) = self._next_tokens(logits[slot:slot + 1], [request])
                chosen.append(token)
        self.peak_held_bytes = max(self.peak_held_bytes, self.cache.held_bytes())
        now = time.perf_counter()
        for (slot, request), token in zip(picked, chosen):
            request.slot_steps.append((self.steps, slot))
            self._emit(slot, request, token, now)

    def run(self, requests: Sequence[Request] | None = None) -> None:
        """一直调度到没有等待与运行的请求（到达时间在未来的请求会等到那一刻）。

        ``requests``：另外要跑的 :class:`Request`（例如 ``Request([2, 3], 5)``），先按顺序排进队列，跑完后它们的
        ``output`` 等字段就地填好；已由 :meth:`add_request` 提交的请求不会再排一次。未给 ``arrival``（0.0）的请求算作现在到达。
        """
        added: list[Request] = []
        try:
            for request in self._new_requests(requests):
                queued = self.add_request(request.prompt, request.max_new_tokens,
                                          arrival=request.arrival if request.arrival else None, sampling=request.sampling,
                                          adapter=request.adapter)
                request.prompt, request.request_id, request.arrival = queued.prompt, queued.request_id, queued.arrival
                request.finish_time = queued.finish_time
                if not queued.done:  # add_request 把它的副本排在队尾：换成调用方自己的对象
                    self.waiting[-1] = request
                    added.append(request)
        except Exception:  # 有一个请求不对，这一批就都不排：不在队里留下半批
            for request in added:
                self.waiting.remove(request)
            raise
        while self.has_work:
            if not self.running and self.waiting and self.waiting[0].arrival > time.perf_counter():
                time.sleep(max(0.0, self.waiting[0].arrival - time.perf_counter()))
            self.step()
