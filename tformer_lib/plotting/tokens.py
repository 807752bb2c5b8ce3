"""词元与嵌入的图（第 1 章）。

* :func:`plot_grouped_bars`：分组柱状图（grouped bar chart）。第 1 章用它比较「词嵌入乘 √d_model
  之前/之后」与「位置编码」的平均范数；函数本身是通用的：给 ``{组名: {系列名: 数值}}``，每组画一簇柱子。
* :func:`plot_input_matrix`：一句话进入模型时的输入矩阵（词嵌入 [×√d_model] [+ 位置编码]）的热力图，
  第 1 章的交互探索器包装的就是它。
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np

from tformer_lib._checks import positive_int
from tformer_lib.plotting._common import new_figure
from tformer_lib.plotting.heatmap import plot_heatmap

__all__ = ["plot_grouped_bars", "plot_input_matrix"]


def plot_grouped_bars(
    values: Mapping[str, Mapping[str, float]],
    *,
    title: str | None = None,
    xlabel: str | None = None,
    ylabel: str | None = None,
    fmt: str = ".2f",
    log: bool = False,
    figsize: tuple[float, float] | None = None,
    ax=None,
):
    """画分组柱状图，返回 ``matplotlib.figure.Figure``。

    参数
    ----
    values : ``{组名: {系列名: 数值}}``，例如 ``{"d_model=64": {"位置编码": 5.66, "词嵌入": 1.0}}``。
        每组的系列名必须相同（同一系列在各组用同一种颜色）。
    fmt : 柱顶数值的格式；``log=True`` 时纵轴用对数刻度。
    ax : 给定时画进这个 Axes，返回它所在的 Figure。
    """
    if not isinstance(values, Mapping) or not values:
        raise ValueError(f"values 应为非空的 {{组名: {{系列名: 数值}}}} 字典，收到 {type(values).__name__}")
    groups = [str(g) for g in values]
    series = [str(s) for s in next(iter(values.values()))]
    if not series:
        raise ValueError("values 里每组至少要有一个系列")
    for g, inner in values.items():
        if [str(s) for s in inner] != series:
            raise ValueError(f"组 {g!r} 的系列 {list(inner)} 与第一组的系列 {series} 不一致")
    data = np.array([[float(v) for v in inner.values()] for inner in values.values()])  # (组数, 系列数)
    if not np.all(np.isfinite(data)):
        raise ValueError("values 里有 nan 或 inf")
    if log and np.any(data <= 0):
        raise ValueError("log=True 时所有数值都应 > 0")
    if ax is None:
        if figsize is None:
            figsize = (min(12.0, 2.2 + 1.1 * len(groups) * len(series)), 4.0)
        fig, ax = new_figure(figsize)
    else:
        fig = ax.figure
    n_series = len(series)
    width = 0.8 / n_series
    x = np.arange(len(groups))
    for j, name in enumerate(series):
        bars = ax.bar(x + (j - (n_series - 1) / 2) * width, data[:, j], width, label=name)
        ax.bar_label(bars, labels=[format(v, fmt) for v in data[:, j]], fontsize=8, padding=2)
    ax.set_xticks(x, groups)
    if log:
        ax.set_yscale("log")
    ax.margins(y=0.15)
    ax.legend(frameon=False, fontsize=9)
    if title:
        ax.set_title(title)
    if xlabel:
        ax.set_xlabel(xlabel)
    if ylabel:
        ax.set_ylabel(ylabel)
    return fig


def plot_input_matrix(
    sentence: str | Sequence[str] = "狗 咬 人",
    *,
    vocab=None,
    d_model: int = 64,
    scale: bool = True,
    add_pe: bool = True,
    n_dims: int = 16,
    seed: int = 0,
    vmax: float = 3.0,
    ax=None,
):
    """画一句话的模型输入矩阵的前 ``n_dims`` 维：行 = 词元，列 = 维度。

    计算全用库里的部件：``TokenEmbedding``（``scale=False`` 时只查表、不乘 √d_model）与
    ``sinusoidal_positional_encoding``（``add_pe=True`` 时相加）。嵌入矩阵按论文实现的方式初始化为
    N(0, d_model^(-1/2))，只由 ``seed`` 决定（不改变全局随机状态），所以同一个词元在任何句子里
    得到同一个向量。标题写出嵌入与位置编码的平均 L2 范数。

    参数
    ----
    sentence : 以空格分词的字符串（如 ``"狗 咬 人"``）或词元列表。
    vocab : :class:`tformer_lib.data.Vocab`；默认用玩具语料的词典词建一张固定词表。词表外的词元按 UNK 处理。
    vmax : 颜色范围 ±vmax（超出的数值按边界色着色）。
    """
    import torch

    from tformer_lib.data import LEXICON, Vocab
    from tformer_lib.parts.embedding import TokenEmbedding
    from tformer_lib.parts.positional import sinusoidal_positional_encoding

    tokens = sentence.split() if isinstance(sentence, str) else [str(t) for t in sentence]
    if not tokens:
        raise ValueError(f"sentence 至少要有一个词元，收到 {sentence!r}")
    d_model = positive_int("d_model", d_model)
    n_dims = positive_int("n_dims", n_dims)
    if n_dims > d_model:
        raise ValueError(f"n_dims={n_dims} 不能大于 d_model={d_model}")
    if vocab is None:
        vocab = Vocab(list(LEXICON))
    with torch.random.fork_rng(devices=[]), torch.no_grad():
        torch.manual_seed(seed)
        emb = TokenEmbedding(len(vocab), d_model)
        torch.nn.init.normal_(emb.lut.weight, mean=0.0, std=d_model**-0.5)
        ids = torch.tensor([vocab.encode(tokens)])  # (1, T)
        x = emb(ids)[0] if scale else emb.lut(ids)[0]  # (T, d_model)
    pe = sinusoidal_positional_encoding(len(tokens), d_model)  # (T, d_model)
    h = x + pe if add_pe else x  # (T, d_model)
    title = (
        f"d_model={d_model}，{'×√d_model' if scale else '不缩放'}，{'加' if add_pe else '不加'}位置编码"
        f"｜嵌入长度 {x.norm(dim=-1).mean().item():.2f}，位置编码长度 {math.sqrt(d_model / 2):.2f}"
    )
    figsize = None if ax is not None else (10.0, 0.5 * len(tokens) + 1.8)
    return plot_heatmap(
        h[:, :n_dims], tokens, [str(j) for j in range(n_dims)], cmap="RdBu_r", vmin=-vmax, vmax=vmax,
        annotate=False, title=title, xlabel=f"前 {n_dims} 维", colorbar_label=f"数值（超出 ±{vmax:g} 按 ±{vmax:g} 着色）",
        figsize=figsize, ax=ax,
    )
