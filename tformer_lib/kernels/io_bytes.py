r"""闭式公式：每个内核读写多少字节的显存（HBM），作为 T、d 与块大小的函数（纯 Python，不需要 triton）。

每个公式都由内核的循环结构逐项推出，测试用 :func:`tformer_lib.kernels.io_count.count_hbm_bytes`
从内核自己的 ``tl.load``/``tl.store`` 数出字节数，逐字节核对。记号：元素字节数 e（float32 为 4），
``n_q = ⌈T_q / BLOCK_M⌉`` 是查询块数。每个（批, 头）：

* 朴素注意力 = 两次分块矩阵乘 + 一次逐行 softmax。矩阵乘 :math:`(M,K)(K,N)` 读
  :math:`e\,(MK\lceil N/B_N\rceil + KN\lceil M/B_M\rceil)`、写 :math:`eMN`；softmax 读写各 :math:`eT_qT_k`。
  其中 S 写一次、读一次，P 写一次、读 :math:`\lceil d/B_N\rceil` 次——这 :math:`\ge 4T_qT_k` 个元素随 T 平方增长。
* FlashAttention 前向：Q 读一次、O 写一次；第 m 块查询读前 :math:`\mathrm{end}_m` 个键和值，
  不因果时 :math:`\mathrm{end}_m = T_k`，因果时 :math:`\mathrm{end}_m = \min(T_k, (m+1)B_M)`。于是
  不因果：读 :math:`e\,d\,(T_q + 2 n_q T_k)`；因果（:math:`T_q = T_k = T`）：
  :math:`e\,d\,(T + 2(B_M n_q(n_q-1)/2 + T))`。**与 BLOCK_N 无关**：键块宽只决定每次读多少，
  不决定一共读几遍；决定重读次数的是 BLOCK_M——这就是第 8 章在线 softmax 的账：
  一块查询扫一遍全部键，片上只留 ``(m, l, acc)``，S 与 P 从不落到显存。
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from .._checks import positive_int

__all__ = ["vector_add_io_bytes", "softmax_io_bytes", "matmul_io_bytes", "naive_attention_io_bytes",
           "flash_attention_io_bytes", "attention_io_bytes", "flash_decoding_io_bytes"]

_INT32 = 4  # key_lengths / cache_lengths 以 int32 读入


def _traffic(read: int, write: int) -> dict:
    return {"read": int(read), "write": int(write), "total": int(read + write)}


def _add(*parts: dict) -> dict:
    return _traffic(sum(p["read"] for p in parts), sum(p["write"] for p in parts))


def _lengths(name: str, lengths, limit: int) -> list[int]:
    values = [int(n) for n in lengths]
    if not values or any(n < 0 or n > limit for n in values):
        raise ValueError(f"{name} 应是非空的整数序列，每个值在 [0, {limit}] 内，收到 {list(lengths)!r}")
    return values


def vector_add_io_bytes(n: int, *, element_bytes: int = 4) -> dict:
    """``x + y``：读 x、y 各 n 个元素，写 n 个。"""
    return _traffic(2 * n * element_bytes, n * element_bytes)


def softmax_io_bytes(rows: int, cols: int, *, element_bytes: int = 4) -> dict:
    """逐行 softmax：每个元素读一次、写一次（越界的列被掩码挡住，不算）。"""
    return _traffic(rows * cols * element_bytes, rows * cols * element_bytes)


def matmul_io_bytes(m: int, k: int, n: int, block_m: int, block_n: int, *, batch: int = 1, element_bytes: int = 4) -> dict:
    """``(M, K) @ (K, N)`` 的分块矩阵乘：A 被 ⌈N/BLOCK_N⌉ 列块各读一遍，B 被 ⌈M/BLOCK_M⌉ 行块各读一遍。"""
    positive_int("block_m", block_m)
    positive_int("block_n", block_n)
    read = m * k * math.ceil(n / block_n) + k * n * math.ceil(m / block_m)
    return _traffic(batch * read * element_bytes, batch * m * n * element_bytes)


def naive_attention_io_bytes(t_q: int, d: int, block_m: int, block_n: int, *, t_k: int | None = None,
                             batch: int = 1, n_heads: int = 1, element_bytes: int = 4) -> dict:
    """:func:`~tformer_lib.kernels.naive_attention`：S = QKᵀ、P = softmax(S)、O = PV 三次启动之和。

    多返回一项 ``"scores_and_weights"``：S 与 P 在显存里的来回（写 S、读 S、写 P、读 P）共多少字节。
    """
    t_k = t_q if t_k is None else t_k
    bh = batch * n_heads
    scores = matmul_io_bytes(t_q, d, t_k, block_m, block_n, batch=bh, element_bytes=element_bytes)
    softmax = softmax_io_bytes(bh * t_q, t_k, element_bytes=element_bytes)
    weighted = matmul_io_bytes(t_q, t_k, d, block_m, block_n, batch=bh, element_bytes=element_bytes)
    total = _add(scores, softmax, weighted)
    total["scores_and_weights"] = bh * t_q * t_k * element_bytes * (3 + math.ceil(d / block_n))
    return total


def flash_attention_io_bytes(t_q: int, d: int, block_m: int, *, t_k: int | None = None, causal: bool = False,
                             key_lengths: Sequence[int] | None = None, batch: int = 1, n_heads: int = 1,
                             element_bytes: int = 4) -> dict:
    """:func:`~tformer_lib.kernels.flash_attention` 的读写字节数（见模块说明的推导）。

    ``key_lengths``（长度为 ``batch`` 的整数序列）给出时，每条序列只读前 ``key_lengths[b]`` 个键，
    每个程序实例还读一个 int32 的长度。
    """
    positive_int("block_m", block_m)
    t_k = t_q if t_k is None else t_k
    lengths = [t_k] * batch if key_lengths is None else _lengths("key_lengths", key_lengths, t_k)
    if len(lengths) != batch:
        raise ValueError(f"key_lengths 应有 batch={batch} 个值，收到 {len(lengths)} 个")
    n_q = math.ceil(t_q / block_m)
    read = 0
    for n_keys in lengths:
        ends = [min(n_keys, (m + 1) * block_m) if causal else n_keys for m in range(n_q)]  # 第 m 块查询读到哪个键
        keys_read = sum(ends)
        read += n_heads * (t_q * d + 2 * keys_read * d) * element_bytes  # Q 一遍；K、V 各 Σ end_m 行
    if key_lengths is not None:
        read += batch * n_heads * n_q * _INT32  # 每个程序实例读一个长度
    return _traffic(read, batch * n_heads * t_q * d * element_bytes)


def attention_io_bytes(t: int, d: int, block_m: int, block_n: int, *, causal: bool = False, batch: int = 1,
                       n_heads: int = 1, element_bytes: int = 4) -> dict:
    """长 ``t`` 的自注意力，朴素（``"naive"``）与分块融合（``"tiled"``）各读写多少字节，以及两者之比。

    朴素路径两次矩阵乘的块为 ``block_m × block_n``；FlashAttention 的查询块为 ``block_m``，键块 ``block_n``
    不改变字节数（只改变每次读多少）。朴素路径的 softmax 总读整行，因此 ``causal`` 只减少 tiled 的字节。
    """
    positive_int("t", t)
    positive_int("d", d)
    naive = naive_attention_io_bytes(t, d, block_m, block_n, batch=batch, n_heads=n_heads, element_bytes=element_bytes)
    tiled = flash_attention_io_bytes(t, d, block_m, causal=causal, batch=batch, n_heads=n_heads,
                                     element_bytes=element_bytes)
    return {"naive": naive, "tiled": tiled, "ratio": naive["total"] / tiled["total"]}


def flash_decoding_io_bytes(cache_lengths: Sequence[int], t_max: int, d: int, split_size: int, *, n_heads: int = 1,
                            element_bytes: int = 4) -> dict:
    """:func:`~tformer_lib.kernels.flash_decoding` 两个内核的读写字节数之和。

    ``n_splits = ⌈T_max / split_size⌉``。每个（批, 头）：每段读一个 int32 长度和 q（d 个元素），
    K、V 各读有效的 ``cache_lengths[b]`` 行（每个键恰好一次），每段写 ``d + 2`` 个 float32 的运行量
    ``(acc, m, l)``；合并内核把它们读回来，写出 d 个元素。多返回一项 ``"partials"``：运行量一写一读的字节数。
    """
    positive_int("split_size", split_size)
    lengths = _lengths("cache_lengths", cache_lengths, t_max)
    n_splits = math.ceil(t_max / split_size)
    partial = n_splits * (d + 2) * 4  # 每个（批, 头）的运行量，float32
    read = write = 0
    for n_keys in lengths:
        read += n_heads * (n_splits * (_INT32 + d * element_bytes) + 2 * n_keys * d * element_bytes + partial)
        write += n_heads * (partial + d * element_bytes)
    result = _traffic(read, write)
    result["partials"] = 2 * partial * n_heads * len(lengths)
    return result
