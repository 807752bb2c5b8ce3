"""Softmax 与缩放（÷√d_k）的图：温度（temperature）柱状图、点积方差随 d_k 的增长与 softmax 饱和。

这些函数不改动全局随机状态：需要随机数时用 ``numpy.random.default_rng(seed)`` 自己的生成器。
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from tformer_lib._checks import positive_int
from tformer_lib.plotting._common import check_labels, new_figure, to_numpy

_MAX_DK = 1024  # 缩放探索器里预先生成的最大维度


def _softmax(x: np.ndarray, axis: int = -1) -> np.ndarray:
    z = x - x.max(axis=axis, keepdims=True)  # 减去最大值，防止 exp 溢出
    e = np.exp(z)
    return e / e.sum(axis=axis, keepdims=True)


def _check_temperature(t: Any, name: str = "temperature") -> float:
    t = float(t)
    if not (t > 0 and np.isfinite(t)):
        raise ValueError(f"{name}={t} 应为正的有限数")
    return t


def plot_softmax_temperature(
    logits: Any = (5.0, 4.0, 0.0),
    labels: Sequence[Any] | None = ("Artificial", "Intelligence", "其他"),
    *,
    temperatures: Sequence[float] = (0.5, 1.0, 2.0),
    title: str | None = None,
    ax=None,
):
    """同一组分数（logits）在不同温度 T 下的 softmax 概率：``softmax(z / T)``，分组柱状图并标百分比。

    默认是第 6 章的例子：分数 5、4、0 在 T=1 时约为 72.7%、26.8%、0.5%。
    T < 1 让分布更尖锐（更“果断”），T > 1 让分布更平坦。
    """
    z = to_numpy(logits, "logits", ndim=1)
    labels = check_labels(labels, z.size, "labels") or [f"类别 {i}" for i in range(z.size)]
    temps = [_check_temperature(t, "temperatures 中的值") for t in temperatures]
    if not temps:
        raise ValueError("temperatures 至少要有一个值")
    if ax is None:
        fig, ax = new_figure((max(5.0, 1.3 * z.size * max(1, len(temps)) / 2 + 3), 3.8))
    else:
        fig = ax.figure
    x = np.arange(z.size)
    width = 0.8 / len(temps)
    for k, t in enumerate(temps):
        p = _softmax(z / t)
        bars = ax.bar(x + (k - (len(temps) - 1) / 2) * width, p, width * 0.95, label=f"T = {t:g}")
        for rect, v in zip(bars, p):
            ax.text(rect.get_x() + rect.get_width() / 2, v + 0.01, f"{100 * v:.1f}%", ha="center", va="bottom",
                    fontsize=8)
    ax.set_xticks(x, labels)
    ax.set_ylim(0, 1.12)
    ax.set_ylabel("概率")
    ax.set_title(title if title is not None else "Softmax：分数 → 概率（温度 T 越小越尖锐）")
    if len(temps) > 1 or temps[0] != 1.0:
        ax.legend(fontsize=8)
    ax.grid(axis="y", alpha=0.3)
    return fig


def plot_dot_product_variance(
    d_ks: Sequence[int] = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024),
    *,
    n_samples: int = 2000,
    n_keys: int = 10,
    seed: int = 0,
):
    """为什么要 ÷√d_k：两幅子图。

    左：q、k 的每个分量独立取自标准正态分布时，点积 ``q·k`` 的方差随 d_k 线性增长（≈ d_k）；
    除以 √d_k 后方差稳定在 1 附近。
    右：对 ``n_keys`` 个键做 softmax 时，最大权重的平均值——不缩放时随 d_k 迅速逼近 1（饱和：
    几乎 one-hot，梯度接近 0）；缩放后保持在适中的水平。
    """
    d_ks = [positive_int("d_ks 中的值", d) for d in d_ks]
    positive_int("n_samples", n_samples, 2)
    positive_int("n_keys", n_keys, 2)
    rng = np.random.default_rng(seed)
    var_raw, var_scaled, max_raw, max_scaled = [], [], [], []
    for d in d_ks:
        q = rng.standard_normal((n_samples, 1, d))
        k = rng.standard_normal((n_samples, n_keys, d))
        s = (q * k).sum(-1)  # (n_samples, n_keys)
        var_raw.append(s[:, 0].var())
        var_scaled.append((s[:, 0] / np.sqrt(d)).var())
        max_raw.append(_softmax(s).max(-1).mean())
        max_scaled.append(_softmax(s / np.sqrt(d)).max(-1).mean())
    fig, axes = new_figure((10.0, 3.9), 1, 2)
    a1, a2 = axes[0]
    a1.loglog(d_ks, var_raw, "o-", label="q·k（不缩放）")
    a1.loglog(d_ks, var_scaled, "s-", label="q·k / √d_k")
    a1.loglog(d_ks, d_ks, ":", color="gray", label="参考线：方差 = d_k")
    a1.set_xlabel("d_k")
    a1.set_ylabel("点积的方差")
    a1.set_title("点积方差随 d_k 增长")
    a1.legend(fontsize=8)
    a1.grid(alpha=0.3, which="both")
    a2.semilogx(d_ks, max_raw, "o-", label="不缩放")
    a2.semilogx(d_ks, max_scaled, "s-", label="÷√d_k")
    a2.axhline(1 / n_keys, color="gray", ls=":", label=f"均匀分布 1/{n_keys}")
    a2.set_ylim(0, 1.05)
    a2.set_xlabel("d_k")
    a2.set_ylabel("最大 softmax 权重（平均）")
    a2.set_title(f"softmax 饱和（{n_keys} 个键）")
    a2.legend(fontsize=8)
    a2.grid(alpha=0.3, which="both")
    return fig


def plot_scaled_attention(
    d_k: int = 64,
    temperature: float = 1.0,
    scaled: bool = True,
    *,
    n_keys: int = 8,
    seed: int = 0,
):
    """一个查询对 ``n_keys`` 个随机键的分数与 softmax 权重（softmax/√d_k 探索器用它）。

    分数 = ``q·k_j``（``scaled=True`` 时再 ÷√d_k），再除以温度 T，然后做 softmax。
    q、k 的分量取自标准正态分布；同一个 ``seed`` 下，改变 d_k 只是多用/少用几个分量，曲线变化连续。
    不缩放且 d_k 大时，权重几乎集中在一个键上（饱和）。
    """
    positive_int("d_k", d_k)
    if d_k > _MAX_DK:
        raise ValueError(f"d_k={d_k} 应 ≤ {_MAX_DK}")
    positive_int("n_keys", n_keys, 2)
    t = _check_temperature(temperature)
    rng = np.random.default_rng(seed)
    q = rng.standard_normal(_MAX_DK)[:d_k]
    k = rng.standard_normal((n_keys, _MAX_DK))[:, :d_k]
    scores = k @ q  # (n_keys,)
    if scaled:
        scores = scores / np.sqrt(d_k)
    scores = scores / t
    w = _softmax(scores)
    fig, axes = new_figure((9.5, 3.6), 1, 2)
    a1, a2 = axes[0]
    x = np.arange(n_keys)
    names = [f"k{j + 1}" for j in range(n_keys)]
    a1.bar(x, scores, color=["tab:red" if v < 0 else "tab:blue" for v in scores])
    a1.axhline(0, color="black", lw=0.8)
    a1.set_xticks(x, names)
    a1.set_title("分数 " + ("q·k / √d_k" if scaled else "q·k（未缩放）") + (f" / T" if t != 1.0 else ""))
    a1.set_ylabel("分数")
    a1.grid(axis="y", alpha=0.3)
    a2.bar(x, w, color="tab:green")
    a2.set_xticks(x, names)
    a2.set_ylim(0, 1.05)
    a2.set_ylabel("softmax 权重")
    state = "饱和：几乎 one-hot" if w.max() > 0.95 else "分布适中"
    a2.set_title(f"最大权重 {w.max():.2f}（{state}）")
    a2.grid(axis="y", alpha=0.3)
    fig.suptitle(f"d_k = {d_k}，T = {t:g}，{'÷√d_k' if scaled else '不缩放'}")
    return fig
