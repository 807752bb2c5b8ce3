"""位置编码（positional encoding）的图：热力图、逐维曲线、P·Pᵀ 相似度与“切片”细看图。

所有图都直接调用库里的 :func:`tformer_lib.sinusoidal_positional_encoding`，书中画的就是库算的。
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from tformer_lib._checks import positive_int
from tformer_lib.plotting._common import blank_figure, new_figure


def _pe(max_len: int, d_model: int) -> np.ndarray:
    from tformer_lib.parts.positional import sinusoidal_positional_encoding

    positive_int("max_len", max_len)
    positive_int("d_model", d_model)
    return sinusoidal_positional_encoding(max_len, d_model).double().numpy()  # (max_len, d_model)


def _dim_label(dim: int) -> str:
    return f"维度 {dim}（{'sin' if dim % 2 == 0 else 'cos'}）"


def plot_positional_encoding(
    max_len: int = 50,
    d_model: int = 128,
    *,
    position: int | None = None,
    dimension: int | None = None,
    cmap: str = "RdBu_r",
    title: str | None = None,
    ax=None,
):
    """正弦余弦位置编码矩阵 ``PE``（行 = 位置 pos，列 = 维度）的热力图。

    左侧（低维）颜色随位置快速交替——高频；右侧（高维）几乎不变——低频。
    ``position`` / ``dimension`` 给定时用虚线框出那一行/那一列。
    """
    pe = _pe(max_len, d_model)
    if ax is None:
        fig, ax = new_figure((7.2, 4.2))
    else:
        fig = ax.figure
    im = ax.imshow(pe, cmap=cmap, vmin=-1, vmax=1, aspect="auto", interpolation="nearest")
    ax.set_xlabel("维度（dimension）")
    ax.set_ylabel("位置 pos")
    ax.set_title(title if title is not None else f"正弦余弦位置编码（max_len={max_len}, d_model={d_model}）")
    if position is not None:
        if not 0 <= position < max_len:
            raise ValueError(f"position={position} 应在 [0, {max_len}) 内")
        ax.axhline(position - 0.5, color="black", ls="--", lw=1)
        ax.axhline(position + 0.5, color="black", ls="--", lw=1)
    if dimension is not None:
        if not 0 <= dimension < d_model:
            raise ValueError(f"dimension={dimension} 应在 [0, {d_model}) 内")
        ax.axvline(dimension - 0.5, color="black", ls="--", lw=1)
        ax.axvline(dimension + 0.5, color="black", ls="--", lw=1)
    fig.colorbar(im, ax=ax, shrink=0.9, label="PE 取值")
    return fig


def plot_positional_curves(
    dims: Sequence[int] = (4, 5, 10, 11, 20, 21),
    max_len: int = 100,
    d_model: int = 64,
    *,
    stacked: bool = False,
    title: str | None = None,
    ax=None,
):
    """若干维度上 ``PE[pos, dim]`` 随位置 pos 变化的曲线：低维频率高、高维频率低；同一对 (2i, 2i+1) 同频。

    ``stacked=True`` 时每个频率（每对 2i / 2i+1）单独一幅子图、上下排列，并标出波长 2π·10000^(2i/d_model)；
    默认把所有曲线画在一幅图里（实线 sin，虚线 cos）。曲线只在整数位置上取值（与库函数一致）。
    """
    pe = _pe(max_len, d_model)
    dims = [int(d) for d in dims]
    if not dims:
        raise ValueError("dims 至少要有一个维度")
    for d in dims:
        if not 0 <= d < d_model:
            raise ValueError(f"dims 中的 {d} 超出 [0, {d_model})")
    pos = np.arange(max_len)
    if stacked:
        if ax is not None:
            raise ValueError("stacked=True 时会新建多幅子图，不能同时给 ax")
        pairs: list[int] = []
        for d in dims:
            if d // 2 not in pairs:
                pairs.append(d // 2)
        fig = blank_figure((7.2, 1.6 * len(pairs) + 0.8))
        axes = fig.subplots(len(pairs), 1, sharex=True, squeeze=False)[:, 0]
        for a, i in zip(axes, pairs):
            for d in (2 * i, 2 * i + 1):
                if d in dims:
                    a.plot(pos, pe[:, d], ls="-" if d % 2 == 0 else "--", marker=".", ms=3, label=_dim_label(d))
            a.set_ylim(-1.2, 1.2)
            a.set_title(f"i = {i}：波长 ≈ {2 * np.pi * 10000.0 ** (2 * i / d_model):.1f}", fontsize=9)
            a.legend(loc="upper right", fontsize=7)
            a.grid(alpha=0.3)
        axes[-1].set_xlabel("位置 pos")
        fig.suptitle(title if title is not None else f"每个频率一行：维度越高，波长越长（d_model={d_model}）")
        return fig
    if ax is None:
        fig, ax = new_figure((7.2, 3.8))
    else:
        fig = ax.figure
    for d in dims:
        ax.plot(pos, pe[:, d], ls="-" if d % 2 == 0 else "--", label=_dim_label(d))
    ax.set_xlabel("位置 pos")
    ax.set_ylabel("PE 取值")
    ax.set_ylim(-1.15, 1.15)
    ax.set_title(title if title is not None else f"各维度的位置编码曲线（d_model={d_model}）")
    ax.legend(loc="upper right", fontsize=8, ncols=2)
    ax.grid(alpha=0.3)
    return fig


def plot_positional_similarity(
    max_len: int = 50,
    d_model: int = 128,
    *,
    normalize: bool = False,
    cmap: str = "viridis",
    title: str | None = None,
    ax=None,
):
    """位置编码之间的相似度矩阵 ``P·Pᵀ``：第 (i, j) 格是位置 i 与位置 j 的编码点积。

    对角线最亮，且只取决于距离 |i − j|（沿对角线方向条纹一致）——相对位置信息就藏在这里。
    ``normalize=True`` 时改画余弦相似度（cosine similarity，点积除以两个向量的长度）。
    """
    pe = _pe(max_len, d_model)
    sim = pe @ pe.T  # (max_len, max_len)
    if normalize:
        norms = np.linalg.norm(pe, axis=1)
        sim = sim / np.outer(norms, norms)
    if ax is None:
        fig, ax = new_figure((5.4, 4.4))
    else:
        fig = ax.figure
    im = ax.imshow(sim, cmap=cmap, aspect="equal", interpolation="nearest")
    ax.set_xlabel("位置 j")
    ax.set_ylabel("位置 i")
    what = "余弦相似度" if normalize else "点积"
    ax.set_title(title if title is not None else f"P·Pᵀ：位置编码两两{what}（d_model={d_model}）")
    fig.colorbar(im, ax=ax, shrink=0.9, label=what)
    return fig


def plot_positional_slice(position: int = 10, dimension: int = 4, d_model: int = 64, max_len: int = 60):
    """位置编码的“细看”图（位置编码探索器用它）：三幅子图。

    左：整张 PE 热力图，虚线框出选中的行（位置）与列（维度）；
    右上：第 ``dimension`` 维随位置变化的曲线，圆点标出 ``position``；
    右下：第 ``position`` 个位置的整条编码向量（每一维的取值）。
    """
    pe = _pe(max_len, d_model)
    if not 0 <= position < max_len:
        raise ValueError(f"position={position} 应在 [0, {max_len}) 内")
    if not 0 <= dimension < d_model:
        raise ValueError(f"dimension={dimension} 应在 [0, {d_model}) 内")
    fig = blank_figure((10.5, 4.6))
    grid = fig.add_gridspec(2, 2, width_ratios=(1.0, 1.25))
    ax_map = fig.add_subplot(grid[:, 0])
    ax_dim = fig.add_subplot(grid[0, 1])
    ax_vec = fig.add_subplot(grid[1, 1])
    plot_positional_encoding(max_len, d_model, position=position, dimension=dimension, ax=ax_map,
                             title=f"PE（d_model={d_model}）")
    pos = np.arange(max_len)
    i = dimension // 2
    wavelength = 2 * np.pi * 10000.0 ** (2 * i / d_model)
    ax_dim.plot(pos, pe[:, dimension], color="tab:blue")
    ax_dim.plot([position], [pe[position, dimension]], "o", color="tab:red")
    ax_dim.set_ylim(-1.15, 1.15)
    ax_dim.set_title(f"{_dim_label(dimension)}随位置变化，波长 ≈ {wavelength:.1f}")
    ax_dim.set_xlabel("位置 pos")
    ax_dim.grid(alpha=0.3)
    ax_vec.bar(np.arange(d_model), pe[position], color=["tab:blue" if d % 2 == 0 else "tab:orange" for d in range(d_model)])
    ax_vec.axvline(dimension, color="tab:red", ls="--", lw=1)
    ax_vec.set_ylim(-1.15, 1.15)
    ax_vec.set_title(f"位置 {position} 的编码向量（蓝 = sin，橙 = cos）")
    ax_vec.set_xlabel("维度")
    return fig
