"""第 16 章（混合专家，MoE）的图：各层专家的负载、容量因子与丢弃率、稠密 FFN 与 MoE 的验证损失。

纯函数：数据是 ``python -m tformer_lib.experiments.moe`` 写的结果文件（``tformer_lib/results/moe.json``）里的
``runs`` 与 ``capacity``，画图函数自己不训练、不计时。组名的中文见 :data:`tformer_lib.experiments.moe.MOE_LABELS`。
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from tformer_lib.plotting._common import blank_figure, finite_array, finite_number, new_figure

__all__ = ["plot_expert_load", "plot_capacity_drop", "plot_moe_validation"]

_ARM_COLORS = {"dense": "#555555", "top1": "#d62728", "top2_fine": "#1f77b4"}
_OTHER_COLORS = ["#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#17becf"]
_SEED_STYLES = ["-", "--", ":", "-."]
_EXPERT_COLORS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#17becf"]


def _moe_labels() -> dict[str, str]:
    from tformer_lib.experiments.moe import MOE_LABELS  # 晚导入：实验模块会导入 torch 与语言模型

    return dict(MOE_LABELS)


def _rows(rows: Any, needed: Sequence[str], name: str, source: str) -> list[Mapping]:
    """``rows`` 应是非空的字典列表、每行都有 ``needed`` 里的字段；错误信息点出参数名 ``name`` 与来源 ``source``。"""
    if isinstance(rows, (Mapping, str, bytes)) or not isinstance(rows, Sequence):
        raise TypeError(f"{name} 应是结果行（字典）的列表（{source}），收到 {type(rows).__name__}")
    if not rows:
        raise ValueError(f"{name} 是空列表：应是 {source} 里的结果行")
    for i, row in enumerate(rows):
        if not isinstance(row, Mapping):
            raise TypeError(f"{name}[{i}] 应是一行结果（字典），收到 {type(row).__name__}")
        missing = [k for k in needed if k not in row]
        if missing:
            raise ValueError(f"{name}[{i}] 缺少字段 {missing}")
    return list(rows)


def _arm_color(arm: str, order: Sequence[str]) -> str:
    if arm in _ARM_COLORS:
        return _ARM_COLORS[arm]
    others = [a for a in order if a not in _ARM_COLORS]
    return _OTHER_COLORS[others.index(arm) % len(_OTHER_COLORS)]


def _unique(values) -> list:
    out: list = []
    for v in values:
        if v not in out:
            out.append(v)
    return out


def plot_expert_load(runs: Sequence[Mapping], *, arm: str, seed: int = 0, title: str | None = None):
    """一个 MoE 组、一个种子：每层一个面板，画每个专家在训练过程中分到的任务份额（每个专家一条线）。

    ``runs`` 是 moe.json 的 ``runs``；取 ``arm``、``seed`` 那一次运行的 ``load``（每 ``load_every`` 步一条记录，
    ``shares`` 是 ``[层][专家]`` 的份额，每层加起来是 1）。灰色虚线是均分的份额 1/E：线越贴近它，负载越均衡。
    各面板纵轴相同，便于比较层与层。
    """
    runs = _rows(runs, ("arm", "seed", "load"), "runs", "moe.json 的 'runs'")
    arms = _unique(str(r["arm"]) for r in runs)
    if not isinstance(arm, str) or arm not in arms:
        raise ValueError(f"arm={arm!r} 不在 runs 里；有的组：{arms}")
    chosen = [r for r in runs if r["arm"] == arm and r["seed"] == seed]
    if not chosen:
        seeds = [r["seed"] for r in runs if r["arm"] == arm]
        raise ValueError(f"arm={arm!r} 没有 seed={seed!r} 的运行；有的种子：{seeds}")
    load = chosen[0]["load"]
    if isinstance(load, (Mapping, str, bytes)) or not isinstance(load, Sequence) or not load:
        raise ValueError(f"arm={arm!r} 的运行没有负载记录（load 应是非空的列表，收到 {load!r:.40}；稠密 FFN 没有专家）")
    steps, shares = [], []
    for i, rec in enumerate(load):
        if not isinstance(rec, Mapping) or "step" not in rec or "shares" not in rec:
            raise ValueError(f"load[{i}] 应是含 step 与 shares 的字典")
        s = finite_array(rec["shares"], f"load[{i}]['shares']")
        if s.ndim != 2 or s.size == 0 or (shares and s.shape != shares[0].shape):
            want = f"与 load[0] 相同的形状 {shares[0].shape}" if shares else "二维 [层][专家]"
            raise ValueError(f"load[{i}]['shares'] 应是{want}，收到形状 {s.shape}")
        if (s < 0).any() or not np.allclose(s.sum(axis=1), 1.0, atol=1e-3):
            raise ValueError(f"load[{i}]['shares'] 的每一层应是加起来为 1 的非负份额，收到各层之和 {np.round(s.sum(axis=1), 4).tolist()}")
        steps.append(finite_number(rec["step"], f"load[{i}]['step']"))
        shares.append(s)
    data = np.stack(shares)  # (记录数, 层数, 专家数)
    _, n_layers, n_experts = data.shape
    ncols = min(n_layers, 4)
    nrows = -(-n_layers // ncols)
    fig = blank_figure((3.1 * ncols + 0.8, 2.9 * nrows + 0.9))
    axes = fig.subplots(nrows, ncols, squeeze=False, sharey=True)  # (nrows, ncols)：一层也是二维数组
    flat = list(axes.ravel())
    top = max(float(data.max()), 1.0 / n_experts) * 1.12
    for layer, ax in enumerate(flat[:n_layers]):
        for e in range(n_experts):
            ax.plot(steps, data[:, layer, e], lw=1.4, color=_EXPERT_COLORS[e % len(_EXPERT_COLORS)],
                    label=f"专家 {e}")
        ax.axhline(1.0 / n_experts, color="#555555", ls="--", lw=1.2, label=f"均分 1/{n_experts}")
        ax.set_title(f"第 {layer + 1} 层")
        ax.set_xlabel("训练步数 step")
        ax.set_ylim(0, top)
        ax.grid(alpha=0.3)
    for ax in flat[n_layers:]:
        ax.set_visible(False)
    for row in axes:
        row[0].set_ylabel("分到的任务份额")
    handles, names = flat[0].get_legend_handles_labels()
    fig.legend(handles, names, loc="outside right center", fontsize=8)
    label = _moe_labels().get(arm, arm)
    fig.suptitle(title or f"{label}（种子 {seed}）：每层各专家分到的任务份额（虚线 = 均分 1/{n_experts}）")
    return fig


def plot_capacity_drop(capacity_rows: Sequence[Mapping], *, title: str | None = None):
    """训完后换容量因子（capacity factor）：左图丢弃率（%），右图验证损失，横轴是量过的容量因子。

    ``capacity_rows`` 是 moe.json 的 ``capacity``（每行 ``arm, seed, capacity_factor, drop_rate, valid_loss``，
    ``drop_rate`` 是 0–1 的比例，图中乘 100）。每组一种颜色：实线连的是各种子的平均，空心点是各个种子。
    """
    keys = ("capacity_factor", "drop_rate", "valid_loss")
    rows = _rows(capacity_rows, ("arm", "seed", *keys), "capacity_rows", "moe.json 的 'capacity'")
    rows = [{**row, **{k: finite_number(row[k], f"capacity_rows[{i}]['{k}']") for k in keys}}
            for i, row in enumerate(rows)]
    for i, row in enumerate(rows):
        if not 0 <= row["drop_rate"] <= 1:
            raise ValueError(f"capacity_rows[{i}]['drop_rate'] 应是 0 到 1 的比例，收到 {row['drop_rate']:g}")
    labels = _moe_labels()
    arms = _unique(str(r["arm"]) for r in rows)
    factors = sorted({float(r["capacity_factor"]) for r in rows})
    fig, axes = new_figure((10.4, 4.0), 1, 2)
    ax_drop, ax_loss = axes[0]
    panels = ((ax_drop, "drop_rate", 100.0), (ax_loss, "valid_loss", 1.0))
    for arm in arms:
        mine = [r for r in rows if str(r["arm"]) == arm]
        color = _arm_color(arm, arms)
        xs = sorted({float(r["capacity_factor"]) for r in mine})
        for ax, key, scale in panels:
            values = {x: [float(r[key]) * scale for r in mine if float(r["capacity_factor"]) == x] for x in xs}
            ax.plot(xs, [float(np.mean(values[x])) for x in xs], "-", lw=1.8, color=color,
                    label=labels.get(arm, arm))
            ax.plot([float(r["capacity_factor"]) for r in mine], [float(r[key]) * scale for r in mine], "o",
                    ls="none", ms=5, mfc="none", color=color, alpha=0.8)
    for ax in (ax_drop, ax_loss):
        ax.set_xticks(factors, [f"{f:g}" for f in factors])
        ax.set_xlabel("容量因子（每个专家的容量 = 因子 × 均分的份额）")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=9)
    ax_drop.set_ylim(bottom=0)
    ax_drop.set_ylabel("丢弃率（%）")
    ax_drop.set_title("超出容量、被丢弃的任务")
    ax_loss.set_ylabel("验证损失（nats）")
    ax_loss.set_title("同一组权重换容量因子后的验证损失")
    fig.suptitle(title or "容量因子：太小就丢词元，丢得多损失就高（实线 = 种子平均，空心点 = 各个种子）")
    return fig


def plot_moe_validation(runs: Sequence[Mapping], *, labels: Mapping[str, str] | None = None,
                        title: str | None = None):
    """验证损失随训练步数：每组一种颜色，每个种子一种线型（实线、虚线、点线……），一共“组数 × 种子数”条线。

    ``runs`` 是 moe.json 的 ``runs``（每次运行的 ``evals`` 是 ``[{step, valid_loss}]``）；``labels`` 把组名换成
    图例里的中文，默认 :data:`~tformer_lib.experiments.moe.MOE_LABELS`。纵轴只框住第 0 步以后的损失
    （第 0 步约为 ln V，画进来其余的差别就看不见了），第 0 步的点在图框上方。
    """
    runs = _rows(runs, ("arm", "seed", "evals"), "runs", "moe.json 的 'runs'")
    if labels is not None and not isinstance(labels, Mapping):
        raise TypeError(f"labels 应是 {{组名: 中文名}} 的字典或 None，收到 {type(labels).__name__}")
    names = {**_moe_labels(), **{str(k): str(v) for k, v in (labels or {}).items()}}
    arms = _unique(str(r["arm"]) for r in runs)
    seeds = _unique(r["seed"] for r in runs)
    fig, ax = new_figure((7.4, 4.4))
    later = []
    for i, run in enumerate(runs):
        evals = run["evals"]
        if isinstance(evals, (Mapping, str, bytes)) or not isinstance(evals, Sequence) or not evals:
            raise ValueError(f"runs[{i}]['evals'] 应是非空的 [{{step, valid_loss}}] 列表")
        if not all(isinstance(e, Mapping) and "step" in e and "valid_loss" in e for e in evals):
            raise ValueError(f"runs[{i}]['evals'] 的每一项应是含 step 与 valid_loss 的字典")
        steps = [finite_number(e["step"], f"runs[{i}]['evals'][{j}]['step']") for j, e in enumerate(evals)]
        losses = [finite_number(e["valid_loss"], f"runs[{i}]['evals'][{j}]['valid_loss']") for j, e in enumerate(evals)]
        later += [v for s, v in zip(steps, losses) if s > 0]
        arm = str(run["arm"])
        style = _SEED_STYLES[seeds.index(run["seed"]) % len(_SEED_STYLES)]
        ax.plot(steps, losses, marker="o", ms=3, ls=style, lw=1.5, color=_arm_color(arm, arms), alpha=0.9,
                label=f"{names.get(arm, arm)} · 种子 {run['seed']}")
    if later:
        lo, hi = min(later), max(later)
        pad = max(0.05 * (hi - lo), 0.02)
        ax.set_ylim(lo - pad, hi + pad)
        above = [float(e["valid_loss"]) for r in runs for e in r["evals"] if float(e["valid_loss"]) > hi + pad]
        if above:
            ax.text(0.02, 0.03, f"第 0 步的损失 ≈ {np.mean(above):.2f}，\n在图框上方", transform=ax.transAxes,
                    ha="left", va="bottom", fontsize=8, color="#555555")  # 左下角是空的：曲线都在右上
    ax.set_xlabel("训练步数 step")
    ax.set_ylabel("验证损失（nats）")
    ax.grid(alpha=0.3)
    handles, texts = ax.get_legend_handles_labels()
    order = sorted(range(len(runs)), key=lambda i: (seeds.index(runs[i]["seed"]), arms.index(str(runs[i]["arm"]))))
    ax.legend([handles[i] for i in order], [texts[i] for i in order], fontsize=8, loc="upper right",
              ncols=len(seeds) if len(seeds) <= 3 else 1)  # 每列一个种子，每行一个组
    ax.set_title(title or "稠密 FFN 与混合专家：验证损失（颜色 = 组，线型 = 种子）")
    return fig
