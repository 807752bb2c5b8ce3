"""第 11 章的内存探索器：一个训练步的内存账本怎样随批大小、长度与注意力路径变化，激活重算省下多少。

网页上（没有内核）拖动的是“批大小 B”滑块（:data:`BATCH_SIZES` 各档，每档预先画好一帧）；长度与注意力路径
两个控件要在 Jupyter 里运行才会重画。每一帧都是公式（:func:`~tformer_lib.measurement.memory.lm_activation_bytes`）
算出的账本，章节正文在随书模型上核对过它与 PyTorch 实测逐字节相等。
"""

from __future__ import annotations

import dataclasses

import ipywidgets as widgets

from tformer_lib.widgets.base import Explorer

__all__ = ["BATCH_SIZES", "LENGTHS", "memory_explorer"]

#: 网页上能切换的批大小
BATCH_SIZES = (1, 2, 4, 8, 16, 32, 64)
#: Jupyter 里可选的长度（随书模型的上下文是 128）
LENGTHS = (32, 64, 128)


def memory_explorer(config, n_params: int, batch: int = 16, length: int = 128) -> Explorer:
    """内存探索器：``config`` 是 :class:`~tformer_lib.lm.LMConfig`，``n_params`` 是它的参数个数。

    图见 :func:`~tformer_lib.plotting.memory.plot_training_memory`（“不重算”与“激活重算”两根条）。
    """
    from tformer_lib._checks import positive_int
    from tformer_lib.lm.config import LMConfig
    from tformer_lib.plotting.memory import plot_training_memory

    if not isinstance(config, LMConfig):
        raise TypeError(f"config 应是 LMConfig，收到 {type(config).__name__}")
    positive_int("n_params", n_params)
    if batch not in BATCH_SIZES:
        raise ValueError(f"batch 应是 {BATCH_SIZES} 之一，收到 {batch!r}")
    if length not in LENGTHS:
        raise ValueError(f"length 应是 {LENGTHS} 之一，收到 {length!r}")
    style = {"description_width": "initial"}
    controls = {
        "batch": widgets.SelectionSlider(options=list(BATCH_SIZES), value=batch, description="批大小 B",
                                         continuous_update=False, style=style),
        "length": widgets.Dropdown(options=list(LENGTHS), value=length, description="长度 T", style=style),
        "fast": widgets.ToggleButtons(options=[("SDPA 快速路径", True), ("显式注意力", False)],
                                      value=bool(config.fast_attention), description="注意力", style=style),
    }

    def _plot(batch, length, fast):
        return plot_training_memory(dataclasses.replace(config, fast_attention=fast), n_params, batch, length)

    _plot.__name__ = "plot_training_memory"
    return Explorer(_plot, controls, {}, title="内存探索器：批大小、长度、注意力路径与激活重算", static="batch")
