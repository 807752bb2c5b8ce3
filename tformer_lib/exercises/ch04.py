"""第 4 章练习的检查器（checker）与两道“找错”题里那两段有错的代码。

- :func:`buggy_masked_attention` + :func:`check_fixed_masked_attention`（找错）：掩码放错了地方；
- :func:`buggy_mha_forward` + :func:`check_fixed_mha_forward`（找错）：拼接各头时少了一步，单头时看不出来；
- :func:`check_layer_param_count`（推导并核对）：一个编码器层 / 解码器层的参数量；
- :func:`check_changed_positions`（预测再验证）：改掉一个输入位置，哪些输出会变；
- :func:`check_sliding_window_mask`（扩展）：只看最近 window 个位置的因果掩码（滑动窗口注意力）。

每个检查器都在多组随机尺寸上调用读者的函数（写死的答案过不了），接受任何正确的数值类型，
桩（stub）→ “⏳ 尚未完成”，不抛异常。
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator
from typing import Any

import torch

from tformer_lib.parts.attention import MultiHeadAttention, fast_scaled_dot_product_attention, scaled_dot_product_attention
from tformer_lib.exercises._core import (
    CheckResult,
    Mistake,
    Variant,
    as_bool,
    as_int,
    as_tensor,
    compare,
    expect_dtype,
    generator,
    run_checks,
)

__all__ = [
    "buggy_masked_attention",
    "check_fixed_masked_attention",
    "buggy_mha_forward",
    "check_fixed_mha_forward",
    "check_layer_param_count",
    "check_changed_positions",
    "changed_positions_experiment",
    "check_sliding_window_mask",
]


def _pair(out: Any, call: str) -> tuple[Any, Any]:
    if not (isinstance(out, (tuple, list)) and len(out) == 2):
        raise Mistake(f"{call} 应返回二元组 (output, weights)", key="type")
    return out[0], out[1]


# ---- 找错 1：掩码放错了地方 -------------------------------------------------------------------------------


def buggy_masked_attention(q, k, v, mask):
    """一个有一处错误的带掩码注意力（第 4 章“找错”练习用，不要在别处使用）。

    ``mask`` 为布尔张量（True = 可以关注），能广播到 ``(..., T_q, T_k)``；返回 ``(output, weights)``。
    """
    d_k = q.shape[-1]
    scores = q @ k.transpose(-2, -1) / math.sqrt(d_k)  # (..., T_q, T_k)
    weights = scores.softmax(dim=-1)  # (..., T_q, T_k)
    weights = weights.masked_fill(~mask, 0.0)  # 被屏蔽的键权重为 0
    return weights @ v, weights  # (..., T_q, d_v), (..., T_q, T_k)


def _random_masks(g: torch.Generator, B: int, T_q: int, T_k: int) -> list[tuple[str, torch.Tensor]]:
    """三种掩码：填充掩码 (B,1,1,T_k)、因果掩码 (T,T)（T_q = T_k 时）、随机掩码 (B,1,T_q,T_k)；每行至少留一个键。"""
    lengths = torch.randint(1, T_k + 1, (B,), generator=g)
    lengths[0] = T_k - 1 if T_k > 1 else 1  # 至少有一句真的带 <pad>
    pad = (torch.arange(T_k)[None, :] < lengths[:, None])[:, None, None, :]  # (B, 1, 1, T_k)
    rand = torch.rand(B, 1, T_q, T_k, generator=g) > 0.5  # (B, 1, T_q, T_k)
    rand[..., int(torch.randint(0, T_k, (1,), generator=g))] = True
    masks = [("填充掩码", pad), ("随机掩码", rand)]
    if T_q == T_k:
        masks.append(("因果掩码", torch.ones(T_q, T_k, dtype=torch.bool).tril()))
    return masks


def check_fixed_masked_attention(fn: Callable[..., Any], *, verbose: bool = True) -> CheckResult:
    """检查改好的 ``fn(q, k, v, mask) -> (output, weights)`` 是否与库里的 ``scaled_dot_product_attention`` 一致
    （每个查询至少能看见一个键的情形）。"""

    def one(f, B, h, T_q, T_k, d_k, d_v, seed) -> None:
        g = generator(seed)
        q = torch.randn(B, h, T_q, d_k, generator=g, dtype=torch.float64)
        k = torch.randn(B, h, T_k, d_k, generator=g, dtype=torch.float64)
        v = torch.randn(B, h, T_k, d_v, generator=g, dtype=torch.float64)
        for name, mask in _random_masks(g, B, T_q, T_k):
            call = f"fixed_masked_attention(q {tuple(q.shape)}, …, {name} {tuple(mask.shape)})"
            out, weights = _pair(f(q.clone(), k.clone(), v.clone(), mask.clone()), call)
            ref_out, ref_w = scaled_dot_product_attention(q, k, v, mask=mask)
            s = q @ k.transpose(-2, -1) / math.sqrt(d_k)  # (B, h, T_q, T_k)
            low = torch.finfo(s.dtype).min
            compare(weights, ref_w, what=f"{call} 的 weights", variants=[
                Variant("mask_after_softmax", "掩码放在 softmax 之后：被屏蔽的权重虽然是 0，但每行的和不再是 1"
                        "（softmax 时被屏蔽的键仍然分走了一份）。应在 softmax 之前把被屏蔽的分数填成极小的数",
                        s.softmax(-1).masked_fill(~mask, 0.0)),
                Variant("polarity", "掩码的极性反了：本书约定 True = 可以关注，要屏蔽的是 mask 为 False 的位置（~mask）",
                        s.masked_fill(mask, low).softmax(-1)),
                Variant("mask_ignored", "掩码没有起作用：权重与不带掩码时一样", s.softmax(-1)),
                Variant("fill_zero", "被屏蔽的分数填成了 0：e⁰ = 1，这些键照样分到权重；要填一个极小的数"
                        "（torch.finfo(scores.dtype).min）", s.masked_fill(~mask, 0.0).softmax(-1)),
            ])
            compare(out, ref_out, what=f"{call} 的 output", default_hint="weights 对了，output 不对：output = weights @ v")

    def cases(f):
        g = generator(80)
        for i in range(4):
            B, h, T_q, d_k, d_v = (int(torch.randint(1, 6, (1,), generator=g)) + j for j in (1, 0, 2, 3, 1))
            T_k = T_q if i % 2 == 0 else T_q + 2
            one(f, B, h, T_q, T_k, d_k, d_v, seed=81 + i)

    answers = (scaled_dot_product_attention, fast_scaled_dot_product_attention,
               torch.nn.functional.scaled_dot_product_attention, MultiHeadAttention)
    return run_checks("找错：带掩码的注意力", fn, [("随机尺寸上的填充、因果与随机掩码", cases)], verbose=verbose,
                      forbidden=answers)


# ---- 找错 2：拼接各头 -------------------------------------------------------------------------------------


def buggy_mha_forward(mha: MultiHeadAttention, x: torch.Tensor) -> torch.Tensor:
    """一个有一处错误的多头自注意力前向计算（第 4 章“找错”练习用，不要在别处使用）。

    用 ``mha`` 的 ``w_q``、``w_k``、``w_v``、``w_o``；``x`` 形状 ``(B, T, d_model)``，返回 ``(B, T, d_model)``。
    """
    B, T, d_model = x.shape
    h, d_k = mha.n_heads, mha.d_k
    # 1) 投影并拆头
    q = mha.w_q(x).view(B, T, h, d_k).transpose(1, 2)  # (B, h, T, d_k)
    k = mha.w_k(x).view(B, T, h, d_k).transpose(1, 2)  # (B, h, T, d_k)
    v = mha.w_v(x).view(B, T, h, d_k).transpose(1, 2)  # (B, h, T, d_k)
    # 2) 每个头各自做注意力
    out, _ = scaled_dot_product_attention(q, k, v)  # (B, h, T, d_k)
    # 3) 拼接各头并乘 W^O
    concat = out.reshape(B, T, d_model)  # (B, T, h·d_k)
    return mha.w_o(concat)  # (B, T, d_model)


@contextlib.contextmanager
def _answers_locked(mha: MultiHeadAttention) -> Iterator[None]:
    """读者的函数运行期间，``mha(...)``、``mha.forward`` 与 ``mha.merge_heads`` 本身就是答案：调用它们报 ❌。"""

    def locked(name: str):
        def call(*args: Any, **kwargs: Any) -> Any:
            raise Mistake(f"你的函数调用了 mha.{name}——它本身就是答案。只用 mha.w_q/w_k/w_v/w_o 与张量运算，"
                          "把上面那段代码改正", key="library_call")
        return call

    mha.forward, mha.merge_heads = locked("forward（即 mha(...)）"), locked("merge_heads")
    try:
        yield
    finally:
        del mha.forward, mha.merge_heads


def check_fixed_mha_forward(fn: Callable[..., Any], *, verbose: bool = True) -> CheckResult:
    """检查改好的 ``fn(mha, x)`` 是否等于 ``mha(x, x, x)``（随机的 d_model、头数、批大小与长度）。"""

    def one(f, B, T, d_model, h, seed) -> None:
        with torch.random.fork_rng(devices=[]):  # 建层时的随机初始化不动读者的全局随机状态
            torch.manual_seed(seed)
            mha = MultiHeadAttention(d_model, h).double().eval()
        x = torch.randn(B, T, d_model, generator=generator(seed), dtype=torch.float64)
        call = f"fixed_mha_forward(MultiHeadAttention({d_model}, {h}), x {tuple(x.shape)})"
        with torch.no_grad():
            ref = mha(x, x, x)
            with _answers_locked(mha):
                got = f(mha, x.clone())
            q, k, v = (mha.split_heads(lin(x)) for lin in (mha.w_q, mha.w_k, mha.w_v))  # (B, h, T, d_k)
            out, _ = scaled_dot_product_attention(q, k, v)  # (B, h, T, d_k)
            compare(got, ref, what=f"{call} 的输出", variants=[
                Variant("merge_without_transpose", "拼接各头时直接 reshape 成 (B, T, d_model)：张量此时是 (B, h, T, d_k)，"
                        "不先 transpose(1, 2) 把 h 换回 T 后面，reshape 会把不同位置的数据混进同一行。"
                        "单头（h = 1）时看不出来",
                        mha.w_o(out.reshape(B, T, d_model))),
                Variant("no_w_o", "拼接之后忘了乘 W^O（mha.w_o）", out.transpose(1, 2).reshape(B, T, d_model)),
            ], default_hint=f"与 mha(x, x, x) 不一致（检查的是 d_model={d_model}、h={h}）")

    def single_head(f):  # h = 1：原来的错在这里看不出来
        one(f, 2, 5, 8, 1, seed=90)

    def multi_head(f):
        g = generator(91)
        for i in range(4):
            h = int(torch.randint(2, 5, (1,), generator=g))
            d_model = h * int(torch.randint(2, 6, (1,), generator=g))
            B, T = (int(torch.randint(1, 5, (1,), generator=g)) + j for j in (0, 2))
            one(f, B, T, d_model, h, seed=92 + i)

    return run_checks("找错：多头注意力的前向计算", fn, [
        ("单头", single_head),
        ("随机的头数与维度", multi_head),
    ], verbose=verbose)


# ---- 推导并核对：一层的参数量 ---------------------------------------------------------------------------


def check_layer_param_count(fn: Callable[..., Any], *, verbose: bool = True) -> CheckResult:
    """检查 ``fn(d_model, d_ff, decoder) -> int``：``EncoderLayer`` / ``DecoderLayer``（``decoder=True``）的参数个数。"""
    from tformer_lib.parts.layers import DecoderLayer, EncoderLayer
    from tformer_lib.translation.model import count_parameters

    def variants(d: int, f: int, decoder: bool) -> list[tuple[int, str, str]]:
        n_attn, n_ln = (2, 3) if decoder else (1, 2)
        attn, ffn, ln = 4 * (d * d + d), 2 * d * f + f + d, 2 * d
        return [
            (n_attn * attn + ffn, "no_layernorm", "漏了层归一化：每个 LayerNorm 有 γ、β 两组参数，各 d_model 个"),
            (n_attn * attn + ffn + n_ln * d, "layernorm_half", "LayerNorm 只算了 γ：还有 β，各 d_model 个"),
            (n_attn * 4 * d * d + 2 * d * f + n_ln * ln, "no_bias", "漏了偏置：每个 nn.Linear 都有偏置"),
            (n_attn * attn + d * f + f + n_ln * ln, "one_ffn_matrix", "FFN 有两个矩阵 W_1（d_model×d_ff）和 W_2（d_ff×d_model）"),
            (n_attn * attn + d * f + f + d + n_ln * ln, "one_ffn_matrix",
             "FFN 有两个矩阵 W_1（d_model×d_ff）和 W_2（d_ff×d_model）"),
            (attn + ffn + 2 * ln, "decoder_like_encoder", "解码器层比编码器层多一个交叉注意力和它的 LayerNorm"),
            (2 * attn + ffn + 2 * ln, "decoder_two_norms", "解码器层有三个子层，所以有三个 LayerNorm"),
            (n_attn * attn + ffn + (n_ln + 1) * ln, "extra_norm", "多算了一个 LayerNorm：每个子层一个"),
        ]

    def cases(f):
        g = generator(100)
        for i in range(8):
            h = int(torch.randint(1, 9, (1,), generator=g))
            d = h * int(torch.randint(1, 17, (1,), generator=g))
            d_ff = int(torch.randint(1, 300, (1,), generator=g))
            decoder = bool(i % 2)
            call = f"layer_param_count({d}, {d_ff}, decoder={decoder})"
            got = as_int(f(d, d_ff, decoder), f"{call} 的返回值")
            with torch.random.fork_rng(devices=[]):  # 建层时的随机初始化不动读者的全局随机状态
                layer = (DecoderLayer if decoder else EncoderLayer)(d, h, d_ff)
            want = count_parameters(layer)
            if got == want:
                continue
            for value, key, hint in variants(d, d_ff, decoder):
                if got == value and value != want:
                    raise Mistake(f"{call} 返回 {got:,}，应为 {want:,}。{hint}", key=key)
            raise Mistake(f"{call} 返回 {got:,}，应为 {want:,}。把一层拆成子层：每个注意力 4 个 nn.Linear(d_model, d_model)，"
                          "FFN 两个 nn.Linear，每个子层一个 LayerNorm——都带偏置", key="values")

    # 推导题：在函数里建层再数（count_parameters）就绕过了推导，检查器不收
    return run_checks("一层的参数量", fn, [("8 组随机的 d_model、d_ff，编码器层与解码器层", cases)], verbose=verbose,
                      forbidden=(EncoderLayer, DecoderLayer, count_parameters))


# ---- 预测再验证：改掉一个输入，哪些输出会变 ---------------------------------------------------------------


def _changed_truth(T: int, t: int, causal: bool, t_is_pad: bool) -> list[bool]:
    """一层自注意力里改掉位置 t 的输入后，各输出位置是否改变（理论答案）。"""
    out = []
    for i in range(T):
        if t_is_pad:  # 没有人能把 t 当键看见；只有 t 自己的查询变了——
            # 但 t 只看得见一个键（权重恒为 1）或一个也看不见（整行屏蔽，输出 0）时，它的输出也不变
            visible = [j for j in range(T) if j != t and (not causal or j <= i)]
            out.append(i == t and len(visible) >= 2)
        else:
            out.append(i >= t if causal else True)
    return out


def changed_positions_experiment(T: int, t: int, causal: bool, t_is_pad: bool, seed: int = 0) -> list[bool]:
    """用真实的 ``MultiHeadAttention`` 做实验：改掉位置 ``t`` 的输入，返回每个输出位置是否改变。"""
    from tformer_lib.parts.masks import causal_mask, combine_masks

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        mha = MultiHeadAttention(8, 2).double().eval()
    g = generator(seed)
    x1 = torch.randn(1, T, 8, generator=g, dtype=torch.float64)  # (B, T, d_model)
    x2 = x1.clone()
    x2[0, t] = torch.randn(8, generator=g, dtype=torch.float64)
    keep = torch.ones(1, 1, 1, T, dtype=torch.bool)  # (B, 1, 1, T_k)
    if t_is_pad:
        keep[..., t] = False
    mask = combine_masks(keep, causal_mask(T) if causal else None)
    with torch.no_grad():
        y1, y2 = mha(x1, x1, x1, mask=mask), mha(x2, x2, x2, mask=mask)
    return [(y1[0, i] - y2[0, i]).abs().max().item() > 1e-9 for i in range(T)]


def _bools(value: Any, T: int, call: str) -> list[bool]:
    if isinstance(value, str):
        raise Mistake(f"{call} 返回的是字符串：请返回长度为 T 的布尔列表，例如 [False, True, True]", key="string")
    try:
        got = as_tensor(value, call) if not isinstance(value, (list, tuple)) else None
    except Mistake:
        raise Mistake(f"{call} 应返回长度为 T 的布尔列表（或布尔张量），你返回的是 {type(value).__name__}", key="type")
    items = got.reshape(-1).tolist() if got is not None else list(value)
    if len(items) != T:
        raise Mistake(f"{call} 应返回 T = {T} 个布尔值（每个输出位置一个），你返回了 {len(items)} 个", key="shape")
    return [as_bool(x, f"{call} 的每一项") for x in items]


def check_changed_positions(fn: Callable[..., Any], *, verbose: bool = True) -> CheckResult:
    """检查 ``fn(T, t, causal, t_is_pad) -> list[bool]``：一层多头自注意力里只改位置 ``t`` 的输入，
    哪些输出位置会变（``causal``：是否用因果掩码；``t_is_pad``：位置 ``t`` 是否是 ``<pad>``、被填充掩码挡住）。
    检查器在 ``2 ≤ t ≤ T − 2`` 的随机情形上把你的预测与真实实验（:func:`changed_positions_experiment`）比较。
    """

    def describe(flags: list[bool]) -> str:
        return "".join("变" if x else "·" for x in flags)

    def cases(f):
        g = generator(110)
        combos = [(c, p) for c in (False, True) for p in (False, True)]
        todo = [(int(torch.randint(5, 10, (1,), generator=g)), c, p) for c, p in combos * 2]
        for n, (T, causal, pad) in enumerate(todo):
            t = int(torch.randint(2, T - 1, (1,), generator=g))  # 2 ≤ t ≤ T − 2
            call = f"predict_changed(T={T}, t={t}, causal={causal}, t_is_pad={pad})"
            got = _bools(f(T, t, causal, pad), T, call)
            want = changed_positions_experiment(T, t, causal, pad, seed=111 + n)
            if got == want:
                continue
            hint = f"实验中各位置（“变”= 输出改变）：{describe(want)}，你的预测：{describe(got)}。"
            if not pad and causal and got == [i <= t for i in range(T)]:
                hint += "方向反了：因果掩码下位置 i 看得见 j ≤ i，所以是 t 及其后面的位置看得见 t"
            elif not pad and causal and got == [i > t for i in range(T)]:
                hint += "位置 t 自己的输出也会变：它的查询（和它自己这个键）都变了"
            elif pad and not any(got):
                hint += "填充掩码只挡键、不挡查询：位置 t 自己的查询变了，它的输出也会变"
            elif pad:
                hint += "位置 t 被填充掩码挡住后，没有哪个查询能把它当键看见"
            raise Mistake(hint, key="values")

    return run_checks("改一个输入，哪些输出会变", fn, [("随机长度与位置，四种掩码组合", cases)], verbose=verbose)


# ---- 扩展：滑动窗口的因果掩码 -----------------------------------------------------------------------------


def check_sliding_window_mask(fn: Callable[..., Any], *, verbose: bool = True) -> CheckResult:
    """检查 ``fn(n, window) -> mask``：``(n, n)`` 的布尔掩码，位置 i 只能看见 ``i − window < j ≤ i``（含自己，共 window 个）。"""

    def cases(f):
        g = generator(120)
        for k in range(8):
            n = int(torch.randint(1, 13, (1,), generator=g))
            window = n + 2 if k == 0 else int(torch.randint(1, n + 1, (1,), generator=g))  # 窗口比序列还长时 = 因果掩码
            call = f"sliding_window_mask({n}, {window})"
            got = f(n, window)
            expect_dtype(got, torch.bool, f"{call} 的结果", hint=f"{call} 应返回布尔张量（True = 可以关注）")
            i, j = torch.arange(n)[:, None], torch.arange(n)[None, :]  # (n, 1), (1, n)
            want = (j <= i) & (i - j < window)  # (n, n)
            compare(got, want, what=f"{call} 的结果", variants=[
                Variant("plain_causal", "这是普通的因果掩码：窗口没有起作用，位置 i 还能看到 i − window 之前的位置",
                        j <= i),
                Variant("off_by_one_wide", "窗口宽了一格：算上自己一共只能看 window 个位置，即 i − window < j ≤ i",
                        (j <= i) & (i - j <= window)),
                Variant("off_by_one_narrow", "窗口窄了一格：算上自己应能看 window 个位置，即 i − window < j ≤ i",
                        (j <= i) & (i - j < window - 1)),
                Variant("not_causal", "窗口两边都开了：还要挡住未来的位置（j > i），窗口只向过去延伸",
                        (i - j).abs() < window),
                Variant("transposed", "行列反了：第 i 行是查询 i，它能看的列 j 在它前面（j ≤ i）",
                        (i <= j) & (j - i < window)),
                Variant("polarity", "极性反了：本书约定 True = 可以关注", ~want),
            ])

    return run_checks("滑动窗口的因果掩码", fn, [("8 组随机的长度与窗口", cases)], verbose=verbose)
