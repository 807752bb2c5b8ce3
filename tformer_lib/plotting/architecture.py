"""结构图（architecture diagram）：用库里的模块名画出 Transformer 的数据通路，箭头上标张量形状。

- :func:`plot_layer_norm_placement`：一个编码器层（或解码器层）里残差连接与 LayerNorm 的位置，
  后置归一化 post-LN（论文，``norm_first=False``）与前置归一化 pre-LN（``norm_first=True``）左右对照；
- :func:`plot_transformer_architecture`：完整的编码器–解码器（论文图 1），从 ``src``/``tgt_in`` 到输出概率。

图里的每个方框都写着它在库里的名字（``src_embed``、``self_attn``、``cross_attn``、``feed_forward``、
``residual_ffn.norm``、``generator``……），测试会逐个检查这些名字在 :class:`~tformer_lib.translation.model.Transformer`
上真的存在，所以图和代码不会悄悄分家。
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from matplotlib.patches import Circle, FancyArrowPatch, FancyBboxPatch

from tformer_lib.plotting._common import new_figure
from tformer_lib.plotting.fonts import FONT_FAMILY

__all__ = ["plot_layer_norm_placement", "plot_transformer_architecture", "diagram_module_names"]

# 颜色大致沿用论文图 1 的配色：注意力橙、前馈蓝、归一化黄、嵌入粉、输出层紫、softmax 绿。
_COLORS = {
    "attn": "#fbd7b0",
    "ffn": "#c6e2f5",
    "norm": "#f5ef9e",
    "embed": "#f7cfd9",
    "pos": "#ffffff",
    "linear": "#dcd3f2",
    "softmax": "#cdebc9",
    "layer": "#f2f2f2",
}
_EDGE = "#444444"
_SHAPE_COLOR = "#1f5a99"  # 箭头上的形状标注
_RESID_COLOR = "#b03a2e"  # 残差连接
_MONO = "DejaVu Sans Mono"  # 代码名用等宽字体（matplotlib 自带）
_MONO_FAMILY = [_MONO, FONT_FAMILY]  # 等宽字体里没有的汉字由随书字体补上

_BOX_H = 0.62  # 方框高度（数据坐标）
_GAP = 0.34  # 元素之间的竖直间隔
_ADD_R = 0.17  # 残差相加 ⊕ 的半径


@dataclass(frozen=True)
class _Sub:
    """一个子层：中文名、库里的属性名、颜色键、残差模块名、附注（例如用哪个掩码）。"""

    title: str
    attr: str
    color: str
    residual: str
    note: str = ""


_ENCODER_SUBLAYERS = (
    _Sub("多头自注意力", "self_attn", "attn", "residual_attn", "src_mask：挡住 <pad>"),
    _Sub("逐位置前馈网络", "feed_forward", "ffn", "residual_ffn"),
)
_DECODER_SUBLAYERS = (
    _Sub("带掩码的多头自注意力", "self_attn", "attn", "residual_self", "tgt_mask：因果 & 填充"),
    _Sub("交叉注意力", "cross_attn", "attn", "residual_cross", "src_mask：挡住原文 <pad>"),
    _Sub("逐位置前馈网络", "feed_forward", "ffn", "residual_ffn"),
)


# ---------------------------------------------------------------- 绘图原语


def _box(ax, x: float, y: float, w: float, title: str, code: str | None = None, *, color: str = "#ffffff",
         h: float = _BOX_H, dashed: bool = False, fontsize: float = 10.5, note: str = "") -> tuple[float, float]:
    """以 (x, y) 为中心画一个圆角方框：中文名、等宽字体的代码名，可选第三行灰色小字 ``note``。返回 (下沿, 上沿)。"""
    if note:
        h += 0.24
    patch = FancyBboxPatch((x - w / 2, y - h / 2), w, h, boxstyle="round,pad=0.02,rounding_size=0.08",
                           facecolor=color, edgecolor=_EDGE, linewidth=1.1, linestyle="--" if dashed else "-",
                           zorder=3)
    ax.add_patch(patch)
    if code:
        top = y + (0.23 if note else 0.11)
        ax.text(x, top, title, ha="center", va="center", fontsize=fontsize, zorder=4)
        ax.text(x, top - 0.26, code, ha="center", va="center", fontsize=fontsize - 1.5, family=_MONO_FAMILY,
                color="#333333", zorder=4)
        if note:
            ax.text(x, top - 0.5, note, ha="center", va="center", fontsize=fontsize - 2, color="#555555",
                    zorder=4)
    else:
        ax.text(x, y, title, ha="center", va="center", fontsize=fontsize, zorder=4)
    return y - h / 2, y + h / 2


def _add(ax, x: float, y: float) -> tuple[float, float]:
    """残差相加 ⊕：一个带十字的小圆。返回 (下沿, 上沿) 的 y。"""
    ax.add_patch(Circle((x, y), _ADD_R, facecolor="#ffffff", edgecolor=_EDGE, linewidth=1.1, zorder=3))
    ax.plot([x - _ADD_R * 0.6, x + _ADD_R * 0.6], [y, y], color=_EDGE, linewidth=1.1, zorder=4)
    ax.plot([x, x], [y - _ADD_R * 0.6, y + _ADD_R * 0.6], color=_EDGE, linewidth=1.1, zorder=4)
    return y - _ADD_R, y + _ADD_R


def _arrow(ax, points: Sequence[tuple[float, float]], *, color: str = _EDGE, lw: float = 1.2,
           label: str | None = None, label_side: str = "right", label_color: str = _SHAPE_COLOR,
           fontsize: float = 9.5) -> None:
    """沿折线 ``points`` 画箭头（最后一段带箭头）；``label`` 写在第一段的旁边（通常是张量形状）。"""
    for (x0, y0), (x1, y1) in zip(points[:-2], points[1:-1]):
        ax.plot([x0, x1], [y0, y1], color=color, linewidth=lw, zorder=2, solid_capstyle="butt")
    ax.add_patch(FancyArrowPatch(points[-2], points[-1], arrowstyle="-|>", mutation_scale=11, color=color,
                                 linewidth=lw, shrinkA=0, shrinkB=0, zorder=2))
    if label:
        (x0, y0), (x1, y1) = points[0], points[1]
        dx = 0.1 if label_side == "right" else -0.1
        ax.text((x0 + x1) / 2 + dx, (y0 + y1) / 2, label, ha="left" if label_side == "right" else "right",
                va="center", fontsize=fontsize, color=label_color, family=_MONO_FAMILY, zorder=4)


def _finish(ax, xlim: tuple[float, float], ylim: tuple[float, float]) -> None:
    ax.set_xlim(*xlim)
    ax.set_ylim(*ylim)
    ax.set_aspect("equal")
    ax.axis("off")


# ---------------------------------------------------------------- 一个层：子层 + 残差 + LayerNorm


def _draw_layer(ax, x: float, y: float, sublayers: Sequence[_Sub], norm_first: bool, *, width: float,
                resid_side: str, prefix: str = "", shape: str | None = None, notes: bool = True) -> tuple[float, dict[str, tuple[float, float]]]:
    """从 ``y`` 向上画一个层的全部子层；返回 (最后一个元素的上沿, {子层属性名: (方框中心 y, 方框下沿 y)})。

    post-LN：子层 → ⊕（加回残差）→ LayerNorm；pre-LN：LayerNorm → 子层 → ⊕。残差连接从每组的入口分出，
    画在 ``resid_side`` 一侧，直接连到 ⊕。
    """
    side = 1.0 if resid_side == "right" else -1.0
    bypass_x = x + side * (width / 2 + 0.32)
    centers: dict[str, tuple[float, float]] = {}
    top = y
    for k, sub in enumerate(sublayers):
        order = ("norm", "sub", "add") if norm_first else ("sub", "add", "norm")
        entry = top + _GAP * 0.45  # 残差连接的分叉点
        ax.add_patch(Circle((x, entry), 0.045, color=_RESID_COLOR, zorder=5))
        cursor = top
        for kind in order:
            if kind == "add":
                lo, hi = _add(ax, x, cursor + _GAP + _ADD_R)
                # 残差连接：分叉点 → 侧边 → ⊕
                _arrow(ax, [(x, entry), (bypass_x, entry), (bypass_x, (lo + hi) / 2), (x + side * _ADD_R, (lo + hi) / 2)],
                       color=_RESID_COLOR, lw=1.3)
            elif kind == "norm":
                lo, hi = _box(ax, x, cursor + _GAP + _BOX_H / 2, width, "层归一化 LayerNorm",
                              f"{prefix}{sub.residual}.norm", color=_COLORS["norm"])
            else:
                note = sub.note if notes else ""
                h = _BOX_H + (0.24 if note else 0.0)
                lo, hi = _box(ax, x, cursor + _GAP + h / 2, width, sub.title, f"{prefix}{sub.attr}",
                              color=_COLORS[sub.color], note=note)
                centers[sub.attr] = ((lo + hi) / 2, lo)
            _arrow(ax, [(x, cursor), (x, lo)], label=shape if (k == 0 and cursor == top and shape) else None,
                   label_side="left" if side > 0 else "right")
            cursor = hi
        top = cursor
    return top, centers


def _check_bool(value: Any, name: str) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"{name} 应为 True 或 False，收到 {value!r}（{type(value).__name__}）")
    return value


def plot_layer_norm_placement(layer: str = "encoder", *, title: str | None = None, figsize: tuple[float, float] | None = None):
    """一个层里残差连接与层归一化（LayerNorm）的位置：post-LN（左）与 pre-LN（右）对照。

    参数
    ----
    layer : ``"encoder"``（两个子层：自注意力、前馈网络）或 ``"decoder"``（三个子层，多一个交叉注意力）。
    title : 总标题，默认自动生成。

    两边画的是同一个 :class:`~tformer_lib.parts.layers.EncoderLayer`/``DecoderLayer``，只差构造参数 ``norm_first``：

    - post-LN（论文，默认）：``x = LayerNorm(x + Dropout(子层(x)))``——每个子层之后归一化，主干上每层有两三次 LayerNorm；
    - pre-LN：``x = x + Dropout(子层(LayerNorm(x)))``——只归一化子层的输入，输入到输出有一条只经过加法的直通路径，
      所以栈的末尾还要补一个 LayerNorm（``Encoder.norm``/``Decoder.norm``）。

    红色折线是残差连接（residual connection）。返回 ``matplotlib.figure.Figure``。
    """
    if layer not in ("encoder", "decoder"):
        raise ValueError(f"layer 应为 'encoder' 或 'decoder'，收到 {layer!r}")
    subs = _ENCODER_SUBLAYERS if layer == "encoder" else _DECODER_SUBLAYERS
    fig, axes = new_figure(figsize=figsize or (8.6, 8.0), nrows=1, ncols=2)
    kind = "编码器层 EncoderLayer" if layer == "encoder" else "解码器层 DecoderLayer"
    width = 2.9
    tops = []
    for ax, norm_first in zip(axes[0], (False, True)):
        y0 = 0.6
        ax.text(0, y0 - 0.25, "输入 x", ha="center", va="top", fontsize=10)
        top, _ = _draw_layer(ax, 0.0, y0, subs, norm_first, width=width, resid_side="right",
                             shape="(B, T, d_model)", notes=False)
        if norm_first:
            lo, hi = _box(ax, 0.0, top + _GAP + _BOX_H / 2 + 0.12, width, "栈末尾再归一化一次",
                          "Encoder.norm" if layer == "encoder" else "Decoder.norm", color=_COLORS["norm"], dashed=True)
            _arrow(ax, [(0.0, top), (0.0, lo)])
            top = hi
        _arrow(ax, [(0.0, top), (0.0, top + 0.55)], label="(B, T, d_model)", label_side="left")
        ax.text(0, top + 0.65, "输出（送往下一层）", ha="center", va="bottom", fontsize=10)
        formula = ("x ← LayerNorm(x + Dropout(子层(x)))" if not norm_first
                   else "x ← x + Dropout(子层(LayerNorm(x)))")
        ax.set_title(("post-LN（论文做法，norm_first=False）" if not norm_first else "pre-LN（norm_first=True）")
                     + "\n" + formula, fontsize=11)
        tops.append(top)
    for ax in axes[0]:
        _finish(ax, (-2.9, 2.6), (-0.2, max(tops) + 1.2))
    if figsize is None:  # 等比例坐标：按画出来的高度定图高，上下不留大片空白
        fig.set_size_inches(8.6, 0.75 * (max(tops) + 1.4) + 1.2)
    fig.suptitle(title or f"一个{kind}：残差（红线）与 LayerNorm 放在哪里", fontsize=12.5)
    return fig


# ---------------------------------------------------------------- 完整的编码器–解码器


def plot_transformer_architecture(config: Any = None, *, norm_first: bool | None = None, title: str | None = None,
                                  figsize: tuple[float, float] = (9.0, 10.6)):
    """完整的编码器–解码器 Transformer（论文图 1），方框写库里的模块名，箭头上标张量形状。

    参数
    ----
    config : :class:`~tformer_lib.translation.config.TransformerConfig`；给出时标题里写它的层数、``d_model``、头数、
        ``d_ff`` 与词表大小，LayerNorm 的位置取 ``config.norm_first``。省略时画论文的基础模型（N = 6，post-LN）。
    norm_first : 覆盖 LayerNorm 的位置（``False`` post-LN，``True`` pre-LN）；省略时取 ``config`` 的设置。

    形状记号：B 批大小，S 原文长度，T 译文前缀长度，V 目标词表大小。返回 ``matplotlib.figure.Figure``。
    """
    if config is not None:
        for attr in ("n_encoder_layers", "n_decoder_layers", "d_model", "n_heads", "d_ff", "norm_first"):
            if not hasattr(config, attr):
                raise TypeError(f"config 应是 TransformerConfig（缺少属性 {attr}），收到 {type(config).__name__}")
        n_enc, n_dec = config.n_encoder_layers, config.n_decoder_layers
        nf = config.norm_first if norm_first is None else _check_bool(norm_first, "norm_first")
        head = (f"编码器 {n_enc} 层、解码器 {n_dec} 层，d_model = {config.d_model}，h = {config.n_heads}，"
                f"d_ff = {config.d_ff}，V = {config.tgt_vocab_size}")
    else:
        n_enc = n_dec = 6
        nf = False if norm_first is None else _check_bool(norm_first, "norm_first")
        head = "论文的基础模型：N = 6，d_model = 512，h = 8，d_ff = 2048"
    ln = "pre-LN（norm_first=True）" if nf else "post-LN（论文，norm_first=False）"

    fig, ax = new_figure(figsize=figsize)
    xe, xd, w = 0.0, 6.2, 3.0  # 编码器列、解码器列的中心与方框宽度

    # ---- 输入端：词嵌入 + 位置编码
    for x, tok, shape_in, emb, pos, zh in ((xe, "src", "(B, S)", "src_embed", "src_pos", "原文"),
                                           (xd, "tgt_in", "(B, T)", "tgt_embed", "tgt_pos", "译文前缀（以 <bos> 开头）")):
        ax.text(x, 0.0, f"{zh}  {tok}：{shape_in} 词元 id", ha="center", va="center", fontsize=10)
        lo, hi = _box(ax, x, 0.95, w, "词嵌入 × √d_model", emb, color=_COLORS["embed"])
        _arrow(ax, [(x, 0.2), (x, lo)])
        lo2, hi2 = _box(ax, x, 1.95, w, "加上位置编码", pos, color=_COLORS["pos"])
        seq = "S" if tok == "src" else "T"
        _arrow(ax, [(x, hi), (x, lo2)], label=f"(B, {seq}, d_model)")

    # ---- 编码器栈
    y_layer = 2.45
    enc_top, _ = _draw_layer(ax, xe, y_layer + 0.2, _ENCODER_SUBLAYERS, nf, width=w, resid_side="left",
                             prefix="", shape="(B, S, d_model)")
    dec_top, centers = _draw_layer(ax, xd, y_layer + 0.2, _DECODER_SUBLAYERS, nf, width=w, resid_side="right",
                                   prefix="", shape="(B, T, d_model)")
    # 层的外框与 “N×”
    for x, top, n, name, side in ((xe, enc_top, n_enc, "编码器层\nEncoderLayer", -1), (xd, dec_top, n_dec,
                                                                                    "解码器层\nDecoderLayer", 1)):
        pad_x = w / 2 + 0.62
        ax.add_patch(FancyBboxPatch((x - pad_x, y_layer), 2 * pad_x, top - y_layer + 0.2,
                                    boxstyle="round,pad=0.02,rounding_size=0.2", facecolor=_COLORS["layer"],
                                    edgecolor="#888888", linewidth=1.2, zorder=1))
        ax.text(x + side * (pad_x + 0.15), (y_layer + top) / 2, f"{n} ×\n{name}", ha="left" if side > 0 else "right",
                va="center", fontsize=10.5)
    enc_top += 0.2
    dec_top += 0.2
    if nf:  # pre-LN：栈末尾的 LayerNorm
        for x, name in ((xe, "encoder.norm"), (xd, "decoder.norm")):
            top = enc_top if x == xe else dec_top
            lo, hi = _box(ax, x, top + _GAP + _BOX_H / 2, w, "栈末尾的 LayerNorm", name, color=_COLORS["norm"])
            _arrow(ax, [(x, top), (x, lo)])
            if x == xe:
                enc_top = hi
            else:
                dec_top = hi

    # ---- memory → 每个解码器层的交叉注意力（K、V 来自 memory，Q 来自解码器自己）
    y_cross, cross_lo = centers["cross_attn"]
    mem_y = enc_top + 0.55
    ax.text(xe, mem_y + 0.1, "memory：(B, S, d_model)", ha="center", va="bottom", fontsize=10,
            color=_SHAPE_COLOR, family=_MONO_FAMILY)
    x_mid = (xe + xd) / 2
    ax.plot([xe, xe], [enc_top, mem_y], color=_EDGE, linewidth=1.6, zorder=2)
    _arrow(ax, [(xe, mem_y), (x_mid, mem_y), (x_mid, y_cross), (xd - w / 2, y_cross)], lw=1.6)
    ax.text((x_mid + xd - w / 2) / 2, y_cross + 0.08, "K、V", ha="center", va="bottom", fontsize=10,
            color=_SHAPE_COLOR)
    ax.text(x_mid - 0.1, (mem_y + y_cross) / 2, "每个解码器层\n都读同一个\nmemory", ha="right", va="center",
            fontsize=9, color="#555555")
    ax.text(xd - 0.12, cross_lo - 0.14, "Q", ha="right", va="center", fontsize=10, color=_SHAPE_COLOR)

    # ---- 输出端：generator → softmax
    lo, hi = _box(ax, xd, dec_top + 0.95, w, "输出层 Linear(d_model→V)", "generator", color=_COLORS["linear"])
    _arrow(ax, [(xd, dec_top), (xd, lo)], label="(B, T, d_model)")
    lo2, hi2 = _box(ax, xd, hi + 0.85, w, "softmax（在损失或解码里）", None, color=_COLORS["softmax"])
    _arrow(ax, [(xd, hi), (xd, lo2)], label="logits (B, T, V)")
    _arrow(ax, [(xd, hi2), (xd, hi2 + 0.45)])
    ax.text(xd, hi2 + 0.55, "下一个词的概率 (B, T, V)", ha="center", va="bottom", fontsize=10)

    _finish(ax, (xe - 3.4, xd + 3.1), (-0.4, hi2 + 1.0))
    ax.set_title(title or f"Transformer 的编码器–解码器（论文图 1，用本书库的模块名）\n{head}；{ln}", fontsize=11.5)
    ax.text(xe, hi2 + 0.3, "B 批大小，S 原文长度，\nT 译文前缀长度，V 词表大小；\n红线是残差连接",
            ha="center", va="center", fontsize=9.5, color="#555555")
    return fig


def diagram_module_names(fig) -> set[str]:
    """图中用等宽字体写出的模块名（例如 ``self_attn``、``residual_ffn.norm``），供测试核对它们确实存在。"""
    names = set()
    for ax in fig.axes:
        for t in ax.texts:
            if _MONO in t.get_fontfamily() and not t.get_text().startswith(("(", "memory", "logits")):
                names.add(t.get_text())
    return names
