r"""朴素注意力（naive attention）：用前面的两个内核拼出教科书里的三步，分数表 S 与权重表 P 都写回显存。

1. :math:`S = QK^\top`：分块矩阵乘，写出 ``(T_q, T_k)`` 的 S；
2. :math:`P = \mathrm{softmax}(S/\sqrt{d})`：逐行 softmax，读 S、写 P；
3. :math:`O = PV`：分块矩阵乘，读 P。

每一步单独看都是好内核，但 S、P 各在显存里走了一个来回——``4·T_q·T_k`` 个元素，随 T 平方增长。
FlashAttention（:mod:`.flash_forward`）把三步融合进一个内核，S、P 只在片上存在，于是这一项整个消失。
两条路径的字节数都由内核自己的读写数出（:func:`tformer_lib.kernels.io_count.count_hbm_bytes`），
并等于 :mod:`.io_bytes` 的闭式公式。这里只支持因果掩码（没有填充掩码）：它只是用来对照的基线。
"""

from __future__ import annotations

import math

import torch

from .._checks import attention_inputs, flag
from .tiled_matmul import matmul
from .softmax import softmax_rows

__all__ = ["naive_attention"]


def naive_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool = False,
                    block_m: int = 32, block_n: int = 32, block_k: int = 32) -> torch.Tensor:
    """``softmax(QKᵀ/√d)V``，由三次内核启动完成：``q`` ``(B, h, T_q, d)``，``k``/``v`` ``(B, h, T_k, d)``。

    ``block_m``/``block_n``/``block_k`` 是两次矩阵乘的块大小；softmax 一行一个程序实例。
    """
    attention_inputs(q, k, v)
    flag("causal", causal)
    if q.dim() != 4 or k.shape != v.shape or q.shape[:2] != k.shape[:2] or q.shape[-1] != v.shape[-1]:
        raise ValueError(f"q 应为 (B, h, T_q, d)，k、v 应同为 (B, h, T_k, d)，收到 q {tuple(q.shape)}、"
                         f"k {tuple(k.shape)}、v {tuple(v.shape)}")
    batch, heads, t_q, d = q.shape
    q3, k3, v3 = (x.contiguous().view(batch * heads, -1, d) for x in (q, k, v))  # (B·h, T, d)
    blocks = dict(block_m=block_m, block_n=block_n, block_k=block_k)
    s = matmul(q3, k3.transpose(1, 2), **blocks)  # (B·h, T_q, T_k)：S 写回显存；kᵀ 是视图，按步长读
    p = softmax_rows(s, scale=1.0 / math.sqrt(d), causal=causal)  # (B·h, T_q, T_k)：读 S，写 P
    out = matmul(p, v3, **blocks)  # (B·h, T_q, d)：读 P
    return out.view(batch, heads, t_q, d)  # (B, h, T_q, d)
