"""第 12 章（分布式训练）的图：流水线的时间线、ZeRO 各阶段每个进程的显存、各方案每步的通信量。

都是纯函数：给数据，返回 ``matplotlib.figure.Figure``；数据来自 :mod:`tformer_lib.parallel`：

- :func:`plot_pipeline_timeline`：:func:`~tformer_lib.parallel.schedule.ideal_schedule` 的理想时间线，或
  :func:`~tformer_lib.parallel.pipeline.measure_pipeline_timeline` 实测的时间线（可以几条上下并排）；
- :func:`plot_zero_memory`：:func:`~tformer_lib.parallel.zero.zero_bytes_per_rank` 的阶段 0–3，旁边可放 FSDP2 实测；
- :func:`plot_comm_volume`：每种方案每步的通信字节，公式与手写方案实际交出的张量（:mod:`~tformer_lib.parallel.comm`）并排。
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping, Sequence

import numpy as np

from tformer_lib.plotting._common import blank_figure, new_figure

__all__ = ["plot_pipeline_timeline", "plot_pipeline_schedules", "plot_zero_memory", "plot_comm_volume",
           "ZERO_PART_LABELS"]

_F_COLOR, _B_COLOR, _IDLE_COLOR = "#4c72b0", "#dd8452", "#eeeeee"
#: ZeRO 账本三项的中文名
ZERO_PART_LABELS = {"parameters": "参数", "gradients": "梯度", "optimizer": "优化器状态（Adam 的 m、v）"}
_ZERO_COLORS = {"parameters": "#1f77b4", "gradients": "#ff7f0e", "optimizer": "#2ca02c"}
_TIME_UNITS = ("auto", "units", "ms", "s")


def _as_events(events, name: str) -> list:
    from tformer_lib.parallel.schedule import PipelineEvent

    try:
        out = [e if isinstance(e, PipelineEvent) else PipelineEvent(*e) for e in events]
    except TypeError as exc:
        raise TypeError(f"{name} 应是 PipelineEvent(rank, kind, micro_batch, start, end) 的列表") from exc
    if not out:
        raise ValueError(f"{name} 为空：应是 PipelineEvent(rank, kind, micro_batch, start, end) 的列表")
    return out


def _auto_unit(events, ideal: bool) -> str:
    """``time_unit="auto"`` 的单位按事件的来源定：:func:`~tformer_lib.parallel.schedule.ideal_schedule` 返回的列表
    （带 ``ideal`` 标记）→ 理想的时间单位，不论时刻是不是整数（反向耗时 1.5 也一样）；别的列表（实测，秒）→ 毫秒，
    只有时刻全是整数的手写列表才当作理想的时间单位（实测的秒几乎不可能全是整数）。"""
    if ideal:
        return "units"
    whole = all(float(e.start).is_integer() and float(e.end).is_integer() for e in events)
    return "units" if whole else "ms"


def _draw_timeline(ax, events, time_unit: str, title: str | None) -> None:
    from tformer_lib.parallel.schedule import idle_fraction
    scale = {"units": 1.0, "ms": 1e3, "s": 1.0}[time_unit]
    origin = min(e.start for e in events)
    ranks = sorted({e.rank for e in events})
    span = (max(e.end for e in events) - origin) * scale
    for r in ranks:  # 灰色底：整条跨度；盖不住的地方就是空闲（气泡）
        ax.barh(r, span, left=0, height=0.8, color=_IDLE_COLOR, edgecolor="none", zorder=1)
    for e in events:
        left, width = (e.start - origin) * scale, (e.end - e.start) * scale
        ax.barh(e.rank, width, left=left, height=0.8, color=_F_COLOR if e.kind == "F" else _B_COLOR,
                edgecolor="white", linewidth=0.8, zorder=2)
        if width > span / 60:
            ax.text(left + width / 2, e.rank, str(e.micro_batch), ha="center", va="center", fontsize=7,
                    color="white", zorder=3)
    ax.set_yticks(ranks, [f"第 {r} 段" for r in ranks])
    ax.set_ylim(max(ranks) + 0.6, min(ranks) - 0.6)  # 第 0 段在最上面
    ax.set_xlim(0, span * 1.01 if span > 0 else 1)
    ax.set_xlabel({"units": "时间（一次前向 = 1）", "ms": "时间（毫秒）", "s": "时间（秒）"}[time_unit])
    idle = idle_fraction(events, len(ranks))
    ax.set_title(f"{title}：空闲 {idle:.1%}" if title else f"空闲比例 {idle:.1%}", fontsize=10)
    ax.grid(axis="x", alpha=0.3, zorder=0)


def plot_pipeline_timeline(events, *, title: str | None = None, time_unit: str = "auto", ax=None):
    """流水线时间线：每段（进程）一行，蓝框是前向 F、橙框是反向 B，框里的数字是微批编号；灰色露出来的地方是空闲。

    ``events``：一串 :class:`~tformer_lib.parallel.schedule.PipelineEvent`，或 ``{名字: 事件列表}``（每条一个子图，
    上下排列，例如“理想 GPipe”“实测”）。每个子图的标题写着它的空闲比例
    （:func:`~tformer_lib.parallel.schedule.idle_fraction`）。``time_unit``：``"auto"``（按来源：
    :func:`~tformer_lib.parallel.schedule.ideal_schedule` 的结果 → 理想调度的时间单位；实测的秒 → 毫秒；
    时刻全是整数的手写列表也当作理想单位）、``"units"``、``"ms"``、``"s"``。
    """
    if time_unit not in _TIME_UNITS:
        raise ValueError(f"time_unit 应是 {_TIME_UNITS} 之一，收到 {time_unit!r}")
    panels = dict(events) if isinstance(events, Mapping) else {None: events}
    if not panels:
        raise ValueError("events 为空：应是事件列表或 {名字: 事件列表}")
    units = {}
    for name, ev in list(panels.items()):  # 单位按来源定（见 _auto_unit）：转成普通列表之前先看 ideal 标记
        ideal = getattr(ev, "ideal", False)
        panels[name] = _as_events(ev, f"events[{name!r}]" if name is not None else "events")
        units[name] = time_unit if time_unit != "auto" else _auto_unit(panels[name], ideal)
    if ax is not None and len(panels) > 1:
        raise ValueError("给了 ax 时只能画一条时间线（events 应是一个列表）")
    if ax is None:
        n_rows = sum(len({e.rank for e in ev}) for ev in panels.values())
        fig = blank_figure((8.0, 0.9 + 0.45 * n_rows + 0.75 * len(panels)))
        axes = fig.subplots(len(panels), 1, squeeze=False)[:, 0]
    else:
        fig, axes = ax.figure, [ax]
    for a, (name, ev) in zip(axes, panels.items()):
        _draw_timeline(a, ev, units[name], name)
    from matplotlib.patches import Patch

    handles = [Patch(color=_F_COLOR, label="前向 F"), Patch(color=_B_COLOR, label="反向 B"),
               Patch(color=_IDLE_COLOR, label="空闲（气泡）")]
    if title:
        fig.suptitle(title, fontsize=11)
    if ax is None:  # 图例放在整张图之外（constrained 布局给它留出位置）：有总标题时放到底下，免得与总标题重叠
        where = "outside lower center" if title else "outside upper center"
        fig.legend(handles=handles, fontsize=7, loc=where, ncol=3, frameon=False)
    else:
        ax.legend(handles=handles, fontsize=7, loc="upper right", ncol=3, framealpha=0.8)
    return fig


def plot_pipeline_schedules(stages: int = 4, micro_batches: int = 8, *, schedules: Sequence[str] = ("gpipe", "1f1b"),
                            backward_time: float = 2.0, title: str | None = None):
    """同样 p 段、m 个微批的理想调度上下并排（默认 GPipe 与 1F1B，反向耗时 = 2 × 前向）。

    每条的标题写着它的空闲比例；总标题写出公式 (p−1)/(m+p−1) 的值。各段同时在飞的微批数（要存几份激活）
    不写在图上：它是第 12 章的练习 4，读者从时间线上自己数。
    """
    from tformer_lib.parallel.pipeline import bubble_fraction
    from tformer_lib.parallel.schedule import ideal_schedule

    names = {"gpipe": "GPipe", "1f1b": "1F1B"}
    if isinstance(schedules, str):  # 一个名字 = 只画这一种调度（不要把字符串逐字拆开）
        schedules = (schedules,)
    schedules = tuple(schedules)
    if not schedules:
        raise ValueError("schedules 为空：应是 'gpipe'、'1f1b' 之一或它们的序列")
    panels = {}
    for sch in schedules:
        events = ideal_schedule(sch, stages, micro_batches, backward_time=backward_time)
        panels[names.get(sch, sch)] = events
    bubble = bubble_fraction(stages, micro_batches)
    return plot_pipeline_timeline(panels, title=title or (f"p = {stages} 段、m = {micro_batches} 个微批："
                                                         f"气泡 (p−1)/(m+p−1) = {bubble:.1%}"))


def plot_zero_memory(n_params: int, world_size: int, *, measured: Mapping[str, float] | None = None,
                     stages: Sequence[int] = (0, 1, 2, 3), unit: float = 2**20, param_bytes: int = 4,
                     grad_bytes: int = 4, optimizer_bytes: int = 8, title: str | None = None, ax=None):
    """ZeRO 各阶段每个进程存的模型状态：每个阶段一根堆叠条（参数 / 梯度 / 优化器状态，:func:`~tformer_lib.parallel.zero.zero_bytes_per_rank`）。

    ``measured``：FSDP2 实测的每进程字节 ``{"parameters", "gradients", "optimizer"}``
    （:func:`~tformer_lib.parallel.fsdp.local_bytes`），给出时在阶段 3 旁边多画一根“FSDP2 实测”。
    ``unit``：换算单位（默认 MiB）。字节数按 ``param_bytes``/``grad_bytes``/``optimizer_bytes`` 计（默认 fp32 + AdamW 的 4/4/8）。
    """
    from tformer_lib.parallel.zero import ZERO_STAGES, zero_bytes_per_rank

    if not (isinstance(unit, (int, float)) and unit > 0):
        raise ValueError(f"unit 应为正数，收到 {unit!r}")
    stages = list(stages)
    if not stages or any(s not in ZERO_STAGES for s in stages):
        raise ValueError(f"stages 应是 {ZERO_STAGES} 里的阶段，收到 {stages!r}")
    rows = {f"阶段 {s}" + ("（DDP）" if s == 0 else "（FSDP）" if s == 3 else ""):
            zero_bytes_per_rank(n_params, world_size, s, param_bytes=param_bytes, grad_bytes=grad_bytes,
                                optimizer_bytes=optimizer_bytes) for s in stages}
    if measured is not None:
        missing = [k for k in ZERO_PART_LABELS if k not in measured]
        if missing:
            raise ValueError(f"measured 缺少 {missing}：应是 {{'parameters', 'gradients', 'optimizer'}} 的字节数")
        if 3 not in stages:
            raise ValueError(f"measured（FSDP2 实测）画在阶段 3 旁边：stages 里应有 3，收到 {tuple(stages)!r}")
        rows["FSDP2 实测"] = dict(measured)
    if ax is None:
        fig, ax = new_figure((7.6, 1.0 + 0.55 * len(rows)))
    else:
        fig = ax.figure
    names = list(rows)
    left = np.zeros(len(names))
    for part, label in ZERO_PART_LABELS.items():
        widths = np.array([rows[n][part] / unit for n in names], dtype=float)
        ax.barh(names, widths, left=left, color=_ZERO_COLORS[part], label=label,
                hatch=None, edgecolor="white", linewidth=0.6)
        left += widths
    for y, total in enumerate(left):
        ax.text(total, y, f" {total:.3g}", va="center", fontsize=8)
    ax.invert_yaxis()
    ax.set_xlim(0, left.max() * 1.18)
    ax.set_xlabel("每个进程的内存（MiB）" if unit == 2**20 else f"每个进程的内存（× {unit:g} 字节）")
    ax.legend(fontsize=7, loc="lower right")
    ax.grid(axis="x", alpha=0.3)
    ax.set_title(title or f"ZeRO：{n_params:,} 个参数、{world_size} 个进程时每个进程存多少", fontsize=10)
    return fig


def plot_comm_volume(volumes: Mapping[str, Mapping[str, float]], *, unit: float = 2**10, log: bool = False,
                     title: str | None = None, ax=None):
    """每种方案每步的通信量：每个方案两根横条——公式（``"formula"``）与手写方案实际交出的张量（``"recorded"``）。

    ``volumes``：``{方案名: {"formula": 字节, "recorded": 字节}}``（``recorded`` 可缺，例如只有公式的方案）；
    数据来自 :mod:`tformer_lib.parallel.comm` 的公式与 ``bytes_per_step``。``unit`` 默认 KiB；方案之间差几个数量级时
    用 ``log=True``（对数横轴）。
    """
    if not volumes:
        raise ValueError("volumes 为空：应是 {方案名: {'formula': 字节, 'recorded': 字节}}")
    if not (isinstance(unit, (int, float)) and unit > 0):
        raise ValueError(f"unit 应为正数，收到 {unit!r}")
    for name, v in volumes.items():
        if not isinstance(v, Mapping) or "formula" not in v:
            raise TypeError(f"volumes[{name!r}] 应是含 'formula'（可另有 'recorded'）的字典，收到 {v!r}")
        for key in ("formula", "recorded"):
            value = v.get(key)
            if value is None and key == "recorded":
                continue
            if (isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value)
                    or value < 0 or (log and value == 0)):
                want = "正数（log=True 的对数轴画不了 0）" if log else " ≥ 0 的有限字节数"
                raise ValueError(f"volumes[{name!r}][{key!r}] 应是{want}，收到 {value!r}")
    if ax is None:
        fig, ax = new_figure((7.2, 1.0 + 0.7 * len(volumes)))
    else:
        fig = ax.figure
    names = list(volumes)
    y = np.arange(len(names))
    h = 0.38
    formula = np.array([volumes[n]["formula"] / unit for n in names], dtype=float)
    recorded = np.array([volumes[n].get("recorded", np.nan) / unit if volumes[n].get("recorded") is not None
                         else np.nan for n in names], dtype=float)
    ax.barh(y - h / 2, formula, height=h, color="#8da0cb", label="公式")
    ax.barh(y + h / 2, np.nan_to_num(recorded), height=h, color="#fc8d62", label="实际交出的张量")
    top = np.nanmax(np.concatenate([formula, recorded]))
    for yi, (f, r) in enumerate(zip(formula, recorded)):
        ax.text(f, yi - h / 2, f" {f:.4g}", va="center", fontsize=7)
        ax.text(0 if np.isnan(r) else r, yi + h / 2, " （未记录）" if np.isnan(r) else f" {r:.4g}", va="center",
                fontsize=7)
    ax.set_yticks(y, names)
    ax.invert_yaxis()
    if log:
        low = np.nanmin(np.concatenate([formula, recorded])[np.concatenate([formula, recorded]) > 0], initial=top)
        ax.set_xscale("log")
        ax.set_xlim(low / 3, top * 4)
    else:
        ax.set_xlim(0, top * 1.22 if top > 0 else 1)
    ax.set_xlabel("每步通信量（KiB）" if unit == 2**10 else "每步通信量（MiB）" if unit == 2**20
                  else f"每步通信量（× {unit:g} 字节）")
    ax.legend(fontsize=7, loc="lower right")
    ax.grid(axis="x", alpha=0.3)
    ax.set_title(title or "每个训练步交给通信原语的字节：公式与实测", fontsize=10)
    return fig
