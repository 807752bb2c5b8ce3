"""多头、掩码与前馈网络的图（第 4 章）。

- :func:`plot_head_split`：把 ``(T, d_model)`` 的矩阵按列切成 h 段，上面是整块矩阵（竖线分开各头），
  下面是切开后每个头的 ``(T, d_k)``——也就是 ``split_heads`` 做的事；
- :func:`plot_activation_curves`：ReLU 与 GELU 等激活函数的曲线；
- :func:`plot_param_share`：一层里各部分参数量的占比（横向堆叠条）；
- :func:`plot_seed_curves`：几个种子的平均曲线与最小–最大范围（FFN 消融实验的验证集曲线）；
- :func:`plot_layer_curves`：随层号变化的若干条曲线（例如 post-LN 与 pre-LN 在 12 层里的激活范数、梯度范数）。
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from tformer_lib._checks import positive_int
from tformer_lib.plotting._common import check_labels, new_figure, to_numpy

_HEAD_COLORS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f")
_STYLES = ("-o", "--s", "-.^", ":D")


def plot_head_split(
    x: Any,
    n_heads: int,
    tokens: Sequence[Any] | str | None = None,
    *,
    name: str = "Q",
    cmap: str = "RdBu_r",
):
    """画出“按头切分”：上方是 ``x``（``(T, d_model)``），彩色竖线把 d_model 列分成 ``n_heads`` 段；
    下方是每一段单独取出后的 ``(T, d_k)`` 小矩阵（头 0、头 1……）。

    ``x`` 可以是 ``(T, d_model)`` 或 ``(1, T, d_model)``；``d_model`` 必须能被 ``n_heads`` 整除。
    所有子图共用一个以 0 为中心的颜色范围，方便看出下方小矩阵只是上方的列切片。
    """
    m = to_numpy(x, "x", ndim=(2, 3))
    if m.ndim == 3:
        if m.shape[0] != 1:
            raise ValueError(f"x 为三维时第一维（batch）应为 1，收到形状 {tuple(m.shape)}")
        m = m[0]
    n_heads = positive_int("n_heads", n_heads)
    T, d_model = m.shape
    if d_model % n_heads:
        raise ValueError(f"d_model={d_model} 不能被 n_heads={n_heads} 整除")
    d_k = d_model // n_heads
    labels = check_labels(tokens, T, "tokens")
    lim = float(np.abs(m[np.isfinite(m)]).max()) if np.isfinite(m).any() else 1.0
    lim = lim or 1.0

    fig, _ = new_figure((max(7.0, 0.28 * d_model + 2.0), 2.2 + 0.55 * T))
    fig.clear()
    gs = fig.add_gridspec(2, n_heads, height_ratios=(1, 1))
    top = fig.add_subplot(gs[0, :])
    im = top.imshow(m, cmap=cmap, vmin=-lim, vmax=lim, aspect="auto", interpolation="nearest")
    for h in range(1, n_heads):
        top.axvline(h * d_k - 0.5, color="black", lw=2)
    for h in range(n_heads):
        top.text((h + 0.5) * d_k - 0.5, -0.75, f"头 {h}", ha="center", va="bottom", fontsize=9,
                 color=_HEAD_COLORS[h % len(_HEAD_COLORS)])
    top.set_yticks(range(T), labels if labels is not None else range(T))
    top.set_xticks(range(0, d_model, d_k))
    top.set_xlabel(f"d_model = {d_model} 个维度")
    top.set_title(f"{name}：(T, d_model) = ({T}, {d_model})", pad=18)
    for h in range(n_heads):
        ax = fig.add_subplot(gs[1, h])
        ax.imshow(m[:, h * d_k:(h + 1) * d_k], cmap=cmap, vmin=-lim, vmax=lim, aspect="auto",
                  interpolation="nearest")
        ax.set_title(f"头 {h}：({T}, {d_k})", fontsize=9, color=_HEAD_COLORS[h % len(_HEAD_COLORS)])
        ax.set_xticks([])
        ax.set_yticks(range(T), labels if (labels is not None and h == 0) else [""] * T)
        for side in ax.spines.values():
            side.set_edgecolor(_HEAD_COLORS[h % len(_HEAD_COLORS)])
            side.set_linewidth(2)
    fig.colorbar(im, ax=fig.axes, shrink=0.7, label="数值")
    return fig


def plot_activation_curves(
    names: Sequence[str] = ("relu", "gelu"),
    *,
    x_min: float = -4.0,
    x_max: float = 4.0,
    n_points: int = 401,
    title: str = "前馈网络的激活函数",
):
    """画激活函数曲线，``names`` 取自 ``"relu"``、``"gelu"``、``"gelu_tanh"``（GELU 的 tanh 近似）。

    曲线直接用 ``torch.nn.functional`` 计算，与 :class:`~tformer_lib.PositionwiseFeedForward` 所用的一致。
    """
    import torch
    import torch.nn.functional as F

    funcs = {
        "relu": ("ReLU(x) = max(0, x)", F.relu),
        "gelu": ("GELU(x) = x·Φ(x)", F.gelu),
        "gelu_tanh": ("GELU（tanh 近似）", lambda t: F.gelu(t, approximate="tanh")),
    }
    if isinstance(names, str):
        names = (names,)
    for n in names:
        if n not in funcs:
            raise ValueError(f"names 中的 {n!r} 不认识，可选 {sorted(funcs)}")
    if not x_min < x_max:
        raise ValueError(f"需要 x_min < x_max，收到 x_min={x_min}, x_max={x_max}")
    n_points = positive_int("n_points", n_points, 2)
    xs = torch.linspace(float(x_min), float(x_max), n_points, dtype=torch.float64)
    fig, ax = new_figure((6.4, 4.0))
    for i, n in enumerate(names):
        label, f = funcs[n]
        ax.plot(xs.numpy(), f(xs).numpy(), ("-", "--", ":")[i % 3], lw=2, label=label)
    ax.axhline(0, color="gray", lw=0.8)
    ax.axvline(0, color="gray", lw=0.8)
    ax.set_xlabel("x")
    ax.set_ylabel("激活值")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend()
    return fig


def plot_param_share(
    counts: Mapping[str, int],
    *,
    title: str = "一层里的参数分布",
    ax: Any = None,
):
    """横向堆叠条：``counts`` 是 ``{部件名: 参数量}``，每段标出数量与百分比。"""
    if not counts:
        raise ValueError("counts 不能为空")
    names = [str(k) for k in counts]
    values = np.array([float(v) for v in counts.values()])
    if (values < 0).any() or values.sum() <= 0:
        raise ValueError(f"counts 的值应为非负且总和为正，收到 {dict(counts)}")
    if ax is None:
        fig, ax = new_figure((8.0, 2.2))
    else:
        fig = ax.figure
    total = values.sum()
    left = 0.0
    for i, (n, v) in enumerate(zip(names, values)):
        ax.barh([0], [v], left=left, color=_HEAD_COLORS[i % len(_HEAD_COLORS)], edgecolor="white")
        if v / total > 0.08:
            ax.text(left + v / 2, 0, f"{n}\n{int(v):,}（{v / total:.1%}）", ha="center", va="center",
                    fontsize=9, color="white")
        left += v
    ax.set_xlim(0, total)
    ax.set_yticks([])
    from matplotlib.ticker import FuncFormatter

    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _pos: f"{v:,.0f}"))
    ax.set_xlabel(f"参数量（合计 {int(total):,}）")
    ax.set_title(title)
    return fig


def plot_seed_curves(
    panels: Mapping[str, Mapping[str, Sequence[Sequence[float]]]],
    *,
    xlabel: str = "epoch",
    title: str | None = None,
):
    """若干个并排子图，每条曲线是几个种子（seed）的平均，阴影是种子之间的最小–最大范围。

    ``panels``：``{子图标题: {图例: [[种子 1 每个 epoch 的值], [种子 2 …], …]}}``；同一条曲线的各种子长度相同。
    横轴为 1, 2, …, E（例如 epoch）。用于第 4 章的 FFN 消融实验（:mod:`tformer_lib.experiments.ablations`）。
    """
    if not panels:
        raise ValueError("panels 不能为空")
    fig, axes = new_figure((4.6 * len(panels), 3.6), 1, len(panels))
    for ax, (ptitle, series) in zip(np.atleast_1d(axes).ravel(), panels.items()):
        if not series:
            raise ValueError(f"子图 {ptitle!r} 没有曲线")
        for i, (label, runs) in enumerate(series.items()):
            lengths = {len(r) for r in runs}
            if len(lengths) != 1:
                raise ValueError(f"panels[{ptitle!r}][{label!r}] 里各种子的长度应相同，收到 {sorted(lengths)}")
            v = to_numpy(runs, f"panels[{ptitle!r}][{label!r}]", ndim=2)  # (种子数, E)
            x = np.arange(1, v.shape[1] + 1)
            style = _STYLES[i % len(_STYLES)]
            color = _HEAD_COLORS[i % len(_HEAD_COLORS)]
            ax.plot(x, v.mean(axis=0), style, color=color, lw=1.8, ms=4, label=f"{label}（{v.shape[0]} 个种子）")
            ax.fill_between(x, v.min(axis=0), v.max(axis=0), color=color, alpha=0.18, lw=0)
        ax.set_title(ptitle, fontsize=10)
        ax.set_xlabel(xlabel)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    if title:
        fig.suptitle(title)
    return fig


def plot_layer_curves(
    panels: Mapping[str, Mapping[str, Sequence[float]]],
    *,
    xlabel: str = "层号",
    logy: bool = False,
    title: str | None = None,
):
    """若干个并排子图，每个子图画几条随层号变化的曲线。

    ``panels``：``{子图标题: {图例: 每层一个数值}}``，例如
    ``{"激活范数": {"post-LN": [...], "pre-LN": [...]}, "梯度范数": {...}}``。横轴为 1, 2, …, L。
    """
    if not panels:
        raise ValueError("panels 不能为空")
    fig, axes = new_figure((4.2 * len(panels), 3.6), 1, len(panels))
    for ax, (ptitle, series) in zip(np.atleast_1d(axes).ravel(), panels.items()):
        if not series:
            raise ValueError(f"子图 {ptitle!r} 没有曲线")
        for i, (label, values) in enumerate(series.items()):
            v = to_numpy(values, f"panels[{ptitle!r}][{label!r}]", ndim=1)
            ax.plot(np.arange(1, len(v) + 1), v, _STYLES[i % len(_STYLES)], lw=1.8, ms=4, label=label)
        if logy:
            ax.set_yscale("log")
        ax.set_title(ptitle, fontsize=10)
        ax.set_xlabel(xlabel)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    if title:
        fig.suptitle(title)
    return fig
