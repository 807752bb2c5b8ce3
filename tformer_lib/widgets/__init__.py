"""交互探索器（interactive explorer）：控件 + 图，Jupyter 里实时重画，发布的 HTML 书里也能拖动。

- :mod:`tformer_lib.widgets.explorer`：机制（:class:`Explorer`、:func:`make_explorer`、预先画帧 + jslink）；
- :mod:`tformer_lib.widgets.explorers`：各章用的探索器（位置编码、softmax 缩放、掩码、温度、学习率、注意力）。

章节作者可用 :func:`make_explorer` 给自己的绘图函数做探索器。只用 ipywidgets 的公开 API。
"""

from tformer_lib.widgets.explorer import (
    CHAPTER_FRAME_BUDGET,
    EXPLORER_DPI,
    MAX_FRAMES,
    Explorer,
    as_selection,
    auto_static,
    figure_to_png,
    make_explorer,
)
from tformer_lib.widgets.explorers import (
    attention_explorer,
    lr_schedule_explorer,
    mask_explorer,
    model_attention_explorer,
    positional_encoding_explorer,
    softmax_scaling_explorer,
    softmax_temperature_explorer,
)

__all__ = [
    "CHAPTER_FRAME_BUDGET",
    "EXPLORER_DPI",
    "MAX_FRAMES",
    "Explorer",
    "as_selection",
    "auto_static",
    "figure_to_png",
    "make_explorer",
    "positional_encoding_explorer",
    "softmax_scaling_explorer",
    "softmax_temperature_explorer",
    "attention_explorer",
    "model_attention_explorer",
    "mask_explorer",
    "lr_schedule_explorer",
]
