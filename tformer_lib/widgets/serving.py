"""第 13 章的探索器：分页缓存的块表一步一步怎样变（请求到达、增长、结束），以及批槽位时间线随 ``max_batch`` 的变化。

两个探索器都先真的跑一遍 :class:`~tformer_lib.serving.Engine`（以及静态批处理），把每一帧要画的**状态**记下来，
再交给 :class:`~tformer_lib.widgets.base.Explorer` 预先画成帧：网页上（没有内核）拖动滑块就换帧。
所有请求都在 0 时刻到达、只做贪心解码、不设 EOS，所以调度只由提示与输出长度决定，每次运行逐帧相同。
"""

from __future__ import annotations

from collections.abc import Sequence

import ipywidgets as widgets

from tformer_lib._checks import positive_int
from tformer_lib.widgets.base import MAX_FRAMES, Explorer

__all__ = ["block_table_states", "block_table_explorer", "slot_timelines", "slot_timeline_explorer"]


def _requests(requests) -> list[tuple[list[int], int]]:
    out = []
    for i, r in enumerate(requests):
        try:
            prompt, n_new = r if isinstance(r, tuple) and len(r) == 2 else (r.prompt, r.max_new_tokens)
        except (AttributeError, TypeError, ValueError) as exc:
            raise TypeError(f"requests[{i}] 应是 (提示 id 列表, max_new_tokens) 或 WorkItem，收到 {r!r:.60}") from exc
        n_new = positive_int(f"requests[{i}] 的 max_new_tokens", n_new)
        out.append((list(prompt), n_new))
    if not out:
        raise ValueError("requests 为空")
    return out


def _frames(max_frames) -> int:
    max_frames = positive_int("max_frames", max_frames)
    if not 2 <= max_frames <= MAX_FRAMES:
        raise ValueError(f"max_frames 应是 [2, {MAX_FRAMES}] 内的整数（至少留第一步与最后一步），收到 {max_frames!r}")
    return max_frames


def _max_batches(max_batches) -> list[int]:
    if isinstance(max_batches, (str, bytes)) or not isinstance(max_batches, Sequence):
        raise TypeError(f"max_batches 应是正整数的序列（如 (2, 4, 8)），收到 {type(max_batches).__name__}")
    values = list(max_batches)
    if not values or len(values) > MAX_FRAMES:
        raise ValueError(f"max_batches 应有 1 到 {MAX_FRAMES} 个取值，收到 {values!r}")
    values = [positive_int("max_batches 里每个取值", b) for b in values]
    if len(set(values)) != len(values):
        raise ValueError(f"max_batches 里有重复的取值：{values}")
    return values


def _pick(n: int, limit: int) -> list[int]:
    """从 ``0 … n-1`` 里均匀挑至多 ``limit`` 个（含首尾）。"""
    if n <= limit:
        return list(range(n))
    return sorted({round(k * (n - 1) / (limit - 1)) for k in range(limit)})


def block_table_states(model, requests, *, max_batch: int = 3, block_size: int = 4, num_blocks: int | None = None,
                       max_frames: int = MAX_FRAMES) -> list[dict]:
    """逐步运行一个引擎，记下每步之后分页缓存的状态；返回至多 ``max_frames`` 帧（均匀挑选，含第一步与最后一步）。

    ``requests``：``[(提示, max_new_tokens), …]`` 或 :class:`~tformer_lib.serving.WorkItem` 列表（到达时间不用，都在 0 时刻）。
    ``num_blocks`` 默认刚好够 ``max_batch`` 条最长的请求（块不够时请求排队，也能在帧里看到）。
    每帧是 ``{"step", "snapshot", "running", "waiting", "finished", "held_bytes"}``；``snapshot`` 见
    :func:`~tformer_lib.plotting.serving.block_table_snapshot`。
    """
    from tformer_lib.plotting.serving import block_table_snapshot
    from tformer_lib.serving.engine import Engine

    work = _requests(requests)
    max_frames = _frames(max_frames)
    if num_blocks is None:  # 刚好够 max_batch 条最长的请求同时运行：物理块的格子不至于多到看不清
        num_blocks = max_batch * max(-(-(len(p) + n) // block_size) for p, n in work)
    engine = Engine(model, max_batch=max_batch, block_size=block_size, num_blocks=num_blocks)
    reqs = [engine.add_request(p, n, arrival=0.0) for p, n in work]
    states = []
    while engine.has_work:
        engine.step()
        states.append({"step": engine.steps, "snapshot": block_table_snapshot(engine.cache.manager),
                       "running": sorted(r.request_id for r in engine.running.values()),
                       "waiting": [r.request_id for r in engine.waiting],
                       "finished": [r.request_id for r in reqs if r.done],
                       "held_bytes": engine.cache.held_bytes()})
    return [states[i] for i in _pick(len(states), max_frames)]


def _state_title(state: dict) -> str:
    def ids(xs):
        return "、".join(map(str, xs)) if xs else "无"

    return (f"第 {state['step']} 步之后：运行中 {ids(state['running'])}；等待 {ids(state['waiting'])}；"
            f"已结束 {ids(state['finished'])}")


def block_table_explorer(model, requests, *, max_batch: int = 3, block_size: int = 4, num_blocks: int | None = None,
                         max_frames: int = 12) -> Explorer:
    """块表探索器：一个“引擎步”滑块（网页上也能拖动），每帧是那一步之后的 :func:`~tformer_lib.plotting.serving.plot_block_table`。

    提示前缀相同的请求会共用写满的前缀块（金色、标出引用数）；请求结束时它的块回到空闲。
    """
    from tformer_lib.plotting.serving import plot_block_table

    states = block_table_states(model, requests, max_batch=max_batch, block_size=block_size,
                                num_blocks=num_blocks, max_frames=max_frames)
    control = widgets.SelectionSlider(options=[(str(s["step"]), i) for i, s in enumerate(states)], value=0,
                                      description="引擎步", continuous_update=False,
                                      style={"description_width": "initial"}, layout={"width": "520px"})

    def _plot(frame):
        state = states[frame]
        return plot_block_table(state["snapshot"], title=_state_title(state))

    _plot.__name__ = "plot_block_table"
    explorer = Explorer(_plot, {"frame": control}, {}, title="分页 K/V 缓存：块表一步一步", static="frame")
    explorer.states = states
    return explorer


def slot_timelines(model, requests, max_batches: Sequence[int] = (2, 4, 8)) -> dict[int, dict]:
    """对每个 ``max_batch`` 各跑一遍静态批处理与连续批处理（都在 0 时刻到达），返回
    ``{max_batch: {"static": [...], "continuous": [...]}}``（每个请求的 ``[(步, 槽位), …]``），并核对两者输出相同。"""
    from tformer_lib.serving.workload import WorkItem, run_continuous, run_static

    items = [WorkItem(tuple(p), n, 0.0) for p, n in _requests(requests)]
    max_batches = _max_batches(max_batches)
    out = {}
    for max_batch in max_batches:
        static, _ = run_static(model, items, max_batch=max_batch)
        continuous, _, _ = run_continuous(model, items, max_batch=max_batch)
        if [r.output for r in static] != [r.output for r in continuous]:
            raise AssertionError(f"max_batch={max_batch} 时静态与连续批处理生成的词元不同")
        out[max_batch] = {"static": [r.slot_steps for r in static], "continuous": [r.slot_steps for r in continuous]}
    return out


def slot_timeline_explorer(model, requests, max_batches: Sequence[int] = (2, 4, 8), value: int | None = None) -> Explorer:
    """时间线探索器：一个 ``max_batch`` 滑块（网页上也能拖动），每帧是静态 vs 连续批处理的
    :func:`~tformer_lib.plotting.serving.plot_slot_timeline`。"""
    from tformer_lib.plotting.serving import plot_slot_timeline

    max_batches = _max_batches(max_batches)
    timelines = slot_timelines(model, requests, max_batches)
    value = max_batches[len(max_batches) // 2] if value is None else value
    if value not in max_batches:
        raise ValueError(f"value={value!r} 应是 max_batches 之一：{max_batches}")
    control = widgets.SelectionSlider(options=[(str(b), b) for b in max_batches], value=value,
                                      description="max_batch", continuous_update=False,
                                      style={"description_width": "initial"})

    def _plot(max_batch):
        return plot_slot_timeline(timelines[max_batch], max_batch=max_batch, show_ids=False,
                                  title=f"max_batch = {max_batch}：哪个请求在哪一步占着哪个槽位")

    _plot.__name__ = "plot_slot_timeline"
    explorer = Explorer(_plot, {"max_batch": control}, {}, title="静态 vs 连续批处理：槽位时间线", static="max_batch")
    explorer.timelines = timelines
    return explorer
