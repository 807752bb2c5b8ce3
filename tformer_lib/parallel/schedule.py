"""流水线调度（pipeline schedule）的时间线：每段（stage）按什么顺序做哪个微批（micro-batch）的前向、反向，
以及由此得到的空闲（气泡，bubble）比例。

一条时间线是一串 :class:`PipelineEvent`——``(rank, kind, micro_batch, start, end)``：第 ``rank`` 段在
``[start, end)`` 里做第 ``micro_batch`` 个微批的前向（``kind="F"``）或反向（``"B"``）。同一种格式有两个来源：

- :func:`ideal_schedule`：理想调度，纯函数——每次前向用 ``forward_time``、每次反向用 ``backward_time``
  （默认都是 1 个时间单位），通信不花时间；
- 手写流水线实测的时间线（:func:`tformer_lib.parallel.pipeline.measure_pipeline_timeline`）：每段在每一步开头的
  ``dist.barrier()`` 之后用 ``time.perf_counter`` 计时，单位是秒。

两种调度（:data:`SCHEDULES`），每段的顺序由 :func:`stage_order` 给出：

- GPipe：先把 m 个微批的前向全做完，再做 m 个反向——第 s 段同时“在飞”（前向做了、反向还没做）的微批最多 m 个；
- 1F1B（PipeDream-Flush）：第 s 段先做 p−1−s 个前向“预热”，然后一前一后交替，最后把剩下的反向做完——
  同时在飞的微批最多 p−s 个（与 m 无关），所以要存的激活少得多；气泡却与 GPipe 一样大。

空闲比例（:func:`idle_fraction`）= 1 − 各段忙碌时间之和 / (p × 整段时间跨度)。理想调度里它恰好是
(p−1)/(m+p−1)（:func:`~tformer_lib.parallel.pipeline.bubble_fraction`，测试对许多 p、m 核对）。
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Iterable, Sequence
from typing import NamedTuple

from .._checks import non_negative_int, positive_int

__all__ = ["PipelineEvent", "IdealTimeline", "SCHEDULES", "stage_order", "ideal_schedule", "makespan", "busy_time",
           "idle_fraction", "idle_per_rank", "peak_in_flight"]

#: 两种调度的名字
SCHEDULES = ("gpipe", "1f1b")


class PipelineEvent(NamedTuple):
    """时间线上的一格：第 ``rank`` 段在 ``[start, end)`` 做第 ``micro_batch`` 个微批的前向（"F"）或反向（"B"）。"""

    rank: int
    kind: str
    micro_batch: int
    start: float
    end: float


class IdealTimeline(list):
    """:func:`ideal_schedule` 返回的事件列表：普通的 ``list``，只多一个标记——时刻是理想调度的时间单位
    （一次前向 = ``forward_time``），不是实测的秒。画图（``time_unit="auto"``）按这个来源选单位，而不是看时刻是不是整数。"""

    ideal = True


def _check_schedule(schedule: str) -> str:
    if schedule not in SCHEDULES:
        raise ValueError(f"schedule 应是 {SCHEDULES} 之一，收到 {schedule!r}")
    return schedule


def stage_order(schedule: str, stages: int, micro_batches: int, stage: int) -> list[tuple[str, int]]:
    """第 ``stage`` 段依次要做的事：``[("F", 0), ("F", 1), …, ("B", 0), …]``。

    GPipe：全部前向，再全部反向（都按微批编号的顺序）。1F1B：先 ``min(p−1−s, m)`` 个前向预热，稳态里每做一个前向
    就做一个反向，最后做完剩下的反向。
    """
    _check_schedule(schedule)
    p, m = positive_int("stages", stages), positive_int("micro_batches", micro_batches)
    stage = non_negative_int("stage", stage)
    if stage >= p:
        raise ValueError(f"stage 应是 0…{p - 1} 之间的整数，收到 {stage!r}")
    if schedule == "gpipe":
        return [("F", i) for i in range(m)] + [("B", i) for i in range(m)]
    warmup = min(p - 1 - stage, m)
    order = [("F", i) for i in range(warmup)]
    for i in range(m - warmup):  # 稳态：一前（第 warmup+i 个）一后（第 i 个）
        order += [("F", warmup + i), ("B", i)]
    order += [("B", i) for i in range(m - warmup, m)]  # 冷却：剩下的反向
    return order


def ideal_schedule(schedule: str, stages: int, micro_batches: int, *, forward_time: float = 1.0,
                   backward_time: float = 1.0, stage_cost: Sequence[float] | None = None) -> IdealTimeline:
    """理想调度的时间线：每段按 :func:`stage_order` 的顺序做事，每件事尽早开始。

    依赖：第 s 段的前向 i 要等第 s−1 段的前向 i 做完（它的输出就是本段的输入）；反向 i 要等第 s+1 段的反向 i
    （对本段输出的梯度），最后一段的反向 i 要等自己的前向 i。通信不花时间。``stage_cost``（可选，每段一个正数）
    是各段的相对耗时：第 s 段的前向花 ``stage_cost[s] × forward_time``、反向花 ``stage_cost[s] × backward_time``
    （段与段不均衡时，如放了输出层的最后一段更慢）；默认各段都是 1。返回按开始时间排好的事件列表
    （:class:`IdealTimeline`，画图时据此用理想的时间单位）。
    """
    _check_schedule(schedule)
    p, m = positive_int("stages", stages), positive_int("micro_batches", micro_batches)
    for name, value in (("forward_time", forward_time), ("backward_time", backward_time)):
        if (isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value)
                or not value > 0):
            raise ValueError(f"{name} 应是有限的正数，收到 {value!r}")
    if stage_cost is None:
        cost = [1.0] * p
    else:
        if isinstance(stage_cost, (str, bytes)) or not isinstance(stage_cost, Sequence) or len(stage_cost) != p:
            raise ValueError(f"stage_cost 应是每段一个数的序列（{p} 个），收到 {stage_cost!r}")
        if any(isinstance(c, bool) or not isinstance(c, numbers.Real) or not math.isfinite(c) or not c > 0
               for c in stage_cost):
            raise ValueError(f"stage_cost 的每一项应是有限的正数，收到 {list(stage_cost)!r}")
        cost = [float(c) for c in stage_cost]
    orders = [stage_order(schedule, p, m, s) for s in range(p)]
    done: dict[tuple[str, int, int], float] = {}  # (kind, stage, micro_batch) → 结束时间
    free = [0.0] * p  # 每段空下来的时刻
    pos = [0] * p
    events: list[PipelineEvent] = []
    while any(pos[s] < len(orders[s]) for s in range(p)):
        progressed = False
        for s in range(p):
            while pos[s] < len(orders[s]):
                kind, i = orders[s][pos[s]]
                if kind == "F":
                    dep = ("F", s - 1, i) if s > 0 else None
                else:
                    dep = ("B", s + 1, i) if s < p - 1 else ("F", s, i)
                if dep is not None and dep not in done:
                    break  # 等别的段
                start = max(free[s], done[dep] if dep is not None else 0.0)
                end = start + cost[s] * (forward_time if kind == "F" else backward_time)
                done[(kind, s, i)] = free[s] = end
                events.append(PipelineEvent(s, kind, i, start, end))
                pos[s] += 1
                progressed = True
        if not progressed:  # pragma: no cover - 上面两种顺序都不会死锁
            raise RuntimeError(f"{schedule} 的顺序互相等待（死锁）")
    return IdealTimeline(sorted(events, key=lambda e: (e.start, e.rank)))


_EVENT_FORMAT = "PipelineEvent(rank, kind, micro_batch, start, end) 的列表"


def _events(events: Iterable) -> list[PipelineEvent]:
    """把 ``events`` 读成一个 PipelineEvent 列表（生成器只读一遍），并检查每个事件。"""
    if isinstance(events, (str, bytes)) or not isinstance(events, Iterable):
        raise TypeError(f"events 应是{_EVENT_FORMAT}，收到 {type(events).__name__}")
    out = []
    for e in events:
        if not isinstance(e, PipelineEvent):
            try:
                e = PipelineEvent(*e)
            except TypeError:
                raise TypeError(f"events 应是{_EVENT_FORMAT}，其中一项是 {e!r}") from None
        out.append(e)
    if not out:
        raise ValueError(f"events 为空：应是{_EVENT_FORMAT}")
    for e in out:
        if e.kind not in ("F", "B"):
            raise ValueError(f"事件的 kind 应是 'F' 或 'B'，收到 {e.kind!r}")
        for name in ("rank", "micro_batch"):
            non_negative_int(f"事件 {tuple(e)} 的 {name}", getattr(e, name))
        for name in ("start", "end"):
            value = getattr(e, name)
            if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value):
                raise ValueError(f"事件 {tuple(e)} 的 {name} 应是有限的数，收到 {value!r}")
        if e.end < e.start:
            raise ValueError(f"事件 {tuple(e)} 的 end 早于 start")
    return out


def makespan(events: Sequence) -> float:
    """整条时间线的跨度：最晚的结束 − 最早的开始。"""
    ev = _events(events)
    return max(e.end for e in ev) - min(e.start for e in ev)


def busy_time(events: Sequence) -> dict[int, float]:
    """每段忙碌（做前向或反向）的总时间 ``{rank: 时间}``。"""
    out: dict[int, float] = {}
    for e in _events(events):
        out[e.rank] = out.get(e.rank, 0.0) + (e.end - e.start)
    return dict(sorted(out.items()))


def idle_per_rank(events: Sequence) -> dict[int, float]:
    """每段在整条时间线跨度里空闲的比例 ``{rank: 比例}``。"""
    ev = _events(events)  # 只读一遍：events 可以是生成器
    span = makespan(ev)
    return {r: (1.0 - b / span if span > 0 else 0.0) for r, b in busy_time(ev).items()}


def idle_fraction(events: Sequence, stages: int | None = None) -> float:
    """所有段合起来的空闲比例：1 − Σ忙碌时间 / (p × 跨度)。``stages`` 默认取事件里出现的段数。

    理想调度（:func:`ideal_schedule`）里它等于 (p−1)/(m+p−1)；实测的时间线里它还包含通信与等待。
    """
    ev = _events(events)  # 只读一遍：events 可以是生成器
    busy = busy_time(ev)
    p = len(busy) if stages is None else positive_int("stages", stages)
    if p < len(busy):
        raise ValueError(f"stages={p} 太少：事件里出现了 {len(busy)} 个段 {sorted(busy)}，stages 至少应是 {len(busy)}")
    span = makespan(ev)
    return 1.0 - sum(busy.values()) / (p * span) if span > 0 else 0.0


def peak_in_flight(events: Sequence) -> dict[int, int]:
    """每段同时“在飞”的微批数的峰值 ``{rank: 个数}``：前向已开始、反向还没结束的微批——
    它们的激活都得存着等反向用。GPipe 是 m，1F1B 的第 s 段是 min(p−s, m)。"""
    out: dict[int, int] = {}
    by_rank: dict[int, list[PipelineEvent]] = {}
    for e in _events(events):
        by_rank.setdefault(e.rank, []).append(e)
    for r, ev in sorted(by_rank.items()):
        # 同一时刻先算开始（+1）、再算结束（−1）的话，首尾相接的两件事会被多算一个：结束排在前面
        points = sorted([(e.start, 1) for e in ev if e.kind == "F"] + [(e.end, -1) for e in ev if e.kind == "B"],
                        key=lambda t: (t[0], t[1]))
        live = peak = 0
        for _, delta in points:
            live += delta
            peak = max(peak, live)
        out[r] = peak
    return out
