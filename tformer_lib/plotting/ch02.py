"""第 2 章用到的图。

* :func:`plot_position_distance`：正弦余弦位置编码中，位置 ``pos`` 与 ``pos + k`` 的欧氏距离随间隔 k 的变化。
  距离只取决于 k（与起点 pos 无关），所以一条曲线就说清了“相邻近、远处远”的平滑性质。
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from tformer_lib.plotting._common import check_positive_int, new_figure

__all__ = ["plot_position_distance"]


def plot_position_distance(
    max_offset: int = 200,
    d_models: Sequence[int] = (64, 512),
    *,
    start: int = 0,
    title: str | None = None,
    ax=None,
):
    """画 ``‖PE(start + k) − PE(start)‖`` 随间隔 ``k = 0..max_offset`` 的曲线，每个 ``d_model`` 一条。

    编码由库里的 :func:`tformer_lib.sinusoidal_positional_encoding` 计算；虚线标出 ``√d_model``：
    两个“毫不相干”的位置的典型距离（每对 sin/cos 维度是单位圆上的一个点，两点相位独立时
    距离平方的期望是 2，d_model/2 对加起来是 d_model）。远处的曲线向它靠拢。
    换一个 ``start`` 曲线完全不变——这正是“位移是旋转”的推论。
    """
    from tformer_lib.positional import sinusoidal_positional_encoding

    check_positive_int(max_offset, "max_offset")
    check_positive_int(start, "start", minimum=0)
    d_models = [check_positive_int(d, "d_models 中的元素") for d in d_models]
    if not d_models:
        raise ValueError("d_models 至少要有一个元素")
    if ax is None:
        fig, ax = new_figure((7.2, 3.8))
    else:
        fig = ax.figure
    ks = np.arange(max_offset + 1)
    for i, d in enumerate(d_models):
        pe = sinusoidal_positional_encoding(start + max_offset + 1, d).double().numpy()  # (start+max_offset+1, d)
        dist = np.linalg.norm(pe[start:] - pe[start], axis=1)  # (max_offset+1,)
        color = f"C{i}"
        ax.plot(ks, dist, color=color, label=f"d_model={d}")
        ax.axhline(np.sqrt(d), color=color, ls=":", lw=1)
    ax.set_xlabel("位置间隔 k")
    ax.set_ylabel("欧氏距离 ‖PE(pos+k) − PE(pos)‖")
    ax.set_title(title if title is not None else f"位置编码的距离随间隔增长（起点 pos={start}；虚线为 √d_model）")
    ax.set_xlim(0, max_offset)
    ax.set_ylim(bottom=0)
    ax.legend(loc="lower right", fontsize=9)
    ax.grid(alpha=0.3)
    return fig
