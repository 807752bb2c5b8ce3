"""模型部件与训练调度的探索器（explorer，第 1–7 章）：每个包装库里的一个绘图函数 ``plot_*``。

机制见 :mod:`tformer_lib.widgets.base`：有内核时任何控件一变就实时重画；每个探索器还有一个
“静态控件”（参数 ``static``，默认是最能说明问题的那个），它的各档预先画好、在浏览器里用 jslink 切换，
所以发布的 HTML 书里也能拖动。``static=None`` 关掉预先画帧。
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import ipywidgets as widgets

from tformer_lib.widgets.base import Explorer


#: 温度滑块在网页上预先画好的各档。
TEMPERATURES = (0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0)
#: 预热步数滑块在网页上预先画好的各档。
WARMUPS = (500, 1000, 2000, 4000, 8000)


def _int_slider(value: int, lo: int, hi: int, description: str, step: int = 1) -> widgets.IntSlider:
    return widgets.IntSlider(value=value, min=lo, max=hi, step=step, description=description,
                             continuous_update=False, style={"description_width": "initial"})


def positional_encoding_explorer(position: int = 10, dimension: int = 4, d_model: int = 64,
                                 max_len: int = 60, *, static: str | None = "position") -> Explorer:
    """位置编码探索器：拖动位置 pos、维度与 d_model，看 :func:`~tformer_lib.plotting.plot_positional_slice`。

    网页上可拖动的是 ``static``（默认位置 pos，每 5 个位置一帧；也可 ``"dimension"`` 或 None）。
    """
    from tformer_lib.plotting import plot_positional_slice

    c_pos = _int_slider(position, 0, max_len - 1, "位置 pos")
    c_dm = _int_slider(d_model, 8, 256, "d_model", step=8)
    c_dim = _int_slider(dimension, 0, d_model - 1, "维度")

    def _limit_dimension(change):  # d_model 变小时，先把维度滑块的上限收紧，再重画
        c_dim.max = change["new"] - 1

    c_dm.observe(_limit_dimension, names="value")
    values = {"position": range(0, max_len, 5), "dimension": range(0, d_model, max(1, d_model // 12))}.get(static)
    return Explorer(plot_positional_slice, {"position": c_pos, "dimension": c_dim, "d_model": c_dm},
                    {"max_len": max_len}, title="位置编码探索器", static=static,
                    static_values=None if values is None else list(values))


def softmax_scaling_explorer(d_k: int = 64, temperature: float = 1.0, scaled: bool = True,
                             n_keys: int = 8, seed: int = 0, *, static: str | None = "d_k") -> Explorer:
    """softmax 与 ÷√d_k 探索器：改 d_k、温度 T、是否缩放，看 :func:`~tformer_lib.plotting.plot_scaled_attention`。

    网页上可拖动的是 ``static``（默认 d_k 的 11 档）。
    """
    from tformer_lib.plotting import plot_scaled_attention

    options = [2 ** i for i in range(11)]  # 1 … 1024
    if d_k not in options:
        raise ValueError(f"d_k={d_k} 应为 {options} 之一")
    controls = {
        "d_k": widgets.SelectionSlider(options=options, value=d_k, description="d_k", continuous_update=False),
        "temperature": widgets.FloatLogSlider(value=temperature, base=10, min=-1, max=1, step=0.05,
                                              description="温度 T", continuous_update=False),
        "scaled": widgets.Checkbox(value=scaled, description="除以 √d_k", indent=False),
    }
    return Explorer(plot_scaled_attention, controls, {"n_keys": n_keys, "seed": seed},
                    title="softmax 与 ÷√d_k 探索器", static=static,
                    static_values=TEMPERATURES if static == "temperature" else None)


def softmax_temperature_explorer(logits: Any = (5.0, 4.0, 0.0),
                                 labels: Sequence[Any] | None = ("Artificial", "Intelligence", "其他"),
                                 temperature: float = 1.0, *, static: str | None = "temperature") -> Explorer:
    """温度探索器：一组分数在温度 T 下的 softmax 概率（:func:`~tformer_lib.plotting.plot_softmax_temperature`）。

    网页上可拖动温度 T（:data:`TEMPERATURES` 各档）；``static=None`` 则温度是连续的对数滑块。
    """
    from tformer_lib.plotting import plot_softmax_temperature

    def _plot(logits, labels, temperature):
        return plot_softmax_temperature(logits, labels, temperatures=(temperature,))

    _plot.__name__ = "plot_softmax_temperature"
    controls = {"temperature": widgets.FloatLogSlider(value=temperature, base=10, min=-1, max=1, step=0.05,
                                                      description="温度 T", continuous_update=False)}
    return Explorer(_plot, controls, {"logits": logits, "labels": labels}, title="Softmax 温度探索器",
                    static=static, static_values=TEMPERATURES if static == "temperature" else None)


def attention_explorer(weights: Any, query_tokens: Sequence[Any] | str | None = None,
                       key_tokens: Sequence[Any] | str | None = None, *, layer: int = 0, head: int = 0,
                       batch: int = 0, static: str | None = "head") -> Explorer:
    """句子上的注意力探索器：选层（layer）与头（head），看 :func:`~tformer_lib.plotting.plot_attention`。

    ``weights``：每层一个 ``(B, h, T_q, T_k)`` 张量的列表（如 ``model.attention_weights()["encoder_self"]``），
    或单独一层的张量。网页上可拖动的是 ``static``（默认“头”，也可 ``"layer"`` 或 None）。
    """
    from tformer_lib.plotting import plot_attention
    from tformer_lib.plotting.attention import as_layers

    layers = as_layers(weights)
    n_layers, n_heads = len(layers), layers[0].shape[1]
    if not 0 <= layer < n_layers or not 0 <= head < n_heads:
        raise ValueError(f"layer={layer}、head={head} 超出范围：共 {n_layers} 层、每层 {n_heads} 个头")

    def _plot(layer, head):
        return plot_attention(layers[layer], query_tokens, key_tokens, head=head, batch=batch,
                              title=f"第 {layer} 层 · 头 {head} 的注意力权重")

    _plot.__name__ = "plot_attention"
    controls = {"layer": _int_slider(layer, 0, n_layers - 1, "层"), "head": _int_slider(head, 0, n_heads - 1, "头")}
    return Explorer(_plot, controls, title="注意力探索器", static=static)


def model_attention_explorer(attention: Mapping[str, Any], src_tokens: Sequence[Any] | str | None = None,
                             tgt_tokens: Sequence[Any] | str | None = None, *, kind: str = "decoder_cross",
                             layer: int = 0, head: int = 0, batch: int = 0,
                             static: str | None = "head") -> Explorer:
    """整个模型的注意力探索器：选注意力种类（编码器自注意力/解码器自注意力/交叉注意力）、层与头。

    ``attention = model.attention_weights()``（在 ``fast_attention=False`` 的模型上做完一次完整前向之后），
    画图用 :func:`~tformer_lib.plotting.plot_model_attention`。网页上可拖动的是 ``static``（默认“头”）。
    """
    from tformer_lib.plotting.attention import ATTENTION_KINDS, as_layers, model_layers, plot_model_attention

    available = [k for k in ATTENTION_KINDS if isinstance(attention, dict) and attention.get(k)]
    if kind not in available:
        raise ValueError(f"kind={kind!r} 不可用；attention 里可用的有 {available}")
    n_layers = {k: len(model_layers(attention, k)) for k in available}
    n_heads = as_layers(model_layers(attention, kind))[0].shape[1]
    if not 0 <= layer < n_layers[kind] or not 0 <= head < n_heads:
        raise ValueError(f"layer={layer}、head={head} 超出范围：{kind} 共 {n_layers[kind]} 层、每层 {n_heads} 个头")
    c_kind = widgets.Dropdown(options=[(ATTENTION_KINDS[k][0], k) for k in available], value=kind, description="种类",
                              style={"description_width": "initial"})
    c_layer = _int_slider(layer, 0, n_layers[kind] - 1, "层")
    c_head = _int_slider(head, 0, n_heads - 1, "头")

    def _limit_layer(change):  # 编码器与解码器层数可能不同
        c_layer.max = n_layers[change["new"]] - 1

    c_kind.observe(_limit_layer, names="value")

    def _plot(kind, layer, head):
        return plot_model_attention(attention, src_tokens, tgt_tokens, kind=kind, layer=layer, head=head, batch=batch)

    _plot.__name__ = "plot_model_attention"
    return Explorer(_plot, {"kind": c_kind, "layer": c_layer, "head": c_head}, title="模型注意力探索器",
                    static=static)


def mask_explorer(lengths: Sequence[int] = (6, 4), *, max_len: int = 10, example: int = 1,
                  padding: bool = True, causal: bool = True, static: str | None = "auto") -> Explorer:
    """掩码探索器：两条序列的长度、看哪一条、是否启用填充/因果掩码（:func:`~tformer_lib.plotting.plot_masks`）。

    网页上可拖动的是 ``static``；默认 ``"auto"`` 是正在查看的那条序列的长度滑块。
    """
    from tformer_lib.plotting import plot_masks

    lengths = [int(n) for n in lengths]
    if len(lengths) != 2 or not all(1 <= n <= max_len for n in lengths):
        raise ValueError(f"lengths 应是两个 1…{max_len} 之间的整数，收到 {lengths}")

    def _plot(len_a, len_b, example, padding, causal):
        return plot_masks((len_a, len_b), example=example, padding=padding, causal=causal)

    _plot.__name__ = "plot_masks"
    controls = {
        "len_a": _int_slider(lengths[0], 1, max_len, "序列 0 长度"),
        "len_b": _int_slider(lengths[1], 1, max_len, "序列 1 长度"),
        "example": widgets.Dropdown(options=[("序列 0", 0), ("序列 1", 1)], value=example, description="查看"),
        "padding": widgets.Checkbox(value=padding, description="填充掩码", indent=False),
        "causal": widgets.Checkbox(value=causal, description="因果掩码", indent=False),
    }
    if static == "auto":
        static = "len_b" if example == 1 else "len_a"
    return Explorer(_plot, controls, title="掩码探索器", static=static)


def lr_schedule_explorer(d_model: int = 512, warmup: int = 4000, factor: float = 1.0,
                         total_steps: int = 20000, *, static: str | None = "warmup") -> Explorer:
    """学习率调度探索器：d_model、预热步数 warmup、倍率 factor（:func:`~tformer_lib.plotting.plot_lr_schedule`）。

    网页上可拖动的是 ``static``（默认 warmup 的 :data:`WARMUPS` 各档；也可 ``"d_model"`` 或 None）。
    """
    from tformer_lib.plotting import plot_lr_schedule

    options = [64, 128, 256, 512, 1024]
    if d_model not in options:
        raise ValueError(f"d_model={d_model} 应为 {options} 之一")
    controls = {
        "d_model": widgets.SelectionSlider(options=options, value=d_model, description="d_model",
                                           continuous_update=False),
        "warmup": _int_slider(warmup, 100, 10000, "预热步数 warmup", step=100),
        "factor": widgets.FloatSlider(value=factor, min=0.1, max=5.0, step=0.1, description="factor",
                                      continuous_update=False),
    }
    return Explorer(plot_lr_schedule, controls, {"total_steps": total_steps}, title="学习率调度探索器",
                    static=static, static_values=WARMUPS if static == "warmup" else None)


__all__ = [
    "positional_encoding_explorer",
    "softmax_scaling_explorer",
    "softmax_temperature_explorer",
    "attention_explorer",
    "model_attention_explorer",
    "mask_explorer",
    "lr_schedule_explorer",
]
