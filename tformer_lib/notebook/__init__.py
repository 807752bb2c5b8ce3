"""笔记本的统一开场：``from tformer_lib.notebook import setup; setup()``。

一次调用完成：固定随机种子（seed）、只用 CPU、PNG 内嵌图（inline figure）且分辨率易读、
注册随书中文字体、torch/NumPy 打印保留 4 位小数。这样每章的输出在不同机器上都一致，
nbval 回归测试才稳定。
"""

from __future__ import annotations

import os
import random
from typing import Any

#: 笔记本里内嵌图的分辨率（每英寸点数，DPI）。
FIGURE_DPI = 110
#: 打印张量/数组时保留的小数位数。
PRINT_PRECISION = 4


def _seed_everything(seed: int) -> None:
    """优先用库里的 ``set_seed``；它还没有时退回到最基本的三处播种。"""
    try:
        from tformer_lib.seed import set_seed
    except ImportError:  # 基础层尚未提供时
        import numpy as np
        import torch

        random.seed(seed)
        np.random.seed(seed)
        torch.manual_seed(seed)
        return
    set_seed(seed)


def _configure_inline_figures(dpi: int) -> bool:
    """在 IPython 内核里启用 inline 后端并只输出 PNG；不在内核里时什么也不做，返回 False。"""
    try:
        from IPython import get_ipython
    except ImportError:  # pragma: no cover
        return False
    ip = get_ipython()
    if ip is None or not hasattr(ip, "kernel"):
        return False
    ip.run_line_magic("matplotlib", "inline")  # 先启用 inline（它会重设部分 rcParams），再覆盖
    from matplotlib_inline.backend_inline import set_matplotlib_formats

    set_matplotlib_formats("png")
    import matplotlib as mpl

    mpl.rcParams["figure.dpi"] = dpi
    return True


def setup(seed: int = 0, *, dpi: int = FIGURE_DPI, precision: int = PRINT_PRECISION) -> Any:
    """为一章笔记本做好确定性的环境，返回 ``torch.device("cpu")``。

    - 随机种子：``set_seed(seed)``（Python、NumPy、torch）；
    - 设备：只用 CPU（返回的 device 供后续 ``.to(device)`` 使用）；
    - 线程：默认单线程（环境变量 ``TFORMER_THREADS`` 可改）。浮点求和的顺序随线程数变化，
      训练几个 epoch 后差异会放大到打印的数字上；固定线程数，笔记本在冷缓存上重训也得到同样的输出；
    - 图：IPython 内核中启用 inline 后端、只输出 PNG（nbval 不比较 PNG），DPI 为 ``dpi``；
    - 字体：注册随书中文字体，负号正常显示（见 :mod:`tformer_lib.plotting.fonts`）；
    - 打印：torch 与 NumPy 保留 ``precision`` 位小数、关闭科学计数法。
    """
    import numpy as np
    import torch

    threads = os.environ.get("TFORMER_THREADS") or "1"
    if threads:
        try:
            n = int(threads)
        except ValueError as exc:
            raise ValueError(f"环境变量 TFORMER_THREADS 应为正整数，收到 {threads!r}") from exc
        if n < 1:
            raise ValueError(f"环境变量 TFORMER_THREADS 应为正整数，收到 {threads!r}")
        torch.set_num_threads(n)
    _seed_everything(seed)
    torch.set_printoptions(precision=precision, sci_mode=False)
    np.set_printoptions(precision=precision, suppress=True)

    import matplotlib as mpl

    from tformer_lib.plotting.fonts import register_cjk_font

    _configure_inline_figures(dpi)
    if mpl.rcParams["figure.dpi"] != dpi:
        mpl.rcParams["figure.dpi"] = dpi
    register_cjk_font()
    return torch.device("cpu")


def display_width(text: str) -> int:
    """文字在等宽终端里占几列：汉字与全角符号（East Asian Width 为 W/F）占 2 列；组合附加符号、零宽字符与变体选择符
    （Unicode 类别 Mn、Me、Cf）占 0 列；其余占 1 列。"""
    import unicodedata

    if not isinstance(text, str):
        raise TypeError(f"text 应是字符串，收到 {type(text).__name__}")
    return sum(0 if unicodedata.category(ch) in ("Mn", "Me", "Cf") else 2 if unicodedata.east_asian_width(ch) in "WF"
               else 1 for ch in text)


def format_table(headers, rows, align: str | None = None) -> str:
    """把表头与若干行排成按列对齐的纯文本表（按 :func:`display_width` 补空格，中英文混排也对得齐）。

    ``rows`` 的每一行与 ``headers`` 一样长，单元格先转成字符串；``align`` 每列一个字符，``"<"`` 左对齐、``">"`` 右对齐，
    默认第一列左对齐、其余右对齐。列之间隔两个空格。
    """
    def cells(row, name):
        if isinstance(row, (str, bytes, dict)) or not isinstance(row, (list, tuple)):
            raise TypeError(f"{name} 应是单元格的列表或元组，收到 {type(row).__name__}")
        out = [str(cell) for cell in row]
        if any("\n" in cell for cell in out):
            raise ValueError(f"{name} 里有含换行的单元格：表的每一行只能占一行")
        return out

    headers = cells(headers, "headers")
    if not headers:
        raise ValueError("headers 是空的：至少要有一列")
    if isinstance(rows, (str, bytes, dict)) or not isinstance(rows, (list, tuple)):
        raise TypeError(f"rows 应是行的列表，收到 {type(rows).__name__}")
    rows = [cells(row, f"rows[{i}]") for i, row in enumerate(rows)]
    for i, row in enumerate(rows):
        if len(row) != len(headers):
            raise ValueError(f"rows[{i}] 有 {len(row)} 个单元格，表头有 {len(headers)} 列")
    align = align if align is not None else "<" + ">" * (len(headers) - 1)
    if not isinstance(align, str) or len(align) != len(headers) or set(align) - {"<", ">"}:
        raise ValueError(f"align 应是每列一个 '<' 或 '>' 的字符串（{len(headers)} 列），收到 {align!r}")
    widths = [max(display_width(r[c]) for r in [headers, *rows]) for c in range(len(headers))]

    def line(cells):
        padded = [(cell + " " * (w - display_width(cell))) if a == "<" else (" " * (w - display_width(cell)) + cell)
                  for cell, w, a in zip(cells, widths, align)]
        return "  ".join(padded).rstrip()

    return "\n".join(line(r) for r in [headers, *rows])
