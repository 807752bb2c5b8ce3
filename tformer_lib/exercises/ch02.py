"""第 2 章练习的检查器（checker）：维度对的波长、相对位移的旋转矩阵、“顺序盲”测试。

用 :mod:`tformer_lib.exercises._core` 的框架：桩（抛 ``NotImplementedError`` 或返回 ``None``）→
“⏳ 尚未完成”（不抛异常）；通过 → ✅；未通过 → ❌ 加一句点名常见错误的提示（忘了 2π、指数少了 2、
sin 的符号放反、角度忘了乘 ω_i、比较前忘了把输出也打乱……）。

检查器建层、打乱顺序用到的随机数都在 ``torch.random.fork_rng`` 里，不改变笔记本的全局随机状态。
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from tformer_lib.exercises._core import CheckResult, Mistake, Variant, compare, expect_shape, run_checks

__all__ = ["check_wavelength", "check_shift_rotation", "check_order_blindness_test"]


# ---- 练习：第 i 对维度的波长 ---------------------------------------------------------------------------

_WAVELENGTH_CASES = ((1, 8), (3, 8), (0, 8), (0, 512), (1, 512), (64, 512), (128, 512), (255, 512), (10, 64))


def _as_number(value: Any, call: str) -> float:
    if isinstance(value, torch.Tensor) and value.numel() == 1:
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        try:
            import numpy as np

            if isinstance(value, np.generic) and value.size == 1:
                return float(value)
        except ImportError:  # pragma: no cover
            pass
        raise Mistake(f"{call} 应返回一个数，你返回的是 {value!r}", key="type")
    return float(value)


def _t(x: float) -> torch.Tensor:
    return torch.tensor(x, dtype=torch.float64)


def _wavelengths(f: Callable) -> None:
    for i, d in _WAVELENGTH_CASES:
        call = f"wavelength({i}, {d})"
        got = _t(_as_number(f(i, d), call))
        want = 2 * math.pi * 10000 ** (2 * i / d)
        compare(got, _t(want), what=call, atol=1e-9, rtol=1e-6, variants=[
            Variant("no_2pi", f"{call} 应为 {want:.4f}。忘了乘 2π：10000^(2i/d_model) 只是角频率 ω_i 的倒数，"
                    "正弦波走完一整圈是 2π 弧度，所以波长 = 2π / ω_i", _t(10000 ** (2 * i / d))),
            Variant("exponent_i", f"{call} 应为 {want:.4f}。指数应是 2i/d_model，不是 i/d_model："
                    "i 是第几“对”维度，这一对的维度号是 2i 与 2i+1", _t(2 * math.pi * 10000 ** (i / d))),
            Variant("angular_frequency", f"{call} 应为 {want:.4f}。这是角频率 ω_i = 10000^(−2i/d_model)，"
                    "不是波长；波长 = 2π / ω_i", _t(10000 ** (-2 * i / d))),
            Variant("frequency", f"{call} 应为 {want:.4f}。这是频率（每走一步转多少圈），波长是它的倒数",
                    _t(1 / want)),
            Variant("exponent_2i_plus_1", f"{call} 应为 {want:.4f}。指数应是 2i/d_model：同一对里的 sin 维与 "
                    "cos 维共用一个频率，不要用 2i+1", _t(2 * math.pi * 10000 ** ((2 * i + 1) / d))),
        ], default_hint=f"{call} 应为 2π·10000^(2i/d_model) ≈ {want:.4f}")


def check_wavelength(fn: Callable[[int, int], float], *, verbose: bool = True) -> CheckResult:
    """检查 ``fn(i, d_model)`` 返回第 i 对维度（第 2i、2i+1 维）的波长 ``2π · 10000^(2i/d_model)``。"""
    return run_checks("第 i 对维度的波长", fn, [("与 2π·10000^(2i/d_model) 一致", _wavelengths)], verbose=verbose)


# ---- 练习：相对位移的旋转矩阵 R_k -------------------------------------------------------------------------

_ROTATION_CASES = ((1, 8), (3, 8), (-2, 8), (0, 8), (5, 4), (7, 64), (-11, 64), (100, 64))
_MAX_LEN = 160


def _rotation(k: float, d: int, *, sign: float = 1.0, scale: bool = True, half_split: bool = False) -> torch.Tensor:
    """R_k 的参考实现（及几种常见错误写法），float64。

    默认是本书约定：第 2i 维（sin）与第 2i+1 维（cos）配对；``half_split=True`` 是 RoPE 的前后两半配对。
    """
    omega = 10000 ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)  # (d/2,)
    theta = k * omega if scale else torch.full_like(omega, float(k))
    c, s = torch.cos(theta), sign * torch.sin(theta)
    r = torch.zeros(d, d, dtype=torch.float64)
    if half_split:
        h = d // 2
        r[:h, :h], r[:h, h:], r[h:, :h], r[h:, h:] = torch.diag(c), torch.diag(s), torch.diag(-s), torch.diag(c)
    else:
        r[0::2, 0::2], r[0::2, 1::2] = torch.diag(c), torch.diag(s)  # sin 分量 ← cos(kω)·sin + sin(kω)·cos
        r[1::2, 0::2], r[1::2, 1::2] = torch.diag(-s), torch.diag(c)  # cos 分量 ← −sin(kω)·sin + cos(kω)·cos
    return r


def _rotations(f: Callable) -> None:
    from tformer_lib.positional import sinusoidal_positional_encoding

    for k, d in _ROTATION_CASES:
        call = f"shift_rotation({k}, {d})"
        r = f(k, d)
        expect_shape(r, (d, d), what=f"{call} 的结果")
        compare(r, _rotation(k, d), what=call, atol=1e-5, rtol=1e-4, variants=[
            Variant("sin_sign", "2×2 块里 sin 的符号放反了：你的矩阵把位置往回挪了 k 步（它是 R_{−k}，即 R_k 的转置）。"
                    "由 sin(a+b) = sin a·cos b + cos a·sin b，sin 分量那一行应是 [cos kω, +sin kω]",
                    _rotation(k, d, sign=-1.0)),
            Variant("angle_k", "旋转角度应是 k·ω_i（ω_i = 10000^(−2i/d_model)），不是 k：每对维度转的角度各不相同",
                    _rotation(k, d, scale=False)),
            Variant("half_split", "你把第 j 维与第 j + d/2 维配成了一对（那是 RoPE 的 half-split 约定）；"
                    "本书的正弦余弦编码是第 2i 维（sin）与第 2i+1 维（cos）配对", _rotation(k, d, half_split=True)),
        ])
        # 再用定义本身验证一次：对所有位置 PE(pos + k) = R_k · PE(pos)
        pe = sinusoidal_positional_encoding(_MAX_LEN, d).double()  # (max_len, d)
        lo, hi = max(0, -k), min(_MAX_LEN, _MAX_LEN - k)
        shifted = pe[lo:hi] @ torch.as_tensor(r, dtype=torch.float64).T  # 每行 R_k · PE(pos)
        compare(shifted, pe[lo + k:hi + k], what=f"{call} 作用在 PE(pos) 上的结果", atol=1e-4)


def check_shift_rotation(fn: Callable[[int, int], Any], *, verbose: bool = True) -> CheckResult:
    """检查 ``fn(k, d_model)`` 返回 R_k：对所有位置 pos 有 ``PE(pos + k) = R_k · PE(pos)``。"""
    return run_checks("相对位移的旋转矩阵 R_k", fn, [("PE(pos + k) = R_k·PE(pos)", _rotations)], verbose=verbose)


# ---- 练习：“顺序盲”测试 ---------------------------------------------------------------------------------

class _WithPositions(nn.Module):
    """先加正弦余弦位置编码，再过一个层：对顺序敏感。"""

    def __init__(self, layer: nn.Module, d_model: int):
        super().__init__()
        from tformer_lib.positional import SinusoidalPositionalEncoding

        self.pe = SinusoidalPositionalEncoding(d_model, max_len=64)
        self.layer = layer

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layer(self.pe(x))


class _RunningMean(nn.Module):
    """沿序列维做累积平均（像一个最简单的 RNN）：第 t 个输出只看前 t 个输入，对顺序敏感。"""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        steps = torch.arange(1, x.shape[1] + 1, dtype=x.dtype)[None, :, None]  # (1, T, 1)
        return x.cumsum(dim=1) / steps  # (B, T, d_model)


def _as_bool(value: Any) -> bool:
    if isinstance(value, torch.Tensor) and value.numel() == 1 and value.dtype == torch.bool:
        value = value.item()
    if not isinstance(value, bool):
        raise Mistake(f"is_order_blind 应返回 True 或 False，你返回的是 {value!r}（{type(value).__name__}）", key="type")
    return value


def _order_blindness(f: Callable) -> None:
    from tformer_lib.layers import EncoderLayer

    d_model = 8
    with torch.random.fork_rng(devices=[]):  # 建层、造输入、读者函数里的 randperm 都不动全局随机状态
        torch.manual_seed(0)
        encoder = EncoderLayer(d_model, n_heads=2, d_ff=16).eval()
        per_token = nn.Sequential(nn.Linear(d_model, d_model), nn.ReLU()).eval()
        cases = (
            ("不带位置编码的编码器层", encoder, True),
            ("逐位置的线性层 + ReLU", per_token, True),
            ("先加位置编码再过编码器层", _WithPositions(encoder, d_model).eval(), False),
            ("沿序列做累积平均的层", _RunningMean(), False),
        )
        x = torch.randn(2, 5, d_model)  # (B, T, d_model)
        for name, layer, want in cases:
            for _ in range(3):  # 读者的函数可能每次随机打乱，多试几次
                got = _as_bool(f(layer, x.clone()))
                if got == want:
                    continue
                if want:
                    raise Mistake(
                        f"对“{name}”返回了 False，但它对顺序是盲的（输入换顺序，输出只是跟着换顺序）。"
                        "是不是拿 layer(打乱后的 x) 直接和 layer(x) 比较了？应先把 layer(x) 按同样方式打乱再比较；"
                        "比较浮点数请用 torch.allclose，不要用 ==", key="forgot_to_permute_output")
                raise Mistake(
                    f"对“{name}”返回了 True，但它对顺序敏感。检查你打乱的是不是序列维（第 1 维）"
                    "——打乱批维（第 0 维）或特征维测不出顺序；还要确认打乱后的顺序确实与原来不同",
                    key="wrong_dimension")


def check_order_blindness_test(fn: Callable[[nn.Module, torch.Tensor], bool], *, verbose: bool = True) -> CheckResult:
    """检查 ``fn(layer, x)``：layer 对序列维的置换等变（顺序盲）时返回 True，否则返回 False。"""
    return run_checks("顺序盲测试", fn, [("区分顺序盲与顺序敏感的层", _order_blindness)], verbose=verbose)
