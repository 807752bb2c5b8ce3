"""第一个内核：向量加法（vector add）——程序实例、块、偏移与掩码。

Triton 把一次启动（launch）拆成一格（grid）**程序实例**（program instance），每个实例处理一块
``BLOCK`` 个元素：``tl.program_id(0)`` 告诉它是第几块，``tl.arange(0, BLOCK)`` 给出块内偏移。
长度 n 不是 ``BLOCK`` 的倍数时，最后一块有一部分偏移越界，掩码（mask）``offs < n`` 让这些位置
既不读也不写——这一行就是 GPU 编程里最常见的错误发生的地方。
"""

from __future__ import annotations

import torch

from ._runtime import block_size, check_tensors, load_triton

triton, tl = load_triton()

__all__ = ["vector_add", "vector_add_reference"]


@triton.jit
def _add_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
    pid = tl.program_id(0)  # 第几块
    offs = pid * BLOCK + tl.arange(0, BLOCK)  # (BLOCK,) 这一块负责的下标
    mask = offs < n  # 最后一块可能越界
    x = tl.load(x_ptr + offs, mask=mask)  # 越界处不读
    y = tl.load(y_ptr + offs, mask=mask)
    tl.store(out_ptr + offs, x + y, mask=mask)  # 越界处不写


def vector_add_reference(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """PyTorch 参照：``x + y``。"""
    return x + y


def vector_add(x: torch.Tensor, y: torch.Tensor, *, block: int = 128) -> torch.Tensor:
    """用 Triton 内核算 ``x + y``（形状相同的任意张量，按元素）。``block`` 是每个程序实例处理的元素数。"""
    check_tensors(_add_kernel, ("x", x), ("y", y))
    if x.shape != y.shape:
        raise ValueError(f"x 与 y 的形状应相同，收到 x {tuple(x.shape)} 与 y {tuple(y.shape)}")
    block_size("block", block)
    x_flat, y_flat = x.contiguous().view(-1), y.contiguous().view(-1)  # (n,) 按内存顺序摊平
    out = torch.empty_like(x_flat)  # (n,)
    n = x_flat.numel()
    if n:
        _add_kernel[(triton.cdiv(n, block),)](x_flat, y_flat, out, n, BLOCK=block)
    return out.view(x.shape)  # 恢复原形状
