"""一份可复现的请求负载（workload），以及在它上面比较静态批处理与连续批处理的度量。

负载里提示长短不一、输出长短不一（多数短、少数长，像真实的对话服务），到达时间按泊松过程（Poisson process）
由种子决定。度量（metrics）：

- 吞吐（throughput）：全部生成词元数 ÷ 从第一个请求到达到最后一个请求结束的墙钟时间；
- 首词元时延（time to first token，TTFT）：第一个新词元的时刻 − 到达时刻；
- 每词元时延（time per output token，TPOT）：（结束 − 第一个词元）÷（输出词元数 − 1）；

时延报告中位数 p50 与 p95。
"""

from __future__ import annotations

import inspect
import math
import random
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass

from torch import nn

from .._checks import finite_positive, language_model, positive_int
from .engine import Engine, Request
from .ragged import greedy_batch

__all__ = ["WorkItem", "make_workload", "run_static", "run_continuous", "summarize"]


@dataclass(frozen=True)
class WorkItem:
    """负载中的一个请求：提示、要生成的词元数、相对开始时刻的到达时间（秒）。"""

    prompt: tuple[int, ...]
    max_new_tokens: int
    arrival: float


def make_workload(prompts: Sequence[Sequence[int]], n_requests: int, *, max_len: int, seed: int = 0,
                  mean_new_tokens: float = 20.0, rate: float = 50.0) -> list[WorkItem]:
    """从 ``prompts`` 里有放回地抽 ``n_requests`` 个提示；输出长度取指数分布（均值 ``mean_new_tokens``，至少 2，
    不超出上下文），到达间隔取均值 ``1/rate`` 秒的指数分布。同一个 ``seed`` 给出同一份负载。"""
    if isinstance(prompts, (str, bytes)) or not isinstance(prompts, Sequence) or not prompts:
        raise ValueError(f"prompts 应是非空的提示列表（每条是 id 列表），收到 {prompts!r:.40}")
    n_requests = positive_int("n_requests", n_requests)
    positive_int("max_len", max_len)
    finite_positive("mean_new_tokens", mean_new_tokens)
    finite_positive("rate", rate)
    rng = random.Random(seed)
    items, now = [], 0.0
    for _ in range(n_requests):
        prompt = tuple(rng.choice(prompts))
        room = max_len - len(prompt)
        if room < 1:
            raise ValueError(f"提示长度 {len(prompt)} 已占满上下文 max_len={max_len}")
        n_new = min(room, max(2, round(rng.expovariate(1.0 / mean_new_tokens))))
        items.append(WorkItem(prompt, n_new, now))
        now += rng.expovariate(rate)
    return items


def run_static(model: nn.Module, items: Sequence[WorkItem], *, max_batch: int = 8, eos_id: int | None = None,
               max_wait: float = 0.05) -> tuple[list[Request], float]:
    """静态批处理：已到达的请求凑成一批（至多 ``max_batch`` 条），一起跑到这批里最长的一条结束，再开下一批。

    开批的时机是常见的“凑满或超时”：已到达 ``max_batch`` 条、或最早到的那条已等了 ``max_wait`` 秒、或后面不会
    再有请求来。不等的话，负载开头只到了一两条时就开批，整批槽位被这一两条占到结束，对静态批处理不公平。
    每批用 :func:`~.ragged.greedy_batch`（左侧填充、连续的 K/V 缓存，与连续批处理同一个模型前向）。
    返回每个请求的记录（时刻、每步所在槽位）与总墙钟时间。
    """
    language_model("model", model)
    positive_int("max_batch", max_batch)
    _check_items(items)
    if not (isinstance(max_wait, (int, float)) and not isinstance(max_wait, bool) and max_wait >= 0):
        raise ValueError(f"max_wait 应是非负的秒数，收到 {max_wait!r}")
    start = time.perf_counter()
    requests = [Request(list(it.prompt), it.max_new_tokens, i, start + it.arrival) for i, it in enumerate(items)]
    pending, step = list(requests), 0
    while pending:
        now = time.perf_counter()
        arrived = [r for r in pending if r.arrival <= now]
        if len(arrived) < min(max_batch, len(pending)):  # 还没凑满，后面还有请求要来
            later = min(r.arrival for r in pending if r.arrival > now)
            deadline = min(r.arrival for r in arrived) + max_wait if arrived else later
            if now < deadline:
                time.sleep(max(0.0, min(later, deadline) - now))
                continue
        batch = arrived[:max_batch]
        taken = {id(r) for r in batch}
        pending = [r for r in pending if id(r) not in taken]
        steps_of = [0] * len(batch)

        def on_token(b, token, batch=batch, steps_of=steps_of, base=step):
            r = batch[b]
            r.slot_steps.append((base + steps_of[b], b))
            steps_of[b] += 1
            t = time.perf_counter()
            if r.first_token_time is None:
                r.first_token_time = t
            r.finish_time = t

        outputs = greedy_batch(model, [r.prompt for r in batch], [r.max_new_tokens for r in batch],
                               eos_id=eos_id, on_token=on_token)
        for r, out in zip(batch, outputs):
            r.output = out
            if not out:  # max_new_tokens=0：不生成词元，随这一批结束（没有第一个词元）
                r.finish_time = time.perf_counter()
        # 整批要跑到最长的一条结束：这段时间里所有槽位都被这批占着
        step += max((len(out) for out in outputs), default=0)
    return requests, time.perf_counter() - start


def run_continuous(model: nn.Module, items: Sequence[WorkItem], *, max_batch: int = 8, eos_id: int | None = None,
                   **engine_options) -> tuple[list[Request], float, Engine]:
    """连续批处理：同一份负载交给 :class:`~.engine.Engine`；返回请求记录、总墙钟时间与引擎（看内存峰值等）。"""
    _check_items(items)
    known = set(inspect.signature(Engine).parameters) - {"model", "max_batch", "eos_id"}
    unknown = sorted(set(engine_options) - known)
    if unknown:
        raise TypeError(f"run_continuous 不认识参数 {'、'.join(unknown)}；可交给 Engine 的有 {'、'.join(sorted(known))}")
    engine = Engine(model, max_batch=max_batch, eos_id=eos_id, **engine_options)
    start = time.perf_counter()
    requests = [engine.add_request(list(it.prompt), it.max_new_tokens, arrival=start + it.arrival) for it in items]
    engine.run()
    return requests, time.perf_counter() - start, engine


def _check_items(items) -> None:
    """``items`` 应是非空的 :class:`WorkItem` 列表（:func:`make_workload` 的结果）。"""
    if isinstance(items, (str, bytes)) or not isinstance(items, Sequence) or not items:
        raise ValueError(f"items 应是非空的 WorkItem 列表（make_workload 的结果），收到 {items!r:.40}")
    for i, it in enumerate(items):
        if not isinstance(it, WorkItem):
            raise TypeError(f"items[{i}] 应是 WorkItem(prompt, max_new_tokens, arrival)，收到 {type(it).__name__}")


def _percentile(values: list[float], q: float) -> float:
    if not values:
        return math.nan
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def summarize(requests: Sequence[Request], wall: float) -> dict:
    """吞吐（词元/秒）与 TTFT、TPOT 的 p50/p95（秒）。

    TTFT 只算生成了词元的请求，TPOT 只算生成了 2 个以上词元的请求；没有这样的请求时那一项是 ``nan``（无从定义）。
    ``wall`` 是整份负载的墙钟秒数（有限的正数）。
    """
    if isinstance(requests, (str, bytes)) or not isinstance(requests, Sequence) or not requests:
        raise ValueError(f"requests 应是非空的 Request 列表，收到 {requests!r:.40}")
    for i, r in enumerate(requests):
        if not isinstance(r, Request):
            raise TypeError(f"requests[{i}] 应是 Request，收到 {type(r).__name__}")
        if not r.done:
            raise ValueError(f"requests[{i}] 还没结束（finish_time 为 None）：先跑完再汇总")
    wall = finite_positive("wall", wall)
    tokens = sum(len(r.output) for r in requests)
    ttft = [r.first_token_time - r.arrival for r in requests if r.output and r.first_token_time is not None]
    tpot = [(r.finish_time - r.first_token_time) / (len(r.output) - 1) for r in requests if len(r.output) > 1]
    return {
        "tokens": tokens,
        "seconds": wall,
        "throughput": tokens / wall,
        "ttft_p50": statistics.median(ttft) if ttft else math.nan, "ttft_p95": _percentile(ttft, 0.95),
        "tpot_p50": statistics.median(tpot) if tpot else math.nan, "tpot_p95": _percentile(tpot, 0.95),
    }
