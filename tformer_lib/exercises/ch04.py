"""第 4 章练习的检查器（checker）：多头注意力的参数量、前置归一化（pre-LN）的残差块。

用 :mod:`tformer_lib.exercises._core` 的框架：桩 → “⏳ 尚未完成”（不抛异常）；通过 → ✅；
未通过 → ❌ 加一句点名常见错误的提示（参数量乘了 h、漏了偏置或 W^O；pre-LN 写成 post-LN、
忘了残差、把 LayerNorm 放到子层之后……）。
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from tformer_lib.exercises._core import CheckResult, Mistake, Variant, compare, expect_shape, generator, run_checks

__all__ = ["check_mha_param_count", "check_pre_ln_block"]


# ---- 练习：多头注意力的参数量 -------------------------------------------------------------------------

_MHA_CASES = ((512, 8), (512, 1), (64, 4), (30, 3), (8, 8))


def _as_int(value, call: str) -> int:
    if isinstance(value, torch.Tensor) and value.numel() == 1:
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != int(value):
        raise Mistake(f"{call} 应返回一个整数，你返回的是 {value!r}", key="type")
    return int(value)


def _mha_counts(fn: Callable) -> None:
    from tformer_lib.attention import MultiHeadAttention
    from tformer_lib.model import count_parameters

    for d, h in _MHA_CASES:
        call = f"mha_param_count({d}, {h})"
        got = _as_int(fn(d, h), call)
        with torch.random.fork_rng(devices=[]):  # 建层时的随机初始化不动读者的全局随机状态
            want = count_parameters(MultiHeadAttention(d, h))
        if got == want:
            continue
        d_k = d // h
        if h > 1 and got in (h * want, 4 * h * d * d, h * 4 * d * d + 4 * d):
            raise Mistake(f"{call} 返回 {got:,}，应为 {want:,}。结果随 h 成倍增长了：每个头只用 d_k = d_model/h 维，"
                          "h 个 W^Q_i 竖着摞起来才是一个 d_model×d_model 的 w_q，参数量与 h 无关。", key="times_h")
        if got == 4 * d * d:
            raise Mistake(f"{call} 返回 {got:,}，应为 {want:,}。漏了偏置：w_q、w_k、w_v、w_o 都是 nn.Linear，"
                          "各自还有 d_model 个偏置。", key="no_bias")
        if got in (3 * (d * d + d), 3 * d * d):
            raise Mistake(f"{call} 返回 {got:,}，应为 {want:,}。漏了输出投影 W^O（w_o）：拼接各头之后还要再乘一个 "
                          "d_model×d_model 的矩阵。", key="no_w_o")
        if h > 1 and got in (4 * (d * d_k + d_k), 4 * d * d_k):
            raise Mistake(f"{call} 返回 {got:,}，应为 {want:,}。这只是单个头的投影（d_model×d_k）；"
                          "把 h 个头合起来才是完整的 w_q 等。", key="one_head")
        raise Mistake(f"{call} 返回 {got:,}，应为 {want:,}（4 个 nn.Linear(d_model, d_model)，含偏置）。", key="values")


def check_mha_param_count(fn: Callable[[int, int], int]) -> CheckResult:
    """检查 ``fn(d_model, n_heads)`` 是否等于 ``MultiHeadAttention(d_model, n_heads)`` 的参数个数（含偏置）。"""
    return run_checks("多头注意力的参数量", fn, [("与 count_parameters(MultiHeadAttention(d_model, h)) 一致", _mha_counts)])


# ---- 练习：pre-LN 残差块 -----------------------------------------------------------------------------


def _pre_ln_values(fn: Callable) -> None:
    from tformer_lib.layers import ResidualNorm

    g = generator(4)
    for d in (8, 16):
        with torch.random.fork_rng(devices=[]):  # 建层时的随机初始化不动读者的全局随机状态
            torch.manual_seed(40 + d)
            norm = nn.LayerNorm(d)
            sub = nn.Sequential(nn.Linear(d, 2 * d), nn.ReLU(), nn.Linear(2 * d, d))
        with torch.no_grad():  # 让 γ、β 不是 1 和 0，“放错位置”才看得出来
            norm.weight.copy_(0.5 + torch.rand(d, generator=g))
            norm.bias.copy_(torch.rand(d, generator=g) - 0.5)
            x = 3 * torch.randn(2, 5, d, generator=g) + 1
            got = fn(x.clone(), sub, norm)
            expect_shape(got, x.shape, "输出", hint=f"输出形状应与输入相同 {tuple(x.shape)}")
            block = ResidualNorm(d, dropout=0.0, norm_first=True)
            block.norm.load_state_dict(norm.state_dict())
            compare(got, block(x, sub), what="输出", variants=[
                Variant("post_ln", "这是后置归一化 post-LN：norm(x + sublayer(x))。pre-LN 要先归一化、再进子层，最后加上原始的 x。",
                        norm(x + sub(x))),
                Variant("no_residual", "忘了残差：pre-LN 的输出是 x + sublayer(norm(x))，少了“+ x”这条直通路。",
                        sub(norm(x))),
                Variant("norm_after", "LayerNorm 放错了位置：它应该作用在子层的输入上（sublayer(norm(x))），而不是子层的输出上。",
                        x + norm(sub(x))),
                Variant("normed_residual", "残差加的是归一化后的 x：直通路上应是原始的 x，不经过 LayerNorm。",
                        norm(x) + sub(norm(x))),
            ], default_hint="结果与 ResidualNorm(norm_first=True) 不一致：应返回 x + sublayer(norm(x))。")


def check_pre_ln_block(fn: Callable) -> CheckResult:
    """检查 ``fn(x, sublayer, norm)`` 是否实现前置归一化的残差块 ``x + sublayer(norm(x))``。"""
    return run_checks("前置归一化（pre-LN）的残差块", fn, [("与 ResidualNorm(norm_first=True) 一致", _pre_ln_values)])
