"""推理与效率的图（第 8 章）：代价随长度的增长、FLOPs 构成、在线 softmax 与逐块注意力的过程、比值条形图。

与其他 ``plot_*`` 一样都是纯函数：给参数、返回 ``matplotlib.figure.Figure``；数字都由库函数算出。
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from tformer_lib._checks import positive_int
from tformer_lib.plotting._common import new_figure, to_numpy

__all__ = [
    "plot_cost_scaling",
    "plot_flops_breakdown",
    "plot_flops_share",
    "plot_online_softmax",
    "plot_tiled_attention",
    "plot_ratio_bars",
    "plot_kv_cache_schedule",
]

_TILE_COLORS = ("#4C72B0", "#DD8452", "#55A868", "#C44E52", "#8172B3", "#937860", "#DA8BC3", "#8C8C8C")


def plot_cost_scaling(
    lengths: Sequence[int],
    series: Mapping[str, Sequence[float]],
    *,
    reference_powers: Sequence[int] = (1, 2),
    title: str | None = None,
    xlabel: str = "序列长度 n",
    ylabel: str = "代价",
    ax: Any = None,
):
    """双对数坐标画“代价 vs 长度”，并画出斜率为 1（∝ n）、2（∝ n²）的虚线参考线。

    ``series``：``{图例: 每个长度对应的值}``。参考线从第一条曲线的第一个点出发，
    曲线与哪条虚线平行，代价就按那个幂次增长。
    """
    n = to_numpy(lengths, "lengths", ndim=1)
    if not series:
        raise ValueError("series 至少要有一条曲线")
    if ax is None:
        fig, ax = new_figure((6.4, 4.2))
    else:
        fig = ax.figure
    first = None
    for i, (label, values) in enumerate(series.items()):
        y = to_numpy(values, f"series[{label!r}]", ndim=1)
        if y.shape != n.shape:
            raise ValueError(f"series[{label!r}] 有 {y.size} 个值，但 lengths 有 {n.size} 个")
        ax.plot(n, y, "o-", color=_TILE_COLORS[i % len(_TILE_COLORS)], label=label, lw=2)
        first = y if first is None else first
    styles = {1: ("∝ n（线性）", ":"), 2: ("∝ n²（平方）", "--"), 3: ("∝ n³", "-.")}
    for p in reference_powers:
        name, ls = styles.get(p, (f"∝ n^{p}", "--"))
        ax.plot(n, first[0] * (n / n[0]) ** p, ls, color="gray", lw=1.2, label=f"参考：{name}")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xticks(n)
    ax.set_xticklabels([str(int(v)) for v in n])
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    if title:
        ax.set_title(title)
    ax.grid(True, which="major", alpha=0.3)
    ax.legend(fontsize=8)
    return fig


def plot_flops_breakdown(config: Any, lengths: Sequence[int], *, batch: int = 1, title: str | None = None, ax: Any = None):
    """一个编码器层的 FLOPs 构成随长度的变化（堆叠面积图，纵轴为占比）。

    三部分：四个线性投影（W^Q、W^K、W^V、W^O），注意力本身（QKᵀ 与 AV），前馈网络。
    投影与前馈 ∝ n，注意力 ∝ n²——两者相等处 n = 2·d_model + d_ff，图中用竖线标出（此后注意力过半）。
    """
    from tformer_lib.measurement.costs import encoder_layer_flops

    n = [positive_int("lengths 中的值", int(t)) for t in lengths]
    proj, attn, ffn = [], [], []
    for t in n:
        f = encoder_layer_flops(config, batch, t)
        total = f["total"]
        proj.append((f["self_attn.q_proj"] + f["self_attn.kv_proj"] + f["self_attn.out_proj"]) / total)
        attn.append((f["self_attn.scores"] + f["self_attn.weighted_sum"]) / total)
        ffn.append(f["ffn"] / total)
    if ax is None:
        fig, ax = new_figure((6.4, 4.0))
    else:
        fig = ax.figure
    ax.stackplot(n, proj, ffn, attn, labels=["线性投影 Q/K/V/O（∝ n）", "前馈网络（∝ n）", "注意力 QKᵀ 与 AV（∝ n²）"],
                 colors=[_TILE_COLORS[0], _TILE_COLORS[2], _TILE_COLORS[3]], alpha=0.85)
    # 注意力部分 2·2·n²·d 与线性部分 (8·d² + 4·d·d_ff)·n 相等时：n* = 2·d + d_ff
    crossover = 2 * config.d_model + config.d_ff
    if n[0] <= crossover <= n[-1]:
        ax.axvline(crossover, color="black", ls="--", lw=1)
        ax.text(crossover, 0.03, f" n = 2·d_model + d_ff = {crossover}\n 注意力过半", fontsize=8, va="bottom")
    ax.set_xscale("log", base=2)
    ax.set_xlim(n[0], n[-1])
    ax.set_ylim(0, 1)
    ax.set_xlabel("序列长度 n")
    ax.set_ylabel("占一层 FLOPs 的比例")
    ax.set_title(title or f"编码器层的 FLOPs 构成（d_model={config.d_model}, d_ff={config.d_ff}）")
    ax.legend(loc="upper left", fontsize=8)
    return fig


def plot_flops_share(d_model: int = 512, d_ff: int = 2048, n_heads: int = 8, max_length: int = 8192):
    """:func:`plot_flops_breakdown` 的参数版（供交互探索器用）：长度从 16 取到 ``max_length``（2 的幂）。"""
    from tformer_lib.translation.config import TransformerConfig

    positive_int("max_length", max_length, 32)
    config = TransformerConfig(1, 1, d_model=d_model, n_heads=n_heads, d_ff=d_ff)
    lengths = [2**p for p in range(4, int(np.log2(max_length)) + 1)]
    return plot_flops_breakdown(config, lengths)


def plot_online_softmax(x: Any, block_size: int = 3, *, title: str | None = None):
    """在线 softmax 的过程：左图是输入分数按块着色、每块读完后的运行最大值 m（阶梯线）；
    右图是每读完一块的运行分母 l 在“修正前/修正后”的值——新最大值出现时，旧的 l 被乘上 e^{m_old−m_new}。
    """
    import torch

    from tformer_lib.parts.flash import online_softmax

    block_size = positive_int("block_size", block_size)
    xs = torch.as_tensor(to_numpy(x, "x", ndim=1), dtype=torch.float64)  # (n,)
    n = xs.numel()
    out, trace = online_softmax(xs, block_size, return_trace=True)
    fig, axes = new_figure((11.0, 3.8), 1, 2)
    ax, ax2 = axes[0, 0], axes[0, 1]
    idx = np.arange(n)
    for j, start in enumerate(range(0, n, block_size)):
        stop = min(start + block_size, n)
        color = _TILE_COLORS[j % len(_TILE_COLORS)]
        ax.bar(idx[start:stop], xs[start:stop].numpy(), color=color, alpha=0.8, label=f"第 {j + 1} 块")
        ax.hlines(float(trace[j]["m"]), start - 0.5, stop - 0.5, colors="black", linestyles="--", lw=1.5)
        ax.axvline(stop - 0.5, color="gray", lw=0.6)
    ax.plot([], [], "k--", lw=1.2, label="读完该块后的运行最大值 m")
    ax.set_xticks(idx)
    ax.set_xlabel("位置 i")
    ax.set_ylabel("分数 x_i")
    ax.set_title("一遍扫描：每块更新一次运行最大值")
    ax.legend(fontsize=7, ncol=2)

    steps = np.arange(1, len(trace) + 1)
    m_final = float(trace[-1]["m"])
    l_own = [float(t["l"]) for t in trace]  # 以当时的 m 为基准
    l_final_base = [float(t["l"]) * float(np.exp(float(t["m"]) - m_final)) for t in trace]  # 换算到最终的 m
    ax2.plot(steps, l_own, "o-", color=_TILE_COLORS[1], label="运行分母 l（以当时的 m 为基准）")
    ax2.plot(steps, l_final_base, "s--", color=_TILE_COLORS[0], label="换算到最终 m 后：Σ e^{x_i − m}")
    ax2.axhline(float(torch.exp(xs - xs.max()).sum()), color="gray", ls=":", label="一次性计算的分母")
    ax2.set_xticks(steps)
    ax2.set_xlabel("已读入的块数")
    ax2.set_ylabel("分母 l")
    ax2.set_title("新最大值出现时，旧的 l 乘以 e^{m_old − m_new}")
    ax2.legend(fontsize=7)
    if title:
        fig.suptitle(title)
    return fig


def plot_tiled_attention(q: Any, k: Any, block_size: int = 4, *, query_labels=None, key_labels=None,
                         title: str | None = None):
    """逐块注意力：左图是完整的分数表 QKᵀ/√d_k（真实算法从不整张存下它），竖线把键切成块；
    右图是每个查询的运行最大值 m 随读入块数的变化（它只增不减，读完最后一块等于该行最大值）。

    ``q`` ``(T_q, d_k)``、``k`` ``(T_k, d_k)``：单个头。
    """
    import torch

    from tformer_lib.parts.flash import tiled_attention

    block_size = positive_int("block_size", block_size)
    qt = torch.as_tensor(to_numpy(q, "q", ndim=2), dtype=torch.float64)  # (T_q, d_k)
    kt = torch.as_tensor(to_numpy(k, "k", ndim=2), dtype=torch.float64)  # (T_k, d_k)
    t_q, t_k = qt.shape[0], kt.shape[0]
    scores = (qt @ kt.T / qt.shape[-1] ** 0.5).numpy()  # (T_q, T_k)
    _, trace = tiled_attention(qt, kt, kt, block_size=block_size, return_trace=True)
    fig, axes = new_figure((11.0, 4.0), 1, 2)
    ax, ax2 = axes[0, 0], axes[0, 1]
    im = ax.imshow(scores, cmap="RdBu_r", aspect="auto", vmin=-np.abs(scores).max(), vmax=np.abs(scores).max())
    fig.colorbar(im, ax=ax, shrink=0.85, label="分数 q·k/√d_k")
    for j, t in enumerate(trace):
        color = _TILE_COLORS[j % len(_TILE_COLORS)]
        ax.add_patch(_rect(t["start"] - 0.5, -0.5, t["stop"] - t["start"], t_q, color))
        ax.text((t["start"] + t["stop"] - 1) / 2, t_q - 0.6, f"块 {j + 1}", ha="center", va="bottom", fontsize=8,
                color=color, bbox={"facecolor": "white", "alpha": 0.8, "edgecolor": "none", "pad": 1})
    ax.set_xlabel("键 j（按块读入）")
    ax.set_ylabel("查询 i")
    if key_labels is not None:
        ax.set_xticks(range(t_k))
        ax.set_xticklabels(list(key_labels))
    if query_labels is not None:
        ax.set_yticks(range(t_q))
        ax.set_yticklabels(list(query_labels))
    ax.set_title("分数表按列切块：每次只算 T_q × 块宽 的一条")

    steps = np.arange(1, len(trace) + 1)
    ms = np.stack([t["m"].numpy() for t in trace])  # (块数, T_q)
    for i in range(t_q):
        label = str(query_labels[i]) if query_labels is not None else f"查询 {i}"
        ax2.plot(steps, ms[:, i], "o-", lw=1.5, label=label)
    ax2.plot(steps[-1] + 0.25 + np.zeros(t_q), scores.max(axis=1), "k*", ms=9, label="整行最大值")
    ax2.set_xticks(steps)
    ax2.set_xlabel("已读入的块数")
    ax2.set_ylabel("运行最大值 m")
    ax2.set_title("每个查询的运行最大值只增不减")
    ax2.legend(fontsize=7, ncol=2)
    if title:
        fig.suptitle(title)
    return fig


def _rect(x, y, w, h, color):
    from matplotlib.patches import Rectangle

    return Rectangle((x, y), w, h, fill=False, edgecolor=color, lw=2.5)


def plot_ratio_bars(labels: Sequence[str], ratios: Sequence[float], *, title: str | None = None,
                    ylabel: str = "比值", baseline_label: str = "1 = 一样快", higher_is_better: bool = False,
                    ax: Any = None):
    """条形图画一组比值（如“我们的耗时 / PyTorch 的耗时”），并标出 1 的基准线；每根条上写两位小数。

    条的颜色：好的一侧绿色、差的一侧红色；``higher_is_better=True`` 时大于 1 算好（如加速比）。
    """
    r = to_numpy(ratios, "ratios", ndim=1)
    if len(labels) != r.size:
        raise ValueError(f"labels 有 {len(labels)} 个，ratios 有 {r.size} 个")
    if ax is None:
        fig, ax = new_figure((max(4.5, 1.1 * r.size + 2.5), 3.8))
    else:
        fig = ax.figure
    colors = [_TILE_COLORS[2] if (v > 1) == higher_is_better else _TILE_COLORS[3] for v in r]
    bars = ax.bar(range(r.size), r, color=colors, alpha=0.85)
    for b, v in zip(bars, r):
        ax.text(b.get_x() + b.get_width() / 2, v, f"{v:.2f}×", ha="center", va="bottom", fontsize=9)
    ax.axhline(1.0, color="black", ls="--", lw=1, label=baseline_label)
    ax.set_xticks(range(r.size))
    ax.set_xticklabels([str(t) for t in labels])
    ax.set_ylabel(ylabel)
    ax.set_ylim(0, max(1.2, float(r.max()) * 1.15))
    if title:
        ax.set_title(title)
    ax.legend(fontsize=8)
    return fig


def plot_kv_cache_schedule(n_steps: int = 6, *, tokens: Sequence[str] | None = None, title: str | None = None):
    """逐字生成时每一步要为哪些位置计算 K、V：左图不用缓存（每步重算整个前缀），右图用 K/V 缓存（只算新位置）。

    格子 (步 t, 位置 j)：深色 = 这一步新算，浅色 = 从缓存读出，白色 = 还没生成。标题里给出两种做法的总次数
    （不用缓存 1 + 2 + … + n = n(n+1)/2，用缓存 n）。
    """
    from matplotlib.colors import ListedColormap

    n = positive_int("n_steps", n_steps)
    labels = list(tokens) if tokens is not None else [f"位置 {j}" for j in range(n)]
    if len(labels) != n:
        raise ValueError(f"tokens 有 {len(labels)} 个，但 n_steps={n}")
    plain = np.zeros((n, n))  # (步, 位置)
    cached = np.zeros((n, n))
    for t in range(n):
        plain[t, : t + 1] = 2  # 每步重算 0..t
        cached[t, :t] = 1  # 0..t-1 从缓存读
        cached[t, t] = 2  # 只有 t 是新算的
    cmap = ListedColormap(["white", "#A6C8E0", _TILE_COLORS[3]])
    fig, axes = new_figure((10.0, 0.45 * n + 2.2), 1, 2)
    for ax, grid, name, count in ((axes[0, 0], plain, "不用缓存：每步重算整个前缀", n * (n + 1) // 2),
                                  (axes[0, 1], cached, "K/V 缓存：每步只算新位置", n)):
        ax.imshow(grid, cmap=cmap, vmin=0, vmax=2, aspect="auto")
        ax.set_xticks(range(n))
        ax.set_xticklabels(labels, fontsize=8)
        ax.set_yticks(range(n))
        ax.set_yticklabels([f"第 {t + 1} 步" for t in range(n)], fontsize=8)
        ax.set_xticks(np.arange(-0.5, n, 1), minor=True)
        ax.set_yticks(np.arange(-0.5, n, 1), minor=True)
        ax.grid(which="minor", color="gray", lw=0.5)
        ax.tick_params(which="minor", length=0)
        ax.set_xlabel("为哪个位置计算 K、V")
        ax.set_title(f"{name}\n共算 {count} 次")
    from matplotlib.patches import Patch

    axes[0, 1].legend(handles=[Patch(color=_TILE_COLORS[3], label="这一步新算"), Patch(color="#A6C8E0", label="从缓存读出")],
                      loc="lower left", fontsize=8, bbox_to_anchor=(1.02, 0.0))
    if title:
        fig.suptitle(title)
    return fig

