"""序列的顺序怎样进入模型的图（第 2 章）：位置编码之间的距离随间隔的变化、循环网络与自注意力的耗时随长度的变化、
位置编码在训练长度之外（长度外推）。

* :func:`plot_position_distance`：正弦余弦位置编码中，位置 ``pos`` 与 ``pos + k`` 的欧氏距离随间隔 k 的变化。
  距离只取决于 k（与起点 pos 无关），所以一条曲线就说清了“相邻近、远处远”的平滑性质。
* :func:`plot_sequence_mixing`：RNN 的 T 步串行循环与一次自注意力的耗时随序列长度的变化
  （数据来自 :func:`tformer_lib.parts.recurrent.measure_sequence_mixing`，在读者自己的机器上现场测量）。
* :func:`plot_length_generalization`：不同位置编码在训练长度之内与之外的准确率。
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from tformer_lib._checks import non_negative_int, positive_int
from tformer_lib.plotting._common import new_figure

__all__ = ["plot_position_distance", "plot_sequence_mixing", "plot_length_generalization"]


def plot_position_distance(
    max_offset: int = 200,
    d_models: Sequence[int] = (64, 512),
    *,
    start: int = 0,
    title: str | None = None,
    ax=None,
):
    """画 ``‖PE(start + k) − PE(start)‖`` 随间隔 ``k = 0..max_offset`` 的曲线，每个 ``d_model`` 一条。

    编码由库里的 :func:`tformer_lib.sinusoidal_positional_encoding` 计算；虚线标出 ``√d_model``：
    两个“毫不相干”的位置的典型距离（每对 sin/cos 维度是单位圆上的一个点，两点相位独立时
    距离平方的期望是 2，d_model/2 对加起来是 d_model）。远处的曲线向它靠拢。
    换一个 ``start`` 曲线完全不变——这正是“位移是旋转”的推论。
    """
    from tformer_lib.parts.positional import sinusoidal_positional_encoding

    positive_int("max_offset", max_offset)
    non_negative_int("start", start)
    d_models = [positive_int("d_models 中的元素", d) for d in d_models]
    if not d_models:
        raise ValueError("d_models 至少要有一个元素")
    if ax is None:
        fig, ax = new_figure((7.2, 3.8))
    else:
        fig = ax.figure
    ks = np.arange(max_offset + 1)
    for i, d in enumerate(d_models):
        pe = sinusoidal_positional_encoding(start + max_offset + 1, d).double().numpy()  # (start+max_offset+1, d)
        dist = np.linalg.norm(pe[start:] - pe[start], axis=1)  # (max_offset+1,)
        color = f"C{i}"
        ax.plot(ks, dist, color=color, label=f"d_model={d}")
        ax.axhline(np.sqrt(d), color=color, ls=":", lw=1)
    ax.set_xlabel("位置间隔 k")
    ax.set_ylabel("欧氏距离 ‖PE(pos+k) − PE(pos)‖")
    ax.set_title(title if title is not None else f"位置编码的距离随间隔增长（起点 pos={start}；虚线为 √d_model）")
    ax.set_xlim(0, max_offset)
    ax.set_ylim(bottom=0)
    ax.legend(loc="lower right", fontsize=9)
    ax.grid(alpha=0.3)
    return fig


def plot_sequence_mixing(result: dict, *, title: str | None = None, ax=None):
    """左轴：RNN 循环与一次自注意力的耗时（毫秒，对数纵轴）随序列长度 T 的变化；标题写明线程数。

    ``result`` 是 :func:`tformer_lib.parts.recurrent.measure_sequence_mixing` 的返回值。耗时随机器与负载变化，
    所以只画图、不进正文；图里同时标出两者的串行步数（RNN 为 T，注意力为 1）。
    """
    for key in ("lengths", "rnn_seconds", "attention_seconds", "rnn_steps", "attention_steps"):
        if key not in result:
            raise ValueError(f"result 缺少键 {key!r}：请传入 measure_sequence_mixing 的返回值")
    lengths = list(result["lengths"])
    if not lengths or any(len(result[k]) != len(lengths) for k in ("rnn_seconds", "attention_seconds")):
        raise ValueError("result 里 lengths 与耗时列表的长度应相同且不为空")
    if ax is None:
        fig, ax = new_figure((7.2, 3.8))
    else:
        fig = ax.figure
    rnn_ms = [1e3 * s for s in result["rnn_seconds"]]
    att_ms = [1e3 * s for s in result["attention_seconds"]]
    ax.plot(lengths, rnn_ms, "o-", color="C3", label="RNN：逐步递推（串行 T 步）")
    ax.plot(lengths, att_ms, "s-", color="C0", label="自注意力：一次矩阵乘法（串行 1 步）")
    for T, r, steps in zip(lengths, rnn_ms, result["rnn_steps"]):
        ax.annotate(f"{steps} 步", (T, r), textcoords="offset points", xytext=(0, 6), ha="center", fontsize=8,
                    color="C3")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xticks(lengths, [str(t) for t in lengths])
    ax.set_xlabel("序列长度 T")
    ax.set_ylabel("耗时（毫秒，中位数）")
    threads = result.get("threads")
    suffix = f"（本机实测，{threads} 个线程）" if threads else "（本机实测）"
    ax.set_title(title if title is not None else "让每个位置看到其他位置的代价" + suffix)
    ax.legend(loc="upper left", fontsize=9)
    ax.grid(alpha=0.3, which="both")
    return fig


def plot_length_generalization(results: dict, train_max_len: int, *, ylabel: str = "整句完全正确（%）",
                               title: str | None = None, ax=None):
    """每种位置编码一条“准确率–序列长度”曲线，并用竖线标出训练时见过的最大长度 ``train_max_len``。

    ``results`` 形如 ``{"正弦余弦": {长度: 准确率, …}, "可学习": {…}}``（准确率在 0 到 1 之间，画成百分数）。
    """
    if not results:
        raise ValueError("results 至少要有一种位置编码")
    positive_int("train_max_len", train_max_len)
    if ax is None:
        fig, ax = new_figure((7.2, 3.8))
    else:
        fig = ax.figure
    for i, (name, by_len) in enumerate(results.items()):
        lengths = sorted(int(t) for t in by_len)
        ax.plot(lengths, [100 * by_len[t] if t in by_len else 100 * by_len[str(t)] for t in lengths], "o-",
                color=f"C{i}", label=name)
    ax.axvline(train_max_len + 0.5, color="gray", ls="--", lw=1)
    ax.text(train_max_len + 0.6, 75, "训练时见过的\n最大长度之外 →", fontsize=8, color="gray", va="center")
    ax.set_ylim(-3, 103)
    ax.set_xlabel("序列长度")
    ax.set_ylabel(ylabel)
    ax.set_title(title if title is not None else "比训练更长的序列：不同位置编码的表现")
    ax.legend(loc="lower left", fontsize=9)
    ax.grid(alpha=0.3)
    return fig
