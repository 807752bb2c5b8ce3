"""第 16 章（长上下文）的图：读过训练长度以后每个位置的损失、RoPE 缩放怎样改每对维度的波长。

纯函数：:func:`plot_position_loss` 的数据是 :func:`tformer_lib.experiments.long_context.measure_long_context`
结果里的 ``evals``（画图函数自己不训练、不评测）；:func:`plot_rope_frequencies` 只调用
:func:`tformer_lib.parts.rope_scaling.rope_frequencies` 算频率。方法名的中文见
:data:`tformer_lib.experiments.long_context.METHOD_LABELS`。
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from tformer_lib._checks import positive_int
from tformer_lib.plotting._common import finite_array, finite_number, new_figure

__all__ = ["plot_position_loss", "plot_rope_frequencies"]

#: 同一种缩放不微调（实线）与微调后（虚线）用同一种颜色
_METHOD_STYLES = {
    "rope/none": ("#333333", "-"), "rope/linear": ("#1f77b4", "-"), "rope/ntk": ("#ff7f0e", "-"),
    "rope/yarn": ("#2ca02c", "-"), "alibi": ("#9467bd", "-"),
    "ft/none": ("#333333", "--"), "ft/linear": ("#1f77b4", "--"), "ft/yarn": ("#2ca02c", "--"),
}
_OTHER_COLORS = ["#8c564b", "#e377c2", "#17becf", "#bcbd22", "#d62728"]
#: 自动裁剪纵轴时，图框上沿比“训练长度以内最差的那条曲线的典型水平”高出的 nats 数（e^1.5 ≈ 4.5 倍困惑度）
_CLIP_MARGIN = 1.5


def _method_labels() -> dict[str, str]:
    from tformer_lib.experiments.long_context import METHOD_LABELS  # 晚导入：实验模块会导入 torch 与语言模型

    return dict(METHOD_LABELS)


def _check_evals(evals: Any) -> list[Mapping]:
    if isinstance(evals, Mapping) and "evals" in evals:  # 也接受整个结果字典
        evals = evals["evals"]
    if isinstance(evals, (Mapping, str, bytes)) or not isinstance(evals, Sequence):
        raise TypeError(f"evals 应是评测记录（字典）的列表（measure_long_context 结果的 'evals'），收到 {type(evals).__name__}")
    if not evals:
        raise ValueError("evals 是空列表：应是 measure_long_context 结果的 'evals'")
    for i, e in enumerate(evals):
        if not isinstance(e, Mapping):
            raise TypeError(f"evals[{i}] 应是一条评测记录（字典），收到 {type(e).__name__}")
        missing = [k for k in ("seed", "method", "eval_len", "position_loss") if k not in e]
        if missing:
            raise ValueError(f"evals[{i}] 缺少字段 {missing}")
    return list(evals)


def _style(method: str, order: Sequence[str]) -> tuple[str, str]:
    if method in _METHOD_STYLES:
        return _METHOD_STYLES[method]
    others = [m for m in order if m not in _METHOD_STYLES]
    return _OTHER_COLORS[others.index(method) % len(_OTHER_COLORS)], "-."


def plot_position_loss(evals: Sequence[Mapping], *, eval_len: int = 256, methods: Sequence[str] | None = None,
                       train_len: int = 64, smooth: int = 8, labels: Mapping[str, str] | None = None,
                       ymax: float | None = None, title: str | None = None):
    """评测长度 ``eval_len`` 上每个位置的交叉熵（nats）：每种方法一条线，各种子平均后再做 ``smooth`` 个位置的滑动平均。

    ``evals`` 是 ``measure_long_context`` 结果的 ``evals``（也可以直接给整个结果字典）；``methods`` 选画哪些方法、按什么顺序
    （默认按 :data:`~tformer_lib.experiments.long_context.METHOD_LABELS` 的顺序画数据里有的全部）；``labels`` 覆盖图例里的中文名。
    滑动平均的窗口居中：第 k 个点画在它覆盖的 ``smooth`` 个位置的中点。竖直虚线是训练长度 ``train_len``：它右边的位置训练时没见过。
    同一种缩放不微调用实线、微调后用虚线，颜色相同。``position_loss`` 里的 NaN 表示那个位置没有可计的目标：
    这时各种子与窗口一起平均（窗口里所有种子的非 NaN 值的平均；没有 NaN 时与“先平均种子、再滑动平均”相同），
    整个窗口都没有数时曲线在那里断开；±inf 是错误。

    纵轴的选择：交叉熵本身是对数量（nats），正常的曲线在 4–6 之间、不缩放的 RoPE 过了训练长度会冲到 10 以上——
    范围不到 10 倍，对数纵轴帮不上忙，只会把平的曲线之间的差别压扁。所以纵轴是**裁剪**的：上沿取
    “训练长度以内最差那条曲线的中位数 + 1.5 nats”（困惑度约 4.5 倍），超出的曲线在图框上沿第一次出界的位置标一个
    同色的 ▲，图例里写出它的最高值；没有曲线超出时纵轴框住全部数据。``ymax`` 给出时用它作上沿。
    """
    evals = _check_evals(evals)
    eval_len = positive_int("eval_len", eval_len)
    train_len = positive_int("train_len", train_len)
    smooth = positive_int("smooth", smooth)
    if labels is not None and not isinstance(labels, Mapping):
        raise TypeError(f"labels 应是 {{方法: 中文名}} 的字典或 None，收到 {type(labels).__name__}")
    if ymax is not None and (isinstance(ymax, bool) or not isinstance(ymax, (int, float)) or not math.isfinite(ymax)):
        raise TypeError(f"ymax 应是有限的数或 None，收到 {ymax!r}")
    names = {**_method_labels(), **{str(k): str(v) for k, v in (labels or {}).items()}}
    here = [e for e in evals if e["eval_len"] == eval_len]
    if not here:
        lens = sorted({e["eval_len"] for e in evals})
        raise ValueError(f"evals 里没有 eval_len={eval_len} 的记录；有的评测长度：{lens}")
    present = []
    for e in here:
        if e["method"] not in present:
            present.append(e["method"])
    if methods is None:
        methods = [m for m in _method_labels() if m in present] + [m for m in present if m not in _method_labels()]
    else:
        if isinstance(methods, str) or not isinstance(methods, Sequence) or not methods:
            raise TypeError(f"methods 应是方法名的非空列表或 None，收到 {methods!r}")
        methods = list(methods)
        absent = [m for m in methods if m not in present]
        if absent:
            raise ValueError(f"methods 里的 {absent} 在 eval_len={eval_len} 上没有记录；有的方法：{present}")
    k = min(smooth, eval_len)
    curves: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    for m in methods:
        rows = []
        for i, e in enumerate(evals):
            if e["eval_len"] != eval_len or e["method"] != m:
                continue
            loss = finite_array(e["position_loss"], f"evals[{i}]['position_loss']", allow_nan=True)
            if loss.shape != (eval_len,):
                raise ValueError(f"evals[{i}]['position_loss'] 应有 eval_len={eval_len} 个数，收到形状 {loss.shape}")
            rows.append(loss)
        known = ~np.isnan(np.stack(rows))  # (种子数, eval_len)：NaN = 这个位置没有可计的目标
        total = np.where(known, np.stack(rows), 0.0).sum(axis=0)  # (eval_len,)
        window = np.ones(k)
        counted = np.convolve(known.sum(axis=0), window, mode="valid")  # (eval_len − k + 1,)：窗口里有数的个数
        summed = np.convolve(total, window, mode="valid")  # 各种子、窗口内的损失之和
        if not counted.any():
            raise ValueError(f"方法 {m!r} 在 eval_len={eval_len} 上每个位置都是 NaN：没有可画的损失")
        y = np.where(counted > 0, summed / np.maximum(counted, 1), np.nan)  # 各种子与窗口一起平均；全空的窗口断开
        x = np.arange(len(y)) + (k - 1) / 2  # 窗口的中点
        curves[m] = (x, y)
    lo = min(float(np.nanmin(y)) for _, y in curves.values())
    hi = max(float(np.nanmax(y)) for _, y in curves.values())
    if ymax is None:
        inside = [float(np.nanmedian(y[x < train_len])) for x, y in curves.values()
                  if np.any(~np.isnan(y[x < train_len]))]
        cap = (max(inside) if inside else lo) + _CLIP_MARGIN
        top = cap if hi > cap else hi + max(0.05 * (hi - lo), 0.05)
    else:
        top = float(ymax)
        if top <= lo:
            raise ValueError(f"ymax={ymax:g} 应大于曲线的最小值 {lo:.3g}")
    fig, ax = new_figure((9.4, 4.8))
    for m, (x, y) in curves.items():
        color, ls = _style(m, methods)
        label = names.get(m, m)
        if np.nanmax(y) > top:
            label += f"（超出图框，最高 {np.nanmax(y):.1f}）"
            first = int(np.argmax(y > top))
            ax.plot([x[first]], [top], marker="^", ms=9, color=color, ls="none", clip_on=False, zorder=5)
        ax.plot(x, y, ls=ls, lw=1.7, color=color, label=label)
    ax.set_ylim(lo - max(0.05 * (top - lo), 0.05), top)
    ax.set_xlim(0, eval_len - 1)
    if train_len < eval_len:
        ax.axvline(train_len, color="#777777", ls="--", lw=1.2)
        ax.annotate(f"训练长度 {train_len}", (train_len, 0.02), xycoords=("data", "axes fraction"),
                    xytext=(4, 0), textcoords="offset points", ha="left", va="bottom", fontsize=9, color="#555555")
    ax.set_xlabel("位置（第几个词元，从 0 数）")
    ax.set_ylabel(f"交叉熵（nats，{k} 个位置的滑动平均）" if k > 1 else "交叉熵（nats）")
    ax.grid(alpha=0.3)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=9, borderaxespad=0)
    ax.set_title(title or f"在 {train_len} 个词元上训练，读 {eval_len} 个词元：每个位置的损失（各种子平均）")
    return fig


def plot_rope_frequencies(d: int = 32, base: float = 10000.0, factor: float = 4.0, original_max_len: int = 64,
                          title: str | None = None):
    """每对维度 i 的波长 :math:`2\\pi/\\theta_i`（对数纵轴）：不缩放、位置插值（PI）、NTK-aware、YaRN 四条线。

    频率来自 :func:`~tformer_lib.parts.rope_scaling.rope_frequencies`（``d`` 是每头维度、``base`` 是 b、``factor`` 是 s，
    YaRN 用 ``original_max_len`` = 训练长度 L）。两条水平线是 L 与 s·L：波长比 L 长的维度在训练里连一圈都没转完。
    图上能看出：PI 把每一对的波长都乘 s；NTK 最高频（i = 0）不动、最低频正好乘 s、中间平滑过渡；YaRN 分三段——
    转得快的不动、转得慢的做 PI、中间线性过渡（浅色底是过渡段）。

    参数一开始就检查：``d`` 是 ≥ 4 的偶数（NTK-aware 需要至少两对），``base`` > 1，``factor`` ≥ 1，
    ``original_max_len`` 是正整数。
    """
    from tformer_lib.parts.rope_scaling import RopeScaling, rope_frequencies

    d = positive_int("d", d, 4)  # NTK-aware 需要至少两对维度
    if d % 2:
        raise ValueError(f"d 应是偶数（每头维度，两两成对旋转），收到 {d}")
    base, factor = finite_number(base, "base"), finite_number(factor, "factor")
    if base <= 1:
        raise ValueError(f"base 应大于 1（θ_i = b^(-2i/d) 随 i 变小），收到 {base:g}")
    if factor < 1:
        raise ValueError(f"factor 应 ≥ 1（s = 想读的长度 / 训练长度），收到 {factor:g}")
    original_max_len = positive_int("original_max_len", original_max_len)
    if title is not None and not isinstance(title, str):
        raise TypeError(f"title 应是字符串或 None，收到 {type(title).__name__}")
    theta, _ = rope_frequencies(d, base)
    if not (np.all(np.isfinite(2 * math.pi / theta.double().numpy())) and base * factor < 1e100):
        raise ValueError(f"base={base:g}、factor={factor:g} 太大：波长超出了能画的范围")
    variants = [
        ("不缩放", None, "#333333", "o"),
        (f"PI（linear）：每一对 × {factor:g}", RopeScaling("linear", factor), "#1f77b4", "s"),
        ("NTK-aware：只换 base", RopeScaling("ntk", factor), "#ff7f0e", "^"),
        ("YaRN：分三段", RopeScaling("yarn", factor, original_max_len=original_max_len), "#2ca02c", "D"),
    ]
    i = np.arange(d // 2)
    fig, ax = new_figure((8.6, 4.8))
    thetas = {}
    for name, scaling, color, marker in variants:
        th, attention = rope_frequencies(d, base, scaling)
        thetas[name] = th.numpy()
        label = name if attention == 1.0 else f"{name}（cos、sin 另乘 {attention:.3f}）"
        dashed = scaling is not None and scaling.kind == "yarn"  # YaRN 的低频段与 PI 重合：虚线、空心点，PI 透得出来
        ax.plot(i, 2 * math.pi / thetas[name], marker=marker, ms=5 if dashed else 4, lw=1.5, color=color, label=label,
                ls="--" if dashed else "-", mfc="none" if dashed else color)
    length = original_max_len
    for y, text in ((length, f"训练长度 L = {length}"), (factor * length, f"s·L = {factor * length:g}")):
        ax.axhline(y, color="#888888", ls=":", lw=1.2)
        ax.annotate(text, (0, y), xycoords=("axes fraction", "data"), xytext=(4, 3), textcoords="offset points",
                    fontsize=8, color="#555555", va="bottom")
    if factor > 1:  # YaRN 每对维度“保持原频率”的权重 k：θ' = θ·(k + (1 − k)/s)，1 = 不动，0 = 完全按 PI
        keep = (thetas["YaRN：分三段"] / theta.numpy() - 1 / factor) / (1 - 1 / factor)
        ramp = np.flatnonzero((keep > 1e-9) & (keep < 1 - 1e-9))
        if len(ramp):
            ax.axvspan(ramp[0] - 0.5, ramp[-1] + 0.5, color="#2ca02c", alpha=0.08, lw=0)
        zones = [(np.flatnonzero(keep >= 1 - 1e-9), "YaRN 不动"), (ramp, "过渡"),
                 (np.flatnonzero(keep <= 1e-9), "YaRN 插值（× s）")]
        for idx, text in zones:
            if len(idx):
                ax.annotate(text, ((idx[0] + idx[-1]) / 2, 0.97), xycoords=("data", "axes fraction"), ha="center",
                            va="top", fontsize=8, color="#2ca02c")
    ax.set_yscale("log")
    ax.set_xticks(i)
    ax.set_xlabel(f"维度对编号 $i$（$\\theta_i = b^{{-2i/d}}$，d = {d}，b = {base:g}；越往右频率越低）")
    ax.set_ylabel("波长 $2\\pi/\\theta_i$（位置数，对数刻度）")
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right", fontsize=9)
    ax.set_title(title or f"RoPE 缩放（s = {factor:g}）：每对维度的波长")
    return fig
