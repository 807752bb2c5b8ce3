"""训练相关的图：学习率预热调度、标签平滑的目标分布、训练历史（损失与指标）曲线。"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from tformer_lib._checks import positive_int
from tformer_lib.plotting._common import blank_figure, check_labels, new_figure


def _noam_rate(step: int, d_model: int, warmup: int, factor: float) -> float:
    """论文的学习率公式；库里有 ``training.schedule.noam_rate`` 时用它（书与训练用同一份代码）。"""
    try:
        from tformer_lib.training.schedule import noam_rate
    except ImportError:  # 训练模块缺失时的后备：同一公式
        step = max(int(step), 1)
        return factor * d_model ** -0.5 * min(step ** -0.5, step * warmup ** -1.5)
    return noam_rate(step, d_model, warmup, factor)


def plot_lr_schedule(
    d_model: int = 512,
    warmup: int = 4000,
    factor: float = 1.0,
    total_steps: int = 20000,
    *,
    compare: Iterable[Mapping[str, Any]] | None = None,
    title: str | None = None,
    ax=None,
):
    """论文的学习率调度 ``lr = factor · d_model^-0.5 · min(step^-0.5, step · warmup^-1.5)``。

    前 ``warmup`` 步线性上升，峰值在 ``step = warmup``，之后按 1/√step 衰减；图中标出峰值。
    ``compare``：再画几条对照曲线，每项是 ``{"d_model": …, "warmup": …, "factor": …}``（缺的键沿用主曲线的值）。
    """
    positive_int("d_model", d_model)
    positive_int("warmup", warmup)
    positive_int("total_steps", total_steps, 2)
    if not float(factor) > 0:
        raise ValueError(f"factor={factor} 应为正数")
    if ax is None:
        fig, ax = new_figure((7.0, 3.8))
    else:
        fig = ax.figure
    steps = np.unique(np.linspace(1, total_steps, num=min(total_steps, 800)).astype(int))
    settings = [{"d_model": d_model, "warmup": warmup, "factor": factor}]
    for extra in compare or ():
        settings.append({**settings[0], **dict(extra)})
    for i, cfg in enumerate(settings):
        lr = np.array([_noam_rate(int(s), int(cfg["d_model"]), int(cfg["warmup"]), float(cfg["factor"])) for s in steps])
        label = f"d_model={cfg['d_model']}, warmup={cfg['warmup']}" + (f", factor={cfg['factor']:g}" if cfg["factor"] != 1 else "")
        (line,) = ax.plot(steps, lr, lw=2 if i == 0 else 1.4, label=label)
        if i == 0 and cfg["warmup"] <= total_steps:
            peak = _noam_rate(int(cfg["warmup"]), int(cfg["d_model"]), int(cfg["warmup"]), float(cfg["factor"]))
            ax.plot([cfg["warmup"]], [peak], "o", color=line.get_color())
            ax.annotate(f"峰值 {peak:.2e}\n(step = warmup)", (cfg["warmup"], peak), textcoords="offset points",
                        xytext=(10, 6), fontsize=8, va="bottom")
    ax.set_xlabel("训练步数 step")
    ax.set_ylabel("学习率")
    ax.set_title(title if title is not None else "学习率调度：先预热（warm-up），再按 1/√step 衰减")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    return fig


def label_smoothing_targets(targets: Sequence[int], vocab_size: int, smoothing: float) -> np.ndarray:
    """标签平滑后的目标分布 ``(len(targets), vocab_size)``：正确类 1−ε+ε/V，其余每类 ε/V。

    与 :func:`tformer_lib.training.loss.label_smoothing_loss`（以及 ``F.cross_entropy(label_smoothing=ε)``）
    的定义一致：ε 平均分给全部 V 个类（包括正确类）。
    """
    positive_int("vocab_size", vocab_size, 2)
    eps = float(smoothing)
    if not 0.0 <= eps < 1.0:
        raise ValueError(f"smoothing={smoothing} 应在 [0, 1) 内")
    targets = [int(t) for t in targets]
    for t in targets:
        if not 0 <= t < vocab_size:
            raise ValueError(f"targets 中的 {t} 超出词表范围 [0, {vocab_size})")
    dist = np.full((len(targets), vocab_size), eps / vocab_size)
    dist[np.arange(len(targets)), targets] += 1.0 - eps
    return dist


def plot_label_smoothing(
    smoothing: float = 0.1,
    vocab_size: int = 8,
    targets: Sequence[int] = (4, 6, 5),
    *,
    vocab_labels: Sequence[Any] | None = None,
):
    """标签平滑（label smoothing）的目标分布：左为第一个目标的 one-hot 与平滑后分布的对比柱状图，
    右为每个目标位置（行）在整个词表（列）上的目标分布热力图。
    """
    from tformer_lib.plotting.heatmap import plot_heatmap

    dist = label_smoothing_targets(targets, vocab_size, smoothing)
    labels = check_labels(vocab_labels, vocab_size, "vocab_labels") or [str(i) for i in range(vocab_size)]
    fig, axes = new_figure((11.0, 3.8), 1, 2)
    a1, a2 = axes[0]
    x = np.arange(vocab_size)
    one_hot = label_smoothing_targets(targets[:1], vocab_size, 0.0)[0]
    a1.bar(x - 0.2, one_hot, 0.4, label="one-hot（ε = 0）", color="tab:gray")
    a1.bar(x + 0.2, dist[0], 0.4, label=f"平滑后（ε = {smoothing:g}）", color="tab:blue")
    a1.set_xticks(x, labels)
    if max(len(t) for t in labels) * vocab_size > 36:  # 标签太挤时斜放
        for t in a1.get_xticklabels():
            t.set(rotation=45, ha="right", rotation_mode="anchor")
    a1.set_ylim(0, 1.1)
    a1.set_ylabel("目标概率")
    a1.set_xlabel("词表中的词元")
    a1.set_title(f"正确词元 {labels[targets[0]]}：{1 - smoothing + smoothing / vocab_size:.3f}，其余各 {smoothing / vocab_size:.4f}",
                 fontsize=10)
    a1.legend(fontsize=8)
    plot_heatmap(dist, [f"位置 {i}" for i in range(len(targets))], labels, ax=a2, cmap="Blues", vmin=0, vmax=1,
                 fmt=".3f", annotate=dist.size <= 64, title="每个位置的目标分布", xlabel="词表中的词元")
    return fig


_METRIC_NAMES = {
    "loss": "损失", "train_loss": "训练损失", "val_loss": "验证损失", "valid_loss": "验证损失",
    "eval_loss": "验证损失", "test_loss": "测试损失", "acc": "准确率", "accuracy": "准确率",
    "train_acc": "训练准确率", "val_acc": "验证准确率", "val_accuracy": "验证准确率", "bleu": "BLEU",
    "val_bleu": "验证 BLEU", "valid_bleu": "验证 BLEU", "lr": "学习率", "ppl": "困惑度", "perplexity": "困惑度",
    "val_ppl": "验证困惑度", "tokens_per_sec": "每秒词元数", "grad_norm": "梯度范数",
    "step_loss": "训练损失（每步）", "valid_token_accuracy": "验证词元准确率", "valid_exact_match": "验证整句正确率",
    "token_accuracy": "词元准确率", "exact_match": "整句正确率",
}
_X_KEYS = ("step", "steps", "epoch", "iteration", "iter")
#: 默认不画的列：耗时每次运行都不同，画出来没有意义。
_IGNORED = ("seconds", "time", "elapsed", "wall_time")


def _trainer_rows(data: Mapping[str, Any]) -> list[dict]:
    """把 ``Trainer.history.to_dict()`` 的形状（step_loss / step_lr / epochs）摊平成按步的记录列表。"""
    rows = [{"step": i + 1, "step_loss": float(x)} for i, x in enumerate(data.get("step_loss", []))]
    for i, lr in enumerate(data.get("step_lr", [])):
        if i < len(rows):
            rows[i]["lr"] = float(lr)
    by_step = {r["step"]: r for r in rows}
    for rec in data.get("epochs", []):
        rec = {k: v for k, v in dict(rec).items() if k not in ("epoch", "lr")}
        step = rec.get("step", len(rows))
        if step in by_step:
            by_step[step].update(rec)
        else:
            row = {"step": step, **rec}
            rows.append(row)
            by_step[step] = row
    return sorted(rows, key=lambda r: r["step"])


def history_to_columns(history: Any) -> dict[str, np.ndarray]:
    """把训练历史统一成“列”：``{名字: float 数组}``，缺失值为 NaN。

    接受三种形状：

    - 记录列表（list of dicts）：``[{"step": 1, "loss": 2.3}, {"step": 2, "loss": 2.1, "val_loss": 2.4}, …]``，
      某条记录缺某个键（例如只偶尔评估一次的验证损失）时记为 NaN；
    - 列字典（dict of lists）：``{"step": [1, 2, …], "loss": […], "val_loss": […]}``，各列等长；
    - 库里训练器的记录：``Trainer.history``（:class:`tformer_lib.training.trainer.History`）或它的
      ``to_dict()``——每步的 ``step_loss``/``step_lr`` 加上每个 epoch 的指标字典 ``epochs``
      （epoch 指标画在该 epoch 结束时的步数上）。

    非数值的列（如字符串）被忽略。
    """
    if hasattr(history, "to_dict") and hasattr(history, "epochs"):
        history = history.to_dict()
    if isinstance(history, Mapping) and "epochs" in history and isinstance(history.get("epochs"), (list, tuple)) \
            and all(isinstance(e, Mapping) for e in history["epochs"]):
        history = _trainer_rows(history)
    if isinstance(history, Mapping):
        cols = {str(k): list(v) for k, v in history.items() if isinstance(v, (list, tuple, np.ndarray))}
        lengths = {len(v) for v in cols.values()}
        if len(lengths) > 1:
            raise ValueError(f"history 是列字典时各列应等长，收到长度 { {k: len(v) for k, v in cols.items()} }")
    elif isinstance(history, Sequence) and not isinstance(history, (str, bytes)):
        rows = list(history)
        if not all(isinstance(r, Mapping) for r in rows):
            raise TypeError("history 是列表时每一项应是字典，例如 {'step': 1, 'loss': 2.3}")
        keys: list[str] = []
        for r in rows:
            keys += [str(k) for k in r if str(k) not in keys]
        cols = {k: [r.get(k) for r in rows] for k in keys}
    else:
        raise TypeError(f"history 应为字典列表、列表字典或训练器的 History，收到 {type(history).__name__}")
    out: dict[str, np.ndarray] = {}
    for k, v in cols.items():
        try:
            out[k] = np.array([np.nan if x is None else float(x) for x in v], dtype=float)
        except (TypeError, ValueError):
            continue
    return out


def plot_history(
    history: Any,
    metrics: Sequence[str] | None = None,
    *,
    x: str | None = None,
    logy: bool = False,
    title: str | None = None,
):
    """训练历史曲线：含 “loss” 的列画在第一幅子图（损失），其余指标（准确率、BLEU、学习率……）各占一幅，每行最多 3 幅。

    ``history`` 的形状见 :func:`history_to_columns`。``x`` 为横轴列名，默认依次找 step/epoch/iteration，
    都没有时用记录序号。``metrics`` 指定要画的列（默认：除横轴外的全部数值列）。缺失值（NaN）跳过，
    稀疏的验证点画成带圆点的折线。
    """
    cols = history_to_columns(history)
    if not cols:
        raise ValueError("history 里没有任何数值列")
    n = len(next(iter(cols.values())))
    if x is None:
        x = next((k for k in _X_KEYS if k in cols), None)
    elif x not in cols:
        raise ValueError(f"x={x!r} 不在 history 的列 {sorted(cols)} 中")
    xs = cols[x] if x is not None else np.arange(1, n + 1, dtype=float)
    names = [k for k in cols if k != x and k not in _X_KEYS and k not in _IGNORED] if metrics is None else list(metrics)
    for k in names:
        if k not in cols:
            raise ValueError(f"metrics 中的 {k!r} 不在 history 的列 {sorted(cols)} 中")
    if not names:
        raise ValueError("没有可画的指标列")
    losses = [k for k in names if "loss" in k.lower()]
    others = [k for k in names if k not in losses]
    panels = ([losses] if losses else []) + [[k] for k in others]
    ncols = min(3, len(panels))
    nrows = math.ceil(len(panels) / ncols)
    fig = blank_figure((min(15.0, 4.8 * ncols + 0.6), 3.6 * nrows))
    axes = fig.subplots(nrows, ncols, squeeze=False).ravel()
    for ax in axes[len(panels):]:
        ax.set_visible(False)
    for ax, group in zip(axes, panels):
        for k in group:
            y = cols[k]
            ok = np.isfinite(y) & np.isfinite(xs)
            sparse = ok.sum() < 0.5 * n
            ax.plot(xs[ok], y[ok], marker="o" if sparse else None, ms=3, lw=0.8 if k == "step_loss" else 1.5,
                    alpha=0.6 if k == "step_loss" else 1.0, label=_METRIC_NAMES.get(k, k))
        ax.set_xlabel({"step": "训练步数", "steps": "训练步数", "epoch": "轮次（epoch）"}.get(x, x or "记录序号"))
        label = "损失" if group is losses else _METRIC_NAMES.get(group[0], group[0])
        ax.set_ylabel(label)
        if logy:
            ax.set_yscale("log")
        if len(group) > 1:
            ax.legend(fontsize=8)
        ax.grid(alpha=0.3)
        ax.set_title(label)
    if title:
        fig.suptitle(title)
    return fig
