"""基准测试结果的图：逐轮比值的分布（点 + 中位数 + 四分位范围），以及整套基准结果的两幅图。

数据来自 :mod:`tformer_lib.measurement.benchmarking`（随包附带的结果文件或本次运行）；图里只画测量本身，
标题写明在哪台机器、几个线程、什么时候测的。
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from tformer_lib.plotting._common import new_figure, to_numpy

__all__ = ["plot_ratio_spread", "plot_benchmark_results"]

_COLORS = ("#4C72B0", "#DD8452", "#55A868", "#C44E52", "#8172B3", "#937860", "#DA8BC3", "#8C8C8C")


def plot_ratio_spread(groups: Mapping[str, Sequence[float]], *, title: str | None = None, ylabel: str = "比值",
                      baseline_label: str = "1 = 一样快", ax: Any = None):
    """逐轮比值的分布：每组一列点（每轮一个点），横线是中位数，竖条是四分位范围（interquartile range）。

    ``groups``：``{组名: 每轮的比值}``。比起只画一根中位数的条，它让读者看见测量噪声有多大：
    比值 1 落在竖条之内，就说不出谁更快。
    """
    if not groups:
        raise ValueError("groups 至少要有一组比值")
    if ax is None:
        fig, ax = new_figure((max(4.5, 1.3 * len(groups) + 2.5), 3.8))
    else:
        fig = ax.figure
    rng = np.random.default_rng(0)  # 点的横向抖动：固定种子，图每次都一样
    top = 1.2
    for i, (label, values) in enumerate(groups.items()):
        r = to_numpy(values, f"groups[{label!r}]", ndim=1)
        if r.size == 0:
            raise ValueError(f"groups[{label!r}] 是空的")
        q1, med, q3 = np.percentile(r, [25, 50, 75])
        color = _COLORS[i % len(_COLORS)]
        ax.scatter(i + rng.uniform(-0.12, 0.12, r.size), r, s=14, color=color, alpha=0.6, zorder=2)
        ax.plot([i - 0.25, i + 0.25], [med, med], color="black", lw=2.2, zorder=3)
        ax.plot([i, i], [q1, q3], color="black", lw=1.2, zorder=3)
        ax.text(i + 0.28, med, f"{med:.2f}×", va="center", fontsize=9)
        top = max(top, float(r.max()) * 1.1)
    ax.axhline(1.0, color="gray", ls="--", lw=1, label=baseline_label)
    ax.set_xticks(range(len(groups)))
    ax.set_xticklabels([str(k) for k in groups])
    ax.set_xlim(-0.6, len(groups) - 0.2)
    ax.set_ylim(0, top)
    ax.set_ylabel(ylabel)
    if title:
        ax.set_title(title)
    ax.legend(fontsize=8, loc="lower right")
    return fig


def plot_benchmark_results(results: Mapping[str, Any], *, live: Mapping[str, Any] | None = None,
                           title: str | None = None):
    """:func:`tformer_lib.measurement.benchmarking.run_benchmarks` 的结果画成两幅“逐轮比值”图。

    左：训练一步 ours / ``torch.nn.Transformer``（每个配置一列；给了 ``live``——同样格式的
    :func:`~tformer_lib.measurement.benchmarking.benchmark_train_step` 结果——就多一列“本次运行”）；
    右：多头注意力前向 + 反向 fast（SDPA）/ explicit，每个长度一列。总标题写明机器、线程数与日期。
    """
    train = results.get("train_step", {})
    attention = results.get("attention", [])
    if not train and not attention:
        raise ValueError("results 里既没有 train_step 也没有 attention")
    fig, axes = new_figure((11.0, 4.2), 1, 2)
    names = {"small": "小配置", "base": "论文 base"}
    groups = {f"{names.get(k, k)}\nB={v['batch']}, T={v['length']}": v["ratio"]["ratios"] for k, v in train.items()}
    if live is not None:
        groups[f"本次运行（小配置）\n{live['rounds']} 轮"] = live["ratio"]["ratios"]
    plot_ratio_spread(groups, ylabel="训练一步：我们 / torch.nn.Transformer", ax=axes[0, 0],
                      title="训练一步的耗时比（每轮一个点）")
    plot_ratio_spread({f"T={a['length']}": a["ratio"]["ratios"] for a in attention}, ax=axes[0, 1],
                      ylabel="注意力前向+反向：SDPA / 显式", title="快速路径 / 显式路径（每轮一个点）")
    m = results.get("machine", {})
    fig.suptitle(title or f"{m.get('cpu', '?')}，torch {m.get('torch', '?')}，{m.get('threads', '?')} 线程，{m.get('date', '?')}",
                 fontsize=9)
    return fig
