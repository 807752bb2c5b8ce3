r"""第五个内核：解码时的分段注意力（split-K attention，又名 FlashDecoding）。

为什么选它而不是 FlashAttention 的反向（backward）：这本书的第 13、14 章讲的是推理——一步解码里
每条序列只有 **一个** 新查询，却要看 K/V 缓存（KV cache）里的全部 T 个键。FlashAttention 前向按查询分块并行，
解码时格里只剩 ``B·h`` 个程序实例，每个实例独自把 T 个键从头扫到尾；GPU 有上百个流式多处理器（SM），
批小的时候大多数闲着。FlashDecoding 换一个方向切：把键切成 ``n_splits`` 段，每段一个程序实例，
格变成 ``(n_splits, B·h)``；每段各自做第 8 章的在线 softmax，写下自己的三样运行量 ``(m, l, acc)``；
第二个小内核再把各段合并——合并的公式就是在线 softmax 的修正因子：

.. math:: M = \max_s m_s,\quad L = \sum_s l_s e^{m_s - M},\quad o = \frac{\sum_s acc_s\, e^{m_s - M}}{L}.

多出来的显存流量只有每段 ``(d + 2)`` 个 float32 的一写一读，比读 K/V 缓存的 ``2·T·d`` 个元素小得多
（:func:`tformer_lib.kernels.io_bytes.flash_decoding_io_bytes`）。反向传播属于训练，书里的训练章节
用 PyTorch 自带的注意力反向就够了；解码内核则直接接上第 13 章的 K/V 缓存与第 14 章的解码提速。

只有一个查询，所以分数是矩阵–向量乘（GEMV）：``tl.sum(q[None, :] * k, axis=1)``，不用 ``tl.dot``
（它要求至少 16 行）；这也说明解码为什么是访存受限的——每读一个键只做 d 次乘加。
"""

from __future__ import annotations

import math

import torch

from ._runtime import block_size, check_tensors, load_triton, next_power_of_2
from .flash_forward import attention_reference, check_key_lengths

triton, tl = load_triton()

__all__ = ["flash_decoding", "decoding_reference"]


@triton.jit
def _split_kernel(q_ptr, k_ptr, v_ptr, lengths_ptr, m_ptr, l_ptr, acc_ptr, T_max, D, H, n_splits, scale,
                  SPLIT: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr):
    split, bh = tl.program_id(0), tl.program_id(1)  # 第几段键；第几个（批, 头）
    n_keys = tl.load(lengths_ptr + bh // H)  # 这条序列缓存里的有效键数
    start = split * SPLIT
    end = tl.minimum(n_keys, start + SPLIT)  # 这一段的键 [start, end)；可能为空
    offs_n, offs_d = tl.arange(0, BLOCK_N), tl.arange(0, BLOCK_D)
    d_mask = offs_d < D
    q = tl.load(q_ptr + bh * D + offs_d, mask=d_mask, other=0.0).to(tl.float32)  # (BLOCK_D,) 唯一的查询
    m = tl.full((), float("-inf"), tl.float32)  # 运行最大值（标量）
    l = tl.zeros((), tl.float32)  # 运行分母
    acc = tl.zeros((BLOCK_D,), tl.float32)  # 累加器
    for block_start in range(start, end, BLOCK_N):
        keys = block_start + offs_n  # (BLOCK_N,)
        kv_mask = (keys[:, None] < end) & d_mask[None, :]  # 只读本段的键
        k = tl.load(k_ptr + (bh * T_max + keys[:, None]) * D + offs_d[None, :], mask=kv_mask, other=0.0)
        v = tl.load(v_ptr + (bh * T_max + keys[:, None]) * D + offs_d[None, :], mask=kv_mask, other=0.0)
        s = tl.sum(q[None, :] * k.to(tl.float32), axis=1) * scale  # (BLOCK_N,) 矩阵–向量乘
        s = tl.where(keys < end, s, float("-inf"))  # 段尾越界的键不算
        m_new = tl.maximum(m, tl.max(s, axis=0))  # 这一段里的第一块一定有有效键，m_new 有限
        p = tl.exp(s - m_new)  # (BLOCK_N,)
        correction = tl.exp(m - m_new)  # e^{m_old - m_new}；第一块时 e^{-inf} = 0
        l = l * correction + tl.sum(p, axis=0)
        acc = acc * correction + tl.sum(p[:, None] * v.to(tl.float32), axis=0)  # (BLOCK_D,)
        m = m_new
    slot = bh * n_splits + split  # 这一段的运行量存在哪儿
    tl.store(m_ptr + slot, m)
    tl.store(l_ptr + slot, l)
    tl.store(acc_ptr + slot * D + offs_d, acc, mask=d_mask)


@triton.jit
def _combine_kernel(m_ptr, l_ptr, acc_ptr, o_ptr, n_splits, D, BLOCK_S: tl.constexpr, BLOCK_D: tl.constexpr):
    bh = tl.program_id(0)
    offs_s, offs_d = tl.arange(0, BLOCK_S), tl.arange(0, BLOCK_D)
    s_mask, d_mask = offs_s < n_splits, offs_d < D
    m = tl.load(m_ptr + bh * n_splits + offs_s, mask=s_mask, other=float("-inf"))  # (BLOCK_S,) 各段最大值
    l = tl.load(l_ptr + bh * n_splits + offs_s, mask=s_mask, other=0.0)  # (BLOCK_S,) 各段分母
    acc = tl.load(acc_ptr + (bh * n_splits + offs_s[:, None]) * D + offs_d[None, :],
                  mask=s_mask[:, None] & d_mask[None, :], other=0.0)  # (BLOCK_S, BLOCK_D) 各段累加器
    m_all = tl.max(m, axis=0)  # M = max_s m_s
    w = tl.exp(m - tl.where(m_all == float("-inf"), 0.0, m_all))  # (BLOCK_S,) e^{m_s - M}；空段为 0
    l_all = tl.sum(l * w, axis=0)  # L
    out = tl.sum(acc * w[:, None], axis=0) / tl.where(l_all == 0.0, 1.0, l_all)  # 没有有效键：输出 0
    tl.store(o_ptr + bh * D + offs_d, out.to(o_ptr.dtype.element_ty), mask=d_mask)


def decoding_reference(q, k_cache, v_cache, cache_lengths) -> torch.Tensor:
    """PyTorch 参照：一个查询对前 ``cache_lengths[b]`` 个缓存键的 SDPA；``q`` ``(B, h, d)`` → ``(B, h, d)``。"""
    return attention_reference(q[:, :, None, :], k_cache, v_cache, key_lengths=cache_lengths)[:, :, 0, :]


def flash_decoding(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, cache_lengths: torch.Tensor, *,
                   split_size: int = 64, block_n: int = 16) -> torch.Tensor:
    """一步解码的注意力：``q`` ``(B, h, d)``（每条序列一个新查询），``k_cache``/``v_cache`` ``(B, h, T_max, d)``，
    ``cache_lengths`` ``(B,)`` 给出每条序列缓存里的有效键数；返回 ``(B, h, d)``。

    键按 ``split_size`` 个一段切开（``n_splits = ⌈T_max / split_size⌉``），每段内每次读 ``block_n`` 个键。
    ``split_size`` 须是 ``block_n`` 的倍数，两者都是 2 的幂。
    """
    check_tensors(_split_kernel, ("q", q), ("k_cache", k_cache), ("v_cache", v_cache))
    block_size("block_n", block_n)
    block_size("split_size", split_size)
    if split_size % block_n:
        raise ValueError(f"split_size 应是 block_n 的倍数，收到 split_size={split_size}、block_n={block_n}")
    if q.dim() != 3 or k_cache.dim() != 4 or k_cache.shape != v_cache.shape or k_cache.shape[:2] != q.shape[:2] \
            or k_cache.shape[-1] != q.shape[-1]:
        raise ValueError(f"q 应为 (B, h, d)，k_cache、v_cache 应同为 (B, h, T_max, d)，收到 q {tuple(q.shape)}、"
                         f"k_cache {tuple(k_cache.shape)}、v_cache {tuple(v_cache.shape)}")
    batch, heads, t_max, d = k_cache.shape
    if t_max == 0 or d == 0:
        raise ValueError(f"k_cache 的 T_max 与 d 至少为 1，收到形状 {tuple(k_cache.shape)}")
    lengths = check_key_lengths(cache_lengths, batch, t_max, q.device)
    n_splits = triton.cdiv(t_max, split_size)
    q2 = q.contiguous().view(batch * heads, d)  # (B·h, d)
    k3, v3 = (x.contiguous().view(batch * heads, t_max, d) for x in (k_cache, v_cache))  # (B·h, T_max, d)
    m = torch.empty(batch * heads, n_splits, dtype=torch.float32, device=q.device)  # (B·h, n_splits)
    l = torch.empty_like(m)  # (B·h, n_splits)
    acc = torch.empty(batch * heads, n_splits, d, dtype=torch.float32, device=q.device)  # (B·h, n_splits, d)
    block_d = next_power_of_2(d)
    _split_kernel[(n_splits, batch * heads)](q2, k3, v3, lengths, m, l, acc, t_max, d, heads, n_splits,
                                             1.0 / math.sqrt(d), SPLIT=split_size, BLOCK_N=block_n, BLOCK_D=block_d)
    out = torch.empty_like(q2)  # (B·h, d)
    _combine_kernel[(batch * heads,)](m, l, acc, out, n_splits, d, BLOCK_S=next_power_of_2(n_splits), BLOCK_D=block_d)
    return out.view(batch, heads, d)  # (B, h, d)
