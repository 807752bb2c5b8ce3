"""第 13 章的图（一）：预填充与解码的算术强度、屋顶线模型（roofline model）。

纯函数：数据来自 :mod:`tformer_lib.serving.roofline`（FLOPs 与字节的闭式公式）；测得的峰值 FLOP/s 与内存带宽
作为参数传进来，画图函数自己不计时。
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from tformer_lib._checks import finite_positive, positive_ints
from tformer_lib.plotting._common import new_figure

__all__ = ["plot_arithmetic_intensity", "plot_roofline"]

_DECODE, _PREFILL, _BALANCE = "#d62728", "#1f77b4", "#555555"


# ---------------------------------------------------------------- 算术强度与屋顶线


def plot_arithmetic_intensity(config, *, batch_sizes: Sequence[int] = (1, 2, 4, 8, 16, 32, 64),
                              prompt_lens: Sequence[int] | None = None, context: int | None = None,
                              peak_flops: float | None = None, bandwidth: float | None = None,
                              bytes_per_element: int = 4, title: str | None = None, ax=None):
    """横轴：一次前向处理的词元数（解码 = 批大小 B，预填充 = 提示长度 T）；纵轴：算术强度（FLOP/字节，对数）。

    红线：一步解码，B 条序列各看 ``context`` 个位置（默认 ``max_len // 2``）——强度随 B 上升，因为权重整批共用；
    蓝线：一条长 T 的提示的预填充（默认 T 取不超过 ``max_len`` 的 ``batch_sizes``）。给出测得的 ``peak_flops``
    （FLOP/s）与 ``bandwidth``（字节/秒）时，再画机器平衡点的水平线：线下访存受限，线上算力受限。
    """
    from tformer_lib.serving.roofline import check_config, decode_cost, machine_balance, prefill_cost

    check_config(config)
    batch_sizes = positive_ints("batch_sizes", batch_sizes)
    context = config.max_len // 2 if context is None else context
    if prompt_lens is None:
        prompt_lens = [t for t in batch_sizes if t <= config.max_len] or [config.max_len]
    prompt_lens = positive_ints("prompt_lens", prompt_lens)
    decode = [decode_cost(config, b, context, bytes_per_element)["intensity"] for b in batch_sizes]
    prefill = [prefill_cost(config, t, 1, bytes_per_element)["intensity"] for t in prompt_lens]
    if ax is None:
        fig, ax = new_figure((6.8, 4.2))
    else:
        fig = ax.figure
    ax.plot(batch_sizes, decode, "o-", color=_DECODE, label=f"解码一步：B 条序列各 1 个词元（上下文 {context}）")
    ax.plot(prompt_lens, prefill, "s--", color=_PREFILL, label="预填充：1 条长 T 的提示")
    if (peak_flops is None) != (bandwidth is None):
        raise ValueError("peak_flops 与 bandwidth 要么都给（画机器平衡点），要么都不给")
    if peak_flops is not None:
        balance = machine_balance(finite_positive("peak_flops", peak_flops), finite_positive("bandwidth", bandwidth))
        ax.axhline(balance, color=_BALANCE, ls=":", lw=1.5, label=f"机器平衡点 峰值÷带宽 ≈ {balance:.3g} FLOP/字节")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    if peak_flops is not None:
        bottom = min(decode + prefill + [balance]) / 2
        ax.set_ylim(bottom, max(decode + prefill + [balance]) * 2)
        ax.axhspan(bottom, balance, color="#f4cccc", alpha=0.3, lw=0)
        ax.text(batch_sizes[-1], balance / 1.25, "访存受限", ha="right", va="top", fontsize=9, color="#a33")
        ax.text(batch_sizes[-1], balance * 1.25, "算力受限", ha="right", va="bottom", fontsize=9, color="#333")
    ax.set_xlabel("一次前向处理的词元数（解码：批大小 B；预填充：提示长度 T）")
    ax.set_ylabel("算术强度（FLOP / 字节）")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8, loc="upper left")
    ax.set_title(title or "预填充与解码的算术强度")
    return fig


def plot_roofline(points: Mapping[str, float], peak_flops: float, bandwidth: float, *,
                  measured: Mapping[str, float] | None = None, title: str | None = None, ax=None):
    """屋顶线：可达 FLOP/s = min(峰值, 强度 × 带宽)（对数坐标）。``points``：``{标签: 算术强度}``，画在屋顶上；
    ``measured``（可选）：``{标签: 实测 FLOP/s}``，画成空心点，与屋顶之间的距离就是没用上的那部分。"""
    from tformer_lib.serving.roofline import attainable_flops, machine_balance

    if not isinstance(points, Mapping):
        raise TypeError(f"points 应是字典 {{标签: 算术强度}}，收到 {type(points).__name__}")
    if not points:
        raise ValueError("points 为空：应是 {标签: 算术强度}")
    if measured is not None and not isinstance(measured, Mapping):
        raise TypeError(f"measured 应是字典 {{标签: 实测 FLOP/s}} 或 None，收到 {type(measured).__name__}")
    unknown = [k for k in (measured or {}) if k not in points]
    if unknown:
        raise ValueError(f"measured 里的 {unknown} 不在 points 里：实测点画在同一标签的强度上，points 应有 {list(points)}")
    balance = machine_balance(finite_positive("peak_flops", peak_flops), finite_positive("bandwidth", bandwidth))
    values = {k: finite_positive(f"points[{k!r}]", v) for k, v in points.items()}
    lo, hi = min(min(values.values()), balance) / 4, max(max(values.values()), balance) * 4
    xs = np.geomspace(lo, hi, 200)
    if ax is None:
        fig, ax = new_figure((6.6, 4.2))
    else:
        fig = ax.figure
    ax.plot(xs, np.minimum(peak_flops, xs * bandwidth), color="#333333", lw=2, label="屋顶：min(峰值, 强度 × 带宽)")
    ax.axvline(balance, color=_BALANCE, ls=":", lw=1)
    ax.text(balance, peak_flops * 1.15, f" 平衡点 {balance:.3g}", fontsize=8, color=_BALANCE)
    colors = ["#d62728", "#ff7f0e", "#2ca02c", "#1f77b4", "#9467bd", "#8c564b", "#e377c2", "#17becf"]
    for i, (label, x) in enumerate(values.items()):
        color = colors[i % len(colors)]
        ax.plot([x], [attainable_flops(x, peak_flops, bandwidth)], "o", color=color, ms=7, label=label)
        if measured and label in measured:
            ax.plot([x], [finite_positive(f"measured[{label!r}]", measured[label])], "o", mfc="none", color=color, ms=9)
    if measured and any(label in measured for label in values):  # 图例里说明空心点（灰色的示意，颜色随各点）
        ax.plot([], [], "o", mfc="none", color="#555555", ms=9, label="空心点：实测 FLOP/s（实心点 = 屋顶上的理论值）")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_ylim(top=peak_flops * 2)
    ax.set_xlabel("算术强度（FLOP / 字节）")
    ax.set_ylabel("可达 FLOP/s")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8, loc="lower right")
    ax.set_title(title or "屋顶线模型：访存受限 vs 算力受限")
    return fig
