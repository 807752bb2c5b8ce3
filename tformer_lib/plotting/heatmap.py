"""通用热力图（heatmap）：行、列都可以带中文词元（token）标签。"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from tformer_lib.plotting._common import check_labels, new_figure, text_color_for, to_numpy


def plot_heatmap(
    matrix: Any,
    row_labels: Sequence[Any] | str | None = None,
    col_labels: Sequence[Any] | str | None = None,
    *,
    title: str | None = None,
    xlabel: str | None = None,
    ylabel: str | None = None,
    cmap: str = "viridis",
    vmin: float | None = None,
    vmax: float | None = None,
    annotate: bool | None = None,
    fmt: str = ".2f",
    colorbar: bool = True,
    colorbar_label: str | None = None,
    figsize: tuple[float, float] | None = None,
    ax: Any = None,
):
    """画一个带标签的二维热力图，返回 ``matplotlib.figure.Figure``。

    参数
    ----
    matrix : 形状 ``(行, 列)`` 的张量、数组或嵌套列表（例如注意力权重 ``(T_q, T_k)``）。
    row_labels, col_labels : 行/列标签（如查询、键的词元）；一个字符串会被拆成单字。
    title, xlabel, ylabel : 标题与坐标轴标签，可用中文。
    annotate : 是否在格子里写数值；默认（None）在格子数 ≤ 100 时写。
    fmt : 数值格式，如 ``".2f"``。
    ax : 给定时画进这个 Axes（用于拼多子图），返回它所在的 Figure。

    数值里的 ``nan``/``inf`` 画成空白格，不会报错。
    """
    m = to_numpy(matrix, "matrix", ndim=2)
    n_rows, n_cols = m.shape
    rows = check_labels(row_labels, n_rows, "row_labels")
    cols = check_labels(col_labels, n_cols, "col_labels")
    if ax is None:
        if figsize is None:
            w = min(12.0, max(3.6, 0.55 * n_cols + 2.4))
            h = min(10.0, max(3.0, 0.5 * n_rows + 1.6))
            figsize = (w, h)
        fig, ax = new_figure(figsize)
    else:
        fig = ax.figure
    finite = m[np.isfinite(m)]
    lo = float(finite.min()) if vmin is None and finite.size else (0.0 if vmin is None else float(vmin))
    hi = float(finite.max()) if vmax is None and finite.size else (1.0 if vmax is None else float(vmax))
    im = ax.imshow(np.ma.masked_invalid(m), cmap=cmap, vmin=lo, vmax=hi, aspect="auto", interpolation="nearest")
    if rows is not None:
        ax.set_yticks(range(n_rows), rows)
    if cols is not None:
        ax.set_xticks(range(n_cols), cols)
        if max((len(c) for c in cols), default=0) > 3:
            for t in ax.get_xticklabels():  # 斜放的长标签右端对准刻度
                t.set(rotation=45, ha="right", rotation_mode="anchor")
    if title:
        ax.set_title(title)
    if xlabel:
        ax.set_xlabel(xlabel)
    if ylabel:
        ax.set_ylabel(ylabel)
    if annotate is None:
        annotate = n_rows * n_cols <= 100
    if annotate:
        cm = im.get_cmap()
        for i in range(n_rows):
            for j in range(n_cols):
                v = m[i, j]
                if not np.isfinite(v):
                    continue
                ax.text(j, i, format(v, fmt), ha="center", va="center", fontsize=8,
                        color=text_color_for(v, lo, hi, cm))
    if colorbar:
        cb = fig.colorbar(im, ax=ax, shrink=0.9)
        if colorbar_label:
            cb.set_label(colorbar_label)
    return fig
