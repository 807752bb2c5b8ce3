"""第 2 章练习的检查器（checker）：位置编码的距离闭式、找错版正弦余弦编码（在 checks.py）、
相对位置下标（Shaw et al. 的截断相对距离）、“顺序盲”测试。

用 :mod:`tformer_lib.exercises._core` 的框架：桩（抛 ``NotImplementedError``）→ “⏳ 尚未完成”（不抛异常）；
返回 None → “函数返回了 None”；通过 → ✅；未通过 → ❌ 加一句点名常见错误的提示。每个检查器都用几组随机的
大小与情形（写死本章例子的答案不会通过）；检查器用到的随机数不改变笔记本的全局随机状态。
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from tformer_lib.exercises._core import (
    CheckResult,
    Mistake,
    Variant,
    as_bool,
    compare,
    compare_number,
    draw_choice,
    draw_int,
    expect_shape,
    random_cases,
    run_checks,
)

__all__ = ["check_pe_distance", "check_relative_position_index", "check_order_blindness_test"]


# ---- 练习：相隔 k 的两个位置编码有多远（推导并核对）-------------------------------------------------------


def _omega(d: int) -> torch.Tensor:
    return 10000.0 ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)  # (d/2,)


def pe_distance_reference(k: int, d_model: int) -> float:
    """‖PE(pos + k) − PE(pos)‖ = √(Σ_i 2 − 2cos(k·ω_i))，与 pos 无关。"""
    return math.sqrt(float((2 - 2 * torch.cos(k * _omega(d_model))).sum()))


def _pe_distance_all(f: Callable) -> None:
    cases = [(1, 512)]
    for g in random_cases(7, seed=201):
        cases.append((draw_int(g, 1, 300), 2 * draw_int(g, 2, 128)))
    for k, d in cases:
        call = f"pe_distance({k}, {d})"
        want = pe_distance_reference(k, d)
        s = float((1 - torch.cos(k * _omega(d))).sum())
        compare_number(f(k, d), want, what=call, rtol=1e-5, atol=1e-6, variants=[
            Variant("squared", f"{call}：这是距离的平方，别忘了开根号", 2 * s),
            Variant("missing_factor_2", f"{call}：每一对维度贡献 (sin a − sin b)² + (cos a − cos b)² = 2 − 2cos(a − b)，"
                    "少了因子 2", math.sqrt(s)),
            Variant("sqrt_d", f"{call}：√d_model 只是两个毫不相干的位置的典型距离（曲线的渐近线），距离还和 k 有关",
                    math.sqrt(d)),
            Variant("one_pair_per_dim", f"{call}：求和是对 d_model/2 个维度“对”（i = 0 … d_model/2 − 1），"
                    "不是对 d_model 个维度", math.sqrt(2 * float((1 - torch.cos(k * 10000.0 ** (
                        -torch.arange(0, d, dtype=torch.float64) / d))).sum()))),
        ], default_hint=f"{call} 不对：把 ‖PE(p+k) − PE(p)‖² 按维度对展开，每对用一次和角公式")


def check_pe_distance(fn: Callable[[int, int], float]) -> CheckResult:
    """``fn(k, d_model)`` 应返回 ‖PE(pos + k) − PE(pos)‖（与 pos 无关）的闭式。"""
    return run_checks("相隔 k 的两个位置编码的距离", fn, [("随机的 k 与 d_model", _pe_distance_all)])


# ---- 练习：相对位置下标（扩展：Shaw et al. 2018 的截断相对距离）---------------------------------------------


def relative_index_reference(t_q: int, t_k: int, max_distance: int) -> torch.Tensor:
    rel = torch.arange(t_k)[None, :] - torch.arange(t_q)[:, None]  # (T_q, T_k)：j − i
    return rel.clamp(-max_distance, max_distance) + max_distance


def _relative_index_all(f: Callable) -> None:
    cases = [(5, 5, 2)]
    for g in random_cases(6, seed=202):
        t_q = draw_int(g, 1, 9)
        t_k = draw_choice(g, [t_q, draw_int(g, 1, 9)])
        cases.append((t_q, t_k, draw_int(g, 1, 6)))
    for t_q, t_k, K in cases:
        call = f"relative_position_index({t_q}, {t_k}, {K})"
        got = f(t_q, t_k, K)
        want = relative_index_reference(t_q, t_k, K)
        expect_shape(got, (t_q, t_k), what=call, hint=f"{call} 的形状应为 (T_q, T_k) = {(t_q, t_k)}：行是查询 i，列是键 j")
        if isinstance(got, torch.Tensor) and (got.is_floating_point() or got.dtype == torch.bool):
            raise Mistake(f"{call} 应是整数张量（拿来给 nn.Embedding 查表），你的 dtype 是 {got.dtype}", key="dtype")
        rel = torch.arange(t_k)[None, :] - torch.arange(t_q)[:, None]  # (T_q, T_k)
        compare(got, want, what=call, atol=0, rtol=0, variants=[
            Variant("direction", f"{call}：方向反了——本书约定相对位置是 j − i（键减查询，键在查询右边为正）",
                    (-rel).clamp(-K, K) + K),
            Variant("no_offset", f"{call}：截断后的 j − i 在 [−K, K] 里，要再加 K 才能当作 0 … 2K 的下标", rel.clamp(-K, K)),
            Variant("no_clip", f"{call}：没有截断：距离超过 K 的都应归到两端的桶（clamp 到 [−K, K]）", rel + K),
            Variant("absolute", f"{call}：用了 |j − i|，丢掉了“谁在前”的信息；应保留符号，共 2K + 1 个桶",
                    rel.abs().clamp(max=K)),
        ], default_hint=f"{call} 应为 clamp(j − i, −K, K) + K，例如 {want.tolist()}")


def check_relative_position_index(fn: Callable[[int, int, int], Any]) -> CheckResult:
    """``fn(t_q, t_k, max_distance)`` 应返回 ``(T_q, T_k)`` 的整数下标 ``clamp(j − i, −K, K) + K``。

    题目要读者自己写：直接调用库里的 :func:`~tformer_lib.parts.relative_position.relative_position_index` 得到 ❌。
    """
    from tformer_lib.parts.relative_position import relative_position_index

    return run_checks("相对位置下标", fn, [("随机的 T_q、T_k、K（含 T_q ≠ T_k）", _relative_index_all)],
                      forbidden=(relative_position_index,))


# ---- 练习：“顺序盲”测试 ---------------------------------------------------------------------------------

class _WithPositions(nn.Module):
    """先加正弦余弦位置编码，再过一个层：对顺序敏感。"""

    def __init__(self, layer: nn.Module, d_model: int):
        super().__init__()
        from tformer_lib.parts.positional import SinusoidalPositionalEncoding

        self.pe = SinusoidalPositionalEncoding(d_model, max_len=64)
        self.layer = layer

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layer(self.pe(x))


class _RunningMean(nn.Module):
    """沿序列维做累积平均（像一个最简单的 RNN）：第 t 个输出只看前 t 个输入，对顺序敏感。"""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        steps = torch.arange(1, x.shape[1] + 1, dtype=x.dtype)[None, :, None]  # (1, T, 1)
        return x.cumsum(dim=1) / steps  # (B, T, d_model)


def _order_blindness(f: Callable) -> None:
    from tformer_lib.parts.layers import EncoderLayer

    for g in random_cases(3, seed=203):
        n_heads = draw_choice(g, [2, 4])
        d_model = n_heads * draw_int(g, 4, 6)  # 太窄（如 2 维）时 LayerNorm 会抹掉几乎所有信息，顺序也测不出
        B, T = draw_int(g, 1, 3), draw_int(g, 3, 7)
        torch.manual_seed(draw_int(g, 0, 10_000))  # run_checks 之后会恢复全局随机状态
        encoder = EncoderLayer(d_model, n_heads=n_heads, d_ff=2 * d_model).eval()
        per_token = nn.Sequential(nn.Linear(d_model, d_model), nn.ReLU()).eval()
        cases = (
            ("不带位置编码的编码器层", encoder, True),
            ("逐位置的线性层 + ReLU", per_token, True),
            ("先加位置编码再过编码器层", _WithPositions(encoder, d_model).eval(), False),
            ("沿序列做累积平均的层", _RunningMean(), False),
        )
        x = torch.randn(B, T, d_model, generator=g)  # (B, T, d_model)
        where = f"（B={B}, T={T}, d_model={d_model}）"
        for name, layer, want in cases:
            for _ in range(3):  # 读者的函数可能每次随机打乱，多试几次
                got = as_bool(f(layer, x.clone()), "is_order_blind 的返回值")
                if got == want:
                    continue
                if want:
                    raise Mistake(
                        f"对“{name}”{where}返回了 False，但它对顺序是盲的（输入换顺序，输出只是跟着换顺序）。"
                        "是不是拿 layer(打乱后的 x) 直接和 layer(x) 比较了？应先把 layer(x) 按同样方式打乱再比较；"
                        "比较浮点数请用 torch.allclose，不要用 ==", key="forgot_to_permute_output")
                raise Mistake(
                    f"对“{name}”{where}返回了 True，但它对顺序敏感。检查你打乱的是不是序列维（第 1 维）"
                    "——打乱批维（第 0 维）或特征维测不出顺序；还要确认打乱后的顺序确实与原来不同",
                    key="wrong_dimension")


def check_order_blindness_test(fn: Callable[[nn.Module, torch.Tensor], bool]) -> CheckResult:
    """检查 ``fn(layer, x)``：layer 对序列维的置换等变（顺序盲）时返回 True，否则返回 False。"""
    return run_checks("顺序盲测试", fn, [("随机大小下区分顺序盲与顺序敏感的层", _order_blindness)])
