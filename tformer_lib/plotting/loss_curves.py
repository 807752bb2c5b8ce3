"""损失曲线的图（第 7 章）：训练时实时刷新的损失曲线（训练器回调）、几条训练曲线的对比、几个模型在各划分上的得分柱状图、
几组多种子训练的损失曲线（每个种子一条线，同组同色）。"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
import numpy as np

from tformer_lib._checks import positive_int
from tformer_lib.plotting._common import new_figure

__all__ = ["LiveLossPlot", "plot_loss_curves", "plot_score_bars", "plot_seed_runs"]


def _smooth(y: np.ndarray, window: int) -> np.ndarray:
    """滑动平均（前 window−1 个点用已有的点平均），让逐步损失的抖动不遮住趋势。"""
    if window <= 1 or len(y) == 0:
        return y
    c = np.cumsum(np.insert(y, 0, 0.0))
    out = np.empty_like(y)
    for i in range(len(y)):
        lo = max(0, i + 1 - window)
        out[i] = (c[i + 1] - c[lo]) / (i + 1 - lo)
    return out


def plot_loss_curves(
    curves: Mapping[str, Sequence[float]],
    *,
    smooth: int = 1,
    title: str | None = None,
    xlabel: str = "训练步数 step",
    ylabel: str = "训练损失",
    styles: Mapping[str, str] | None = None,
    ylim: tuple[float, float] | None = None,
    ax=None,
):
    """把几条逐步损失曲线画在一张图上比较（例如 post-LN 与 pre-LN、有无预热）。

    ``curves``：``{图例名: 每步的损失}``，第 i 个值画在 step = i + 1。``smooth`` > 1 时画滑动平均（原曲线淡色保留）。
    ``styles``：``{图例名: matplotlib 线型}``（如 ``"--"``）。
    """
    if not curves:
        raise ValueError("curves 为空：至少需要一条曲线")
    smooth = positive_int("smooth", smooth)
    if ax is None:
        fig, ax = new_figure((7.0, 3.8))
    else:
        fig = ax.figure
    for name, values in curves.items():
        y = np.asarray(list(values), dtype=float)
        if y.ndim != 1 or len(y) == 0:
            raise ValueError(f"curves[{name!r}] 应是非空的一维数值序列，收到形状 {y.shape}")
        x = np.arange(1, len(y) + 1)
        ls = (styles or {}).get(name, "-")
        if smooth > 1:
            (line,) = ax.plot(x, _smooth(y, smooth), ls, lw=1.8, label=name)
            ax.plot(x, y, ls, lw=0.6, alpha=0.3, color=line.get_color())
        else:
            ax.plot(x, y, ls, lw=1.5, label=name)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    if ylim is not None:
        ax.set_ylim(*ylim)
    ax.set_title(title if title is not None else "训练损失对比")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    return fig



_GROUP_COLORS = ("#C44E52", "#4C72B0", "#55A868", "#8172B3")


def plot_seed_runs(
    groups: Mapping[str, Sequence[Sequence[float]]],
    *,
    smooth: int = 1,
    lr: Sequence[float] | None = None,
    hline: tuple[float, str] | None = None,
    title: str | None = None,
    ylabel: str = "训练损失",
    ax=None,
):
    """几组多种子训练的逐步损失：``groups`` 是 ``{组名: [种子 0 的每步损失, 种子 1 的……]}``，同组同色、每个种子一条线。

    ``lr`` 给出时在右侧纵轴画学习率（灰色点线），``hline=(数值, 说明)`` 画一条水平参考线（例如只按词频猜的损失）。
    """
    if not groups:
        raise ValueError("groups 为空：至少需要一组曲线")
    smooth = positive_int("smooth", smooth)
    if ax is None:
        fig, ax = new_figure((7.4, 4.0))
    else:
        fig = ax.figure
    for gi, (name, runs) in enumerate(groups.items()):
        if len(runs) == 0:
            raise ValueError(f"groups[{name!r}] 里没有任何一次运行")
        color = _GROUP_COLORS[gi % len(_GROUP_COLORS)]
        for ri, values in enumerate(runs):
            y = np.asarray(list(values), dtype=float)
            if y.ndim != 1 or len(y) == 0:
                raise ValueError(f"groups[{name!r}][{ri}] 应是非空的一维数值序列，收到形状 {y.shape}")
            x = np.arange(1, len(y) + 1)
            ax.plot(x, _smooth(y, smooth), "-", color=color, lw=1.4, alpha=0.85,
                    label=f"{name}（{len(runs)} 个种子）" if ri == 0 else None)
    if hline is not None:
        ax.axhline(hline[0], color="black", ls="--", lw=1, label=hline[1])
    ax.set_xlabel("训练步数 step")
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    if lr is not None:
        lr_ax = ax.twinx()
        lr_ax.plot(np.arange(1, len(lr) + 1), list(lr), ":", color="gray", lw=1.2)
        lr_ax.set_ylabel("学习率（灰色点线）")
    ax.legend(fontsize=8, loc="upper right")
    ax.set_title(title if title is not None else "多个种子的训练损失")
    return fig

def plot_score_bars(
    scores: Mapping[str, Mapping[str, float]],
    *,
    title: str | None = None,
    ylabel: str = "整句完全匹配率",
    ylim: tuple[float, float] = (0.0, 1.25),
    fmt: str = "{:.0%}",
    ax=None,
):
    """分组柱状图：``scores = {模型名: {划分或指标名: 数值}}``，每组一个划分，每根柱子一个模型，柱顶写数值。"""
    if not scores:
        raise ValueError("scores 为空：至少需要一个模型")
    models = list(scores)
    groups: list[str] = []
    for m in models:
        groups += [g for g in scores[m] if g not in groups]
    if not groups:
        raise ValueError("scores 里没有任何数值")
    if ax is None:
        fig, ax = new_figure((max(5.0, 1.6 * len(groups) * max(1, len(models)) / 2 + 2.0), 3.6))
    else:
        fig = ax.figure
    width = 0.8 / len(models)
    x = np.arange(len(groups))
    for i, m in enumerate(models):
        vals = [float(scores[m].get(g, np.nan)) for g in groups]
        bars = ax.bar(x + (i - (len(models) - 1) / 2) * width, vals, width * 0.95, label=m)
        for b, v in zip(bars, vals):
            if np.isfinite(v):
                ax.annotate(fmt.format(v), (b.get_x() + b.get_width() / 2, v), textcoords="offset points",
                            xytext=(0, 2), ha="center", va="bottom", fontsize=8)
    ax.set_xticks(x, groups)
    ax.set_ylim(*ylim)
    ax.set_ylabel(ylabel)
    ax.set_title(title if title is not None else ylabel)
    ax.legend(fontsize=8, loc="upper center", ncol=len(models))
    ax.grid(axis="y", alpha=0.3)
    return fig


class LiveLossPlot:
    """训练器回调（``Trainer(callbacks=[LiveLossPlot()])``）：边训练边重画损失曲线。

    左图：每步的训练损失（细线）与其滑动平均；若给了 ``reference``（例如缓存模型训练时记下的逐步损失），
    用虚线画在同一坐标里对照。右图：每个 epoch 结束时的验证损失与验证词元准确率。

    在 Jupyter 里，第一次重画时 ``display(..., display_id=True)`` 显示图，以后每 ``every`` 步原地更新同一个输出
    （不会越刷越长）；执行完毕后留下的就是最终曲线的静态 PNG。不在 IPython 里时什么也不显示，只记录数据，
    训练结束后可用 :meth:`figure` 取图。
    """

    def __init__(self, every: int = 10, *, reference: Sequence[float] | None = None,
                 reference_label: str = "参考", smooth: int = 10, total_steps: int | None = None,
                 title: str = "训练中的损失", display: bool = True):
        self.every = positive_int("every", every)
        self.smooth = positive_int("smooth", smooth)
        self.reference = None if reference is None else [float(v) for v in reference]
        self.reference_label = reference_label
        self.total_steps = total_steps
        self.title = title
        self.display = display
        self.steps: list[int] = []
        self.losses: list[float] = []
        self.epochs: list[dict] = []
        self._handle = None

    def __call__(self, event: str, info: dict) -> None:
        if event == "step":
            self.steps.append(int(info["step"]))
            self.losses.append(float(info["loss"]))
            if len(self.steps) % self.every == 0:
                self.redraw()
        elif event == "epoch":
            self.epochs.append({k: v for k, v in info.items() if k != "history"})
            self.redraw()

    def figure(self):
        """当前数据的图（两幅子图，坐标范围固定，重画时不跳动）。"""
        fig, axes = new_figure((11.0, 3.6), 1, 2)
        a1, a2 = axes[0]
        n_ref = len(self.reference) if self.reference else 0
        x_max = max(self.total_steps or 0, n_ref, self.steps[-1] if self.steps else 1)
        if self.steps:
            y = np.asarray(self.losses)
            a1.plot(self.steps, y, color="tab:blue", lw=0.6, alpha=0.35)
            a1.plot(self.steps, _smooth(y, self.smooth), color="tab:blue", lw=3.0, alpha=0.8,
                    label=f"本次训练（{self.smooth} 步滑动平均）")
        if self.reference:  # 画在上面：两条线重合时，虚线仍看得见
            a1.plot(np.arange(1, n_ref + 1), _smooth(np.asarray(self.reference), self.smooth), "--",
                    color="black", lw=1.2, label=f"{self.reference_label}（同样平滑）", zorder=5)
        a1.set_xlim(0, x_max + 1)
        a1.set_xlabel("训练步数 step")
        a1.set_ylabel("训练损失（标签平滑）")
        a1.set_title(f"{self.title}：第 {self.steps[-1] if self.steps else 0} 步")
        a1.grid(alpha=0.3)
        if self.steps or self.reference:
            a1.legend(fontsize=8)
        ep = [e.get("epoch", i + 1) for i, e in enumerate(self.epochs)]
        vl = [e.get("valid_loss", np.nan) for e in self.epochs]
        acc = [e.get("valid_token_accuracy", np.nan) for e in self.epochs]
        a2.plot(ep, vl, "o-", color="tab:red", label="验证损失（无平滑）")
        a2.set_xlabel("轮次（epoch）")
        a2.set_ylabel("验证损失")
        a2.grid(alpha=0.3)
        a3 = a2.twinx()
        a3.plot(ep, acc, "s--", color="tab:green", label="验证词元准确率")
        a3.set_ylim(0, 1.02)
        a3.set_ylabel("词元准确率")
        a2.set_title("每个 epoch 结束时的验证")
        if self.epochs:
            a2.set_xticks(ep)
            lines = a2.get_lines() + a3.get_lines()
            a2.legend(lines, [ln.get_label() for ln in lines], fontsize=8, loc="center right")
        return fig

    def redraw(self) -> None:
        """在 IPython 里显示或原地更新图；在别处什么也不做。"""
        if not self.display:
            return
        try:
            from IPython import get_ipython
            from IPython.display import display
        except ImportError:  # pragma: no cover
            return
        if get_ipython() is None:
            return
        fig = self.figure()
        if self._handle is None:
            self._handle = display(fig, display_id=True)
        else:
            self._handle.update(fig)

    def __repr__(self) -> str:
        return f"LiveLossPlot(steps={len(self.steps)}, epochs={len(self.epochs)})"

