"""可视化：所有 ``plot_*`` 函数都是纯函数（pure function），给参数、返回 ``matplotlib.figure.Figure``。

图里的中文用随书字体显示（:mod:`tformer_lib.plotting.fonts`），在任何机器上都不依赖系统字体。
"""

from tformer_lib.plotting.fonts import FONT_FAMILY, font_path, missing_glyphs, register_cjk_font
from tformer_lib.plotting.heatmap import plot_heatmap

__all__ = [
    "FONT_FAMILY",
    "font_path",
    "missing_glyphs",
    "register_cjk_font",
    "plot_heatmap",
]
