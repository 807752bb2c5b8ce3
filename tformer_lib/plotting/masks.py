"""掩码（mask）的图：填充掩码（padding mask）、因果掩码（causal mask）与两者的合并。

全书约定：掩码是布尔张量，True = 可以关注（图中亮色），False = 被屏蔽（图中灰色）。
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from tformer_lib.plotting._common import blank_figure, check_labels, to_numpy

_KEEP, _BLOCK = "#4C9F70", "#D9D9D9"  # 绿色 = 可关注，浅灰 = 屏蔽


def plot_mask(
    mask: Any,
    row_labels: Sequence[Any] | str | None = None,
    col_labels: Sequence[Any] | str | None = None,
    *,
    title: str | None = None,
    xlabel: str = "键（key）位置",
    ylabel: str = "查询（query）位置",
    annotate: bool | None = None,
    ax=None,
):
    """画一个二维布尔掩码：绿色格 = True（可以关注），灰色格 = False（屏蔽）。

    ``mask`` 可以带长度为 1 的前导维（例如 ``padding_mask`` 的 ``(1, 1, 1, T)``），会被压成二维。
    ``annotate``（默认格子数 ≤ 144 时）在格子里写 1/0。
    """
    from matplotlib.colors import ListedColormap

    m = to_numpy(mask, "mask")
    while m.ndim > 2 and m.shape[0] == 1:
        m = m[0]
    if m.ndim == 1:
        m = m[None, :]
    if m.ndim != 2:
        raise ValueError(f"mask 去掉长度为 1 的前导维后应为二维，收到形状 {tuple(np.shape(m))}")
    rows = check_labels(row_labels, m.shape[0], "row_labels")
    cols = check_labels(col_labels, m.shape[1], "col_labels")
    if ax is None:
        fig = blank_figure((min(10.0, 0.5 * m.shape[1] + 2.2), min(8.0, 0.45 * m.shape[0] + 1.6)))
        ax = fig.add_subplot()
    else:
        fig = ax.figure
    ax.imshow(m.astype(bool), cmap=ListedColormap([_BLOCK, _KEEP]), vmin=0, vmax=1, aspect="equal",
              interpolation="nearest")
    ax.set_xticks(range(m.shape[1]), cols if cols is not None else range(m.shape[1]))
    ax.set_yticks(range(m.shape[0]), rows if rows is not None else range(m.shape[0]))
    ax.set_xticks(np.arange(-0.5, m.shape[1]), minor=True)
    ax.set_yticks(np.arange(-0.5, m.shape[0]), minor=True)
    ax.grid(which="minor", color="white", lw=1.5)
    ax.tick_params(which="minor", length=0)
    if annotate is None:
        annotate = m.size <= 144
    if annotate:
        for i in range(m.shape[0]):
            for j in range(m.shape[1]):
                ax.text(j, i, "1" if m[i, j] else "0", ha="center", va="center", fontsize=8,
                        color="white" if m[i, j] else "#555555")
    if title:
        ax.set_title(title)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    return fig


def _batch_tokens(lengths: Sequence[int], tokens: Sequence[Sequence[Any]] | None, pad_token: str):
    """按长度生成（或检查）每个序列的词元标签，短序列补 pad_token 到最长长度。"""
    T = max(lengths)
    if tokens is None:
        return [[f"x{j + 1}" for j in range(n)] + [pad_token] * (T - n) for n in lengths]
    if len(tokens) != len(lengths):
        raise ValueError(f"tokens 有 {len(tokens)} 个序列，但 lengths 有 {len(lengths)} 个")
    out = []
    for b, (toks, n) in enumerate(zip(tokens, lengths)):
        toks = list(toks)
        if len(toks) != n:
            raise ValueError(f"tokens[{b}] 有 {len(toks)} 个词元，但 lengths[{b}]={n}")
        out.append([str(t) for t in toks] + [pad_token] * (T - n))
    return out


def plot_masks(
    lengths: Sequence[int] = (6, 4),
    *,
    example: int = -1,
    padding: bool = True,
    causal: bool = True,
    tokens: Sequence[Sequence[Any]] | None = None,
    pad_token: str = "<pad>",
):
    """一批长短不一的序列的三种掩码，用库里的 ``padding_mask`` / ``causal_mask`` / ``combine_masks`` 计算。

    - 左：整批的填充掩码（行 = 序列，列 = 位置；补齐的 <pad> 为灰色）；
    - 中：因果掩码（下三角：位置 i 只看 j ≤ i）；
    - 右：第 ``example`` 个序列实际使用的掩码（``padding``、``causal`` 控制是否各自启用）。

    ``lengths``：每个序列的真实长度（其余位置补 PAD）；``tokens``：可选，每个序列的词元（如 ``["我","爱","你"]``）。
    """
    import torch

    from tformer_lib.parts.masks import causal_mask, combine_masks, padding_mask
    from tformer_lib.specials import PAD

    lengths = [int(n) for n in lengths]
    if not lengths or min(lengths) < 1:
        raise ValueError(f"lengths 应是至少一个正整数的序列，收到 {lengths}")
    B, T = len(lengths), max(lengths)
    if not -B <= example < B:
        raise ValueError(f"example={example} 超出范围：共 {B} 个序列")
    example %= B
    labels = _batch_tokens(lengths, tokens, pad_token)
    ids = torch.full((B, T), PAD, dtype=torch.long)
    for b, n in enumerate(lengths):
        ids[b, :n] = 4 + torch.arange(n)  # 任意非 PAD 的 id
    pad = padding_mask(ids, PAD)  # (B, 1, 1, T)
    cau = causal_mask(T)  # (T, T)
    used = combine_masks(pad[example] if padding else None, cau if causal else None)  # (1, T, T) 或 (T, T)
    if used is None:
        used = torch.ones(T, T, dtype=torch.bool)
    used = used.expand(1, T, T)[0] if used.dim() == 3 else used.expand(T, T)

    fig = blank_figure((min(15.0, 1.15 * T + 6.0), min(6.0, 0.42 * T + 2.0)))
    a1, a2, a3 = fig.subplots(1, 3, gridspec_kw={"width_ratios": (1, 1, 1)})
    plot_mask(pad[:, 0, 0, :], [f"序列 {b}" for b in range(B)], list(range(T)), ax=a1, annotate=False,
              title="填充掩码（padding mask）", xlabel="位置", ylabel="")
    for b in range(B):
        for j in range(T):  # 格子里写词元本身
            a1.text(j, b, labels[b][j], ha="center", va="center", fontsize=7,
                    color="white" if j < lengths[b] else "#555555")
    plot_mask(cau, None, None, ax=a2, title="因果掩码（causal mask）")
    which = "+".join(n for n, on in (("填充", padding), ("因果", causal)) if on) or "无掩码"
    plot_mask(used, labels[example], labels[example], ax=a3, title=f"序列 {example} 实际使用：{which}")
    fig.suptitle("绿色 = 可以关注（True），灰色 = 被屏蔽（False）", fontsize=10)
    return fig
