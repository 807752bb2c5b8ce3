"""第 9 章（缩放实验）的图：验证损失对训练算力，每种大小一条线，下包络与它的幂律拟合。

纯函数：数据是 ``python -m tformer_lib.scale.scaling`` 结果文件里的 ``rows`` 与 ``frontier_fit``，画图函数自己不训练。
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

from tformer_lib.plotting._common import check_result_rows, new_figure

__all__ = ["plot_scaling"]

_NEEDED = ("d_model", "n_layers", "non_embedding_params", "flops", "valid_loss")


def plot_scaling(rows: Sequence[Mapping], fit: Mapping | None = None, *, frontier: Sequence[Mapping] = (),
                 title: str | None = None):
    """双对数坐标：横轴训练 FLOPs，纵轴验证损失；同一大小的模型（不同的训练词元数）连成一条线，图例写非嵌入参数个数。
    ``frontier``（:func:`~tformer_lib.scale.scaling.compute_frontier` 的行）画成空心圈，``fit``（``a``、``alpha``）
    画成穿过它们的虚线。"""
    rows = check_result_rows(rows, _NEEDED, "scaling.json")
    if fit is not None and (not isinstance(fit, Mapping) or not {"a", "alpha"} <= set(fit)):
        raise ValueError(f"fit 应是 fit_power_law 返回的字典（含 'a'、'alpha'），收到 {fit!r}")
    frontier = check_result_rows(frontier, ("flops", "valid_loss"), "compute_frontier") if len(frontier) else []
    groups: dict[tuple[int, int], list[Mapping]] = {}
    for row in rows:
        groups.setdefault((int(row["d_model"]), int(row["n_layers"])), []).append(row)
    fig, ax = new_figure((7.6, 5.0))
    colors = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2"]
    for k, ((d, n), runs) in enumerate(sorted(groups.items(), key=lambda kv: kv[1][0]["non_embedding_params"])):
        runs = sorted(runs, key=lambda r: r["flops"])
        ax.plot([r["flops"] for r in runs], [r["valid_loss"] for r in runs], "o-", color=colors[k % len(colors)],
                label=f"d={d}, {n} 层（{runs[0]['non_embedding_params']:,} 个非嵌入参数）")
    if frontier:
        ax.plot([r["flops"] for r in frontier], [r["valid_loss"] for r in frontier], "o", markersize=13,
                markerfacecolor="none", markeredgecolor="#333333", label="下包络：这个算力上最好的点")
    if fit is not None:
        xs = np.geomspace(min(r["flops"] for r in rows), max(r["flops"] for r in rows), 50)
        ax.plot(xs, fit["a"] * xs ** -fit["alpha"], "--", color="#333333",
                label=f"幂律拟合 L = {fit['a']:.3g}·C^(−{fit['alpha']:.3f})")
    ax.set_xscale("log")
    ax.set_yscale("log")
    plain = FuncFormatter(lambda v, _: f"{v:.2g}")  # 损失只跨一小段：刻度写成 5.4、5.6，而不是 5.4×10⁰
    ax.yaxis.set_major_formatter(plain)
    ax.yaxis.set_minor_formatter(plain)
    ax.xaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))  # 横轴在 1、2、5 × 10ⁿ 处标数
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:.0e}".replace("e+", "e")))
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.set_xlabel("训练算力 C（FLOPs，按第 11 章的公式逐项数）")
    ax.set_ylabel("验证损失（nats / 词元，对数坐标）")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8)
    ax.set_title(title or "唐诗模型的缩放：算力越多，损失越低（每条线一种大小）")
    return fig
