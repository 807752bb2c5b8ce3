"""经典练习的检查器：softmax、缩放点积注意力、因果掩码、填充掩码、位置编码、拆分/合并多头、学习率调度、标签平滑。

每个检查器都认得几种典型错误，并用中文点名（例如“忘了除以 √d_k”“掩码极性反了”）。
用法见 :mod:`tformer_lib.exercises._core`；所有检查器返回 :class:`~tformer_lib.exercises._core.CheckResult`。
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch

from tformer_lib.exercises._core import (
    CheckResult,
    Mistake,
    Variant,
    as_number,
    as_tensor,
    compare,
    draw_int,
    expect_dtype,
    expect_shape,
    randn,
    random_cases,
    run_checks,
)

__all__ = [
    "check_softmax",
    "check_attention",
    "check_causal_mask",
    "check_padding_mask",
    "check_positional_encoding",
    "check_split_heads",
    "check_merge_heads",
    "check_lr_schedule",
    "check_label_smoothing",
]


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


# ------------------------------------------------------------------ attention

def _attention_ref(q, k, v, mask=None, *, scale: float | None = None, axis: int = -1, polarity: bool = True,
                   fill: float | None = None):
    """参考实现及其“错误变体”（都用 float64）。"""
    q, k, v = q.double(), k.double(), v.double()
    d_k = q.shape[-1]
    scale = math.sqrt(d_k) if scale is None else scale
    scores = q @ k.transpose(-2, -1) / scale  # (..., T_q, T_k)
    if mask is not None:
        blocked = ~mask if polarity else mask
        scores = scores.masked_fill(blocked, torch.finfo(scores.dtype).min if fill is None else fill)
    w = scores.softmax(dim=axis)
    return w @ v, w


def _split_output(out: Any) -> tuple[Any, Any]:
    """读者可以返回 ``output`` 或 ``(output, weights)``。"""
    if isinstance(out, (tuple, list)):
        if len(out) != 2:
            raise Mistake(f"请返回 output 或 (output, weights)，你返回了 {len(out)} 个值", key="type")
        return out[0], out[1]
    return out, None


def check_attention(fn: Callable[..., Any], *, verbose: bool = True) -> CheckResult:
    r"""检查 ``fn(q, k, v, mask=None)``：缩放点积注意力 :math:`\mathrm{softmax}(QK^\top/\sqrt{d_k})V`。

    形状 ``q (..., T_q, d_k)``、``k (..., T_k, d_k)``、``v (..., T_k, d_v)``；``mask`` 为布尔张量，
    **True = 可以关注**，能广播到 ``(..., T_q, T_k)``。返回 ``output``（``(..., T_q, d_v)``），
    或像库里的 ``scaled_dot_product_attention`` 那样返回 ``(output, weights)``。

    认得的错误：忘了除以 √d_k；除以了 d_k；softmax 沿错了维度；掩码极性反了；被屏蔽处填 0 而不是极小值；
    没有使用掩码。
    """
    q, k, v = randn(2, 3, 16, seed=11), randn(2, 5, 16, seed=12), randn(2, 5, 6, seed=13)

    def variants(mask=None):
        out = [
            Variant("no_scale", "忘了除以 √d_k：分数 QKᵀ 的方差随 d_k 增大，softmax 会饱和；应为 softmax(QKᵀ / √d_k)",
                    _attention_ref(q, k, v, mask, scale=1.0)[0]),
            Variant("scale_by_dk", "除以了 d_k 而不是 √d_k：缩放因子是 d_k 的平方根（math.sqrt(d_k)）",
                    _attention_ref(q, k, v, mask, scale=16.0)[0]),
            Variant("wrong_axis", "softmax 沿错了维度：权重应在键（key）这一维、即最后一维（dim=-1）上归一化，"
                    "让每个查询的权重和为 1", _attention_ref(q, k, v, mask, axis=-2)[0]),
        ]
        if mask is not None:
            out += [
                Variant("mask_polarity", "掩码极性反了：全书约定 True = 可以关注，应屏蔽的是 mask 为 False 的位置"
                        "（scores.masked_fill(~mask, …)）", _attention_ref(q, k, v, mask, polarity=False)[0]),
                Variant("mask_fill_zero", "被屏蔽的分数填成了 0：exp(0) = 1，仍然会分到权重；应填一个极小的数"
                        "（如 torch.finfo(scores.dtype).min 或 -inf）", _attention_ref(q, k, v, mask, fill=0.0)[0]),
                Variant("mask_ignored", "没有使用 mask：被屏蔽的位置也分到了权重",
                        _attention_ref(q, k, v, None)[0]),
            ]
        return out

    def no_mask(f):
        out, weights = _split_output(f(q, k, v))
        ref_out, ref_w = _attention_ref(q, k, v)
        compare(out, ref_out, what="注意力输出", variants=variants())
        if weights is not None:
            compare(weights, ref_w, what="注意力权重")

    def with_mask(f):
        mask = torch.tensor([[True, True, True, False, False]]).expand(3, 5)  # (T_q, T_k)，后两个键被屏蔽
        mask = mask.clone()
        mask[0, 1] = False
        out, weights = _split_output(f(q, k, v, mask))
        ref_out, ref_w = _attention_ref(q, k, v, mask)
        compare(out, ref_out, what="带掩码的注意力输出", variants=variants(mask))
        if weights is not None:
            w = as_tensor(weights, "注意力权重")
            if w.shape == ref_w.shape and float(w[..., ~mask].abs().max()) > 1e-6:
                raise Mistake("被屏蔽位置的权重不为 0", key="mask_leak")
            compare(w, ref_w, what="带掩码的注意力权重")

    def batched_heads(f):
        qh, kh, vh = randn(2, 4, 3, 8, seed=21), randn(2, 4, 3, 8, seed=22), randn(2, 4, 3, 8, seed=23)
        causal = torch.ones(3, 3, dtype=torch.bool).tril()
        out, _ = _split_output(f(qh, kh, vh, causal))
        compare(out, _attention_ref(qh, kh, vh, causal)[0], what="(B, h, T, d_k) 输入的输出",
                default_hint="对 (B, h, T, d_k) 的四维输入结果不对：用 k.transpose(-2, -1) 而不是 k.T 或 transpose(0, 1)，"
                             "掩码靠广播作用到每个批次和每个头")

    return run_checks("缩放点积注意力", fn, [
        ("不带掩码", no_mask),
        ("带掩码（True = 可以关注）", with_mask),
        ("多头四维输入 + 因果掩码", batched_heads),
    ], verbose=verbose)


# ------------------------------------------------------------------ masks

def check_causal_mask(fn: Callable[[int], Any], *, verbose: bool = True) -> CheckResult:
    """检查 ``fn(n) -> (n, n)`` 布尔因果掩码：位置 i 可以看见 j ≤ i（下三角，含对角线），True = 可以关注。

    认得的错误：排除了对角线（差一，off by one）；上三角（方向反了）；极性反了；不是布尔类型；形状不对。
    """

    sizes = [4, 6, 1] + [draw_int(g, 2, 12) for g in random_cases(3, seed=42)]

    def values(f):
        for n in sizes:
            out = f(n)
            ref = torch.ones(n, n, dtype=torch.bool).tril()
            if isinstance(out, torch.Tensor) and out.dtype != torch.bool:
                as_bool = out.to(torch.bool) if out.shape == ref.shape else None
                if as_bool is not None and torch.equal(as_bool, ref):
                    raise Mistake(f"数值对了，但 dtype 是 {out.dtype}：全书的掩码是布尔张量（torch.bool），"
                                  "用 .bool() 或 dtype=torch.bool", key="dtype")
            expect_dtype(out, torch.bool, f"n={n} 时的掩码", "掩码应是布尔张量（dtype=torch.bool），True = 可以关注")
            compare(out, ref, what=f"n={n} 时的掩码", variants=[
                Variant("diagonal_excluded", "差了一格（off by one）：对角线被排除了。位置 i 应能看见它自己（j ≤ i），"
                        "用 tril() 而不是 tril(-1)", torch.ones(n, n, dtype=torch.bool).tril(-1)),
                Variant("polarity", "极性反了：全书约定 True = 可以关注，应是下三角为 True、右上方（未来）为 False",
                        ~ref),
                Variant("upper_triangle", "方向反了：你给的是上三角（位置 i 看得见 j ≥ i，即偷看未来）；应为下三角 tril()",
                        torch.ones(n, n, dtype=torch.bool).triu()),
            ])

    return run_checks("因果掩码", fn, [(f"n = {sizes} 的下三角布尔矩阵", values)], verbose=verbose)


def check_padding_mask(fn: Callable[..., Any], *, verbose: bool = True) -> CheckResult:
    """检查 ``fn(tokens, pad_id) -> (B, 1, 1, T)`` 布尔填充掩码：不是填充词元处为 True（可以关注）。

    认得的错误：极性反了；形状是 ``(B, T)``（不能广播到 ``(B, h, T_q, T_k)``）或把键维放错了位置；
    忽略了 ``pad_id`` 参数（写死 0）；不是布尔类型。
    """
    batches = [(torch.tensor([[5, 6, 7, 9], [8, 9, 9, 9]]), 9)]
    for g in random_cases(3, seed=43):  # 随机的批大小、长度与填充 id：写死的掩码通不过
        B, T, pad = draw_int(g, 1, 4), draw_int(g, 2, 7), draw_int(g, 1, 9)
        toks = torch.randint(0, 10, (B, T), generator=g)
        toks[toks == pad] = (pad + 1) % 10  # 真实词元里不出现 pad
        for b in range(B):
            toks[b, draw_int(g, 1, T):] = pad  # 每句右侧随机补齐
        batches.append((toks, pad))

    def values(f):
        for tokens, pad in batches:
            one_batch(f, tokens, pad)

    def one_batch(f, tokens, pad):
        out = f(tokens.clone(), pad)
        ref = (tokens != pad)[:, None, None, :]
        if isinstance(out, torch.Tensor) and out.dtype != torch.bool:
            raise Mistake(f"掩码应是布尔张量（torch.bool），你的是 {out.dtype}；直接用比较 tokens != pad_id 就得到布尔值",
                          key="dtype")
        compare(out, ref, what="填充掩码", variants=[
            Variant("polarity", "极性反了：全书约定 True = 可以关注，填充位置应为 False（tokens != pad_id）",
                    ~ref),
            Variant("shape_2d", "形状应为 (B, 1, 1, T)：(B, T) 不能直接广播到分数的 (B, h, T_q, T_k)，"
                    "用 [:, None, None, :] 插入头和查询两个维度", tokens != pad),
            Variant("shape_query_axis", "维度放错了位置：填充掩码屏蔽的是键（key），也就是分数的最后一维（列），"
                    "形状应为 (B, 1, 1, T_k) 而不是 (B, 1, T, 1)", (tokens != pad)[:, None, :, None]),
            Variant("shape_3d", "形状应为 (B, 1, 1, T)：(B, 1, T) 会和头这一维错位，再插入一个维度",
                    (tokens != pad)[:, None, :]),
            Variant("pad_id_ignored", f"忽略了 pad_id 参数：这里的填充 id 是 {pad}，不要写死 0 或 PAD",
                    (tokens != 0)[:, None, None, :]),
        ])

    def broadcasts(f):
        toks = torch.tensor([[4, 5, 0]])
        mask = f(toks, 0)
        expect_shape(mask, (1, 1, 1, 3), "pad_id=0 时的填充掩码")
        scores = torch.zeros(1, 2, 3, 3)
        try:
            scores.masked_fill(~mask, -1.0)
        except (RuntimeError, TypeError) as exc:  # pragma: no cover - 形状已检查
            raise Mistake(f"掩码不能广播到分数形状 (B, h, T_q, T_k)：{exc}", key="shape") from exc

    return run_checks("填充掩码", fn, [
        ("几组随机批次：布尔、(B, 1, 1, T)、pad_id 处为 False", values),
        ("能广播到 (B, h, T_q, T_k)", broadcasts),
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

    from tformer_lib.positional import SinusoidalPositionalEncoding, sinusoidal_positional_encoding

    return run_checks("正弦余弦位置编码", fn, [("几组随机大小下与论文公式一致", values)], verbose=verbose,
                      forbidden=(sinusoidal_positional_encoding, SinusoidalPositionalEncoding))


# ------------------------------------------------------------------ multi-head split / merge

def check_split_heads(fn: Callable[[torch.Tensor, int], Any], *, verbose: bool = True) -> CheckResult:
    """检查 ``fn(x, n_heads)``：把 ``(B, T, d_model)`` 拆成 ``(B, h, T, d_k)``，``d_k = d_model / h``。

    正确做法：``x.view(B, T, h, d_k).transpose(1, 2)``——每个头取连续的 d_k 个特征。
    认得的错误：直接 ``view(B, h, T, d_k)``（顺序错，把不同位置的特征混进一个头）；忘了 transpose；
    特征交错分给各头（``view(B, T, d_k, h)``）。
    """
    B, T, d_model, h = 2, 3, 8, 2
    d_k = d_model // h
    x = torch.arange(B * T * d_model, dtype=torch.float32).reshape(B, T, d_model)

    def values(f):
        out = f(x.clone(), h)
        ref = x.view(B, T, h, d_k).transpose(1, 2)  # (B, h, T, d_k)
        compare(out, ref, what="拆分后的张量", atol=0, rtol=0, variants=[
            Variant("view_wrong_order", "头拆错了顺序：x.view(B, h, T, d_k) 形状虽对，却把不同位置的特征混进了同一个头。"
                    "应先 view(B, T, h, d_k)，再 transpose(1, 2) 得到 (B, h, T, d_k)", x.reshape(B, h, T, d_k)),
            Variant("no_transpose", "忘了 transpose(1, 2)：view(B, T, h, d_k) 之后还要把头维换到第 1 维，得到 (B, h, T, d_k)",
                    x.view(B, T, h, d_k)),
            Variant("interleaved", "特征分配错了：每个头应取连续的 d_k 个特征（第 0 个头取 0…d_k-1），"
                    "不是隔 h 个取一个", x.view(B, T, d_k, h).permute(0, 3, 1, 2)),
        ])

    def other_sizes(f):
        for g in random_cases(3, seed=44):
            b, t, hh, dk = draw_int(g, 1, 3), draw_int(g, 1, 6), draw_int(g, 1, 4), draw_int(g, 1, 5)
            y = randn(b, t, hh * dk, generator=g)
            compare(f(y.clone(), hh), y.view(b, t, hh, dk).transpose(1, 2), what=f"{tuple(y.shape)}、h={hh} 时的结果",
                    default_hint="形状要从输入推出来（B, T, d_model = x.shape；d_k = d_model // n_heads），不要写死数字")

    return run_checks("拆分多头", fn, [("(2, 3, 8) 拆成 2 个头", values), ("其他形状", other_sizes)], verbose=verbose)


def check_merge_heads(fn: Callable[[torch.Tensor], Any], *, verbose: bool = True) -> CheckResult:
    """检查 ``fn(x)``：把 ``(B, h, T, d_k)`` 合并回 ``(B, T, h·d_k)``——拆分多头的逆操作。

    正确做法：``x.transpose(1, 2).contiguous().view(B, T, h * d_k)``（或 ``.reshape``）。
    认得的错误：没有先 transpose 就 view（头与位置混在一起）；transpose 后直接 view（不连续，报错）。
    """
    B, h, T, d_k = 2, 2, 3, 4
    x = torch.arange(B * h * T * d_k, dtype=torch.float32).reshape(B, h, T, d_k)

    def values(f):
        out = f(x.clone())
        ref = x.transpose(1, 2).reshape(B, T, h * d_k)
        compare(out, ref, what="合并后的张量", atol=0, rtol=0, variants=[
            Variant("no_transpose", "没有先 transpose(1, 2)：直接 view(B, T, h·d_k) 会把不同头、不同位置的特征混在一起；"
                    "先把头维换回第 2 维：x.transpose(1, 2).contiguous().view(B, T, h * d_k)", x.reshape(B, T, h * d_k)),
        ])

    def other_sizes(f):
        for g in random_cases(3, seed=45):
            b, hh, t, dk = draw_int(g, 1, 3), draw_int(g, 1, 4), draw_int(g, 1, 6), draw_int(g, 1, 5)
            y = randn(b, hh, t, dk, generator=g)
            compare(f(y.clone()), y.transpose(1, 2).reshape(b, t, hh * dk), what=f"{tuple(y.shape)} 合并的结果",
                    default_hint="形状要从输入推出来（B, h, T, d_k = x.shape），不要写死数字")

    return run_checks("合并多头", fn, [("(2, 2, 3, 4) 合并成 (2, 3, 8)", values), ("随机的其他形状", other_sizes)],
                      verbose=verbose)


# ------------------------------------------------------------------ training: learning-rate schedule, label smoothing

def _noam(step: int, d_model: int, warmup: int, *, swap=False, warm_exp=-1.5, scale=True) -> float:
    a, b = step ** -0.5, step * warmup ** warm_exp
    core = max(a, b) if swap else min(a, b)
    return (d_model ** -0.5 if scale else 1.0) * core


def check_lr_schedule(fn: Callable[[int, int, int], Any], *, verbose: bool = True) -> CheckResult:
    r"""检查 ``fn(step, d_model, warmup) -> float``：论文的学习率 :math:`d_{model}^{-0.5}\min(step^{-0.5}, step\cdot warmup^{-1.5})`。

    只在 step ≥ 1 上检查（step 0 时 0^-0.5 无定义，库里把它当作 step 1）。
    认得的错误：min 写成 max；预热段的指数不是 −1.5；漏了 d_model^−0.5；峰值不在 step = warmup。
    """
    cases = [(1, 512, 4000), (100, 512, 4000), (4000, 512, 4000), (20000, 512, 4000), (50, 64, 100), (400, 64, 100)]
    for g in random_cases(4, seed=46):
        warm = draw_int(g, 10, 5000)
        cases.append((draw_int(g, 1, 3 * warm), 2 * draw_int(g, 4, 512), warm))

    def values(f):
        got = [as_number(f(step, d_model, warmup), f"step={step}, d_model={d_model}, warmup={warmup} 时的学习率")
               for step, d_model, warmup in cases]
        got_t = torch.tensor(got, dtype=torch.float64)

        def col(**kw):
            return torch.tensor([_noam(*c, **kw) for c in cases], dtype=torch.float64)

        compare(got_t, col(), what="各步的学习率", rtol=1e-6, atol=1e-12, variants=[
            Variant("max_instead_of_min", "min 写成了 max：预热阶段 step·warmup^-1.5 更小、之后 step^-0.5 更小，"
                    "取两者的较小值（min）才会先升后降", col(swap=True)),
            Variant("warmup_exponent", "预热段的指数不对：应为 step · warmup^(-1.5)，这样两段在 step = warmup 处恰好相接",
                    col(warm_exp=-0.5)),
            Variant("no_d_model_factor", "漏了 d_model^(-0.5) 这个因子：模型越宽，学习率越小", col(scale=False)),
        ])

    def peak(f):
        steps = list(range(1, 301))
        vals = [float(f(s, 64, 100)) for s in steps]
        best = steps[max(range(len(vals)), key=vals.__getitem__)]
        if best != 100:
            raise Mistake(f"学习率的峰值应在 step = warmup = 100，你的峰值在 step = {best}", key="peak")

    return run_checks("学习率预热调度", fn, [("与论文公式一致", values), ("峰值在 step = warmup", peak)],
                      verbose=verbose)


def check_label_smoothing(fn: Callable[[torch.Tensor, int, float], Any], *, verbose: bool = True) -> CheckResult:
    """检查 ``fn(target, vocab_size, smoothing) -> (N, V)``：标签平滑后的目标分布。

    本书（与 ``F.cross_entropy(label_smoothing=ε)``、库里的 ``label_smoothing_loss`` 一致）的约定：
    ε 平均分给全部 V 个类，正确类得 ``1 − ε + ε/V``，其余每类 ``ε/V``，每行和为 1。
    认得的错误：只把 ε 分给其余 V−1 个类（另一种约定，与本书不同）；正确类只有 1−ε 而其余 ε/V（和不为 1）；
    正确类与其余类弄反了；形状不对。
    """
    cases = [(torch.tensor([2, 0, 4]), 5, 0.1)]
    for g in random_cases(3, seed=47):  # 词表比目标里最大的 id 大得多：不能从 target 推出 V
        V = draw_int(g, 6, 30)
        target = torch.randint(0, V // 2, (draw_int(g, 1, 6),), generator=g)
        cases.append((target, V, round(0.05 + 0.4 * float(torch.rand((), generator=g)), 3)))

    def make(target, V, true_val, other_val):
        d = torch.full((len(target), V), other_val, dtype=torch.float64)  # (N, V)
        d[torch.arange(len(target)), target] = true_val
        return d

    def values(f):
        for target, V, eps in cases:
            out = f(target.clone(), V, eps)
            what = f"V={V}、ε={eps} 时的目标分布"
            expect_shape(out, (len(target), V), what, hint=f"{what}的形状应为 (N, V) = {(len(target), V)}："
                         "列数是参数 vocab_size，不要从 target 里推")
            compare(out, make(target, V, 1 - eps + eps / V, eps / V), what=what, variants=[
                Variant("spread_over_others", "你把 ε 只分给了其余 V−1 个类（正确类 1−ε，其余 ε/(V−1)）——这是另一种常见约定；"
                        "本书与 F.cross_entropy(label_smoothing=ε) 一致：ε 平均分给全部 V 个类，正确类得 1−ε+ε/V",
                        make(target, V, 1 - eps, eps / (V - 1))),
                Variant("rows_do_not_sum_to_one", "每行加起来不等于 1：正确类应得 1−ε+ε/V（它自己也分到一份 ε/V），"
                        "不是 1−ε", make(target, V, 1 - eps, eps / V)),
                Variant("swapped", "弄反了：正确类应得到大部分概率（1−ε+ε/V），其余类各得 ε/V",
                        make(target, V, eps / V, 1 - eps + eps / V)),
            ])

    def zero_smoothing(f):
        target, V, _ = cases[-1]
        out = f(target.clone(), V, 0.0)
        compare(out, make(target, V, 1.0, 0.0), what="ε = 0 时的目标分布", default_hint="ε = 0 时应退化为 one-hot 分布")

    return run_checks("标签平滑目标分布", fn, [("几组随机的 V 与 ε", values), ("ε = 0 退化为 one-hot", zero_smoothing)],
                      verbose=verbose)
