"""输出层（线性层与 Softmax）的图（第 6 章）。

- :func:`plot_top_k`：词表上概率最高的 k 个词（横向柱状图，标百分比），其余词的概率合成一根灰柱；
- :func:`plot_top_k_steps`：逐步解码时每一步的前 k 个候选，一步一幅子图；
- :func:`plot_softmax_properties`：softmax 的三个性质——保序、放大差距（差 Δ 分 → 概率之比 e^Δ）、归一化；
- :func:`plot_sigmoid_vs_softmax`：同一组分数经 sigmoid（各自独立）与 softmax（互相竞争）得到的概率；
- :func:`plot_temperature_entropy`：分布的熵随温度 T 的变化（T → 0 趋于 0，T → ∞ 趋于 ln V）。

都只用 numpy 计算，不改动任何随机状态。
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from tformer_lib._checks import positive_int
from tformer_lib.plotting._common import check_labels, new_figure, to_numpy

__all__ = ["plot_top_k", "plot_top_k_steps", "plot_softmax_properties", "plot_sigmoid_vs_softmax",
           "plot_temperature_entropy"]


def _softmax(z: np.ndarray, axis: int = -1) -> np.ndarray:
    z = z - z.max(axis=axis, keepdims=True)  # 减去最大值，exp 不会溢出
    e = np.exp(z)
    return e / e.sum(axis=axis, keepdims=True)


def _entropy(p: np.ndarray) -> np.ndarray:
    with np.errstate(divide="ignore", invalid="ignore"):
        return -np.where(p > 0, p * np.log(p), 0.0).sum(axis=-1)


def _check_probs(probs: Any, name: str = "probs") -> np.ndarray:
    p = to_numpy(probs, name, ndim=1).astype(float)
    if p.size == 0 or np.any(p < -1e-9) or not np.isclose(p.sum(), 1.0, atol=1e-3):
        raise ValueError(f"{name} 应是一个非负、和为 1 的一维概率向量（长度 {p.size}，和为 {p.sum():.4f}）")
    return p


def plot_top_k(
    probs: Any,
    labels: Sequence[Any],
    k: int = 8,
    *,
    highlight: Any = None,
    show_rest: bool = True,
    title: str | None = None,
    ax: Any = None,
):
    """词表上概率最高的 ``k`` 个词：横向柱状图，从上到下按概率降序，柱尾标百分比。

    参数
    ----
    probs : 一维概率向量 ``(V,)``（例如 ``logits.softmax(-1)[0, -1]``），和为 1。
    labels : ``V`` 个词（``tgt_vocab.itos``）。
    highlight : 要标成橙色的词（例如参考译文里的正确词），可省略。
    show_rest : 再画一根灰柱，表示其余 ``V − k`` 个词的概率之和。
    """
    p = _check_probs(probs)
    labels = check_labels(labels, p.size, "labels")
    if labels is None:
        raise ValueError("labels 不能为空：需要 V 个词的名字")
    k = min(positive_int("k", k), p.size)
    order = np.argsort(-p, kind="stable")[:k]
    names = [str(labels[i]) for i in order]
    values = list(p[order])
    colors = ["tab:orange" if highlight is not None and n == str(highlight) else "tab:blue" for n in names]
    if show_rest and k < p.size:
        names.append(f"其余 {p.size - k} 个词")
        values.append(float(p.sum() - p[order].sum()))
        colors.append("lightgray")
    if ax is None:
        fig, ax = new_figure((6.0, 0.38 * len(names) + 1.2))
    else:
        fig = ax.figure
    y = np.arange(len(names))
    ax.barh(y, values, color=colors)
    for yi, v in zip(y, values):
        ax.text(v + 0.01, yi, f"{100 * v:.1f}%", va="center", fontsize=8)
    ax.set_yticks(y, names)
    ax.invert_yaxis()
    ax.set_xlim(0, 1.15)
    ax.set_xlabel("概率")
    ax.set_title(title if title is not None else f"概率最高的 {k} 个词")
    ax.grid(axis="x", alpha=0.3)
    return fig


def plot_top_k_steps(
    probs: Any,
    labels: Sequence[Any],
    step_titles: Sequence[str],
    k: int = 5,
    *,
    chosen: Sequence[Any] | None = None,
    ncols: int = 3,
):
    """逐步解码的每一步各画一幅 :func:`plot_top_k`：``probs`` 形状 ``(steps, V)``，每行和为 1。

    ``step_titles``：每一步的子图标题（如“前缀：<bos> artificial”）；``chosen``：每一步实际选中的词（橙色）。
    """
    p = to_numpy(probs, "probs", ndim=2)
    n = p.shape[0]
    step_titles = check_labels(step_titles, n, "step_titles")
    if chosen is not None:
        chosen = check_labels(chosen, n, "chosen")
    ncols = max(1, min(positive_int("ncols", ncols), n))
    nrows = -(-n // ncols)
    fig, axes = new_figure((3.6 * ncols, (0.36 * (min(k, p.shape[1]) + 1) + 1.0) * nrows), nrows, ncols)
    for i in range(nrows * ncols):
        ax = axes[i // ncols][i % ncols]
        if i >= n:
            ax.set_axis_off()
            continue
        plot_top_k(p[i], labels, k, highlight=None if chosen is None else chosen[i], title=str(step_titles[i]), ax=ax)
        ax.set_xlabel("")
    return fig


def plot_softmax_properties(
    logits: Any = (5.0, 4.0, 0.0),
    labels: Sequence[Any] | None = ("Artificial", "Intelligence", "其他"),
    *,
    max_gap: float = 6.0,
):
    """三幅子图：softmax 的三个性质。

    1. 保序：分数与概率按同一顺序排列（左右两组柱子同样由高到低）；
    2. 放大差距：两个分数相差 Δ，概率之比正好是 e^Δ（对数纵轴上是一条直线），对比“直接除以总和”
       （分数为 Δ+1 与 1 时比值只有 Δ+1）；
    3. 归一化：无论分数正负、大小、整体平移，概率都落在 0~1 之间且总和为 1（百分比堆叠柱）。
    """
    z = to_numpy(logits, "logits", ndim=1).astype(float)
    labels = check_labels(labels, z.size, "labels") or [f"类别 {i}" for i in range(z.size)]
    if max_gap <= 0:
        raise ValueError(f"max_gap={max_gap} 应为正数")
    p = _softmax(z)
    fig, axes = new_figure((12.5, 3.9), 1, 3)
    a1, a2, a3 = axes[0]

    order = np.argsort(-z, kind="stable")
    x = np.arange(z.size)
    w = 0.38
    zs = z[order] / max(np.abs(z).max(), 1e-12)
    a1.bar(x - w / 2, zs, w, color="tab:gray", label="分数（按最大值缩放）")
    bars = a1.bar(x + w / 2, p[order], w, color="tab:blue", label="softmax 概率")
    for rect, v in zip(bars, p[order]):
        a1.text(rect.get_x() + rect.get_width() / 2, v + 0.02, f"{100 * v:.1f}%", ha="center", fontsize=8)
    a1.set_xticks(x, [str(labels[i]) for i in order])
    a1.set_ylim(min(0.0, zs.min() - 0.1), 1.15)
    a1.set_title("保序：分数高的，概率也高")
    a1.legend(fontsize=8, loc="upper right")
    a1.grid(axis="y", alpha=0.3)

    gaps = np.linspace(0, max_gap, 61)
    a2.semilogy(gaps, np.exp(gaps), "-", color="tab:blue", lw=2, label="softmax：p₁/p₂ = e^Δ")
    a2.semilogy(gaps, gaps + 1.0, "--", color="tab:gray", label="直接除以总和：(Δ+1)/1")
    for d in (1.0, 5.0):
        if d <= max_gap:
            a2.plot([d], [np.exp(d)], "o", color="tab:orange")
            a2.annotate(f"Δ={d:g} → {np.exp(d):.1f} 倍", (d, np.exp(d)), textcoords="offset points", xytext=(6, -12),
                        fontsize=8)
    a2.set_xlabel("两个分数之差 Δ")
    a2.set_ylabel("概率之比（对数刻度）")
    a2.set_title("放大差距：差 Δ 分，概率差 e^Δ 倍")
    a2.legend(fontsize=8, loc="upper left")
    a2.grid(alpha=0.3, which="both")

    cases = {"原分数": z, "全部 +100": z + 100, "全部 −20": z - 20, "×3": 3 * z, "全相等": np.zeros_like(z)}
    bottom = np.zeros(len(cases))
    colors = ["tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple", "tab:brown"]
    probs = np.stack([_softmax(v) for v in cases.values()])  # (cases, n)
    for j in range(z.size):
        a3.bar(np.arange(len(cases)), probs[:, j], bottom=bottom, color=colors[j % len(colors)], label=str(labels[j]),
               edgecolor="white", lw=0.5)
        bottom += probs[:, j]
    for i, s in enumerate(bottom):
        a3.text(i, s + 0.02, f"和 = {s:.3f}", ha="center", fontsize=8)
    a3.set_xticks(np.arange(len(cases)), list(cases), fontsize=8)
    a3.set_ylim(0, 1.32)
    a3.set_ylabel("概率（堆叠）")
    a3.set_title("归一化：每根柱子正好填满 1")
    a3.legend(fontsize=7, loc="upper center", ncol=3)
    return fig


def plot_sigmoid_vs_softmax(
    logits: Any = (5.0, 4.0, 0.0),
    labels: Sequence[Any] | None = ("Artificial", "Intelligence", "其他"),
):
    """两幅子图：左边同一组分数经 sigmoid 与 softmax 的概率（标出各自的总和）；
    右边把第一个分数从 −6 扫到 8、其余不变，看各类概率怎么变——sigmoid 下其余类不受影响，softmax 下其余类被“挤走”。
    """
    z = to_numpy(logits, "logits", ndim=1).astype(float)
    labels = check_labels(labels, z.size, "labels") or [f"类别 {i}" for i in range(z.size)]
    sig = 1.0 / (1.0 + np.exp(-z))
    soft = _softmax(z)
    fig, axes = new_figure((11.0, 3.9), 1, 2)
    a1, a2 = axes[0]
    x = np.arange(z.size)
    w = 0.38
    for off, vals, name, c in ((-w / 2, sig, "sigmoid（各自独立）", "tab:green"), (w / 2, soft, "softmax（互相竞争）", "tab:blue")):
        bars = a1.bar(x + off, vals, w, color=c, label=f"{name}，总和 {vals.sum():.3f}")
        for rect, v in zip(bars, vals):
            a1.text(rect.get_x() + rect.get_width() / 2, v + 0.02, f"{100 * v:.1f}%", ha="center", fontsize=8)
    a1.set_xticks(x, [str(s) for s in labels])
    a1.set_ylim(0, 1.25)
    a1.set_ylabel("概率")
    a1.set_title("同一组分数：sigmoid 与 softmax")
    a1.legend(fontsize=8, loc="upper right")
    a1.grid(axis="y", alpha=0.3)

    sweep = np.linspace(-6, 8, 141)
    zz = np.repeat(z[None, :], sweep.size, axis=0)
    zz[:, 0] = sweep
    ps = _softmax(zz)
    ss = 1.0 / (1.0 + np.exp(-zz))
    for j in range(min(z.size, 3)):
        c = ("tab:blue", "tab:orange", "tab:purple")[j]
        a2.plot(sweep, ps[:, j], "-", color=c, lw=2, label=f"softmax：{labels[j]}")
        a2.plot(sweep, ss[:, j], ":", color=c, lw=1.6, label=f"sigmoid：{labels[j]}")
    a2.set_xlabel(f"“{labels[0]}”的分数（其余分数不变）")
    a2.set_ylabel("概率")
    a2.set_ylim(-0.02, 1.05)
    a2.set_title("提高一个分数：softmax 会挤走别人，sigmoid 不会")
    a2.legend(fontsize=7, loc="center left")
    a2.grid(alpha=0.3)
    return fig


def plot_temperature_entropy(
    logits: Mapping[str, Any] | Any = (5.0, 4.0, 0.0),
    temperatures: Sequence[float] | None = None,
    *,
    mark: Sequence[float] = (0.5, 1.0, 2.0),
    title: str | None = None,
    ax: Any = None,
):
    """``softmax(z / T)`` 的熵（自然对数）随温度 T 的变化，横轴对数刻度。

    ``logits``：一组分数，或 ``{名字: 分数}`` 的字典（可比较多组，例如例子里的 3 个分数与真实模型的 V 个 logits）。
    每组画一条曲线，并用同色虚线标出上限 ln V（T → ∞ 时的均匀分布）；T → 0 时熵趋于 0（只剩 argmax）。
    """
    groups = dict(logits) if isinstance(logits, Mapping) else {"分数": logits}
    if not groups:
        raise ValueError("logits 至少要有一组")
    temps = np.logspace(-2, 2, 161) if temperatures is None else to_numpy(list(temperatures), "temperatures", ndim=1)
    if np.any(temps <= 0):
        raise ValueError("temperatures 应全为正数")
    if ax is None:
        fig, ax = new_figure((6.4, 3.9))
    else:
        fig = ax.figure
    colors = ["tab:blue", "tab:orange", "tab:green", "tab:red"]
    for i, (name, z) in enumerate(groups.items()):
        z = to_numpy(z, f"logits[{name!r}]", ndim=1).astype(float)
        c = colors[i % len(colors)]
        h = _entropy(_softmax(z[None, :] / temps[:, None]))
        ax.semilogx(temps, h, "-", color=c, lw=2, label=f"{name}（V = {z.size}）")
        ax.axhline(np.log(z.size), color=c, ls="--", lw=1, alpha=0.7)
        ax.text(temps[0], np.log(z.size), f" ln {z.size} = {np.log(z.size):.2f}", color=c, va="bottom", fontsize=8)
        for t in mark:
            ht = float(_entropy(_softmax(z / t)))
            ax.plot([t], [ht], "o", color=c, ms=4)
    for t in mark:
        ax.axvline(t, color="gray", ls=":", lw=0.8)
    ax.set_xlabel("温度 T（对数刻度）")
    ax.set_ylabel("熵（nats）")
    ax.set_title(title if title is not None else "温度越高，分布越平（熵越大）")
    ax.legend(fontsize=8, loc="center right")
    ax.grid(alpha=0.3, which="both")
    return fig
