"""绘图模块共用的小工具：张量转数组、新建图（Figure）、参数检查。

所有 ``plot_*`` 函数都用 :func:`new_figure` 直接创建 ``matplotlib.figure.Figure``，
不经过 pyplot 的图表注册表，所以在笔记本里把返回的图作为单元格最后一个表达式时只显示一次，
不会因为 inline 后端在单元格结束时再“冲刷”（flush）一遍而重复显示。
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np


def _tensor_to_numpy(x: Any) -> Any:
    """torch 张量 → float64 的 NumPy 数组（脱离计算图、搬到 CPU）；别的输入原样返回。"""
    try:
        import torch
    except ImportError:  # pragma: no cover
        return x
    return x.detach().to("cpu", dtype=torch.float64).numpy() if isinstance(x, torch.Tensor) else x


def to_numpy(x: Any, name: str, ndim: int | tuple[int, ...] | None = None) -> np.ndarray:
    """把 torch 张量（tensor）、NumPy 数组或嵌套列表转成 float 型 ``np.ndarray``。

    ``ndim`` 给出允许的维数；不符时抛出 ``ValueError``，报出参数名与收到的形状。
    """
    x = _tensor_to_numpy(x)
    try:
        arr = np.asarray(x, dtype=float)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"{name} 应为张量、数组或数值列表，收到 {type(x).__name__}") from exc
    if ndim is not None:
        allowed = (ndim,) if isinstance(ndim, int) else tuple(ndim)
        if arr.ndim not in allowed:
            raise ValueError(f"{name} 应为 {'/'.join(map(str, allowed))} 维，收到形状 {tuple(arr.shape)}")
    return arr


def check_labels(labels: Sequence[Any] | None, n: int, name: str) -> list[str] | None:
    """检查标签个数与矩阵的行数/列数一致，并把每个标签转成字符串。"""
    if labels is None:
        return None
    if isinstance(labels, str):
        labels = list(labels)  # “人工智能” → ["人", "工", "智", "能"]
    labels = [str(t) for t in labels]
    if len(labels) != n:
        raise ValueError(f"{name} 有 {len(labels)} 个，但矩阵这一维长度为 {n}")
    return labels


def finite_array(value: Any, name: str, *, allow_nan: bool = False) -> np.ndarray:
    """结果文件里的一串数（或嵌套的数表）转成 float 数组，并检查都是有限的数。

    ``name`` 是这串数在输入里的完整路径（如 ``"load[3]['shares']"``），写进错误信息；``allow_nan=True`` 时
    NaN 可以有（“这里没有数据”，图上画成断开），±inf 仍然不行。
    """
    value = _tensor_to_numpy(value)
    try:
        raw = np.asarray(value)
        if raw.dtype.kind not in "iuf":  # 字符串、字节串、布尔值、None 不是数（np.asarray(["1"], float) 会悄悄转换）
            raise TypeError(raw.dtype)
        arr = raw.astype(float)
    except (TypeError, ValueError, OverflowError) as exc:
        raise ValueError(f"{name} 应是数值（或数值表，不含字符串、布尔值与 None），收到 {value!r:.60}") from exc
    bad = np.isinf(arr) if allow_nan else ~np.isfinite(arr)
    if bad.any():
        where = tuple(int(i) for i in np.argwhere(bad)[0]) if arr.ndim else ()
        at = f"（下标 {where[0] if len(where) == 1 else where}）" if where else ""
        allowed = "有限的数或 NaN" if allow_nan else "有限的数"
        raise ValueError(f"{name} 应是{allowed}，收到 {arr[bad].flat[0]}{at}")
    return arr


def finite_number(value: Any, name: str) -> float:
    """结果文件里的一个数：有限的实数（不是列表、字符串或布尔值）；``name`` 是它在输入里的完整路径。"""
    if isinstance(value, (bool, str, bytes)) or np.ndim(value) != 0:
        raise ValueError(f"{name} 应是一个有限的数，收到 {value!r}")
    return float(finite_array(value, name))


def check_result_rows(rows: Any, needed: Sequence[str], source: str) -> list[Mapping]:
    """结果文件里的 ``rows``：非空的字典列表，每行都有 ``needed`` 里的字段；``source`` 是文件名（写进错误信息）。"""
    if isinstance(rows, (Mapping, str, bytes)) or not isinstance(rows, Sequence) or not rows:
        shown = "空列表" if isinstance(rows, Sequence) and not rows else type(rows).__name__
        raise ValueError(f"rows 应是非空的结果行列表（{source} 的 'rows'），收到 {shown}")
    for i, row in enumerate(rows):
        if not isinstance(row, Mapping):
            raise ValueError(f"rows[{i}] 应是一行结果（字典），收到 {type(row).__name__}")
        missing = [k for k in needed if k not in row]
        if missing:
            raise ValueError(f"rows[{i}] 缺少字段 {missing}")
    return list(rows)


def new_figure(figsize: tuple[float, float] = (6.4, 4.2), nrows: int = 1, ncols: int = 1, **subplot_kw: Any):
    """新建一个不进入 pyplot 注册表的 Figure，返回 ``(fig, axes)``。

    先确保随书中文字体已注册；使用 constrained 布局，标签不会互相遮挡。
    ``nrows == ncols == 1`` 时 ``axes`` 是单个 Axes，否则是二维数组（``squeeze=False``）。
    """
    fig = blank_figure(figsize)
    if nrows == 1 and ncols == 1:
        return fig, fig.add_subplot(1, 1, 1, **subplot_kw)
    axes = fig.subplots(nrows, ncols, squeeze=False, subplot_kw=subplot_kw or None)
    return fig, axes


def blank_figure(figsize: tuple[float, float] = (6.4, 4.2)):
    """新建一个空白、不进入 pyplot 注册表的 Figure（constrained 布局），并确保中文字体已注册。"""
    from matplotlib.figure import Figure

    from tformer_lib.plotting.fonts import register_cjk_font

    register_cjk_font()
    return Figure(figsize=figsize, layout="constrained")


def text_color_for(value: float, vmin: float, vmax: float, cmap) -> str:
    """根据底色亮度选择数值注释的文字颜色（深底白字，浅底黑字）。"""
    span = vmax - vmin
    t = 0.5 if span <= 0 or not np.isfinite(value) else (value - vmin) / span
    r, g, b, _ = cmap(float(np.clip(t, 0.0, 1.0)))
    luminance = 0.299 * r + 0.587 * g + 0.114 * b
    return "black" if luminance > 0.55 else "white"
