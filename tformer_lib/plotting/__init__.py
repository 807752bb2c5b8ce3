"""可视化：所有 ``plot_*`` 函数都是纯函数（pure function），给参数、返回 ``matplotlib.figure.Figure``。

图用 ``matplotlib.figure.Figure`` 直接创建，不进入 pyplot 的注册表：在笔记本里作为单元格最后一个
表达式时只显示一次。图里的中文用随书字体显示（:mod:`tformer_lib.plotting.fonts`），不依赖系统字体。

组织规则：一个模块画一个主题，按它画的东西命名（``tokens``、``positional``、``qkv``、``attention``、``masks``、``blocks``、
``output_layer``、``loss_curves``、``efficiency``、``lm``、``memory``、``parallel``、``serving``、``quant``……），不按章号；
哪一章用它写在模块的说明里。共用的检查与建图函数在 ``_common``。
"""

from tformer_lib.plotting.attention import plot_attention, plot_attention_grid, plot_model_attention
from tformer_lib.plotting.fonts import FONT_FAMILY, font_path, missing_glyphs, register_cjk_font
from tformer_lib.plotting.heatmap import plot_heatmap
from tformer_lib.plotting.masks import plot_mask, plot_masks
from tformer_lib.plotting.positional import (
    plot_positional_curves,
    plot_positional_encoding,
    plot_positional_similarity,
    plot_positional_slice,
)
from tformer_lib.plotting.softmax import plot_dot_product_variance, plot_scaled_attention, plot_softmax_temperature
from tformer_lib.plotting.training import (
    history_to_columns,
    label_smoothing_targets,
    plot_history,
    plot_label_smoothing,
    plot_lr_schedule,
)

__all__ = [
    "FONT_FAMILY",
    "font_path",
    "missing_glyphs",
    "register_cjk_font",
    "plot_heatmap",
    "plot_attention",
    "plot_attention_grid",
    "plot_model_attention",
    "plot_mask",
    "plot_masks",
    "plot_positional_encoding",
    "plot_positional_curves",
    "plot_positional_similarity",
    "plot_positional_slice",
    "plot_softmax_temperature",
    "plot_dot_product_variance",
    "plot_scaled_attention",
    "plot_lr_schedule",
    "plot_label_smoothing",
    "label_smoothing_targets",
    "plot_history",
    "history_to_columns",
]
