"""第 15 章的图：朴素注意力与 FlashAttention 的显存（HBM）读写字节，随序列长度 T 与块大小变化。

纯函数：数据来自 :mod:`tformer_lib.kernels.io_bytes` 的闭式公式（不需要 triton）；用解释器从内核
自己的读写数出的字节数（:func:`tformer_lib.kernels.count_hbm_bytes`）可以作为 ``counted`` 画成点，
它们应正好落在线上。
"""

from __future__ import annotations

from collections.abc import Sequence

from tformer_lib._checks import positive_ints
from tformer_lib._checks import positive_int
from tformer_lib.plotting._common import new_figure

__all__ = ["attention_io_table", "plot_attention_io"]

_NAIVE, _TILED = "#d62728", ("#1f77b4", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b")


def attention_io_table(lengths: Sequence[int], d: int, block_ms: Sequence[int], *, naive_block: int = 64,
                       causal: bool = False, element_bytes: int = 4) -> dict:
    """画图用的数：``{"naive": [每个 T 的总字节], "scores_and_weights": […], block_m: […] 每个查询块大小一行}``。"""
    from tformer_lib.kernels.io_bytes import flash_attention_io_bytes, naive_attention_io_bytes

    lengths, block_ms = positive_ints("lengths", lengths), positive_ints("block_ms", block_ms)
    positive_int("d", d)
    positive_int("naive_block", naive_block)
    naive = [naive_attention_io_bytes(t, d, naive_block, naive_block, element_bytes=element_bytes) for t in lengths]
    table = {"naive": [n["total"] for n in naive], "scores_and_weights": [n["scores_and_weights"] for n in naive]}
    for block_m in block_ms:
        table[block_m] = [flash_attention_io_bytes(t, d, block_m, causal=causal, element_bytes=element_bytes)["total"]
                          for t in lengths]
    return table


def plot_attention_io(lengths: Sequence[int] = (128, 256, 512, 1024, 2048, 4096), d: int = 64,
                      block_ms: Sequence[int] = (32, 64, 128), *, naive_block: int = 64, causal: bool = False,
                      element_bytes: int = 4, counted: Sequence[tuple] | None = None, unit: float = 2**20,
                      title: str | None = None):
    """左：一个头的注意力读写多少显存（对数坐标）；右：朴素 ÷ 分块，即 FlashAttention 省下的倍数。

    红线是朴素注意力（S、P 写回显存，两次矩阵乘的块为 ``naive_block``²），虚线是其中 S、P 的来回；
    其余每条线是一个查询块大小 ``BLOCK_M`` 的 FlashAttention（键块大小不影响字节数）。
    ``counted`` 是 ``(T, block_m 或 None, 字节数)`` 的列表——``None`` 表示朴素路径——画成叉号，
    它们来自解释器里数出的真实读写，应落在对应的线上。
    """
    table = attention_io_table(lengths, d, block_ms, naive_block=naive_block, causal=causal,
                               element_bytes=element_bytes)
    if not unit > 0:
        raise ValueError(f"unit 应为正数，收到 {unit!r}")
    lengths = list(lengths)
    fig, axes = new_figure((10.0, 4.2), 1, 2)
    left, right = axes[0]
    left.plot(lengths, [b / unit for b in table["naive"]], "o-", color=_NAIVE, label="朴素：S、P 写回显存")
    left.plot(lengths, [b / unit for b in table["scores_and_weights"]], ":", color=_NAIVE, label="其中 S、P 的来回")
    for i, block_m in enumerate(block_ms):
        color = _TILED[i % len(_TILED)]
        left.plot(lengths, [b / unit for b in table[block_m]], "s--", color=color, label=f"FlashAttention BLOCK_M={block_m}")
        right.plot(lengths, [n / t for n, t in zip(table["naive"], table[block_m])], "s-", color=color,
                   label=f"BLOCK_M={block_m}")
    for t, block_m, n_bytes in counted or ():
        color = _NAIVE if block_m is None else _TILED[list(block_ms).index(block_m) % len(_TILED)]
        left.plot([t], [n_bytes / unit], "x", color=color, ms=10, mew=2)
    if counted:
        left.plot([], [], "kx", ms=8, mew=2, label="解释器里数出的字节")
    unit_name = {2**20: "MiB", 2**10: "KiB", 1: "字节"}.get(unit, f"×{unit:g} 字节")
    for ax in (left, right):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("序列长度 T")
        ax.grid(alpha=0.3, which="both")
    left.set_yscale("log")
    left.set_ylabel(f"显存读写（{unit_name}，一个头，d={d}）")
    left.legend(fontsize=8)
    right.set_ylabel("朴素 ÷ FlashAttention")
    right.axhline(1, color="#555555", lw=1)
    right.legend(fontsize=8)
    fig.suptitle(title or ("注意力的显存读写：" + ("因果" if causal else "不带掩码")
                           + "，FlashAttention 不写 S 与 P"))
    return fig
