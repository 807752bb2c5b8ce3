"""第 14 章（量化）的图：每种格式的字节与质量、大 GEMV 在屋顶线上的位置。

纯函数：数据来自 ``python -m tformer_lib.quant.measure`` 的结果行（``rows``）与 ``benchmarks/quant_gemv.py``
的结果字典，画图函数自己不计时、不跑模型。
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from tformer_lib.plotting._common import check_result_rows, new_figure
from tformer_lib.plotting.roofline import plot_roofline

__all__ = ["plot_quantization", "gemv_roofline_points", "plot_gemv_roofline"]

_NEEDED = ("name", "weight_bytes", "kv_bytes_per_token", "perplexity", "form_accuracy", "form_accuracy_stderr")


def plot_quantization(rows: Sequence[Mapping], *, title: str | None = None):
    """四栏，每行一种格式：权重字节（MiB）、每词元 K/V 字节、留出集困惑度（点）、温度 0.8 的体裁正确率（点 ±1 个标准误）。

    困惑度与正确率的横轴只框住数据附近（差别很小，从 0 画起就看不见），所以用点而不用柱。
    """
    rows = check_result_rows(rows, _NEEDED, "quantization.json")
    names = [str(r["name"]) for r in rows]
    y = np.arange(len(rows))
    fig, axes = new_figure((11.5, 0.45 * len(rows) + 1.8), ncols=4)
    ax_w, ax_kv, ax_ppl, ax_form = axes[0]
    ax_w.barh(y, [r["weight_bytes"] / 2**20 for r in rows], color="#1f77b4")
    ax_w.set_xlabel("权重（MiB）")
    ax_kv.barh(y, [r["kv_bytes_per_token"] for r in rows], color="#ff7f0e")
    ax_kv.set_xlabel("K/V 缓存（字节 / 词元）")
    ax_ppl.plot([r["perplexity"] for r in rows], y, "s", color="#555555")
    ax_ppl.set_xlabel("留出集困惑度（越低越好）")
    ax_form.errorbar([r["form_accuracy"] for r in rows], y, xerr=[r["form_accuracy_stderr"] for r in rows],
                     fmt="o", color="#d62728", capsize=3)
    ax_form.set_xlabel("体裁正确率 ±1 标准误（T = 0.8）")
    for ax in (ax_w, ax_kv, ax_ppl, ax_form):
        ax.set_yticks(y, names if ax is ax_w else [""] * len(rows))
        ax.set_ylim(len(rows) - 0.5, -0.5)  # 第一行在最上面
        ax.grid(alpha=0.3, axis="x")
    ax_ppl.margins(x=0.3)
    ax_form.margins(x=0.3)
    fig.suptitle(title or "量化的代价：字节与质量（随书唐诗模型）")
    return fig


def gemv_roofline_points(result: Mapping) -> tuple[dict[str, float], dict[str, float]]:
    """从 GEMV 基准结果取出 ``({做法: 算术强度}, {做法: 实测 FLOP/s})``，交给 :func:`plot_roofline`。

    ``result`` 要有 ``"peak_flops"``、``"bandwidth"`` 与非空的 ``"variants"``；每个做法要有 ``"intensity_flop_per_byte"``
    与 ``"achieved_flops"``（``benchmarks/quant_gemv.py`` 写的结果文件就是这样）。"""
    if not isinstance(result, Mapping) or not isinstance(result.get("variants"), Mapping) or not result["variants"]:
        raise ValueError("result 应是 benchmarks/quant_gemv.py 的结果字典（含非空的 'variants'）")
    missing = [k for k in ("peak_flops", "bandwidth") if k not in result]
    missing += [f"variants[{name!r}][{k!r}]" for name, v in result["variants"].items()
                for k in ("intensity_flop_per_byte", "achieved_flops") if not isinstance(v, Mapping) or k not in v]
    if missing:
        raise ValueError(f"result 缺少 {'、'.join(missing)}（应是 benchmarks/quant_gemv.py 的结果字典）")
    points = {name: float(v["intensity_flop_per_byte"]) for name, v in result["variants"].items()}
    measured = {name: float(v["achieved_flops"]) for name, v in result["variants"].items()}
    return points, measured


def plot_gemv_roofline(result: Mapping, *, title: str | None = None):
    """大 GEMV 的各种做法放在屋顶线上：实心点是屋顶（按各自搬动的字节），空心点是实测 FLOP/s。``result`` 的键见
    :func:`gemv_roofline_points`。"""
    points, measured = gemv_roofline_points(result)
    n = result.get("n", "?")
    fig = plot_roofline(points, result["peak_flops"], result["bandwidth"], measured=measured,
                        title=title or f"{n}×{n} 的矩阵–向量乘：字节少了，屋顶才高")
    ax = fig.axes[0]
    handles, labels = ax.get_legend_handles_labels()
    ax.legend(handles, labels, fontsize=8, loc="upper left")  # 左上角是空的：实测的空心点多在右下方
    return fig
