"""Q、K、V 与一次注意力的图（第 3 章）。

- :func:`plot_dk_curves`：若干条“随 d_k 变化”的曲线（横轴按 2 的幂取对数刻度），
  用来对比“不缩放”与“÷√d_k”两种分数在方差、最大权重、梯度上的差别；
- :func:`plot_weighted_sum`：把一行输出 ``o_i = Σ_j a_ij v_j`` 拆开画——左边是权重 ``a_ij``，
  右边是每个 ``a_ij v_j`` 在各维上的贡献（堆叠柱），以及它们的和 ``o_i``（黑色菱形）。
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from tformer_lib.plotting._common import check_labels, new_figure, to_numpy

_STYLES = ("-o", "--s", "-.^", ":D")


def plot_dk_curves(
    d_ks: Sequence[int],
    series: Mapping[str, Sequence[float]],
    *,
    title: str | None = None,
    ylabel: str | None = None,
    logy: bool = False,
    reference: Mapping[str, Sequence[float]] | None = None,
    ax: Any = None,
):
    """画若干条随 ``d_k`` 变化的曲线，返回 ``Figure``。

    参数
    ----
    d_ks : 横轴上的 d_k 取值（正整数，通常是 2 的幂），横轴用以 2 为底的对数刻度。
    series : ``{图例: 与 d_ks 等长的数值}``，例如 ``{"不缩放": [...], "÷√d_k": [...]}``。
    reference : 可选的参考线（灰色细虚线），例如理论值 ``{"理论 d_k": d_ks}``。
    logy : 纵轴是否取对数刻度。
    ax : 给定时画进这个 Axes（拼多子图用），返回它所在的 Figure。
    """
    xs = to_numpy(list(d_ks), "d_ks", ndim=1)
    if xs.size == 0 or np.any(xs <= 0):
        raise ValueError(f"d_ks 应为非空的正数序列，收到 {list(d_ks)}")
    if not series:
        raise ValueError("series 至少要有一条曲线")
    if ax is None:
        fig, ax = new_figure((6.0, 3.8))
    else:
        fig = ax.figure
    for i, (label, ys) in enumerate(series.items()):
        ys = to_numpy(list(ys), f"series[{label!r}]", ndim=1)
        if ys.shape != xs.shape:
            raise ValueError(f"series[{label!r}] 有 {ys.size} 个值，但 d_ks 有 {xs.size} 个")
        ax.plot(xs, ys, _STYLES[i % len(_STYLES)], label=str(label), lw=1.8, ms=5)
    for label, ys in (reference or {}).items():
        ys = to_numpy(list(ys), f"reference[{label!r}]", ndim=1)
        if ys.shape != xs.shape:
            raise ValueError(f"reference[{label!r}] 有 {ys.size} 个值，但 d_ks 有 {xs.size} 个")
        ax.plot(xs, ys, color="gray", ls=":", lw=1.2, label=str(label))
    ax.set_xscale("log", base=2)
    ax.set_xticks(xs)
    ax.set_xticklabels([str(int(x)) if float(x).is_integer() else f"{x:g}" for x in xs])
    if logy:
        ax.set_yscale("log")
    ax.set_xlabel("d_k（Q、K 的维度）")
    if ylabel is not None:
        ax.set_ylabel(ylabel)
    if title is not None:
        ax.set_title(title)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=9)
    return fig


def plot_weighted_sum(
    weights: Any,
    values: Any,
    key_labels: Sequence[Any] | str,
    *,
    query_label: str | None = None,
    dim_labels: Sequence[Any] | None = None,
    title: str | None = None,
):
    """把 ``o = Σ_j a_j v_j`` 画成两幅子图，返回 ``Figure``。

    参数
    ----
    weights : 一行注意力权重 ``a``，形状 ``(T_k,)``（通常和为 1）。
    values : 值矩阵 ``V``，形状 ``(T_k, d_v)``。
    key_labels : 每个键/值的标签（如词元）；一个字符串会被拆成单字。
    query_label : 这一行属于哪个查询（写进标题）。
    dim_labels : 各维的名字（默认“维度 0”、“维度 1”……）。

    左图：权重柱状图；右图：每一维上，各 ``a_j v_j`` 按颜色堆叠（正负分开堆），黑色菱形是它们的和
    ``o`` 在这一维的值——恰好等于 ``(A V)`` 的那一行。
    """
    a = to_numpy(weights, "weights", ndim=1)
    v = to_numpy(values, "values", ndim=2)
    if v.shape[0] != a.shape[0]:
        raise ValueError(f"weights 有 {a.shape[0]} 个，但 values 有 {v.shape[0]} 行（应相等）")
    labels = check_labels(key_labels, a.shape[0], "key_labels")
    d_v = v.shape[1]
    dims = check_labels(dim_labels, d_v, "dim_labels") or [f"维度 {d}" for d in range(d_v)]
    contrib = a[:, None] * v  # (T_k, d_v)：第 j 行是 a_j v_j
    out = contrib.sum(axis=0)  # (d_v,)

    fig, axes = new_figure((11.0, 3.6), 1, 2)
    ax_w, ax_c = axes[0, 0], axes[0, 1]
    fig.get_layout_engine().set(wspace=0.08)
    colors = [f"C{j % 10}" for j in range(a.shape[0])]
    ax_w.bar(range(a.shape[0]), a, color=colors)
    for j, w in enumerate(a):
        ax_w.text(j, w, f"{w:.2f}", ha="center", va="bottom", fontsize=9)
    ax_w.set_xticks(range(a.shape[0]))
    long_labels = max(len(t) for t in labels) > 4
    ax_w.set_xticklabels(labels, rotation=20 if long_labels else 0, ha="right" if long_labels else "center")
    ax_w.set_ylim(0, max(1.0, float(a.max()) * 1.15))
    ax_w.set_ylabel("注意力权重 a_j")
    ax_w.set_title("权重（这一行和为 {:.2f}）".format(float(a.sum())))

    xs = np.arange(d_v)
    pos_base = np.zeros(d_v)
    neg_base = np.zeros(d_v)
    for j in range(a.shape[0]):
        c = contrib[j]
        base = np.where(c >= 0, pos_base, neg_base)
        ax_c.bar(xs, c, bottom=base, color=colors[j], label=f"a·v（{labels[j]}）", width=0.6)
        pos_base = pos_base + np.clip(c, 0, None)
        neg_base = neg_base + np.clip(c, None, 0)
    ax_c.plot(xs, out, "D", color="black", ms=7, label="和 o")
    ax_c.axhline(0, color="gray", lw=0.8)
    ax_c.set_xticks(xs)
    ax_c.set_xticklabels(dims)
    ax_c.set_ylabel("贡献")
    ax_c.set_title("每个 a_j·v_j 的贡献与它们的和")
    lo = min(0.0, float(neg_base.min()), float(out.min()))
    hi = max(0.0, float(pos_base.max()), float(out.max()))
    pad = 0.12 * (hi - lo if hi > lo else 1.0)
    ax_c.set_ylim(lo - pad if lo < 0 else 0.0, hi + pad)
    ax_c.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0)
    head = f"查询“{query_label}”的输出 o = Σ a_j v_j" if query_label else "输出 o = Σ a_j v_j"
    fig.suptitle(title if title is not None else head)
    return fig


__all__ = ["plot_dk_curves", "plot_weighted_sum"]
