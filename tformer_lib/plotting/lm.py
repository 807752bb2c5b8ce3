"""第 9–10 章（语言模型）的图：BPE 学到了什么、采样前后的下一个字分布、某个位置看向前文的注意力、
各种结构改动的多种子验证损失与代价（参数量、K/V 缓存、吞吐）。

都是纯函数：给数据（数组、字典），返回 ``matplotlib.figure.Figure``；算这些数据的代码在
:mod:`tformer_lib.text.explain`、:mod:`tformer_lib.lm` 与 :mod:`tformer_lib.experiments.modern_variants` 里。
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from tformer_lib._checks import positive_int
from tformer_lib.plotting._common import blank_figure, check_labels, finite_array, new_figure, to_numpy
from tformer_lib.plotting.heatmap import plot_heatmap

__all__ = [
    "plot_merge_kinds",
    "plot_sampling",
    "plot_query_attention",
    "plot_variant_curves",
    "plot_variant_costs",
    "plot_lm_metrics",
]

_KIND_COLORS = {"字节片段": "#9e9e9e", "单字": "#1f77b4", "多字词": "#d62728"}
_ARM_COLORS = ["#333333", "#d62728", "#1f77b4", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#17becf"]


def plot_merge_kinds(counts: Mapping[str, Sequence[int]], *, title: str | None = None, ax=None):
    """BPE 学到前 k 条合并规则时，三种词元（字节片段 / 单字 / 多字词）各有多少个（:func:`~tformer_lib.text.merge_kind_counts`）。"""
    if not counts:
        raise ValueError("counts 为空：应是 {种类: [学到第 1、2、… 条规则时的个数]}")
    if ax is None:
        fig, ax = new_figure((6.8, 3.6))
    else:
        fig = ax.figure
    for kind, values in counts.items():
        y = np.asarray(list(values), dtype=float)
        if y.ndim != 1 or len(y) == 0:
            raise ValueError(f"counts[{kind!r}] 应是非空的一维序列")
        ax.plot(np.arange(1, len(y) + 1), y, lw=1.8, label=kind, color=_KIND_COLORS.get(kind))
    ax.set_xlabel("已学到的合并规则条数")
    ax.set_ylabel("合并出的词元个数")
    ax.legend(loc="upper left")
    ax.grid(alpha=0.3)
    ax.set_title(title or "字节级 BPE：先拼出整字，再拼出多字词")
    return fig


def plot_sampling(before: Any, after: Any, labels: Sequence[Any], *, poem: str | None = None,
                  title: str | None = None, ax=None):
    """下一个字的分布：灰柱 = 模型原始的 softmax 概率，彩柱 = 经过温度 / top-k / top-p 之后真正用来采样的概率。

    ``before``、``after``：同样长度的一维概率（通常只取原始概率最高的若干个候选）；``labels``：候选字。
    ``poem`` 给出时在图下方写出用这套设置采样出的一首诗。
    """
    b, a = to_numpy(before, "before", 1), to_numpy(after, "after", 1)
    if b.shape != a.shape:
        raise ValueError(f"before 与 after 的长度应相同，收到 {b.shape} 与 {a.shape}")
    names = check_labels(labels, len(b), "labels")
    if ax is None:
        fig, ax = new_figure((7.2, 4.4 if poem else 3.4))
    else:
        fig = ax.figure
    x = np.arange(len(b))
    ax.bar(x - 0.2, b, width=0.4, color="#bdbdbd", label="原始概率 softmax(z)")
    ax.bar(x + 0.2, a, width=0.4, color="#1f77b4", label="采样用的概率")
    ax.set_xticks(x, names)
    ax.set_ylim(0, max(1e-9, float(max(b.max(), a.max()))) * 1.15)
    ax.set_ylabel("概率")
    kept = int((a > 0).sum())
    ax.set_title(title or f"下一个字：图中 {len(b)} 个候选里有 {kept} 个可能被采到")
    ax.legend(loc="upper right", fontsize=9)
    if poem:
        ax.set_xlabel("采样出的诗：" + poem, fontsize=10, loc="left")
    return fig


def plot_query_attention(weights: Any, key_tokens: Sequence[Any] | str, row_labels: Sequence[str], *,
                         marks: Sequence[int] = (), title: str | None = None, ax=None):
    """一个查询位置看向前文的注意力：``weights`` ``(R, T_k)``，每行一个（层, 头），列是它之前（含自己）的字。

    ``marks`` 里的列（例如前面的韵脚）在横轴上标成红色。
    """
    w = to_numpy(weights, "weights", 2)
    keys = check_labels(key_tokens, w.shape[1], "key_tokens")
    rows = check_labels(row_labels, w.shape[0], "row_labels")
    if ax is None:
        fig, ax = new_figure((max(6.0, 0.32 * w.shape[1] + 2.0), 0.42 * w.shape[0] + 1.6))
    else:
        fig = ax.figure
    plot_heatmap(w, rows, keys, ax=ax, annotate=False, vmin=0.0, vmax=float(max(w.max(), 1e-9)),
                 colorbar_label="注意力权重", title=title, cmap="Blues")
    for i, label in enumerate(ax.get_xticklabels()):
        if i in set(marks):
            label.set_color("#d62728")
    return fig


def _arm_runs(results: Mapping[str, Any], arm: str) -> list[tuple[list[int], list[float]]]:
    out = []
    for run in results["runs"]:
        if run["arm"] == arm:
            out.append(([e["step"] for e in run["evals"]], [e["valid_loss"] for e in run["evals"]]))
    return out


def plot_variant_curves(results: Mapping[str, Any], panels: Mapping[str, Sequence[str]],
                        labels: Mapping[str, str] | None = None, *, title: str | None = None):
    """多种子的验证损失曲线：每个面板一组对比（都含基线），每组一种颜色、每个种子一条线。

    ``results``：:func:`~tformer_lib.experiments.modern_variants.load_variant_results` 的结果；``panels``：``{面板标题: [组名…]}``。
    """
    if not panels:
        raise ValueError("panels 为空")
    labels = dict(labels or {})
    fig = blank_figure((4.0 * len(panels), 3.6))
    axes = fig.subplots(1, len(panels), squeeze=False)
    arms_all = list(results["settings"]["arms"]) + list(results["settings"].get("warmup_arms", {}))  # 决定颜色
    for ax, (name, arms) in zip(axes[0], panels.items()):
        for arm in arms:
            runs = _arm_runs(results, arm)
            if not runs:
                raise ValueError(f"结果里没有组 {arm!r}")
            color = _ARM_COLORS[arms_all.index(arm) % len(_ARM_COLORS)]
            for k, (steps, losses) in enumerate(runs):
                ax.plot(steps, losses, "-o", ms=2.5, lw=1.3, color=color, alpha=0.85,
                        label=labels.get(arm, arm) if k == 0 else None)
        ax.set_title(name)
        ax.set_xlabel("训练步数 step")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    axes[0][0].set_ylabel("验证损失（每个种子一条线）")
    lo = min(e["valid_loss"] for r in results["runs"] for e in r["evals"] if e["step"] > 0)
    hi = max(e["valid_loss"] for r in results["runs"] for e in r["evals"] if e["step"] > 0)
    for ax in axes[0]:
        ax.set_ylim(lo - 0.1, hi + 0.1)
    if title:
        fig.suptitle(title)
    return fig


def plot_variant_costs(arms: Mapping[str, Mapping[str, float]], labels: Mapping[str, str] | None = None, *,
                       title: str | None = None):
    """三个横向柱状图：参数量、每个词元的 K/V 缓存字节数、训练吞吐（tokens/s），每根柱子一种结构。

    某组给出 ``tokens_per_second_rounds``（各轮计时的吞吐）时，吞吐柱上画出各轮的最小到最大作误差线。
    """
    metrics = [("parameters", "参数量", "{:,.0f}"), ("kv_bytes_per_token", "K/V 缓存（字节/词元）", "{:,.0f}"),
               ("tokens_per_second", "训练吞吐（tokens/s）", "{:,.0f}")]
    if not isinstance(arms, Mapping) or not arms:
        raise ValueError(f"arms 应是非空的字典（组名 → 这一组的代价），收到 {arms!r:.60}")
    for arm, row in arms.items():
        missing = [key for key, _, _ in metrics if not isinstance(row, Mapping) or key not in row]
        if missing:
            raise ValueError(f"arms[{arm!r}] 应是含 {[key for key, _, _ in metrics]} 的字典，缺 {missing}（收到 {row!r:.60}）")
        for key, _, _ in metrics:
            value = row[key]
            if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)) \
                    or not np.isfinite(value) or value < 0:
                raise ValueError(f"arms[{arm!r}][{key!r}] 应是有限的非负数，收到 {value!r}")
    if labels is not None and not isinstance(labels, Mapping):
        raise TypeError(f"labels 应是字典（组名 → 图上的名字）或 None，收到 {type(labels).__name__}")
    labels = dict(labels or {})
    names = [labels.get(a, a) for a in arms]
    fig = blank_figure((11.0, 0.36 * len(arms) + 1.4))
    axes = fig.subplots(1, 3, squeeze=False)
    y = np.arange(len(arms))
    for ax, (key, name, fmt) in zip(axes[0], metrics):
        values = finite_array([arms[a][key] for a in arms], f"arms[…][{key!r}]")
        ax.barh(y, values, color=[_ARM_COLORS[i % len(_ARM_COLORS)] for i in range(len(arms))])
        right = values.copy()
        if key == "tokens_per_second" and any("tokens_per_second_rounds" in arms[a] for a in arms):
            rounds = [finite_array(arms[a].get("tokens_per_second_rounds", [v]), f"arms[{a!r}]['tokens_per_second_rounds']")
                      for a, v in zip(arms, values)]
            for a, r in zip(arms, rounds):
                if r.ndim != 1 or r.size == 0:
                    raise ValueError(f"arms[{a!r}]['tokens_per_second_rounds'] 应是非空的一串数，收到形状 {r.shape}")
            low = np.array([r.min() for r in rounds])
            high = np.array([r.max() for r in rounds])
            for a, lo, hi, v in zip(arms, low, high, values):
                if not lo <= v <= hi:
                    raise ValueError(f"arms[{a!r}]['tokens_per_second']={v:g} 应落在各轮吞吐 tokens_per_second_rounds 的"
                                     f"最小与最大之间（{lo:g}–{hi:g}）")
                if lo < 0:
                    raise ValueError(f"arms[{a!r}]['tokens_per_second_rounds'] 应是非负数，最小的是 {lo:g}")
            ax.errorbar(values, y, xerr=np.stack([values - low, high - values]), fmt="none", ecolor="#333333",
                        elinewidth=1.0, capsize=3)
            right = high
            name += "\n（误差线：各轮的最小–最大）"
        for yi, v, r in zip(y, values, right):
            ax.text(r, yi, " " + fmt.format(v), va="center", fontsize=8)
        ax.set_xlim(0, right.max() * 1.35)
        ax.set_yticks(y, names if ax is axes[0][0] else [""] * len(names))
        ax.invert_yaxis()
        ax.set_title(name)
        ax.grid(axis="x", alpha=0.3)
    if title:
        fig.suptitle(title)
    return fig


def plot_lm_metrics(metrics: Any, *, smooth: int = 20, title: str | None = None):
    """``lm-train`` 写的指标（``<检查点>.metrics.jsonl`` 的路径，或 :func:`~tformer_lib.lm.metrics_log.read_metrics`
    读回的字典列表）画成两幅图：左边训练损失（``smooth`` 步滑动平均）与验证损失，右边学习率；标题里给出吞吐的中位数。
    """
    if isinstance(metrics, (str, bytes)) or hasattr(metrics, "__fspath__"):
        from tformer_lib.lm.metrics_log import read_metrics

        metrics = read_metrics(metrics)
    rows = list(metrics)
    if not rows:
        raise ValueError("metrics 为空：没有可画的训练步")
    for i, r in enumerate(rows):
        if not isinstance(r, Mapping) or not {"step", "loss", "lr"} <= set(r):
            raise ValueError(f"metrics[{i}] 应是含 step、loss、lr 的字典，收到 {r!r}")
    smooth = positive_int("smooth", smooth)
    steps = np.array([r["step"] for r in rows], dtype=float)
    loss = np.array([r["loss"] for r in rows], dtype=float)
    k = min(smooth, len(loss))
    smoothed = np.convolve(loss, np.ones(k) / k, mode="valid")  # 长度 len − k + 1
    evals = [r for r in rows if r.get("valid_loss") is not None]
    fig, axes = new_figure((10.0, 3.6), 1, 2)
    ax_loss, ax_lr = axes[0]
    ax_loss.plot(steps, loss, color="#bbbbbb", lw=0.8, label="训练损失（每步）")
    ax_loss.plot(steps[k - 1 :], smoothed, color="#1f77b4", lw=1.8, label=f"训练损失（{k} 步平均）")
    if evals:
        ax_loss.plot([r["step"] for r in evals], [r["valid_loss"] for r in evals], "o-", color="#d62728",
                     label="验证损失")
    ax_loss.set_xlabel("step")
    ax_loss.set_ylabel("交叉熵（nats）")
    ax_loss.legend(fontsize=8)
    ax_loss.grid(alpha=0.3)
    ax_lr.plot(steps, [r["lr"] for r in rows], color="#2ca02c")
    ax_lr.set_xlabel("step")
    ax_lr.set_ylabel("学习率")
    ax_lr.grid(alpha=0.3)
    speeds = [r["tokens_per_s"] for r in rows if r.get("tokens_per_s")]
    note = f"吞吐中位数 {np.median(speeds):,.0f} tokens/s" if speeds else ""
    fig.suptitle("  ".join(t for t in (title, note) if t) or "训练指标")
    return fig
