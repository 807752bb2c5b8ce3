"""探索器（explorer）的机制：控件 + 图，有内核时实时重画，没有内核时也能拖动。

一个探索器包装一个纯绘图函数 ``plot_fn(**参数)``（画在 ``matplotlib.figure.Figure`` 上，不经 pyplot）。

**有内核时**（Jupyter 里）：任何控件一变，就用当前参数重画，把 PNG 字节整体换进一个
``ipywidgets.Image``——不闪烁，也不依赖 ``Output`` 控件的消息路由（nbval 与 nbclient 执行时它不可靠）。

**没有内核时**（发布的 HTML 书）：探索器可以指定一个“静态控件”（``static=控件名``）。构造时按这个控件的
每个取值各画一帧（frame），放进一个 ``ipywidgets.Stack``，再用 ``ipywidgets.jslink`` 把控件的
``index`` 连到 Stack 的 ``selected_index``。jslink 在浏览器里直接运行，不需要内核，所以读者在网页上
拖动这个滑块就会看到预先画好的图。其他控件在网页上不起作用（状态行下的一行提示会说明）。帧是缩小过的
调色板 PNG（:data:`FRAME_COLORS` 色），每章所有帧合计不超过 :data:`CHAPTER_FRAME_BUDGET` 字节。

静态控件可以是任何“选择型”控件（``SelectionSlider``、``Dropdown``、``ToggleButtons``……，它们都有同步的
``index``）；``IntSlider`` 与浮点滑块会换成一个同名、同说明的 ``SelectionSlider``，取值为滑块上的各档
（最多 :data:`MAX_FRAMES` 档，或由 ``static_values`` 给出）。

此外，探索器的输出除了控件视图还附带当前图的 ``image/png``，前端连控件都渲染不了时（GitHub 预览）就显示它。
"""

from __future__ import annotations

import base64
import html
import io
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import ipywidgets as widgets

#: 选择型控件：都有一个与前端同步的整数 ``index``，jslink 可以把它连到 Stack 上。
SELECTION_WIDGETS = (widgets.SelectionSlider, widgets.Dropdown, widgets.ToggleButtons, widgets.RadioButtons,
                     widgets.Select)

#: 探索器里 PNG 的分辨率。
EXPLORER_DPI = 96
#: 帧（以及实时重画的图）用的调色板颜色数：PNG 约小 3 倍，看不出差别。
FRAME_COLORS = 256
#: 一个静态控件最多预先画多少帧。
MAX_FRAMES = 16
#: 一章所有探索器的帧合计的上限（字节，按 PNG 计；存进笔记本时 base64 再大约 1.33 倍）。
CHAPTER_FRAME_BUDGET = 1_500_000
#: ``static="auto"`` 时，自动挑选的静态控件最多有几档。
AUTO_MAX_FRAMES = 12


def figure_to_png(fig, dpi: int = EXPLORER_DPI, *, colors: int | None = None) -> bytes:
    """把 Figure 渲染成 PNG 字节（紧凑边框）；``colors`` 给定时转成该颜色数的调色板 PNG（更小）。"""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi, bbox_inches="tight")
    if colors is None:
        return buf.getvalue()
    from PIL import Image

    buf.seek(0)
    fast_octree = Image.Quantize.FASTOCTREE if hasattr(Image, "Quantize") else 2  # Pillow < 9.1 没有枚举
    img = Image.open(buf).convert("RGB").quantize(colors=colors, method=fast_octree)
    out = io.BytesIO()
    img.save(out, format="PNG", optimize=True)
    return out.getvalue()


def _error_figure(exc: Exception):
    """参数组合不合法的那一帧：一张写着原因的小图（网页上没有状态行可写）。"""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(5, 1.2))
    fig.text(0.5, 0.5, f"⚠ 这组参数画不出图：{exc}", ha="center", va="center", wrap=True, color="#b00")
    return fig


def _label(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def _slider_values(ctl: widgets.ValueWidget, limit: int) -> list[Any]:
    """数值滑块上的各档：档数不多就全取，否则取均匀分布的 ``limit`` 档（对数滑块按对数均匀）。"""
    if isinstance(ctl, widgets.IntSlider):
        lo, hi, step = int(ctl.min), int(ctl.max), int(ctl.step) or 1
        n = (hi - lo) // step + 1
        if n <= limit:
            return list(range(lo, hi + 1, step))
        return sorted({lo + round(k * (n - 1) / (limit - 1)) * step for k in range(limit)})
    if isinstance(ctl, widgets.FloatLogSlider):
        exps = [ctl.min + k * (ctl.max - ctl.min) / (limit - 1) for k in range(limit)]
        return [float(f"{ctl.base ** e:.2g}") for e in exps]
    if isinstance(ctl, widgets.FloatSlider):
        return [float(f"{ctl.min + k * (ctl.max - ctl.min) / (limit - 1):.3g}") for k in range(limit)]
    raise TypeError(f"static 控件应是选择型控件或数值滑块，收到 {type(ctl).__name__}")


def as_selection(ctl: widgets.ValueWidget, values: Sequence[Any] | None = None,
                 limit: int = MAX_FRAMES) -> widgets.ValueWidget:
    """把控件变成有同步 ``index`` 的选择型控件（jslink 要用它）；本来就是选择型则原样返回。

    数值滑块换成同说明的 ``SelectionSlider``，取 ``values``（默认：滑块上最多 ``limit`` 档），
    当前值若不在其中就插进去；原控件被关闭。
    """
    if isinstance(ctl, SELECTION_WIDGETS):
        if values is not None:
            raise ValueError(f"{type(ctl).__name__} 本身就是选择型控件，不需要 static_values")
        return ctl
    if values is None:
        values = _slider_values(ctl, limit)
    values = sorted(set(values) | {ctl.value})
    if len(values) > limit + 1:
        raise ValueError(f"static_values 有 {len(values)} 个取值，最多 {limit} 个（帧太多，书会太大）")
    new = widgets.SelectionSlider(options=[(_label(v), v) for v in values], value=ctl.value,
                                  description=ctl.description, continuous_update=False,
                                  style={"description_width": "initial"})
    ctl.close()
    return new


def _n_positions(ctl: widgets.ValueWidget) -> int | None:
    if isinstance(ctl, SELECTION_WIDGETS):
        return len(ctl.options)
    if isinstance(ctl, widgets.IntSlider):
        return (int(ctl.max) - int(ctl.min)) // (int(ctl.step) or 1) + 1
    return None


def auto_static(controls: Mapping[str, widgets.ValueWidget]) -> str | None:
    """``static="auto"``：第一个档数在 2…:data:`AUTO_MAX_FRAMES` 之间的选择型控件或整数滑块。"""
    for name, ctl in controls.items():
        n = _n_positions(ctl)
        if n is not None and 2 <= n <= AUTO_MAX_FRAMES:
            return name
    return None


def _same(a: Any, b: Any) -> bool:
    try:
        return bool(a == b)
    except Exception:  # 例如张量的 == 是逐元素的
        return a is b


class Explorer(widgets.VBox):
    """一个探索器：上面是控件，中间是图，下面是一行状态/错误提示。

    属性
    ----
    controls : ``{参数名: 控件}``，控件的 ``value`` 就是传给 ``plot_fn`` 的同名参数。
    image : 当前显示的图（``ipywidgets.Image``）。
    frames : 静态控件每个取值一帧的 ``Image`` 列表（没有静态控件时只有一帧）。
    stack : 放帧的 ``ipywidgets.Stack``（没有静态控件时为 None）；``link`` 是连接它的 jslink。
    status : 显示错误的 ``ipywidgets.HTML``（参数组合不合法时写在这里，而不是抛异常）。
    plot_fn, fixed, static : 绘图函数、固定不变的参数、静态控件的名字（或 None）。
    """

    def __init__(self, plot_fn: Callable[..., Any], controls: Mapping[str, widgets.ValueWidget],
                 fixed: Mapping[str, Any] | None = None, *, title: str | None = None,
                 dpi: int = EXPLORER_DPI, columns: int = 3, static: str | None = None,
                 static_values: Sequence[Any] | None = None):
        if not callable(plot_fn):
            raise TypeError(f"plot_fn 应是可调用的绘图函数，收到 {type(plot_fn).__name__}")
        for name, ctl in controls.items():
            if not isinstance(ctl, widgets.ValueWidget):
                raise TypeError(f"controls[{name!r}] 应是带 value 的 ipywidgets 控件，收到 {type(ctl).__name__}")
        self.plot_fn = plot_fn
        self.controls = dict(controls)
        self.fixed = dict(fixed or {})
        self.dpi = dpi
        if static == "auto":
            static = auto_static(self.controls)
        if static is not None and static not in self.controls:
            raise ValueError(f"static={static!r} 不是控件名；可用的有 {sorted(self.controls)}")
        self.static = static
        self.status = widgets.HTML("")
        img_layout = {"max_width": "100%", "height": "auto"}
        if static is None:
            self.frames = [widgets.Image(format="png", layout=widgets.Layout(**img_layout))]
            self.stack = self.link = None
            shown: list[widgets.Widget] = [self.frames[0]]
            self._drawn: list[dict | None] = [None]
            self._errors: list[Exception | None] = [None]
        else:
            ctl = self.controls[static] = as_selection(self.controls[static], static_values)
            self.frames = [widgets.Image(format="png", layout=widgets.Layout(**img_layout)) for _ in ctl.options]
            self._drawn = [None] * len(self.frames)
            self._errors = [None] * len(self.frames)
            errors = [self._draw(i, {**self._control_values(), static: value})
                      for i, value in enumerate(self._option_values())]
            self.stack = widgets.Stack(children=self.frames, selected_index=ctl.index)
            # jslink 在浏览器里运行：没有内核也能换帧。Link 是一个小部件，其状态随笔记本保存。
            self.link = widgets.jslink((ctl, "index"), (self.stack, "selected_index"))
            hint = widgets.HTML(f'<small style="color:#666">网页上也可拖动「{html.escape(ctl.description or static)}」'
                                "（各档的图已预先画好）；其余控件要在 Jupyter 中运行才会重画。</small>")
            shown = [self.stack, hint]
        ctl_list = list(self.controls.values())
        rows = [widgets.HBox(ctl_list[i:i + columns]) for i in range(0, len(ctl_list), columns)]
        header = [widgets.HTML(f"<b>{html.escape(title)}</b>")] if title else []
        super().__init__(children=[*header, *rows, *shown, self.status])
        self._title = title or getattr(plot_fn, "__name__", "plot")
        if static is None:
            self.redraw()
        else:
            self._show_error(errors[self.index])
        for name, c in self.controls.items():
            c.observe(self._on_change, names="value" if name != static else "index")

    # ---- 参数与绘图 ----
    def _control_values(self) -> dict[str, Any]:
        return {name: ctl.value for name, ctl in self.controls.items()}

    def _option_values(self) -> list[Any]:
        opts = self.controls[self.static].options
        return [o[1] if isinstance(o, tuple) else o for o in opts]

    def params(self) -> dict[str, Any]:
        """当前参数：固定参数加上每个控件的值。"""
        return {**self.fixed, **self._control_values()}

    def figure(self, **overrides: Any):
        """按当前参数（可临时覆盖）画一张新图并返回 Figure——用于在笔记本里静态显示。"""
        return self.plot_fn(**{**self.params(), **overrides})

    @property
    def index(self) -> int:
        """当前显示的是第几帧。"""
        return 0 if self.static is None else int(self.controls[self.static].index)

    @property
    def image(self) -> widgets.Image:
        return self.frames[self.index]

    def frame_bytes(self) -> int:
        """所有帧的 PNG 字节数之和（存进笔记本的控件状态里，受 :data:`CHAPTER_FRAME_BUDGET` 约束）。"""
        return sum(len(bytes(f.value)) for f in self.frames)

    def _draw(self, i: int, values: dict[str, Any]) -> Exception | None:
        try:
            fig = self.plot_fn(**{**self.fixed, **values})
            error = None
        except Exception as exc:  # 回调里抛出的异常读者看不到（只进内核日志），所以写在状态行/图里
            if self.static is None or i == self.index and self._drawn[i] is not None:
                return exc  # 保留旧图
            fig, error = _error_figure(exc), exc
        self.frames[i].value = figure_to_png(fig, self.dpi, colors=FRAME_COLORS)
        self._drawn[i], self._errors[i] = values, error
        return error

    def redraw(self) -> None:
        """重画当前帧：成功则整体替换它的 PNG；参数不合法则保留旧图并在状态行写出原因。"""
        self._show_error(self._draw(self.index, self._control_values()))

    def _show_error(self, error: Exception | None) -> None:
        if error is not None:
            self.status.value = (f'<span style="color:#b00">⚠ {html.escape(type(error).__name__)}：'
                                 f"{html.escape(str(error))}</span>")
        else:
            self.status.value = ""

    def _stale(self, i: int) -> bool:
        drawn, now = self._drawn[i], self._control_values()
        return drawn is None or any(not _same(drawn.get(k), v) for k, v in now.items())

    def update(self, **values: Any) -> None:
        """用代码设置若干控件的值（每设一个就会重画一次）。"""
        for name, value in values.items():
            if name not in self.controls:
                raise ValueError(f"没有名为 {name!r} 的控件；可用的有 {sorted(self.controls)}")
            ctl = self.controls[name]
            if isinstance(ctl, SELECTION_WIDGETS) and not any(_same(value, v) for v in self._values_of(ctl)):
                raise ValueError(f"{name}={value!r} 不是可选的取值；可选的有 {self._values_of(ctl)}")
            ctl.value = value

    @staticmethod
    def _values_of(ctl: widgets.ValueWidget) -> list[Any]:
        return [o[1] if isinstance(o, tuple) else o for o in ctl.options]

    def _on_change(self, change: dict) -> None:
        if self.stack is not None:
            self.stack.selected_index = self.index  # 在浏览器里 jslink 已经换了帧；这里同步内核一侧
            if not self._stale(self.index):
                self._show_error(self._errors[self.index])
                return
        self.redraw()

    # ---- 显示 ----
    def __repr__(self) -> str:  # 稳定的纯文本表示（nbval 会比较 text/plain）
        return f"<探索器：{self._title}>"

    def _repr_mimebundle_(self, **kwargs: Any):
        data = super()._repr_mimebundle_(**kwargs)
        if data is not None and self.image.value:
            # 前端渲染不了控件时（GitHub 预览等），退回显示当前图
            data["image/png"] = base64.b64encode(bytes(self.image.value)).decode("ascii")
        return data


def make_explorer(plot_fn: Callable[..., Any], controls: Mapping[str, widgets.ValueWidget],
                  fixed: Mapping[str, Any] | None = None, *, title: str | None = None,
                  dpi: int = EXPLORER_DPI, static: str | None = "auto",
                  static_values: Sequence[Any] | None = None) -> Explorer:
    """通用构造器：``plot_fn(**fixed, **{名字: 控件.value})`` 的交互版。

    ``static``：网页上（没有内核）也能拖动的控件名；默认 ``"auto"`` 取第一个档数不多的选择型控件或整数滑块，
    ``None`` 表示不预先画帧。``static_values``：给数值滑块指定预先画哪几档。例::

        ex = make_explorer(plot_positional_curves,
                           {"d_model": widgets.IntSlider(value=64, min=8, max=256, step=8, description="d_model")},
                           fixed={"dims": (0, 1, 6, 7)}, static="d_model", static_values=[16, 64, 256])
        ex            # 作为单元格最后一个表达式显示（是 ex，不是 jslink(...)）
    """
    return Explorer(plot_fn, controls, fixed, title=title, dpi=dpi, static=static, static_values=static_values)


__all__ = [
    "CHAPTER_FRAME_BUDGET",
    "EXPLORER_DPI",
    "Explorer",
    "MAX_FRAMES",
    "as_selection",
    "auto_static",
    "figure_to_png",
    "make_explorer",
]
