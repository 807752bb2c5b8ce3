"""注意力权重（attention weights）的图：单个头的热力图，以及“层 × 头”的网格。

权重的来源：``scaled_dot_product_attention`` 返回的 ``weights``、``MultiHeadAttention.attn_weights``
或 ``model.attention_weights()["encoder_self"]`` 等（每层一个 ``(B, h, T_q, T_k)`` 张量）。
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from tformer_lib.plotting._common import blank_figure, check_labels, to_numpy
from tformer_lib.plotting.heatmap import plot_heatmap


def _select_head(weights: Any, head: int, batch: int) -> np.ndarray:
    """从 ``(T_q, T_k)``、``(h, T_q, T_k)`` 或 ``(B, h, T_q, T_k)`` 中取出一个头的 ``(T_q, T_k)``。"""
    w = to_numpy(weights, "weights", ndim=(2, 3, 4))
    if w.ndim == 4:
        if not 0 <= batch < w.shape[0]:
            raise ValueError(f"batch={batch} 超出范围：weights 形状 {tuple(w.shape)}（B={w.shape[0]}）")
        w = w[batch]  # (h, T_q, T_k)
    if w.ndim == 3:
        if not 0 <= head < w.shape[0]:
            raise ValueError(f"head={head} 超出范围：weights 形状 {tuple(w.shape)}（h={w.shape[0]}）")
        w = w[head]  # (T_q, T_k)
    return w


def as_layers(weights: Any) -> list[np.ndarray]:
    """统一成“每层一个 ``(B, h, T_q, T_k)`` 数组”的列表。"""
    if isinstance(weights, dict):
        raise TypeError("weights 应是一层的张量或每层一个张量的列表；字典请先取一项，如 weights['encoder_self']")
    if isinstance(weights, (list, tuple)) and weights and not np.isscalar(weights[0]) and np.ndim(weights[0]) >= 2:
        layers = [to_numpy(w, f"weights[{i}]", ndim=(2, 3, 4)) for i, w in enumerate(weights)]
    else:
        layers = [to_numpy(weights, "weights", ndim=(2, 3, 4))]
    out = []
    for w in layers:
        while w.ndim < 4:
            w = w[None]
        out.append(w)
    return out


def plot_attention(
    weights: Any,
    query_tokens: Sequence[Any] | str | None = None,
    key_tokens: Sequence[Any] | str | None = None,
    *,
    head: int = 0,
    batch: int = 0,
    title: str | None = None,
    annotate: bool | None = None,
    cmap: str = "Blues",
    ax=None,
):
    """一个头的注意力权重热力图：行 = 查询（query）词元，列 = 键（key）词元，每行和为 1。

    ``weights`` 可以是 ``(T_q, T_k)``、``(h, T_q, T_k)`` 或 ``(B, h, T_q, T_k)``，后两种用 ``head``/``batch``
    选出一个头。``key_tokens`` 省略时与 ``query_tokens`` 相同（自注意力）。颜色范围固定为 [0, 1]，
    不同头、不同层之间可以直接比较。
    """
    w = _select_head(weights, head, batch)
    if key_tokens is None and w.shape[0] == w.shape[1]:
        key_tokens = query_tokens
    if title is None:
        title = "注意力权重" if np.ndim(weights) == 2 else f"注意力权重（头 {head}）"
    return plot_heatmap(w, query_tokens, key_tokens, title=title, xlabel="键（key）", ylabel="查询（query）",
                        cmap=cmap, vmin=0.0, vmax=1.0, annotate=annotate, colorbar_label="权重", ax=ax)


def plot_attention_grid(
    weights: Any,
    query_tokens: Sequence[Any] | str | None = None,
    key_tokens: Sequence[Any] | str | None = None,
    *,
    layers: Sequence[int] | None = None,
    heads: Sequence[int] | None = None,
    batch: int = 0,
    title: str | None = None,
    cmap: str = "Blues",
    cell_size: float = 2.3,
):
    """“层 × 头”的注意力网格：每行一层、每列一个头，共用一个 [0, 1] 颜色条。

    ``weights``：每层一个 ``(B, h, T_q, T_k)`` 张量的列表（例如 ``model.attention_weights()["encoder_self"]``），
    或单独一层的 ``(B, h, T_q, T_k)`` / ``(h, T_q, T_k)`` 张量。``layers``、``heads`` 选出要画的子集。
    """
    per_layer = as_layers(weights)
    n_layers, n_heads = len(per_layer), per_layer[0].shape[1]
    layers = list(range(n_layers)) if layers is None else [int(i) for i in layers]
    heads = list(range(n_heads)) if heads is None else [int(i) for i in heads]
    for li in layers:
        if not 0 <= li < n_layers:
            raise ValueError(f"layers 中的 {li} 超出范围：共 {n_layers} 层")
    for hi in heads:
        if not 0 <= hi < n_heads:
            raise ValueError(f"heads 中的 {hi} 超出范围：每层 {n_heads} 个头")
    t_q, t_k = per_layer[0].shape[-2:]
    q_labels = check_labels(query_tokens, t_q, "query_tokens")
    if key_tokens is None and t_q == t_k:
        key_tokens = query_tokens
    k_labels = check_labels(key_tokens, t_k, "key_tokens")
    fig = blank_figure((cell_size * len(heads) + 1.2, cell_size * len(layers) + 0.6))
    axes = fig.subplots(len(layers), len(heads), squeeze=False)
    im = None
    for r, li in enumerate(layers):
        w = per_layer[li]
        if not 0 <= batch < w.shape[0]:
            raise ValueError(f"batch={batch} 超出范围：第 {li} 层权重形状 {tuple(w.shape)}")
        for c, hi in enumerate(heads):
            ax = axes[r, c]
            im = ax.imshow(w[batch, hi], cmap=cmap, vmin=0.0, vmax=1.0, aspect="auto", interpolation="nearest")
            ax.set_xticks(range(t_k), k_labels if (k_labels and r == len(layers) - 1) else [""] * t_k)
            ax.set_yticks(range(t_q), q_labels if (q_labels and c == 0) else [""] * t_q)
            ax.tick_params(labelsize=8, length=0)
            if r == 0:
                ax.set_title(f"头 {hi}", fontsize=10)
            if c == 0:
                ax.set_ylabel(f"第 {li} 层", fontsize=10)
    fig.colorbar(im, ax=axes, shrink=0.8, label="权重")
    fig.suptitle(title if title is not None else "各层各头的注意力权重")
    return fig


#: ``model.attention_weights()`` 的三种注意力：(中文名, 查询用哪种词元, 键用哪种词元)
ATTENTION_KINDS = {
    "encoder_self": ("编码器自注意力", "src", "src"),
    "decoder_self": ("解码器自注意力（带因果掩码）", "tgt", "tgt"),
    "decoder_cross": ("交叉注意力（解码器看编码器）", "tgt", "src"),
}


def model_layers(attention: Any, kind: str) -> list:
    if kind not in ATTENTION_KINDS:
        raise ValueError(f"kind={kind!r} 应为 {list(ATTENTION_KINDS)} 之一")
    if not isinstance(attention, dict) or kind not in attention:
        raise TypeError("attention 应是 model.attention_weights() 返回的字典（含 encoder_self / decoder_self / decoder_cross）")
    layers = list(attention[kind])
    if not layers:
        raise ValueError(f"attention[{kind!r}] 是空列表：模型没有这种注意力层")
    if any(w is None for w in layers):
        raise ValueError(f"attention[{kind!r}] 里有 None：快速路径（fast_attention=True）不保存权重；"
                         "请用 fast_attention=False 的模型做一次完整的前向 model(src, tgt_in) 再取权重")
    return layers


def plot_model_attention(
    attention: Mapping[str, Any],
    src_tokens: Sequence[Any] | str | None = None,
    tgt_tokens: Sequence[Any] | str | None = None,
    *,
    kind: str = "decoder_cross",
    layer: int = 0,
    head: int = 0,
    batch: int = 0,
    annotate: bool | None = None,
    ax=None,
):
    """画整个模型里某一种注意力的某层某头：``attention = model.attention_weights()``（完整前向之后）。

    ``kind``：``"encoder_self"``（行列都是源词元）、``"decoder_self"``（行列都是目标词元）或
    ``"decoder_cross"``（行 = 目标词元，列 = 源词元）。标签按 kind 自动对应到 ``src_tokens``/``tgt_tokens``。
    """
    layers = model_layers(attention, kind)
    if not 0 <= layer < len(layers):
        raise ValueError(f"layer={layer} 超出范围：{kind} 共 {len(layers)} 层")
    name, q_kind, k_kind = ATTENTION_KINDS[kind]
    tokens = {"src": src_tokens, "tgt": tgt_tokens}
    return plot_attention(layers[layer], tokens[q_kind], tokens[k_kind], head=head, batch=batch, annotate=annotate,
                          title=f"{name} · 第 {layer} 层 · 头 {head}", ax=ax)
