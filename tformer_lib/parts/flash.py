r"""在线 softmax（online softmax）与 FlashAttention 的核心思想，用纯 PyTorch 逐块（tile）实现。

显式注意力要先把整张 ``(T_q, T_k)`` 分数表放进内存，再做 softmax。FlashAttention 的想法是：
把键/值切成宽 ``block_size`` 的小块，一块一块地读；每读一块，就更新三样“运行中”的量——

* 运行最大值（running max）``m``：到目前为止见过的最大分数，用来保证 ``exp`` 不溢出；
* 归一化分母（normaliser）``l``：到目前为止的 :math:`\sum_j e^{s_j - m}`；
* 累加器（accumulator）``acc``：到目前为止的 :math:`\sum_j e^{s_j - m} v_j`。

当新的一块带来更大的最大值 ``m_new`` 时，旧的 ``l`` 与 ``acc`` 都乘上修正因子
:math:`e^{m_{old} - m_{new}}`，就像它们一开始就是以 ``m_new`` 为基准算的。读完最后一块，
``acc / l`` 就是精确的注意力输出——不是近似。内存里任何时刻只有 ``(T_q, block_size)`` 的一小块分数。

这里用 PyTorch 张量运算写出算法本身，便于阅读和验证；真正的 FlashAttention 把同样的循环写进一个
GPU 内核，让小块留在片上高速缓存（SRAM）里，省掉的是显存读写。
"""

from __future__ import annotations

import math

import torch

from .._checks import attention_inputs, bool_mask, positive_int

__all__ = ["online_softmax", "tiled_attention"]


def _safe_max(m: torch.Tensor) -> torch.Tensor:
    """把 ``-inf`` 换成 0 的最大值，用作减数：避免 ``(-inf) - (-inf) = nan``（整块都被屏蔽时）。"""
    return torch.where(torch.isneginf(m), torch.zeros_like(m), m)


def online_softmax(
    x: torch.Tensor, block_size: int, dim: int = -1, return_trace: bool = False
) -> torch.Tensor | tuple[torch.Tensor, list[dict[str, torch.Tensor]]]:
    r"""沿 ``dim`` 做 softmax，但只**扫一遍**输入、每次读 ``block_size`` 个数来求最大值与分母。

    第 j 块读入后：:math:`m \leftarrow \max(m, \max_{i\in j} x_i)`，
    :math:`l \leftarrow l\,e^{m_{old}-m} + \sum_{i\in j} e^{x_i-m}`。
    扫完后输出 :math:`e^{x - m}/l`，与 ``torch.softmax(x, dim)`` 相同（含 ``-inf`` 屏蔽的元素）。

    ``return_trace=True`` 时还返回每块读完后的 ``{"m": …, "l": …}`` 列表（形状同去掉 ``dim`` 后的 x），
    供画出“运行最大值”如何一步步变化。整行都是 ``-inf`` 时输出全 0（``torch.softmax`` 给 nan）。
    """
    if not isinstance(x, torch.Tensor) or not x.is_floating_point():
        raise TypeError(f"x 应是浮点类型的 torch.Tensor，收到 {getattr(x, 'dtype', type(x).__name__)}")
    positive_int("block_size", block_size)
    if x.dim() == 0 or x.shape[dim] == 0:
        raise ValueError(f"x 在 dim={dim} 这一维上不能为空，收到形状 {tuple(x.shape)}")
    z = x.movedim(dim, -1)  # (..., n)：把要归一化的维度挪到最后
    n = z.shape[-1]
    m = torch.full(z.shape[:-1], float("-inf"), dtype=z.dtype, device=z.device)  # (...,) 运行最大值
    l = torch.zeros(z.shape[:-1], dtype=z.dtype, device=z.device)  # (...,) 运行分母
    trace = []
    for start in range(0, n, block_size):
        tile = z[..., start:start + block_size]  # (..., b)：这一块，b ≤ block_size
        m_new = torch.maximum(m, tile.max(dim=-1).values)  # (...,)
        base = _safe_max(m_new)  # (...,)
        # 旧分母按新最大值重新标定，再加上这一块的贡献
        l = l * torch.exp(m - base) + torch.exp(tile - base.unsqueeze(-1)).sum(dim=-1)  # (...,)
        m = m_new
        if return_trace:
            trace.append({"m": m.clone(), "l": l.clone()})
    safe_l = torch.where(l == 0, torch.ones_like(l), l)  # 整行 -inf：l = 0，输出 0 而不是 nan
    out = torch.exp(z - _safe_max(m).unsqueeze(-1)) / safe_l.unsqueeze(-1)  # (..., n)
    out = out.movedim(-1, dim)  # 挪回原来的维度顺序
    return (out, trace) if return_trace else out


def tiled_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor | None = None,
    block_size: int = 64,
    return_trace: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, list[dict[str, torch.Tensor]]]:
    r"""逐块计算 :math:`\mathrm{softmax}(QK^\top/\sqrt{d_k})V`，结果与显式路径相同，但从不构造完整的分数表。

    形状与 :func:`tformer_lib.scaled_dot_product_attention` 相同：``q`` ``(..., T_q, d_k)``，
    ``k`` ``(..., T_k, d_k)``，``v`` ``(..., T_k, d_v)``；``mask`` 为布尔（True = 可以关注），
    能广播到 ``(..., T_q, T_k)``。返回 ``(..., T_q, d_v)``；整行都被屏蔽的查询输出全 0。

    ``block_size`` 是每次读入的键/值个数，不必整除 T_k（最后一块可以短一些）。
    ``return_trace=True`` 时还返回每块之后的 ``{"m", "l", "start", "stop"}`` 列表
    （``m``、``l`` 形状 ``(..., T_q)``），供画图。
    """
    attention_inputs(q, k, v)  # 与显式路径相同的形状检查
    positive_int("block_size", block_size)
    t_q, t_k = q.shape[-2], k.shape[-2]
    batch_shape = torch.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2])
    if mask is not None:
        bool_mask("mask", mask, (*batch_shape, t_q, t_k))
        mask = mask.expand(*batch_shape, t_q, t_k)  # (..., T_q, T_k)：广播成完整形状，方便按列切块
    scale = 1.0 / math.sqrt(q.shape[-1])

    m = torch.full((*batch_shape, t_q), float("-inf"), dtype=q.dtype, device=q.device)  # (..., T_q) 运行最大值
    l = torch.zeros((*batch_shape, t_q), dtype=q.dtype, device=q.device)  # (..., T_q) 运行分母
    acc = torch.zeros((*batch_shape, t_q, v.shape[-1]), dtype=q.dtype, device=q.device)  # (..., T_q, d_v)
    trace = []
    for start in range(0, t_k, block_size):
        stop = min(start + block_size, t_k)
        k_tile = k[..., start:stop, :]  # (..., b, d_k)：这一块的键
        v_tile = v[..., start:stop, :]  # (..., b, d_v)：这一块的值
        s = q @ k_tile.transpose(-2, -1) * scale  # (..., T_q, b)：只有这一小块分数
        if mask is not None:
            s = s.masked_fill(~mask[..., start:stop], float("-inf"))  # 被屏蔽的分数 → -inf，exp 后恰为 0
        m_new = torch.maximum(m, s.max(dim=-1).values)  # (..., T_q)
        base = _safe_max(m_new)  # (..., T_q)
        p = torch.exp(s - base.unsqueeze(-1))  # (..., T_q, b)：以新最大值为基准的未归一化权重
        correction = torch.exp(m - base)  # (..., T_q)：旧累计量改用新基准的修正因子 e^{m_old - m_new}
        l = l * correction + p.sum(dim=-1)  # (..., T_q)
        acc = acc * correction.unsqueeze(-1) + p @ v_tile  # (..., T_q, d_v)
        m = m_new
        if return_trace:
            trace.append({"m": m.clone(), "l": l.clone(), "start": start, "stop": stop})
    safe_l = torch.where(l == 0, torch.ones_like(l), l)  # 整行被屏蔽：l = 0，acc = 0，输出 0
    out = acc / safe_l.unsqueeze(-1)  # (..., T_q, d_v)
    return (out, trace) if return_trace else out
