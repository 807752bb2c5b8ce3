"""第 17 章（微调）的图：学到的与忘掉的——每种方法、每个种子一个点。

纯函数：数据是 ``python -m tformer_lib.finetune.measure`` 结果文件里的 ``rows``，画图函数自己不训练、不计时。
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from tformer_lib.plotting._common import check_result_rows, new_figure

__all__ = ["plot_finetune_tradeoff"]

_NEEDED = ("name", "target_test", "others_test", "trainable")
_COLORS = {"base": "#555555", "full": "#d62728", "lora": "#1f77b4", "qlora": "#2ca02c"}


def plot_finetune_tradeoff(rows: Sequence[Mapping], *, author: str = "杜甫", title: str | None = None):
    """横轴：目标诗人 test 诗上的困惑度（越左学得越多）；纵轴：其他诗人 test 诗上的困惑度（越高忘得越多）。

    每个点是一次运行（一种方法、一个种子），同一种方法的点连成一条短线，线的长度就是种子之间的差别；
    旁边标出方法名与可训练参数个数。底座是一个灰色的方块。
    """
    rows = check_result_rows(rows, _NEEDED, "finetune.json")
    groups: dict[str, list[Mapping]] = {}
    for row in rows:
        groups.setdefault(str(row["name"]), []).append(row)
    fig, axes = new_figure((7.6, 5.0))
    ax = axes
    for name, runs in groups.items():
        kind = str(runs[0].get("method", name.split("-")[0]))
        color = _COLORS.get(kind, "#9467bd")
        xs, ys = [r["target_test"] for r in runs], [r["others_test"] for r in runs]
        marker = "s" if kind == "base" else "o"
        ax.plot(xs, ys, marker=marker, linestyle="-", color=color, markersize=7, alpha=0.9)
        label = name if kind == "base" else f"{name}（{runs[0]['trainable']:,} 个参数）"
        offset = (7, -14) if kind == "qlora" else (7, 5)  # QLoRA 与同秩的 LoRA 几乎重合：标签放到下方
        ax.annotate(label, (sum(xs) / len(xs), sum(ys) / len(ys)), textcoords="offset points", xytext=offset,
                    fontsize=9, color=color)
    ax.set_xlabel(f"{author}的 test 诗：困惑度（越低 = 学到越多）")
    ax.set_ylabel("其他诗人的 test 诗：困惑度（越高 = 忘得越多）")
    ax.grid(alpha=0.3)
    ax.margins(x=0.25, y=0.12)
    ax.set_title(title or f"微调的得与失：在{author}的诗上训练（每个点一个种子）")
    return fig
