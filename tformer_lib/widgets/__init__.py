"""交互探索器（interactive explorer）：控件 + 图，Jupyter 里实时重画，发布的 HTML 书里也能拖动。

组织规则：:mod:`tformer_lib.widgets.base` 是机制（:class:`Explorer`、:func:`make_explorer`、预先画帧 + jslink）；
其余每个模块放一个主题的探索器，与它画的库包同名：

- :mod:`tformer_lib.widgets.parts`：模型部件与训练调度（第 1–7 章：位置编码、softmax 缩放与温度、注意力、掩码、学习率）；
- :mod:`tformer_lib.widgets.lm`、:mod:`~tformer_lib.widgets.memory`、:mod:`~tformer_lib.widgets.parallel`、
  :mod:`~tformer_lib.widgets.serving`：第 9、11、12、13 章。

章节作者可用 :func:`make_explorer` 给自己的绘图函数做探索器。只用 ipywidgets 的公开 API。
"""

from tformer_lib.widgets.base import (
    CHAPTER_FRAME_BUDGET,
    EXPLORER_DPI,
    MAX_FRAMES,
    Explorer,
    as_selection,
    auto_static,
    figure_to_png,
    make_explorer,
)
from tformer_lib.widgets.parts import (
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
