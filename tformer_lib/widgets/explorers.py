"""交互探索器（interactive explorer）：每个探索器包装一个纯绘图函数 ``plot_*``。

做法：控件（ipywidgets 的滑块、复选框……）下面放一个 ``ipywidgets.Image``；控件一变，就用当前参数
重新调用绘图函数，把 PNG 字节整体换进 Image。换图是一次性的，不会闪烁（flicker），也不依赖
``Output`` 控件的消息路由（nbval 与 nbclient 执行时它不可靠，见 DESIGN §6）。

没有内核时（发布的 HTML 书、GitHub 预览）也看得到图：

- 探索器在笔记本输出里除了控件视图，还附带一份当前（默认）参数的 ``image/png``，前端渲染不了控件时就显示它；
- 导出时若保存了控件状态（widget state），Image 里的 PNG 也随之保存；
- 章节仍按约定另外静态地显示一次默认图：``plot_x()`` 或 ``explorer.figure()``。

只用 ipywidgets 的公开 API。章节作者可用 :func:`make_explorer` 给自己的绘图函数做探索器。
"""

from __future__ import annotations

import base64
import html
import io
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import ipywidgets as widgets

#: 探索器里 PNG 的分辨率。
EXPLORER_DPI = 96


def figure_to_png(fig, dpi: int = EXPLORER_DPI) -> bytes:
    """把 Figure 渲染成 PNG 字节（紧凑边框）。"""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi, bbox_inches="tight")
    return buf.getvalue()


class Explorer(widgets.VBox):
    """一个探索器：上面是控件，中间是图（``ipywidgets.Image``），下面是一行状态/错误提示。

    属性
    ----
    controls : ``{参数名: 控件}``，控件的 ``value`` 就是传给 ``plot_fn`` 的同名参数。
    image : 显示图的 ``ipywidgets.Image``。
    status : 显示错误的 ``ipywidgets.HTML``（参数组合不合法时写在这里，而不是抛异常）。
    plot_fn, fixed : 绘图函数与固定不变的参数。
    """

    def __init__(self, plot_fn: Callable[..., Any], controls: Mapping[str, widgets.ValueWidget],
                 fixed: Mapping[str, Any] | None = None, *, title: str | None = None,
                 dpi: int = EXPLORER_DPI, columns: int = 3):
        if not callable(plot_fn):
            raise TypeError(f"plot_fn 应是可调用的绘图函数，收到 {type(plot_fn).__name__}")
        for name, ctl in controls.items():
            if not isinstance(ctl, widgets.ValueWidget):
                raise TypeError(f"controls[{name!r}] 应是带 value 的 ipywidgets 控件，收到 {type(ctl).__name__}")
        self.plot_fn = plot_fn
        self.controls = dict(controls)
        self.fixed = dict(fixed or {})
        self.dpi = dpi
        self.image = widgets.Image(format="png", layout=widgets.Layout(max_width="100%", height="auto"))
        self.status = widgets.HTML("")
        ctl_list = list(self.controls.values())
        rows = [widgets.HBox(ctl_list[i:i + columns]) for i in range(0, len(ctl_list), columns)]
        header = [widgets.HTML(f"<b>{html.escape(title)}</b>")] if title else []
        super().__init__(children=[*header, *rows, self.image, self.status])
        self._title = title or getattr(plot_fn, "__name__", "plot")
        self.redraw()
        for ctl in ctl_list:
            ctl.observe(self._on_change, names="value")

    # ---- 参数与绘图 ----
    def params(self) -> dict[str, Any]:
        """当前参数：固定参数加上每个控件的值。"""
        return {**self.fixed, **{name: ctl.value for name, ctl in self.controls.items()}}

    def figure(self, **overrides: Any):
        """按当前参数（可临时覆盖）画一张新图并返回 Figure——用于在笔记本里静态显示。"""
        return self.plot_fn(**{**self.params(), **overrides})

    def redraw(self) -> None:
        """重画：成功则整体替换 Image 的 PNG；参数不合法则保留旧图并在状态行写出原因。"""
        try:
            png = figure_to_png(self.figure(), self.dpi)
        except Exception as exc:  # 回调里抛出的异常读者看不到（只进内核日志），所以写在状态行里
            self.status.value = f'<span style="color:#b00">⚠ {html.escape(type(exc).__name__)}：{html.escape(str(exc))}</span>'
            return
        self.image.value = png
        self.status.value = ""

    def update(self, **values: Any) -> None:
        """用代码设置若干控件的值（每设一个就会重画一次）。"""
        for name, value in values.items():
            if name not in self.controls:
                raise ValueError(f"没有名为 {name!r} 的控件；可用的有 {sorted(self.controls)}")
            self.controls[name].value = value

    def _on_change(self, change: dict) -> None:
        self.redraw()

    # ---- 显示 ----
    def __repr__(self) -> str:  # 稳定的纯文本表示（nbval 会比较 text/plain）
        return f"<探索器：{self._title}>"

    def _repr_mimebundle_(self, **kwargs: Any):
        data = super()._repr_mimebundle_(**kwargs)
        if data is not None and self.image.value:
            # 前端渲染不了控件时（静态 HTML、GitHub），退回显示当前图
            data["image/png"] = base64.b64encode(bytes(self.image.value)).decode("ascii")
        return data


def make_explorer(plot_fn: Callable[..., Any], controls: Mapping[str, widgets.ValueWidget],
                  fixed: Mapping[str, Any] | None = None, *, title: str | None = None,
                  dpi: int = EXPLORER_DPI) -> Explorer:
    """通用构造器：``plot_fn(**fixed, **{名字: 控件.value})`` 的交互版。

    例::

        ex = make_explorer(plot_positional_curves,
                           {"d_model": widgets.IntSlider(value=64, min=8, max=256, step=8, description="d_model")},
                           fixed={"dims": (0, 1, 6, 7)})
        ex            # 作为单元格最后一个表达式显示
    """
    return Explorer(plot_fn, controls, fixed, title=title, dpi=dpi)


def _int_slider(value: int, lo: int, hi: int, description: str, step: int = 1) -> widgets.IntSlider:
    return widgets.IntSlider(value=value, min=lo, max=hi, step=step, description=description,
                             continuous_update=False, style={"description_width": "initial"})


def positional_encoding_explorer(position: int = 10, dimension: int = 4, d_model: int = 64,
                                 max_len: int = 60) -> Explorer:
    """位置编码探索器：拖动位置 pos、维度与 d_model，看 :func:`~tformer_lib.plotting.plot_positional_slice`。"""
    from tformer_lib.plotting import plot_positional_slice

    c_pos = _int_slider(position, 0, max_len - 1, "位置 pos")
    c_dm = _int_slider(d_model, 8, 256, "d_model", step=8)
    c_dim = _int_slider(dimension, 0, d_model - 1, "维度")

    def _limit_dimension(change):  # d_model 变小时，先把维度滑块的上限收紧，再重画
        c_dim.max = change["new"] - 1

    c_dm.observe(_limit_dimension, names="value")
    return Explorer(plot_positional_slice, {"position": c_pos, "dimension": c_dim, "d_model": c_dm},
                    {"max_len": max_len}, title="位置编码探索器")


def softmax_scaling_explorer(d_k: int = 64, temperature: float = 1.0, scaled: bool = True,
                             n_keys: int = 8, seed: int = 0) -> Explorer:
    """softmax 与 ÷√d_k 探索器：改 d_k、温度 T、是否缩放，看 :func:`~tformer_lib.plotting.plot_scaled_attention`。"""
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
                    title="softmax 与 ÷√d_k 探索器")


def softmax_temperature_explorer(logits: Any = (5.0, 4.0, 0.0),
                                 labels: Sequence[Any] | None = ("Artificial", "Intelligence", "其他"),
                                 temperature: float = 1.0) -> Explorer:
    """温度探索器：一组分数在温度 T 下的 softmax 概率（:func:`~tformer_lib.plotting.plot_softmax_temperature`）。"""
    from tformer_lib.plotting import plot_softmax_temperature

    def _plot(logits, labels, temperature):
        return plot_softmax_temperature(logits, labels, temperatures=(temperature,))

    _plot.__name__ = "plot_softmax_temperature"
    controls = {"temperature": widgets.FloatLogSlider(value=temperature, base=10, min=-1, max=1, step=0.05,
                                                      description="温度 T", continuous_update=False)}
    return Explorer(_plot, controls, {"logits": logits, "labels": labels}, title="Softmax 温度探索器")


def attention_explorer(weights: Any, query_tokens: Sequence[Any] | str | None = None,
                       key_tokens: Sequence[Any] | str | None = None, *, layer: int = 0, head: int = 0,
                       batch: int = 0) -> Explorer:
    """句子上的注意力探索器：选层（layer）与头（head），看 :func:`~tformer_lib.plotting.plot_attention`。

    ``weights``：每层一个 ``(B, h, T_q, T_k)`` 张量的列表（如 ``model.attention_weights()["encoder_self"]``），
    或单独一层的张量。
    """
    from tformer_lib.plotting import plot_attention
    from tformer_lib.plotting.attention import _as_layers

    layers = _as_layers(weights)
    n_layers, n_heads = len(layers), layers[0].shape[1]
    if not 0 <= layer < n_layers or not 0 <= head < n_heads:
        raise ValueError(f"layer={layer}、head={head} 超出范围：共 {n_layers} 层、每层 {n_heads} 个头")

    def _plot(layer, head):
        return plot_attention(layers[layer], query_tokens, key_tokens, head=head, batch=batch,
                              title=f"第 {layer} 层 · 头 {head} 的注意力权重")

    _plot.__name__ = "plot_attention"
    controls = {"layer": _int_slider(layer, 0, n_layers - 1, "层"), "head": _int_slider(head, 0, n_heads - 1, "头")}
    return Explorer(_plot, controls, title="注意力探索器")


def model_attention_explorer(attention: Mapping[str, Any], src_tokens: Sequence[Any] | str | None = None,
                             tgt_tokens: Sequence[Any] | str | None = None, *, kind: str = "decoder_cross",
                             layer: int = 0, head: int = 0, batch: int = 0) -> Explorer:
    """整个模型的注意力探索器：选注意力种类（编码器自注意力/解码器自注意力/交叉注意力）、层与头。

    ``attention = model.attention_weights()``（在 ``fast_attention=False`` 的模型上做完一次完整前向之后），
    画图用 :func:`~tformer_lib.plotting.plot_model_attention`。
    """
    from tformer_lib.plotting.attention import ATTENTION_KINDS, _as_layers, _model_layers, plot_model_attention

    available = [k for k in ATTENTION_KINDS if isinstance(attention, dict) and attention.get(k)]
    if kind not in available:
        raise ValueError(f"kind={kind!r} 不可用；attention 里可用的有 {available}")
    n_layers = {k: len(_model_layers(attention, k)) for k in available}
    n_heads = _as_layers(_model_layers(attention, kind))[0].shape[1]
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
    return Explorer(_plot, {"kind": c_kind, "layer": c_layer, "head": c_head}, title="模型注意力探索器")


def mask_explorer(lengths: Sequence[int] = (6, 4), *, max_len: int = 10, example: int = 1,
                  padding: bool = True, causal: bool = True) -> Explorer:
    """掩码探索器：两条序列的长度、看哪一条、是否启用填充/因果掩码（:func:`~tformer_lib.plotting.plot_masks`）。"""
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
    return Explorer(_plot, controls, title="掩码探索器")


def lr_schedule_explorer(d_model: int = 512, warmup: int = 4000, factor: float = 1.0,
                         total_steps: int = 20000) -> Explorer:
    """学习率调度探索器：d_model、预热步数 warmup、倍率 factor（:func:`~tformer_lib.plotting.plot_lr_schedule`）。"""
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
    return Explorer(plot_lr_schedule, controls, {"total_steps": total_steps}, title="学习率调度探索器")


__all__ = [
    "Explorer",
    "make_explorer",
    "figure_to_png",
    "positional_encoding_explorer",
    "softmax_scaling_explorer",
    "softmax_temperature_explorer",
    "attention_explorer",
    "model_attention_explorer",
    "mask_explorer",
    "lr_schedule_explorer",
]
