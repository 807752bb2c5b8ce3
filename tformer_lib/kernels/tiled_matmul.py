r"""第三个内核：分块矩阵乘（tiled matmul）:math:`C = AB`——二维的格、沿 K 的循环与 ``tl.dot``。

每个程序实例负责 C 的一块 ``BLOCK_M × BLOCK_N``：沿公共维 K 每次读 A 的一条 ``BLOCK_M × BLOCK_K``
和 B 的一条 ``BLOCK_K × BLOCK_N``，用 ``tl.dot`` 乘起来累加到 float32 的累加器里，最后写一次。
于是 A 的每个元素被读 :math:`\lceil N/\mathrm{BLOCK\_N}\rceil` 次，B 的每个元素被读
:math:`\lceil M/\mathrm{BLOCK\_M}\rceil` 次（见 :func:`tformer_lib.kernels.io_bytes.matmul_io_bytes`）：
块越大，重复读越少，但一块要占的片上存储越多——这是所有分块算法的同一笔账。

输入可带一个批维度 ``(Bt, M, K) @ (Bt, K, N)``（格的第三维），并按步长（stride）寻址：
``B`` 可以是转置视图（如 ``k.transpose(-2, -1)``），不必先拷贝成连续的。
"""

from __future__ import annotations

import torch

from ._runtime import block_size, check_tensors, load_triton

triton, tl = load_triton()

__all__ = ["matmul", "matmul_reference"]


@triton.jit
def _matmul_kernel(a_ptr, b_ptr, c_ptr, M, N, K,
                   stride_ab, stride_am, stride_ak, stride_bb, stride_bk, stride_bn, stride_cb, stride_cm, stride_cn,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    pid_m, pid_n, batch = tl.program_id(0), tl.program_id(1), tl.program_id(2)  # C 的第几块、第几个矩阵
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)  # (BLOCK_M,) C 的行
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)  # (BLOCK_N,) C 的列
    offs_k = tl.arange(0, BLOCK_K)  # (BLOCK_K,) 公共维内的偏移
    a_ptrs = a_ptr + batch * stride_ab + offs_m[:, None] * stride_am + offs_k[None, :] * stride_ak  # (BLOCK_M, BLOCK_K)
    b_ptrs = b_ptr + batch * stride_bb + offs_k[:, None] * stride_bk + offs_n[None, :] * stride_bn  # (BLOCK_K, BLOCK_N)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        a = tl.load(a_ptrs, mask=(offs_m[:, None] < M) & (offs_k[None, :] < K - k0), other=0.0)  # 行、K 越界补 0
        b = tl.load(b_ptrs, mask=(offs_k[:, None] < K - k0) & (offs_n[None, :] < N), other=0.0)  # K、列越界补 0
        acc += tl.dot(a, b)  # 补的 0 对乘积没有贡献
        a_ptrs += BLOCK_K * stride_ak  # 沿 K 前进一块
        b_ptrs += BLOCK_K * stride_bk
    c_ptrs = c_ptr + batch * stride_cb + offs_m[:, None] * stride_cm + offs_n[None, :] * stride_cn
    tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=(offs_m[:, None] < M) & (offs_n[None, :] < N))  # 只写 C 之内


def matmul_reference(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """PyTorch 参照：``a @ b``。"""
    return a @ b


def matmul(a: torch.Tensor, b: torch.Tensor, *, block_m: int = 32, block_n: int = 32, block_k: int = 32) -> torch.Tensor:
    """用 Triton 内核算 ``a @ b``：``(M, K) @ (K, N)`` 或带批维度的 ``(Bt, M, K) @ (Bt, K, N)``。

    块大小是 2 的幂且至少 16（``tl.dot`` 的要求）；M、N、K 不必是块大小的倍数。
    """
    check_tensors(_matmul_kernel, ("a", a), ("b", b), uses_dot=True)
    for name, value in (("block_m", block_m), ("block_n", block_n), ("block_k", block_k)):
        block_size(name, value, minimum=16)
    if a.dim() not in (2, 3) or b.dim() != a.dim():
        raise ValueError(f"a、b 应同为 (M, K)/(K, N) 或 (Bt, M, K)/(Bt, K, N)，收到 a {tuple(a.shape)} 与 b {tuple(b.shape)}")
    if a.shape[-1] != b.shape[-2] or a.shape[:-2] != b.shape[:-2]:
        raise ValueError(f"a 的最后一维（K）应等于 b 的倒数第二维，批维度也应相同，收到 a {tuple(a.shape)} 与 b {tuple(b.shape)}")
    a3, b3 = (a, b) if a.dim() == 3 else (a.unsqueeze(0), b.unsqueeze(0))  # (Bt, M, K), (Bt, K, N)
    (batch, m, k), n = a3.shape, b3.shape[-1]
    c = torch.empty(batch, m, n, dtype=a.dtype, device=a.device)  # (Bt, M, N)
    if batch and m and n:
        grid = (triton.cdiv(m, block_m), triton.cdiv(n, block_n), batch)
        _matmul_kernel[grid](a3, b3, c, m, n, k, *a3.stride(), *b3.stride(), *c.stride(),
                             BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k)
    return c if a.dim() == 3 else c.squeeze(0)  # (M, N) 或 (Bt, M, N)
