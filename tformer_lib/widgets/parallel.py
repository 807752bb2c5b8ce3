"""第 12 章的探索器：流水线调度随微批数 m 怎样变（气泡 (p−1)/(m+p−1)），与 ZeRO 各阶段每个进程的显存随进程数 p 怎样变。

两个探索器都只画公式与理想调度（纯函数，不起进程），每档预先画好一帧：网页上（没有内核）也能拖动静态滑块，
Jupyter 里其余控件实时重画。帧数与尺寸都小，合计远在每章 1.5 MB 的帧预算之内。
"""

from __future__ import annotations

import numbers
from collections.abc import Mapping, Sequence

import ipywidgets as widgets

from tformer_lib._checks import finite_positive

from tformer_lib.widgets.base import Explorer

__all__ = ["pipeline_schedule_explorer", "zero_memory_explorer", "PIPELINE_MICRO_BATCHES", "ZERO_WORLD_SIZES"]

#: 流水线探索器网页上可选的微批数
PIPELINE_MICRO_BATCHES = (1, 2, 4, 8, 16)
#: ZeRO 探索器网页上可选的进程数
ZERO_WORLD_SIZES = (1, 2, 4, 8, 16, 64)

_STYLE = {"description_width": "initial"}
#: ToggleButtons 的每个按钮默认固定 148 px 宽，“fp32 + AdamW（4+4+8 字节）”会被截成“fp32 + AdamW（…”：按钮随标签变宽
_TOGGLE_STYLE = {**_STYLE, "button_width": "auto"}
#: 流水线探索器里段数滑块的范围
_STAGES_RANGE = (2, 8)


def _int_at_least(name: str, value, low: int, high: int | None = None) -> int:
    """整数（含 NumPy 整数，不含 bool）且在 [low, high] 内；否则点名参数报错（不让滑块悄悄把它夹到范围里）。"""
    if (isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < low
            or (high is not None and value > high)):
        want = f" {low}…{high} 之间的整数" if high is not None else f" ≥ {low} 的整数"
        raise ValueError(f"{name} 应是{want}，收到 {value!r}")
    return int(value)


def _options(values, name: str = "options") -> list[int]:
    if isinstance(values, (str, bytes)) or not isinstance(values, Sequence) or not values:
        raise ValueError(f"{name} 应是非空的正整数序列，收到 {values!r}")
    return [_int_at_least(f"{name} 里的值", v, 1) for v in values]


def pipeline_schedule_explorer(stages: int = 4, micro_batches: int = 8, *, backward_time: float = 2.0,
                               options: Sequence[int] = PIPELINE_MICRO_BATCHES) -> Explorer:
    """流水线调度探索器：静态滑块“微批数 m”（网页上也能拖），Jupyter 里还能改段数 p。

    每帧是 :func:`~tformer_lib.plotting.parallel.plot_pipeline_schedules`：GPipe 与 1F1B 的理想时间线上下并排，
    标题里是气泡比例 (p−1)/(m+p−1)（在飞微批数的峰值留给练习 4，不写在图上）。
    """
    from tformer_lib.plotting.parallel import plot_pipeline_schedules

    stages = _int_at_least("stages", stages, *_STAGES_RANGE)
    micro_batches = _int_at_least("micro_batches", micro_batches, 1)
    backward_time = finite_positive("backward_time", backward_time)
    options = sorted(set(_options(options)) | {micro_batches})
    m = widgets.SelectionSlider(options=options, value=micro_batches, description="微批数 m",
                                continuous_update=False, style=_STYLE)
    p = widgets.IntSlider(value=stages, min=_STAGES_RANGE[0], max=_STAGES_RANGE[1], description="段数 p", continuous_update=False, style=_STYLE)

    def _plot(micro_batches, stages, backward_time):
        return plot_pipeline_schedules(stages, micro_batches, backward_time=backward_time)

    _plot.__name__ = "plot_pipeline_schedules"
    return Explorer(_plot, {"micro_batches": m, "stages": p}, {"backward_time": backward_time},
                    title="流水线调度：微批越多，气泡越小", static="micro_batches")


def zero_memory_explorer(n_params: int, world_size: int = 2, *, measured: Mapping[str, float] | None = None,
                         measured_world_size: int = 2, options: Sequence[int] = ZERO_WORLD_SIZES) -> Explorer:
    """ZeRO 显存探索器：静态滑块“进程数 p”（网页上也能拖），Jupyter 里还能切换 fp32 / 混合精度的字节数。

    每帧是 :func:`~tformer_lib.plotting.parallel.plot_zero_memory`（阶段 0–3 每个进程的参数、梯度、优化器状态）；
    ``measured``（FSDP2 实测的每进程字节）只在 p = ``measured_world_size`` 且 fp32 的那一帧画在阶段 3 旁边。
    """
    from tformer_lib.plotting.parallel import plot_zero_memory

    n_params = _int_at_least("n_params", n_params, 1)
    world_size = _int_at_least("world_size", world_size, 1)
    measured_world_size = _int_at_least("measured_world_size", measured_world_size, 1)
    if measured is not None:  # 在这里就报错，而不是让那一帧变成错误提示
        from tformer_lib.plotting.parallel import ZERO_PART_LABELS

        missing = [k for k in ZERO_PART_LABELS if not isinstance(measured, Mapping) or k not in measured]
        if missing:
            raise ValueError(f"measured 缺少 {missing}：应是 {{'parameters', 'gradients', 'optimizer'}} 的字节数")
    options = sorted(set(_options(options)) | {world_size})
    p = widgets.SelectionSlider(options=options, value=world_size, description="进程数 p", continuous_update=False,
                                style=_STYLE)
    precision = widgets.ToggleButtons(options=[("fp32 + AdamW（4+4+8 字节）", "fp32"),
                                               ("混合精度（2+2+12 字节）", "mixed")], value="fp32",
                                      description="精度", style=_TOGGLE_STYLE)

    def _plot(world_size, precision, n_params, measured, measured_world_size):
        sizes = (4, 4, 8) if precision == "fp32" else (2, 2, 12)
        show = measured if (precision == "fp32" and world_size == measured_world_size) else None
        return plot_zero_memory(n_params, world_size, measured=show, param_bytes=sizes[0], grad_bytes=sizes[1],
                                optimizer_bytes=sizes[2])

    _plot.__name__ = "plot_zero_memory"
    return Explorer(_plot, {"world_size": p, "precision": precision},
                    {"n_params": n_params, "measured": measured, "measured_world_size": measured_world_size},
                    title="ZeRO：进程越多，每个进程存得越少", static="world_size")
