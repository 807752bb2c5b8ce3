r"""第二个内核：融合的逐行 softmax（fused row softmax）——一个程序实例处理一整行。

PyTorch 的 ``torch.softmax`` 在 GPU 上也是一个内核，但“缩放 → 掩码 → 减最大值 → exp → 求和 → 相除”
若一步一个运算去写，每一步都要把整张表从显存读一遍、写一遍。融合（fusion）之后，一行只读一次、写一次：
``BLOCK_N`` 取不小于行长的 2 的幂，整行留在片上。越界的列以 ``-inf`` 读入，``exp`` 之后恰为 0，
不影响最大值和分母。减去最大值（max-subtraction）保证 :math:`e^{x-m} \le 1`，不会上溢——第 3 章的老规矩。

``causal=True`` 时第 i 行只保留前 ``i + 1`` 列（因果掩码），供“朴素注意力”（:mod:`.naive`）
直接在分数表 S 上用；整行仍然读入、整行写出，和 PyTorch 的做法一样。
"""

from __future__ import annotations

import torch

from .._checks import finite_positive, flag
from ._runtime import check_tensors, load_triton, next_power_of_2

triton, tl = load_triton()

__all__ = ["softmax_rows", "softmax_rows_reference"]


@triton.jit
def softmax_kernel(x_ptr, out_ptr, n_cols, n_rows_per_matrix, stride_x, stride_out, scale,
                    CAUSAL: tl.constexpr, BLOCK_N: tl.constexpr):
    row = tl.program_id(0)  # 一个程序实例 = 一行
    cols = tl.arange(0, BLOCK_N)  # (BLOCK_N,) ≥ n_cols
    in_row = cols < n_cols  # 越界的列
    x = tl.load(x_ptr + row * stride_x + cols, mask=in_row, other=float("-inf"))  # 越界读成 -inf
    x = x.to(tl.float32) * scale
    if CAUSAL:
        i = row % n_rows_per_matrix  # 这一行在自己的 (M, N) 矩阵里是第 i 行
        x = tl.where(cols <= i, x, float("-inf"))  # 因果：第 i 行只看列 ≤ i
    m = tl.max(x, axis=0)  # 行最大值
    num = tl.exp(x - m)  # 减最大值再取 exp：≤ 1，不会上溢；-inf → 0
    out = num / tl.sum(num, axis=0)
    tl.store(out_ptr + row * stride_out + cols, out.to(out_ptr.dtype.element_ty), mask=in_row)  # 只写行内


def softmax_rows_reference(x: torch.Tensor, *, scale: float = 1.0, causal: bool = False) -> torch.Tensor:
    """PyTorch 参照：``softmax(scale · x)`` 沿最后一维；``causal`` 时先把列 > 行的位置填 ``-inf``。"""
    s = x.float() * scale
    if causal:
        keep = torch.ones(x.shape[-2:], dtype=torch.bool, device=x.device).tril()  # (M, N) 下三角
        s = s.masked_fill(~keep, float("-inf"))
    return s.softmax(dim=-1).to(x.dtype)


def softmax_rows(x: torch.Tensor, *, scale: float = 1.0, causal: bool = False) -> torch.Tensor:
    """用 Triton 内核沿最后一维做 ``softmax(scale · x)``；``x`` 形如 ``(..., M, N)``，行内元素连续。

    ``causal=True`` 时第 i 行（每个 ``(M, N)`` 矩阵内的行号）只保留列 ≤ i。
    """
    check_tensors(softmax_kernel, ("x", x))
    flag("causal", causal)
    finite_positive("scale", scale)
    if x.dim() < 1 or x.shape[-1] == 0:
        raise ValueError(f"x 的最后一维（行长）应至少为 1，收到形状 {tuple(x.shape)}")
    if causal and x.dim() < 2:
        raise ValueError(f"causal=True 时 x 应形如 (..., M, N)，收到形状 {tuple(x.shape)}")
    n_cols = x.shape[-1]
    n_rows_per_matrix = x.shape[-2] if x.dim() >= 2 else 1
    rows = x.contiguous().view(-1, n_cols)  # (R, N)：所有行摞在一起
    out = torch.empty_like(rows)  # (R, N)
    if rows.shape[0]:
        softmax_kernel[(rows.shape[0],)](rows, out, n_cols, n_rows_per_matrix, rows.stride(0), out.stride(0),
                                          float(scale), CAUSAL=causal, BLOCK_N=next_power_of_2(n_cols))
    return out.view(x.shape)  # 恢复原形状
