"""第 11 章（显存与混合精度）的图：一个训练步的内存账本、精度对比的损失曲线、剖析表里各算子的占比。

都是纯函数：给数据（字典、列表），返回 ``matplotlib.figure.Figure``；算这些数据的代码在
:mod:`tformer_lib.measurement.memory`、:mod:`tformer_lib.measurement.precision` 与 :mod:`tformer_lib.measurement.profiling` 里。
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from tformer_lib.plotting._common import new_figure

__all__ = ["plot_memory_account", "plot_precision_losses", "plot_profile", "plot_step_times", "plot_mfu",
           "plot_training_memory"]

#: 账本各项的中文名（没列出的键原样显示）
PART_LABELS = {
    "params": "参数", "grads": "梯度", "master": "fp32 主权重", "adam_m": "Adam 一阶矩 m", "adam_v": "Adam 二阶矩 v",
    "step": "Adam 步数", "embedding": "嵌入（词元 id 与位置）", "norms": "归一化", "linear_inputs": "线性层输入",
    "attention": "注意力", "ffn": "前馈网络", "loss": "损失（log-softmax）", "block_inputs": "每块的输入",
    "activations": "激活", "rope": "RoPE 的 cos/sin 表",
}
_SKIP = {"total", "per_block", "recompute_peak", "bytes_per_parameter"}
_COLORS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22",
           "#17becf", "#393b79", "#637939"]


def plot_memory_account(accounts: Mapping[str, Mapping[str, int]], *, unit: float = 2**20, title: str | None = None,
                        ax=None):
    """每个场景一根横向堆叠条：账本的每一项（字节，``"total"`` 等汇总键不画）按 ``unit``（默认 MiB）换算。

    ``accounts``：``{场景名: {项: 字节}}``，例如 :func:`~tformer_lib.measurement.memory.model_state_bytes` 与
    :func:`~tformer_lib.measurement.memory.lm_activation_bytes` 的结果（可合并成一个字典）。
    """
    if not accounts:
        raise ValueError("accounts 为空：应是 {场景名: {项: 字节数}}")
    if isinstance(unit, bool) or not (isinstance(unit, (int, float)) and 0 < unit < float("inf")):
        raise ValueError(f"unit 应为正数，收到 {unit!r}")
    parts: list[str] = []
    for name, account in accounts.items():
        if not isinstance(account, Mapping):
            raise TypeError(f"accounts[{name!r}] 应是 {{项: 字节数}} 的字典，收到 {type(account).__name__}")
        for k, v in account.items():
            if k in _SKIP:
                continue
            if isinstance(v, bool) or not isinstance(v, (int, float, np.integer, np.floating)) or not 0 <= v < float("inf"):
                raise ValueError(f"accounts[{name!r}][{k!r}] 应是非负的有限字节数，收到 {v!r}")
            if k not in parts:
                parts.append(k)
    parts = [k for k in parts if any(a.get(k, 0) for a in accounts.values())]  # 处处为 0 的项（如 fp32 的主权重）不画
    if not parts:
        raise ValueError(f"accounts 里每一项都是 0（或没有任何项），没有可画的：收到 {dict(accounts)!r}")
    if ax is None:
        fig, ax = new_figure((8.4, max(2.6, 0.9 + 0.55 * len(accounts))))
    else:
        fig = ax.figure
    names = list(accounts)
    left = np.zeros(len(names))
    for i, part in enumerate(parts):
        widths = np.array([accounts[n].get(part, 0) / unit for n in names], dtype=float)
        ax.barh(names, widths, left=left, color=_COLORS[i % len(_COLORS)], label=PART_LABELS.get(part, part))
        left += widths
    for y, total in enumerate(left):
        ax.text(total, y, f" {total:.1f}", va="center", fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("内存（MiB）" if unit == 2**20 else f"内存（× {unit:g} 字节）")
    ax.set_xlim(0, left.max() * 1.15 if left.max() > 0 else 1)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)  # 图例放在条的右边
    ax.grid(axis="x", alpha=0.3)
    ax.set_title(title or "一个训练步的内存账本")
    return fig


def plot_precision_losses(losses: Mapping[str, Sequence[float]], *, reference: str = "fp32", title: str | None = None):
    """上：每种精度的逐步训练损失；下：与 ``reference`` 的差（:func:`~tformer_lib.measurement.precision.compare_autocast_training`）。"""
    if reference not in losses:
        raise ValueError(f"losses 里没有参照 {reference!r}：收到 {list(losses)}")
    ref = np.asarray(losses[reference], dtype=float)
    if ref.size == 0:
        raise ValueError(f"losses[{reference!r}] 为空：至少要有一步的损失")
    fig, axes = new_figure((6.8, 4.6), nrows=2, ncols=1)
    top, bottom = axes[0, 0], axes[1, 0]
    for i, (name, values) in enumerate(losses.items()):
        y = np.asarray(values, dtype=float)
        if y.shape != ref.shape:
            raise ValueError(f"losses[{name!r}] 有 {len(y)} 步，而参照 {reference!r} 有 {len(ref)} 步")
        steps = np.arange(1, len(y) + 1)
        top.plot(steps, y, lw=1.5, label=name, color=_COLORS[i % len(_COLORS)])
        if name != reference:
            bottom.plot(steps, y - ref, lw=1.2, label=f"{name} − {reference}", color=_COLORS[i % len(_COLORS)])
    bottom.axhline(0, color="#333333", lw=0.8)
    top.set_ylabel("训练损失")
    bottom.set_ylabel("与参照之差")
    bottom.set_xlabel("训练步")
    for ax in (top, bottom):
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
    top.set_title(title or "混合精度与 float32 的训练损失")
    return fig


def plot_profile(rows: Sequence[Mapping], *, title: str | None = None, ax=None):
    """剖析表（:func:`~tformer_lib.measurement.profiling.profile_step`）里各算子自身耗时的占比，横向条形图。"""
    if not rows:
        raise ValueError("rows 为空：应是 profile_step 返回的 [{name, share, …}, …]")
    for r in rows:
        if not isinstance(r, Mapping) or "name" not in r:
            raise ValueError(f"每行应是带 name 与 share 的字典（profile_step 的结果），收到 {r!r}")
        share = r.get("share")
        if isinstance(share, bool) or not isinstance(share, (int, float)) or not 0 <= share <= 1:
            raise ValueError(f"每行的 share 应是 [0, 1] 内的占比，收到 {r!r}")
    names = [str(r["name"]).removeprefix("aten::") for r in rows]
    shares = np.array([float(r["share"]) for r in rows]) * 100
    if ax is None:
        fig, ax = new_figure((6.8, 0.8 + 0.35 * len(rows)))
    else:
        fig = ax.figure
    ax.barh(names, shares, color="#1f77b4")
    for y, s in enumerate(shares):
        ax.text(s, y, f" {s:.0f}%", va="center", fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("占全部算子自身耗时的百分比")
    ax.set_xlim(0, max(shares.max() * 1.2, 1.0))
    ax.grid(axis="x", alpha=0.3)
    ax.set_title(title or "一个训练步里最耗时的算子")
    return fig


def plot_step_times(times: Mapping[str, Sequence[float]], *, reference: str | None = None, title: str | None = None):
    """交替计时的每轮步时（秒）：每个做法一列点与中位数横线，图注写出各做法中位数与 ``reference`` 的比。

    ``times``：``{做法名: [每轮秒数, …]}``，例如“不重算”与“激活重算”轮流各跑一步、记下的时间。
    比值只在同一次运行里有意义（机器负载会变），所以只画在图上，不写进正文。
    """
    if not times:
        raise ValueError("times 为空：应是 {做法名: [每轮秒数, …]}")
    names = list(times)
    reference = names[0] if reference is None else reference
    if reference not in times:
        raise ValueError(f"times 里没有参照 {reference!r}：收到 {names}")
    for name, values in times.items():
        if len(values) == 0:
            raise ValueError(f"times[{name!r}] 为空：至少要有一轮计时")
        bad = [v for v in values if isinstance(v, bool) or not isinstance(v, (int, float, np.floating))
               or not np.isfinite(v) or v <= 0]
        if bad:
            raise ValueError(f"times[{name!r}] 应是正的有限秒数，收到 {bad[0]!r}")
    medians = {name: float(np.median(np.asarray(v, dtype=float))) for name, v in times.items()}
    fig, ax = new_figure((6.4, 3.4))
    for i, name in enumerate(names):
        y = np.asarray(times[name], dtype=float) * 1000
        x = np.full(len(y), i) + np.linspace(-0.12, 0.12, len(y))
        ax.scatter(x, y, s=14, alpha=0.7, color=_COLORS[i % len(_COLORS)])
        ax.hlines(medians[name] * 1000, i - 0.25, i + 0.25, color="#333333", lw=2)
        ratio = medians[name] / medians[reference]
        label = f"中位数 {medians[name] * 1000:.0f} ms" + ("" if name == reference else f"（{ratio:.2f}×）")
        ax.text(i + 0.28, medians[name] * 1000, label, va="center", fontsize=8)
    ax.set_xticks(range(len(names)), names)
    ax.set_xlim(-0.5, len(names) - 0.5 + 0.6)
    ax.set_ylim(bottom=0)
    ax.set_ylabel("每步耗时（毫秒）")
    ax.grid(axis="y", alpha=0.3)
    ax.set_title(title or "交替计时的训练步耗时（每个点一轮）")
    return fig


def plot_mfu(achieved: float, peak: float, *, label: str = "一个训练步", title: str | None = None):
    """训练步（``label``）实际达到的 FLOP/s 与同一台机器上实测的矩阵乘法“峰值”并排，图注写出 MFU = 二者之比。

    两个数都是同一次运行里现测的；它们随负载变化，所以只画在图上（:mod:`tformer_lib.measurement.profiling`）。
    """
    for name, value in (("achieved", achieved), ("peak", peak)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < float("inf"):
            raise ValueError(f"{name} 应为正的有限数（FLOP/s），收到 {value!r}")
    fig, ax = new_figure((6.4, 2.3))
    labels = ["实测的方阵乘法（当作峰值）", str(label)]
    values = np.array([peak, achieved]) / 1e9
    ax.barh(labels, values, color=["#7f7f7f", "#1f77b4"])
    for y, v in enumerate(values):
        ax.text(v, y, f" {v:.1f} GFLOP/s", va="center", fontsize=8)
    ax.invert_yaxis()
    ax.set_xlim(0, values.max() * 1.3)
    ax.set_xlabel("每秒浮点运算次数（GFLOP/s，单线程）")
    ax.grid(axis="x", alpha=0.3)
    ax.set_title(title or f"MFU = {label} ÷ 峰值 = {achieved / peak:.2f}")
    return fig


def plot_training_memory(config, n_params: int, batch: int, length: int, *, unit: float = 2**20,
                         title: str | None = None):
    """一个训练步的账本（公式）：同一模型、同一批，“不重算”与“激活重算”两根条（fp32 模型状态 + 激活各项）。

    第 11 章探索器的一帧（:func:`tformer_lib.widgets.memory.memory_explorer`）；``config`` 是
    :class:`~tformer_lib.lm.LMConfig`，``n_params`` 是参数个数（:func:`~tformer_lib.measurement.memory.parameter_count`）。
    """
    from tformer_lib.measurement.memory import lm_activation_bytes, model_state_bytes

    states = model_state_bytes(n_params, "fp32")
    accounts = {
        "不重算": {**states, **lm_activation_bytes(config, batch, length)},  # 它也检查 config、batch、length
        "激活重算": {**states, **lm_activation_bytes(config, batch, length, checkpointing=True)},
    }
    path = "SDPA 快速路径" if config.fast_attention else "显式注意力"
    return plot_memory_account(accounts, unit=unit,
                               title=title or f"批大小 B = {batch}，长度 T = {length}（{path}，float32）")
