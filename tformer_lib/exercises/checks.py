"""两道经典练习的检查器：softmax（第 6 章）与正弦余弦位置编码（第 2 章）。

每个检查器都认得几种典型错误，并用中文点名（例如“忘了除以 √d_k”“掩码极性反了”）。
用法见 :mod:`tformer_lib.exercises._core`；所有检查器返回 :class:`~tformer_lib.exercises._core.CheckResult`。
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from tformer_lib.exercises._core import (
    CheckResult,
    Mistake,
    Variant,
    as_tensor,
    compare,
    draw_int,
    randn,
    random_cases,
    run_checks,
)

__all__ = ["check_softmax", "check_positional_encoding"]


# ------------------------------------------------------------------ softmax

def _naive_softmax(x: torch.Tensor, dim: int) -> torch.Tensor:
    e = x.double().exp()
    return e / e.sum(dim=dim, keepdim=True)


def check_softmax(fn: Callable[[torch.Tensor], Any], *, verbose: bool = True) -> CheckResult:
    """检查 ``fn(x) -> Tensor``：沿**最后一维**（每一行）做 softmax，形状与 ``x`` 相同。

    认得的错误：沿错了维度（axis）；忘了除以总和；没有先减去最大值（大输入时 exp 溢出成 inf → NaN）；
    原地修改了输入。
    """

    def rows_sum_to_one(f):
        x = randn(3, 4, seed=1)
        x0 = x.clone()
        out = f(x)
        if not torch.equal(x, x0):
            raise Mistake("你的函数改动了输入 x（原地操作，如 x -= …、x.exp_()）；请不要修改输入", key="inplace")
        compare(out, torch.softmax(x.double(), dim=-1), what="softmax 的输出", variants=[
            Variant("wrong_axis", "沿错了维度：你在第 0 维（按列）做了归一化，应沿最后一维（dim=-1，每一行）求和为 1",
                    torch.softmax(x.double(), dim=0)),
            Variant("no_normalization", "忘了除以总和：exp 之后还要除以同一行所有 exp 的和，每行才会加起来等于 1",
                    x.double().exp()),
            Variant("exp_missing", "忘了取指数：softmax 是 exp(x_i) / Σ_j exp(x_j)，不是 x_i / Σ_j x_j",
                    x.double() / x.double().sum(-1, keepdim=True)),
        ])

    def last_axis_in_3d(f):
        x = randn(2, 3, 5, seed=2)
        compare(f(x), torch.softmax(x.double(), dim=-1), what="三维输入的输出", variants=[
            Variant("wrong_axis", "沿错了维度：对 (B, T, V) 这样的三维输入也应沿最后一维（dim=-1）归一化，"
                    "不要写死 dim=1 或 dim=0", torch.softmax(x.double(), dim=1)),
            Variant("wrong_axis", "沿错了维度：应沿最后一维（dim=-1）归一化", torch.softmax(x.double(), dim=0)),
        ])

    def large_inputs(f):
        x = torch.tensor([[1000.0, 999.0, 0.0], [-1000.0, -1001.0, -1002.0]])
        out = f(x)
        got = as_tensor(out, "大输入时的输出")
        if got.shape == x.shape and not bool(torch.isfinite(got).all()):
            raise Mistake("没有先减去每行的最大值：输入很大（如 1000）时 exp 溢出成 inf，inf/inf 得到 NaN；"
                          "很小（如 −1000）时 exp 下溢成 0，0/0 也是 NaN。先算 x − x.max(dim=-1, keepdim=True)"
                          " 再 exp，结果不变却不会溢出", key="overflow")
        compare(got, torch.softmax(x.double(), dim=-1), what="大输入时的输出")

    return run_checks("softmax", fn, [
        ("每行和为 1、与 torch.softmax 一致", rows_sum_to_one),
        ("三维输入沿最后一维", last_axis_in_3d),
        ("大数值不溢出", large_inputs),
    ], verbose=verbose)


# ------------------------------------------------------------------ positional encoding

def _pe_variant(max_len: int, d_model: int, kind: str = "ok") -> torch.Tensor:
    pos = torch.arange(max_len, dtype=torch.float64)[:, None]  # (max_len, 1)
    j = torch.arange(d_model, dtype=torch.float64)  # 每一列的下标
    two_i = 2 * torch.div(j, 2, rounding_mode="floor")  # 与列 j 配对的 2i
    base = 10000.0
    if kind == "i_not_2i":
        expo = (two_i / 2) / d_model
    elif kind == "j_exponent":
        expo = j / d_model
    else:
        expo = two_i / d_model
    if kind == "pos_from_1":
        pos = pos + 1
    angle = pos / base ** expo  # (max_len, d_model)
    even = (j % 2 == 0)
    if kind == "swapped":
        return torch.where(even, torch.cos(angle), torch.sin(angle))
    if kind == "concat":
        half = angle[:, 0::2]
        return torch.cat([torch.sin(half), torch.cos(half)], dim=1)
    return torch.where(even, torch.sin(angle), torch.cos(angle))


def check_positional_encoding(fn: Callable[[int, int], Any], *, verbose: bool = True) -> CheckResult:
    r"""检查 ``fn(max_len, d_model) -> (max_len, d_model)``：论文的正弦余弦位置编码。

    .. math:: PE(pos, 2i) = \sin(pos / 10000^{2i/d_{model}}),\quad PE(pos, 2i+1) = \cos(pos / 10000^{2i/d_{model}})

    认得的错误：sin 与 cos 对调；指数用了 i 而不是 2i；奇数维用了自己的下标 j 而不是配对的 2i；
    前一半 sin、后一半 cos 的拼接；位置从 1 开始；形状转置。
    """

    sizes = [(6, 8), (50, 16)]
    for g in random_cases(4, seed=41):  # 再加几组随机的偶数 d_model 与长度：写死的表通不过
        sizes.append((draw_int(g, 1, 80), 2 * draw_int(g, 1, 40)))

    def values(f):
        for max_len, d_model in sizes:
            out = f(max_len, d_model)
            ref = _pe_variant(max_len, d_model)
            compare(out, ref, what=f"PE({max_len}, {d_model})", atol=1e-4, variants=[
                Variant("sin_cos_swapped", "sin 与 cos 对调了：偶数维（0, 2, 4…）用 sin，奇数维（1, 3, 5…）用 cos",
                        _pe_variant(max_len, d_model, "swapped")),
                Variant("exponent_i", "指数写错了：应为 10000^(2i/d_model)，你用的是 10000^(i/d_model)（少了因子 2），"
                        "频率下降得太慢", _pe_variant(max_len, d_model, "i_not_2i")),
                Variant("exponent_j", "奇数维的频率不对：第 2i 维和第 2i+1 维共用同一个频率 10000^(2i/d_model)；"
                        "你给奇数维用了它自己的下标 j", _pe_variant(max_len, d_model, "j_exponent")),
                Variant("concatenated", "排列方式不对：论文是 sin、cos 交错（第 0 维 sin、第 1 维 cos、第 2 维 sin……），"
                        "不是前一半全 sin、后一半全 cos", _pe_variant(max_len, d_model, "concat")),
                Variant("pos_from_1", "位置应从 0 开始（pos = 0, 1, 2, …）：第 0 个位置的编码是 [0, 1, 0, 1, …]",
                        _pe_variant(max_len, d_model, "pos_from_1")),
                Variant("transposed", f"形状应为 (max_len, d_model) = ({max_len}, {d_model})：行是位置、列是维度，"
                        "你的结果转置了", ref.T),
            ])

    from tformer_lib.parts.positional import SinusoidalPositionalEncoding, sinusoidal_positional_encoding

    return run_checks("正弦余弦位置编码", fn, [("几组随机大小下与论文公式一致", values)], verbose=verbose,
                      forbidden=(sinusoidal_positional_encoding, SinusoidalPositionalEncoding))
