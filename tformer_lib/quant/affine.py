r"""对称量化（symmetric quantization）的基本运算：比例因子（scale）、量化、反量化（dequantization）。

b 位有符号整数的取值是 :math:`[q_{\min}, q_{\max}] = [-2^{b-1}, 2^{b-1}-1]`（int8：[−128, 127]；int4：[−8, 7]）。
对称量化的零点（zero point）恒为 0，每组数（一行、一组或一个词元的一个头）共用一个比例因子：

.. math::

    s = \frac{\max|w|}{(q_{\max}-q_{\min})/2}\quad(\text{int8：}\max|w|/127.5，\ \text{int4：}\max|w|/7.5),\qquad
    q = \operatorname{clamp}(\operatorname{round}(w/s),\ q_{\min},\ q_{\max}),\qquad \hat w = s\,q

因为 :math:`|w/s| \le 127.5`，取整最多差半个台阶；clamp 只会把恰好 ±127.5 的值截到 127 / −128，也只差半步，
所以每个元素都满足 :math:`|w-\hat w| \le s/2`（测试逐元素核对，只多留浮点舍入的余量）。

约定（与 torchao 的 ``Int8WeightOnlyConfig`` 和 gpt-fast 相同）：比例因子存成 float32，下限截在
``torch.finfo(torch.float32).eps``（全零的一行不会得到 s = 0 再 0/0）；``round`` 是 ``torch.round``（四舍六入五成双，
round half to even）。唯一的不同：我们按公式做除法 ``w / s``，torchao 乘倒数 ``w * (1 / s)``——两者在 w/s
恰好落在半步附近时可能差一个台阶（测试里点名这些位置）。
"""

from __future__ import annotations

import torch

from .._checks import positive_int

__all__ = ["SCALE_DTYPE", "SCALE_EPS", "int_range", "symmetric_scale", "quantize_symmetric", "dequantize_symmetric",
           "quantize_groupwise", "dequantize_groupwise"]

SCALE_DTYPE = torch.float32  # 比例因子的存储类型（每个 4 字节）
SCALE_EPS = torch.finfo(torch.float32).eps  # 比例因子的下限


def int_range(bits: int) -> tuple[int, int]:
    """b 位有符号整数的 ``(q_min, q_max)``：``int_range(8) == (-128, 127)``，``int_range(4) == (-8, 7)``。"""
    if isinstance(bits, bool) or not isinstance(bits, int) or bits not in (4, 8):
        raise ValueError(f"bits 应是 4 或 8，收到 {bits!r}")
    return -(2 ** (bits - 1)), 2 ** (bits - 1) - 1


def _check_float(name: str, x, finite: bool = False) -> torch.Tensor:
    if not isinstance(x, torch.Tensor) or not x.dtype.is_floating_point:
        raise TypeError(f"{name} 应是浮点张量，收到 {getattr(x, 'dtype', type(x).__name__)}")
    if x.dim() == 0 or x.shape[-1] == 0:
        raise ValueError(f"{name} 的最后一维不能为空，收到形状 {tuple(x.shape)}")
    if finite and not bool(torch.isfinite(x).all()):  # 量化权重时（一次性的）查一遍；解码热路径上的 K/V 不查
        raise ValueError(f"{name} 里有 NaN 或 inf：它们没有对称量化的比例因子（s 会变成 NaN/inf）")
    return x


def _check_dequantize(q, scale, dtype) -> None:
    if not isinstance(q, torch.Tensor) or q.dtype.is_floating_point or q.dtype == torch.bool:
        raise TypeError(f"q 应是整数张量（int8），收到 {getattr(q, 'dtype', type(q).__name__)}")
    if not isinstance(scale, torch.Tensor) or not scale.dtype.is_floating_point:
        raise TypeError(f"scale 应是浮点张量，收到 {getattr(scale, 'dtype', type(scale).__name__)}")
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise TypeError(f"dtype 应是浮点的 torch.dtype（如 torch.float32），收到 {dtype!r}")


def symmetric_scale(x: torch.Tensor, bits: int) -> torch.Tensor:
    """沿最后一维每组一个比例因子 ``s = max|x| / ((q_max − q_min)/2)``，形状 ``(..., 1)``，float32。"""
    q_min, q_max = int_range(bits)
    amax = _check_float("x", x).detach().abs().amax(dim=-1, keepdim=True).to(SCALE_DTYPE)  # (..., 1)
    return (amax / ((q_max - q_min) / 2)).clamp(min=SCALE_EPS)


def quantize_symmetric(x: torch.Tensor, bits: int, *, check_finite: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """沿最后一维对称量化：返回 ``(q, scale)``，``q`` 是 int8 张量（int4 的值也先放在 int8 里，取值 [−8, 7]），
    ``scale`` 的形状是 ``(..., 1)``。``x`` 里有 NaN/inf 时报错（``check_finite=False`` 跳过这次扫描：
    每步都要量化的 K/V 缓存用它，省掉一次与数据有关的检查）。"""
    q_min, q_max = int_range(bits)
    _check_float("x", x, finite=check_finite)
    scale = symmetric_scale(x, bits)  # (..., 1)
    q = torch.round(x.detach().to(SCALE_DTYPE) / scale).clamp(q_min, q_max)  # q = clamp(round(w / s))
    return q.to(torch.int8), scale


def dequantize_symmetric(q: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """``ŵ = s · q``：在 float32 里相乘，再转成 ``dtype``。``scale`` 能广播到 ``q`` 的形状。"""
    _check_dequantize(q, scale, dtype)
    try:
        fits = torch.broadcast_shapes(q.shape, scale.shape) == q.shape
    except RuntimeError:
        fits = False
    if not fits:
        raise ValueError(f"scale 的形状 {tuple(scale.shape)} 不能广播到 q 的形状 {tuple(q.shape)}")
    return (q.to(SCALE_DTYPE) * scale).to(dtype)


def _groups(name: str, w: torch.Tensor, group_size: int) -> int:
    group_size = positive_int("group_size", group_size)
    if w.shape[-1] % group_size != 0:
        raise ValueError(
            f"{name} 的最后一维（in_features）是 {w.shape[-1]}，不是 group_size={group_size} 的整数倍："
            f"请选一个能整除它的组大小（本书不做补零填充）"
        )
    return w.shape[-1] // group_size


def quantize_groupwise(w: torch.Tensor, bits: int, group_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """分组量化（group-wise）：``w`` ``(out, in)`` 的每行每 ``group_size`` 个相邻元素共用一个比例因子。

    返回 ``q`` ``(out, in)``（int8 容器）与 ``scale`` ``(out, in / group_size)``。``in`` 必须是组大小的整数倍。
    """
    _check_float("w", w, finite=True)
    n_groups = _groups("w", w, group_size)
    grouped = w.reshape(*w.shape[:-1], n_groups, group_size)  # (out, in/g, g)
    q, scale = quantize_symmetric(grouped, bits)  # (out, in/g, g), (out, in/g, 1)
    return q.reshape(w.shape), scale.squeeze(-1)  # (out, in), (out, in/g)


def dequantize_groupwise(q: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """:func:`quantize_groupwise` 的逆：``q`` ``(out, in)``、``scale`` ``(out, in/g)`` → ``ŵ`` ``(out, in)``。"""
    _check_dequantize(q, scale, dtype)
    if q.dim() == 0 or scale.shape[:-1] != q.shape[:-1] or scale.shape[-1] == 0 or q.shape[-1] % scale.shape[-1]:
        raise ValueError(f"scale 的形状应为 q 的形状 {tuple(q.shape)} 把最后一维换成组数（能整除 {q.shape[-1] if q.dim() else 0}），"
                         f"收到 {tuple(scale.shape)}")
    n_groups = scale.shape[-1]
    grouped = q.reshape(*q.shape[:-1], n_groups, q.shape[-1] // n_groups)  # (out, in/g, g)
    return dequantize_symmetric(grouped, scale[..., None], dtype).reshape(q.shape)  # (out, in)
