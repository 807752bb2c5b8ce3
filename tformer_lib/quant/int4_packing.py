"""int4 的打包（packing）：两个 4 位整数装进一个 uint8 字节。

取值 q ∈ [−8, 7] 先加 8 变成无符号的 u ∈ [0, 15]（4 位）；沿最后一维相邻的两个数 ``(u[2i], u[2i+1])`` 合成一个字节
``u[2i] | (u[2i+1] << 4)``——偶数下标放低 4 位，奇数下标放高 4 位。最后一维长度为奇数时末尾补一个 0 再打包，
所以 n 个数占 ⌈n/2⌉ 字节；解包时给出原来的长度 n，把补的那半个字节去掉。
"""

from __future__ import annotations

import torch

from .._checks import non_negative_int

__all__ = ["pack_int4", "unpack_int4", "packed_length"]

_OFFSET = 8  # q + 8：把 [−8, 7] 移到 [0, 15]


def packed_length(n: int) -> int:
    """n 个 int4 数打包后的字节数 ⌈n/2⌉。"""
    return (n + 1) // 2


def pack_int4(q: torch.Tensor) -> torch.Tensor:
    """``q``：整数张量，取值在 [−8, 7]，形状 ``(..., n)`` → uint8 ``(..., ⌈n/2⌉)``。"""
    if not isinstance(q, torch.Tensor) or q.dtype.is_floating_point or q.dtype == torch.bool:
        raise TypeError(f"q 应是整数张量，收到 {getattr(q, 'dtype', type(q).__name__)}")
    if q.dim() == 0:
        raise ValueError("q 至少要有一维（沿最后一维打包）")
    if q.numel() and (int(q.min()) < -8 or int(q.max()) > 7):
        raise ValueError(f"q 的取值应在 int4 的 [-8, 7] 内，收到 [{int(q.min())}, {int(q.max())}]")
    u = (q.to(torch.int16) + _OFFSET).to(torch.uint8)  # (..., n)，取值 [0, 15]
    if u.shape[-1] % 2:
        u = torch.cat([u, u.new_zeros(*u.shape[:-1], 1)], dim=-1)  # (..., n + 1)：补半个字节
    return u[..., 0::2] | (u[..., 1::2] << 4)  # (..., ⌈n/2⌉)：偶数下标在低 4 位，奇数下标在高 4 位


def unpack_int4(packed: torch.Tensor, n: int) -> torch.Tensor:
    """:func:`pack_int4` 的逆：uint8 ``(..., ⌈n/2⌉)`` → int8 ``(..., n)``，取值 [−8, 7]。"""
    if not isinstance(packed, torch.Tensor) or packed.dtype != torch.uint8:
        raise TypeError(f"packed 应是 uint8 张量，收到 {getattr(packed, 'dtype', type(packed).__name__)}")
    if packed.dim() == 0:
        raise ValueError("packed 至少要有一维（沿最后一维解包）")
    n = non_negative_int("n", n)
    if packed_length(n) != packed.shape[-1]:
        raise ValueError(f"n={n!r} 与 packed 的最后一维 {packed.shape[-1]} 不符：应有 ⌈n/2⌉ = packed.shape[-1]")
    low, high = packed & 0x0F, packed >> 4  # (..., ⌈n/2⌉) 各一份
    u = torch.stack([low, high], dim=-1).flatten(-2)[..., :n]  # (..., n)：交错还原，去掉补的半个字节
    return (u.to(torch.int16) - _OFFSET).to(torch.int8)
