r"""第四个内核：FlashAttention 前向（forward）——把第 8 章的在线 softmax 写进一个内核。

一个程序实例负责一块 ``BLOCK_M`` 个查询（一个头里）：先把这块 Q 读进片上，然后沿键的方向每次读
``BLOCK_N`` 个键与值，算出这一小块分数 :math:`S = QK^\top/\sqrt{d}`，用与
:func:`tformer_lib.parts.flash.tiled_attention` 完全相同的三样运行量更新——运行最大值 ``m``、
分母 ``l``、累加器 ``acc``，旧量乘修正因子 :math:`e^{m_{old}-m_{new}}`。读完最后一块，``acc / l``
就是精确的注意力输出。分数表 S 与权重表 P 从不写回显存：这正是它比朴素注意力省下的字节
（:mod:`.io_bytes` 给出两者的闭式公式，:mod:`.io_count` 从内核自己的读写数出来核对）。

两种掩码：
* 因果（causal）：查询 i 只看键 j ≤ i。第 ``pid_m`` 块查询最远只看到键 ``(pid_m + 1)·BLOCK_M - 1``，
  所以循环到 ``end = (pid_m + 1)·BLOCK_M`` 就停——右上角整块整块的键根本不读；对角线上的块再逐元素屏蔽。
* 填充（padding）：``key_lengths[b]`` 给出第 b 条序列的有效键数，之后的键不读、不算。

整行都被屏蔽（有效键数为 0）时 ``l = 0``，输出 0 而不是 NaN，与库的显式路径一致。

解释器按 float32 逐位计算 ``tl.dot``；GPU 上 float32 的 ``tl.dot`` 默认用 TF32 张量核，
与 PyTorch 的差距会比在 CPU 上测得的大。
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from .._checks import attention_inputs, flag
from ._runtime import block_size, check_tensors, load_triton, next_power_of_2

triton, tl = load_triton()

__all__ = ["flash_attention", "attention_reference", "check_key_lengths"]


@triton.jit
def _flash_forward_kernel(q_ptr, k_ptr, v_ptr, o_ptr, lengths_ptr, T_q, T_k, D, H, scale,
                          CAUSAL: tl.constexpr, HAS_LENGTHS: tl.constexpr,
                          BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr):
    pid_m, bh = tl.program_id(0), tl.program_id(1)  # 第几块查询；第几个（批, 头）
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)  # (BLOCK_M,) 这块查询的位置
    offs_n = tl.arange(0, BLOCK_N)  # (BLOCK_N,) 键块内的偏移
    offs_d = tl.arange(0, BLOCK_D)  # (BLOCK_D,) ≥ D
    n_keys = T_k
    if HAS_LENGTHS:
        n_keys = tl.load(lengths_ptr + bh // H)  # 这条序列的有效键数（一个 int32）
    end = n_keys  # 读到哪个键为止（不含）
    if CAUSAL:
        end = tl.minimum(n_keys, (pid_m + 1) * BLOCK_M)  # 更靠后的键这块查询一个也看不见
    q_mask = (offs_m[:, None] < T_q) & (offs_d[None, :] < D)
    q = tl.load(q_ptr + bh * T_q * D + offs_m[:, None] * D + offs_d[None, :], mask=q_mask, other=0.0)  # (BLOCK_M, BLOCK_D)
    m = tl.full((BLOCK_M,), float("-inf"), tl.float32)  # 运行最大值
    l = tl.zeros((BLOCK_M,), tl.float32)  # 运行分母
    acc = tl.zeros((BLOCK_M, BLOCK_D), tl.float32)  # 累加器
    for start in range(0, end, BLOCK_N):
        keys = start + offs_n  # (BLOCK_N,)
        kv_mask = (keys[:, None] < end) & (offs_d[None, :] < D)  # 只读 end 之前的键
        k = tl.load(k_ptr + bh * T_k * D + keys[:, None] * D + offs_d[None, :], mask=kv_mask, other=0.0)  # (BLOCK_N, BLOCK_D)
        v = tl.load(v_ptr + bh * T_k * D + keys[:, None] * D + offs_d[None, :], mask=kv_mask, other=0.0)
        s = tl.dot(q, tl.trans(k)) * scale  # (BLOCK_M, BLOCK_N) 这一小块分数，只在片上
        keep = keys[None, :] < n_keys  # 填充掩码（也挡住块尾越界的键）
        if CAUSAL:
            keep = keep & (keys[None, :] <= offs_m[:, None])  # 因果掩码：对角线上的块需要
        s = tl.where(keep, s, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, axis=1))  # (BLOCK_M,)
        base = tl.where(m_new == float("-inf"), 0.0, m_new)  # 整行尚无可见键：避免 (-inf) - (-inf)
        p = tl.exp(s - base[:, None])  # 以新最大值为基准的未归一化权重
        correction = tl.exp(m - base)  # e^{m_old - m_new}
        l = l * correction + tl.sum(p, axis=1)
        acc = acc * correction[:, None] + tl.dot(p.to(v.dtype), v)
        m = m_new
    out = acc / tl.where(l == 0.0, 1.0, l)[:, None]  # 整行被屏蔽：l = 0，acc = 0，输出 0
    tl.store(o_ptr + bh * T_q * D + offs_m[:, None] * D + offs_d[None, :], out.to(o_ptr.dtype.element_ty), mask=q_mask)


def check_key_lengths(key_lengths, batch: int, t_k: int, device) -> torch.Tensor:
    """``key_lengths`` 应是 ``(B,)`` 的整数张量，每个值在 ``[0, t_k]`` 内；返回同设备的 int32 副本。"""
    if not isinstance(key_lengths, torch.Tensor) or key_lengths.dtype.is_floating_point or key_lengths.dtype == torch.bool:
        raise TypeError(f"key_lengths 应是整数类型的 torch.Tensor（每条序列的有效键数），收到 "
                        f"{getattr(key_lengths, 'dtype', type(key_lengths).__name__)}")
    if tuple(key_lengths.shape) != (batch,):
        raise ValueError(f"key_lengths 的形状应为 (B,) = ({batch},)，收到 {tuple(key_lengths.shape)}")
    if batch and (int(key_lengths.min()) < 0 or int(key_lengths.max()) > t_k):
        raise ValueError(f"key_lengths 的值应在 [0, {t_k}] 内，收到 {key_lengths.tolist()}")
    return key_lengths.to(device=device, dtype=torch.int32)


def attention_reference(q, k, v, *, causal: bool = False, key_lengths=None) -> torch.Tensor:
    """PyTorch 参照：``F.scaled_dot_product_attention`` 配上同样的因果/填充布尔掩码；整行被屏蔽处输出 0。"""
    t_q, t_k = q.shape[-2], k.shape[-2]
    keep = torch.ones(t_q, t_k, dtype=torch.bool, device=q.device)  # (T_q, T_k)
    if causal:
        keep = keep.tril()  # 查询 i 只看键 j ≤ i
    if key_lengths is not None:
        valid = torch.arange(t_k, device=q.device) < key_lengths.to(q.device)[:, None]  # (B, T_k)
        keep = keep & valid[:, None, None, :]  # (B, 1, T_q, T_k)
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=keep)
    return torch.where(keep.any(dim=-1, keepdim=True), out, torch.zeros_like(out))  # 整行被屏蔽 → 0


def flash_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool = False,
                    key_lengths: torch.Tensor | None = None, block_m: int = 32, block_n: int = 32) -> torch.Tensor:
    """FlashAttention 前向：``q`` ``(B, h, T_q, d)``，``k``/``v`` ``(B, h, T_k, d)``，返回 ``(B, h, T_q, d)``。

    ``causal=True``：查询 i 只看键 j ≤ i（左上角对齐，与 ``causal_mask`` 和 SDPA 的 ``is_causal`` 相同）；
    ``key_lengths``：``(B,)`` 整数，第 b 条序列只有前 ``key_lengths[b]`` 个键有效（填充掩码）。
    块大小是 2 的幂且至少 16；T、d 都不必是块大小的倍数。
    """
    check_tensors(_flash_forward_kernel, ("q", q), ("k", k), ("v", v), uses_dot=True)
    attention_inputs(q, k, v)
    flag("causal", causal)
    block_size("block_m", block_m, minimum=16)
    block_size("block_n", block_n, minimum=16)
    if q.dim() != 4 or k.shape != v.shape or q.shape[:2] != k.shape[:2] or q.shape[-1] != v.shape[-1]:
        raise ValueError(f"q 应为 (B, h, T_q, d)，k、v 应同为 (B, h, T_k, d)，收到 q {tuple(q.shape)}、"
                         f"k {tuple(k.shape)}、v {tuple(v.shape)}")
    batch, heads, t_q, d = q.shape
    t_k = k.shape[-2]
    lengths = None if key_lengths is None else check_key_lengths(key_lengths, batch, t_k, q.device)
    q3, k3, v3 = (x.contiguous().view(batch * heads, -1, d) for x in (q, k, v))  # (B·h, T, d)
    out = torch.empty_like(q3)  # (B·h, T_q, d)
    grid = (triton.cdiv(t_q, block_m), batch * heads)
    _flash_forward_kernel[grid](q3, k3, v3, out, q3 if lengths is None else lengths, t_q, t_k, d, heads,
                                1.0 / math.sqrt(d), CAUSAL=causal, HAS_LENGTHS=lengths is not None,
                                BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_D=next_power_of_2(d, minimum=16))
    return out.view(batch, heads, t_q, d)  # (B, h, T_q, d)
