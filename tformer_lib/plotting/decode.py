"""第 14 章的图：一步解码的时间花在哪里（堆叠柱），以及 FLOP 与字节两条下限。

纯函数：数据来自 :func:`tformer_lib.inference.breakdown.profile_breakdown` 与
:func:`tformer_lib.inference.floors.decode_floors`，画图函数自己不计时。
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from tformer_lib.plotting._common import new_figure

__all__ = ["plot_decode_breakdown"]

_PARTS = (("overhead", "Python 与分派开销", "#d62728"), ("matmul", "矩阵乘法", "#1f77b4"),
          ("attention", "注意力", "#2ca02c"), ("other", "其他计算", "#9467bd"))


def _seconds(name: str, value) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.floating, np.integer)) or not 0 <= value < float("inf"):
        raise ValueError(f"{name} 应为有限的非负秒数，收到 {value!r}")
    return float(value)


def plot_decode_breakdown(breakdowns: Mapping[str, Mapping[str, float]], *, floors: Mapping[str, float] | None = None,
                          title: str | None = None, ax=None):
    """每条路径一根柱（如 ``{"eager": …, "编译": …}``），自下而上堆叠四份耗时（毫秒）；柱顶写总耗时。

    ``breakdowns[路径]`` 至少有 ``"overhead"``、``"matmul"``、``"attention"``、``"other"`` 四项（秒）。
    ``floors``（可选，秒）：``{"flop_floor_s", "byte_floor_s"}``，画成两条水平虚线——纵轴为对数时才看得见，
    所以给出 floors 时纵轴取对数。
    """
    if not isinstance(breakdowns, Mapping) or not breakdowns:
        raise ValueError("breakdowns 应是非空的 {路径名: {overhead, matmul, attention, other}} 字典")
    if floors is not None:
        if not isinstance(floors, Mapping) or any(k not in floors for k in ("flop_floor_s", "byte_floor_s")):
            raise ValueError(f"floors 应是含 'flop_floor_s' 与 'byte_floor_s' 的字典（秒），收到 {floors!r:.80}")
        for key in ("flop_floor_s", "byte_floor_s"):
            if not _seconds(f"floors[{key!r}]", floors[key]) > 0:
                raise ValueError(f"floors[{key!r}] 应是正的秒数（纵轴是对数的），收到 {floors[key]!r}")
    if ax is not None and not hasattr(ax, "bar"):
        raise TypeError(f"ax 应是 matplotlib 的 Axes 或 None，收到 {type(ax).__name__}")
    names = list(breakdowns)
    values = {}
    for path in names:
        parts = breakdowns[path]
        if not isinstance(parts, Mapping) or any(key not in parts for key, _, _ in _PARTS):
            raise ValueError(f"breakdowns[{path!r}] 应含 overhead、matmul、attention、other 四项，收到 {parts!r:.80}")
        values[path] = [_seconds(f"breakdowns[{path!r}][{key!r}]", parts[key]) * 1e3 for key, _, _ in _PARTS]
    if ax is None:
        fig, ax = new_figure((1.8 + 1.6 * len(names), 4.2))
    else:
        fig = ax.figure
    x = np.arange(len(names))
    bottom = np.zeros(len(names))
    for i, (_, label, color) in enumerate(_PARTS):
        heights = np.array([values[p][i] for p in names])
        ax.bar(x, heights, 0.55, bottom=bottom, color=color, label=label)
        bottom += heights
    for xi, total in zip(x, bottom):
        ax.text(xi, total, f"{total:.3g} ms", ha="center", va="bottom", fontsize=9)
    if floors is not None:
        if not bottom.min() > 0:
            raise ValueError("给了 floors（对数纵轴）时，每根柱的总耗时都应大于 0")
        ax.set_yscale("log")
        for key, label, style in (("flop_floor_s", "FLOP 下限", "--"), ("byte_floor_s", "字节下限", ":")):
            ms = _seconds(f"floors[{key!r}]", floors[key]) * 1e3
            ax.axhline(ms, color="#333333", ls=style, lw=1, label=f"{label} {ms:.2g} ms")
    # 柱子上方留出放图例的地方（对数纵轴要留得多些），图例不会盖住最高的柱
    ax.set_ylim(top=float(bottom.max()) * (8 if floors is not None else 1.6))
    ax.set_xticks(x, names)
    ax.set_ylabel("每步耗时（毫秒）")
    ax.set_title(title or "一步解码的时间花在哪里")
    ax.legend(fontsize=8, loc="upper right")
    return fig
