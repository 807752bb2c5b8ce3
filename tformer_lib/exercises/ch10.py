"""第 10 章（现代大模型的结构改动）练习的检查器，和“找错”题里那段有错的代码。

- :func:`check_rms_equals_layer`（预测再验证）：什么样的输入上 LayerNorm 与 RMSNorm 给出同样的结果；
- :func:`buggy_grouped_attention` + :func:`check_fixed_grouped_attention`（找错）：不复制 K/V 的分组查询注意力，
  MHA 与 MQA 时都对，真正分组时错了；
- :func:`check_interleaved_to_halves`（实现）：把按相邻配对训练的 RoPE 权重（Meta 原始 LLaMA 的写法）换成
  前后两半配对（本书与 Hugging Face 的写法），注意力打分不变；
- :func:`check_lm_param_count`（推导并核对）：任意配置（GQA、SwiGLU、RMSNorm、RoPE、是否共享输出层）的参数量。

每个检查器都在多组随机尺寸上调用读者的函数（写死的答案过不了），接受任何正确的数值类型，
桩（stub）→ “⏳ 尚未完成”，不抛异常。
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from tformer_lib.parts.attention import scaled_dot_product_attention
from tformer_lib.exercises._core import (
    CheckResult,
    Mistake,
    TorchCalls,
    Variant,
    as_bool,
    as_int,
    as_tensor,
    compare,
    draw_choice,
    draw_int,
    random_cases,
    run_checks,
)
from tformer_lib.lm.config import LMConfig
from tformer_lib.lm.model import make_lm
from tformer_lib.parts.masks import causal_mask
from tformer_lib.translation.model import count_parameters
from tformer_lib.parts.norms import RMSNorm
from tformer_lib.parts.positional import apply_rope

__all__ = [
    "check_rms_equals_layer",
    "buggy_grouped_attention",
    "check_fixed_grouped_attention",
    "check_interleaved_to_halves",
    "check_lm_param_count",
]


# ---- 预测再验证：LayerNorm 与 RMSNorm 何时相同 ------------------------------------------------------------

# 预测题里不许调用的归一化（算一遍再比就不是预测了）；x.norm()、torch.linalg.vector_norm 这类求范数的不在其列
_NORM_FUNCTIONS = {"layer_norm", "rms_norm", "group_norm", "batch_norm", "instance_norm"}


def check_rms_equals_layer(fn: Callable[..., Any], *, verbose: bool = True) -> CheckResult:
    """检查 ``fn(x) -> bool``：对向量 ``x`` ``(d,)``，预测 γ=1、β=0 的 LayerNorm 与 RMSNorm 的输出是否相同。"""

    def cases(f):
        for g in random_cases(8, seed=101):
            d = draw_int(g, 4, 64)
            x = torch.randn(d, generator=g, dtype=torch.float64) * (0.5 + 3 * float(torch.rand((), generator=g)))
            kind = draw_int(g, 0, 2)
            if kind == 0:
                x = x - x.mean()  # 均值恰为 0
            elif kind == 1:
                x = x + 0.5 + float(torch.rand((), generator=g))  # 明显不为 0 的均值
            with torch.no_grad():
                same = torch.allclose(F.layer_norm(x, (d,), eps=1e-5), RMSNorm(d)(x.float()).double(), atol=1e-4)
            with TorchCalls() as calls:
                returned = f(x.clone())
            normed = [name for name in calls.names if name in _NORM_FUNCTIONS]
            if normed:
                raise Mistake(f"你的函数调用了 {'、'.join(dict.fromkeys(normed))}：这是预测题，把两个公式写在一起看 x 的什么"
                              "性质决定它们相同，不要把两种归一化都算一遍再比", key="computed")
            got = as_bool(returned, f"预测（x 的均值 {float(x.mean()):+.3f}）")
            exact = torch.tensor([1.0, -1.0, 2.0, -2.0], dtype=torch.float64)  # 均值恰好是 0（浮点数里也是）
            if got != same and same and abs(float(x.mean())) < 1e-12 and as_bool(f(exact), "预测（均值恰为 0）"):
                raise Mistake(f"d={d}、x 的均值为 {float(x.mean()):.1e}（浮点数里减去均值之后几乎从不恰好是 0）时两者相同，"
                              "你预测不同：判断“均值为 0”要留一点容差，例如 abs(均值) < 1e-6", key="exact_zero")
            if got != same:
                raise Mistake(f"d={d}、x 的均值为 {float(x.mean()):+.3f}、均方根为 {float(x.pow(2).mean().sqrt()):.3f} 时，"
                              f"两者{'相同' if same else '不同'}，你预测{'相同' if got else '不同'}。"
                              "把两个公式写在一起：LayerNorm 减去了什么、除以的是什么？", key="values")

    return run_checks("LayerNorm 与 RMSNorm 何时相同", fn, [("8 个随机向量（有的均值为 0，有的不为 0）", cases)],
                      verbose=verbose, forbidden=(RMSNorm,))


# ---- 找错：不复制 K/V 的分组查询注意力 -------------------------------------------------------------------


def buggy_grouped_attention(q, k, v, mask=None):
    """一个有一处错误的分组查询注意力（第 10 章“找错”练习用，不要在别处使用）。

    ``q`` ``(B, h, T, d_k)``，``k``、``v`` ``(B, h_kv, T_k, d_k)``，h 是 h_kv 的整数倍；``mask`` 布尔（True = 可以关注），
    能广播到 ``(T, T_k)``。不把 K/V 复制 h/h_kv 份，而是把同组的查询头摞在一起，与同一个 K/V 头一次算完。
    """
    B, h, T, d_k = q.shape
    h_kv = k.shape[1]
    g = h // h_kv  # 每组几个查询头
    qg = q.reshape(B, g, h_kv, T, d_k).transpose(1, 2)  # (B, h_kv, g, T, d_k)
    scores = qg @ k[:, :, None].transpose(-2, -1) / math.sqrt(d_k)  # (B, h_kv, g, T, T_k)
    if mask is not None:
        scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
    out = scores.softmax(dim=-1) @ v[:, :, None]  # (B, h_kv, g, T, d_k)
    return out.transpose(1, 2).reshape(B, h, T, d_k)  # (B, h, T, d_k)


def _gqa_reference(q, k, v, mask):
    group = q.shape[1] // k.shape[1]
    k = k.repeat_interleave(group, dim=1)  # (B, h, T_k, d_k)
    v = v.repeat_interleave(group, dim=1)  # (B, h, T_k, d_k)
    return scaled_dot_product_attention(q, k, v, mask)[0]  # (B, h, T, d_k)


class _CopyWatch(TorchFunctionMode):
    """记下读者的代码里哪些 torch 调用造出了 ``numel`` 个元素、又不与 ``k``/``v`` 共用存储的新张量。

    “把 K/V 复制成 h 个头”（``repeat_interleave``、``repeat``、``cat``、``expand`` 之后 ``reshape``……）造出的正是
    ``B·h·T_k·d_k`` 个元素的新张量；不复制的写法只有 ``expand``/``[:, :, None]`` 这类视图（共用存储），
    矩阵乘在内部怎样广播，这里看不见也不管。
    """

    def __init__(self, numel: int, *shared: torch.Tensor):
        super().__init__()
        self.numel, self.shared = numel, {t.untyped_storage().data_ptr() for t in shared}
        self.copies: list[str] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if (isinstance(t, torch.Tensor) and t.numel() == self.numel
                    and t.untyped_storage().data_ptr() not in self.shared):
                self.copies.append(getattr(func, "__name__", str(func)))
        return out


def check_fixed_grouped_attention(fn: Callable[..., Any], *, verbose: bool = True) -> CheckResult:
    """检查改好的 ``fn(q, k, v, mask) -> (B, h, T, d_k)``：与“把每个 K/V 头复制给同组查询头”的注意力一致，
    而且**不复制** K/V（题目的要求）。

    查询头 i 属于第 i // (h/h_kv) 组（与库里 ``MultiHeadAttention`` 显式路径的 ``repeat_interleave`` 相同）。
    不复制的检查：在一组 ``T ≠ T_k`` 的输入上（这样 K/V 的 h 头副本的元素数与其他中间结果都不同），看读者的
    torch 调用有没有造出 ``B·h·T_k·d_k`` 个元素的新张量（:class:`_CopyWatch`）。
    """

    def cases(f):
        shapes = [(1, 4), (4, 1), (2, 2), (2, 3), (3, 2), (4, 2)]  # (h_kv, 每组几个查询头)，含 MHA 与 MQA
        for i, g in enumerate(random_cases(6, seed=102)):
            h_kv, group = shapes[i]
            B, T, d_k = draw_int(g, 1, 3), draw_int(g, 2, 7), draw_int(g, 2, 8)
            q = torch.randn(B, h_kv * group, T, d_k, generator=g, dtype=torch.float64)
            k = torch.randn(B, h_kv, T, d_k, generator=g, dtype=torch.float64)
            v = torch.randn(B, h_kv, T, d_k, generator=g, dtype=torch.float64)
            mask = causal_mask(T)
            want = _gqa_reference(q, k, v, mask)
            call = f"fixed_grouped_attention(q {tuple(q.shape)}, k {tuple(k.shape)}, …, 因果掩码)"
            compare(f(q.clone(), k.clone(), v.clone(), mask.clone()), want, what=call, atol=1e-8, rtol=1e-6, variants=[
                Variant("groups_interleaved", f"{call}：h_kv={h_kv}、每组 {group} 个查询头时，查询头 i 应该用第 i // {group} 个 "
                        f"K/V 头，你的写法让它用了第 i % {h_kv} 个（两者只在 h_kv = 1 或每组 1 个头时相同）",
                        buggy_grouped_attention(q, k, v, mask)),
                Variant("mask_ignored", f"{call}：忘了因果掩码", _gqa_reference(q, k, v, None)),
            ])

    def no_copies(f):
        g = torch.Generator().manual_seed(103)
        B, h_kv, group, T, T_k, d_k = 2, 2, 3, 3, 7, 5  # K/V 的 h 头副本 2·6·7·5 = 420 个元素，别的中间结果都不是
        q = torch.randn(B, h_kv * group, T, d_k, generator=g, dtype=torch.float64)
        k = torch.randn(B, h_kv, T_k, d_k, generator=g, dtype=torch.float64)
        v = torch.randn(B, h_kv, T_k, d_k, generator=g, dtype=torch.float64)
        mask = torch.ones(T, T_k, dtype=torch.bool).tril(T_k - T)  # (T, T_k)：解码时的因果掩码，前面 T_k − T 个是缓存
        watch = _CopyWatch(B * h_kv * group * T_k * d_k, k, v)
        with watch:
            got = f(q, k, v, mask)
        call = f"fixed_grouped_attention(q {tuple(q.shape)}, k {tuple(k.shape)}, …, 掩码 {tuple(mask.shape)})"
        compare(got, _gqa_reference(q, k, v, mask), what=call, atol=1e-8, rtol=1e-6)
        if watch.copies:
            raise Mistake(f"{call}：结果对了，但 {'、'.join(dict.fromkeys(watch.copies))} 造出了一份 h 个头的 K/V 副本"
                          f"（{B}·{h_kv * group}·{T_k}·{d_k} 个元素）——这正是题目要省掉的内存。"
                          "让同组的查询头摞在一起、与同一个 K/V 头相乘（k[:, :, None] 这样的视图不复制）", key="copies_kv")

    return run_checks("分组查询注意力", fn, [("6 组 (h_kv, 每组头数)，含 MHA、MQA 与真正的分组", cases),
                                      ("T ≠ T_k 的一组：结果正确，而且不把 K/V 复制成 h 个头", no_copies)],
                      verbose=verbose)


# ---- 实现：把相邻配对的 RoPE 权重换成前后两半配对 ------------------------------------------------------------


def _rope_interleaved(x: torch.Tensor, positions: torch.Tensor, base: float) -> torch.Tensor:
    """相邻配对（Meta 原始 LLaMA 代码的写法）的 RoPE：第 2i 维与第 2i+1 维配成一对，按 ``pos·θ_i`` 旋转。

    ``x`` ``(T, h, d_k)``，``positions`` ``(T,)``；在 float64 里算。
    """
    T, h, d_k = x.shape
    theta = base ** (-torch.arange(0, d_k, 2, dtype=torch.float64) / d_k)  # (d_k/2,)
    angle = positions.to(torch.float64)[:, None, None] * theta  # (T, 1, d_k/2)
    pairs = x.to(torch.float64).reshape(T, h, d_k // 2, 2)  # (T, h, d_k/2, 2)：相邻两维一对
    a, b = pairs[..., 0], pairs[..., 1]  # 各 (T, h, d_k/2)
    rotated = torch.stack([a * angle.cos() - b * angle.sin(), a * angle.sin() + b * angle.cos()], dim=-1)
    return rotated.reshape(T, h, d_k)  # (T, h, d_k)


def _rope_scores(wq, wk, x, positions, n_heads, base, rope) -> torch.Tensor:
    """``x`` ``(T, d_in)`` 经 ``wq``、``wk`` 投影、按头切开、旋转后的打分 ``(h, T, T)``。"""
    T = x.shape[0]
    q = (x @ wq.T).reshape(T, n_heads, -1)  # (T, h, d_k)
    k = (x @ wk.T).reshape(T, n_heads, -1)  # (T, h, d_k)
    q, k = rope(q, positions, base), rope(k, positions, base)
    return q.transpose(0, 1) @ k.permute(1, 2, 0)  # (h, T, d_k) @ (h, d_k, T) → (h, T, T)


def _rope_halves(x: torch.Tensor, positions: torch.Tensor, base: float) -> torch.Tensor:
    """库里的 RoPE（前后两半配对），``x`` ``(T, h, d_k)``。"""
    return apply_rope(x.to(torch.float64).transpose(0, 1), positions, base).transpose(0, 1)  # (T, h, d_k)


def _is_row_permutation(new: torch.Tensor, old: torch.Tensor, rtol: float) -> bool:
    """``new`` 的行是否恰好是 ``old`` 的行换了顺序（每行找到一个不同的、在容差内相等的原行）。"""
    distance = torch.cdist(new, old, compute_mode="donot_use_mm_for_euclid_dist")  # (rows, rows)：新行 i 与原行 j 的距离
    nearest = distance.argmin(dim=1)  # (rows,)
    scale = rtol * float(old.abs().max())
    return bool((distance.min(dim=1).values <= scale * old.shape[1] ** 0.5).all()) and nearest.unique().numel() == len(nearest)


def _float_eps(value: Any) -> float:
    """返回值的浮点精度（torch 或 NumPy 的浮点数组）；认不出时按 float64。"""
    dtype = getattr(value, "dtype", None)
    if isinstance(dtype, torch.dtype) and dtype.is_floating_point:
        return torch.finfo(dtype).eps
    try:
        import numpy as np

        return float(np.finfo(dtype).eps) if dtype is not None and np.issubdtype(dtype, np.floating) else 2.0 ** -52
    except (ImportError, TypeError, ValueError):
        return 2.0 ** -52


def _layout_variants(w: torch.Tensor, h: int) -> list[tuple[str, torch.Tensor, str]]:
    rows, d_in = w.shape
    d_k = rows // h
    return [
        ("unchanged", w, "原样返回：两种写法配对的维度不同，同一组权重在前后两半配对的 RoPE 下转出的是另一对维度"),
        ("whole_matrix", w.reshape(rows // 2, 2, d_in).transpose(0, 1).reshape(rows, d_in),
         "把整个矩阵当成一个头重排了：RoPE 在每个头里各自配对，先按头切开（每头 d_k 行），在每个头内部重排"),
        ("inverse", w.reshape(h, 2, d_k // 2, d_in).transpose(1, 2).reshape(rows, d_in),
         "方向反了：这是把前后两半配对的权重换成相邻配对。新矩阵第 i 行（前半）应取原来的第 2i 行，"
         "第 i + d_k/2 行（后半）取原来的第 2i+1 行"),
        ("swapped", w.reshape(h, d_k // 2, 2, d_in).flip(2).transpose(1, 2).reshape(rows, d_in),
         "每一对的两行放反了：第 2i 行应到前半（第 i 行）、第 2i+1 行到后半（第 i + d_k/2 行）。放反等于把每一对反着转（角度变成 −θ_i），"
         "打分就依赖 m − n 的相反数"),
        ("columns", w.reshape(rows, d_in // 2, 2).transpose(1, 2).reshape(rows, d_in) if d_in % 2 == 0 else w,
         "重排的是输入维（列）：RoPE 旋转的是投影出来的 q、k 的维度，也就是 W 的输出维（行）"),
    ]


def check_interleaved_to_halves(fn: Callable[..., Any], *, verbose: bool = True) -> CheckResult:
    """检查 ``fn(w, n_heads) -> Tensor``：把按**相邻配对**（第 2i、2i+1 维一对）训练的 ``W^Q`` 或 ``W^K``
    ``(n_heads·d_k, d_in)`` 的行重排，使它在库里**前后两半配对**（第 i、i+d_k/2 维一对）的 RoPE 下给出同样的打分。

    在随机的头数、``d_k``、``base`` 与位置上，比较两种写法的注意力打分 ``(h, T, T)``（float64）。
    """

    def cases(f):
        for case, g in enumerate(random_cases(6, seed=105)):
            h = draw_choice(g, (1, 2, 4))
            d_k = draw_choice(g, (8, 16))
            d_in = 2 * draw_int(g, 2, 6)
            T = draw_int(g, 3, 7)
            base = draw_choice(g, (10000.0, 500000.0, 100.0))
            positions = torch.randint(0, 4096, (T,), generator=g)
            wq = torch.randn(h * d_k, d_in, generator=g, dtype=torch.float64)
            wk = torch.randn(h * d_k, d_in, generator=g, dtype=torch.float64)
            x = torch.randn(T, d_in, generator=g, dtype=torch.float64)
            want = _rope_scores(wq, wk, x, positions, h, base, _rope_interleaved)
            call = f"interleaved_to_halves(w, n_heads={h})（w 的形状 ({h * d_k}, {d_in})，d_k={d_k}）"
            before_q, before_k = wq.clone(), wk.clone()
            order = ("q", "k") if case % 2 == 0 else ("k", "q")  # 两个矩阵的调用次序轮换：答案不能依赖先换哪一个
            raw = {name: f({"q": wq, "k": wk}[name], h) for name in order}
            if not (torch.equal(wq, before_q) and torch.equal(wk, before_k)):
                raise Mistake(f"{call} 改动了传进来的 w：返回一个新张量，不要原地修改参数", key="in_place")
            new_q, new_k = (as_tensor(raw[name], f"{call} 的返回值") for name in ("q", "k"))
            if new_q.shape != wq.shape or new_k.shape != wk.shape:
                raise Mistake(f"{call} 返回的形状是 {tuple(new_q.shape)}，应与 w 相同：{tuple(wq.shape)}", key="shape")
            got = _rope_scores(new_q, new_k, x, positions, h, base, _rope_halves)
            # 答案可以是 float32（例如先建一个 torch.zeros 再逐行填）：容差按返回值里精度最低的那种浮点数放宽
            eps = max(_float_eps(raw["q"]), _float_eps(raw["k"]))
            if torch.allclose(got, want, rtol=1e3 * eps, atol=1e3 * eps * float(want.abs().max())):
                for name, new, old in (("W^Q", new_q, wq), ("W^K", new_k, wk)):
                    if not _is_row_permutation(new, old, 1e3 * eps):
                        raise Mistake(f"{call}：打分对上了，但换过的 {name} 不只是原矩阵的行换了顺序（有的行被缩放、改号或混合了）。"
                                      "题目只要求重排行：每一行原样搬到新位置", key="not_permutation")
                continue
            for key, value, hint in _layout_variants(wq, h):
                if torch.allclose(new_q, value, rtol=1e3 * eps, atol=0):
                    raise Mistake(f"{call}：{hint}", key=key)
            worst = float((got - want).abs().max())
            raise Mistake(f"{call}：换过的权重在前后两半配对的 RoPE 下，打分与相邻配对的原模型最多差 {worst:.3g}"
                          f"（位置 {positions.tolist()}）。每个头里，旋转角 θ_i 相同的那一对维度要落到第 i 与第 i+d_k/2 行",
                          key="values")

    return run_checks("相邻配对的 RoPE 权重换成前后两半配对", fn,
                      [("6 组随机的头数、d_k、base 与位置，比较注意力打分", cases)], verbose=verbose)


# ---- 推导并核对：任意配置的参数量 ----------------------------------------------------------------------------


def _model_answers() -> tuple:
    """推导题要读者从配置算出来：建一个模型再去数参数就绕过了推导，检查器不收。"""
    from tformer_lib.lm import DecoderOnlyLM, LMCache
    from tformer_lib.measurement.memory import parameter_count

    return (make_lm, DecoderOnlyLM, LMCache, count_parameters, parameter_count)


def _random_config(g: torch.Generator) -> LMConfig:
    h_kv = draw_int(g, 1, 3)
    h = h_kv * draw_int(g, 1, 3)
    return LMConfig(
        draw_int(g, 10, 300), d_model=h * 2 * draw_int(g, 1, 5), n_heads=h, n_kv_heads=draw_choice(g, [None, h_kv]),
        n_layers=draw_int(g, 1, 3), d_ff=draw_int(g, 4, 60), max_len=draw_int(g, 4, 40),
        positional=draw_choice(g, ["learned", "sinusoidal", "rope", "none"]), norm=draw_choice(g, ["layer", "rms"]),
        norm_first=draw_choice(g, [True, False]), activation=draw_choice(g, ["relu", "gelu", "swiglu"]),
        tie_embeddings=draw_choice(g, [True, False]),
    )


def _param_variants(c: LMConfig) -> list[tuple[int, str, str]]:
    d, f, V = c.d_model, c.d_ff, c.vocab_size
    kv = c.kv_heads * c.d_k

    def count(*, kv=kv, swiglu_mats=3, norm_params=None, pos=True, final=True, head=None):
        attn = 2 * (d * d + d) + 2 * (d * kv + kv)
        ffn = (swiglu_mats - 1) * (d * f + f) + f * d + d if c.activation == "swiglu" else 2 * d * f + f + d
        per_norm = norm_params if norm_params is not None else (2 * d if c.norm == "layer" else d)
        n_norms = 2 * c.n_layers + (1 if (c.norm_first and final) else 0)
        emb = V * d + (c.max_len * d if (c.positional == "learned" and pos) else 0)
        out = (0 if c.tie_embeddings else V * d) if head is None else head
        return c.n_layers * (attn + ffn) + n_norms * per_norm + emb + out

    return [
        (count(head=V * d), "tied_twice", "共享（tie）时输出层就是词嵌入矩阵本身，不再另算 V × d_model 个参数"),
        (count(kv=d), "gqa_full_kv", "GQA 时 W^K、W^V 只投影到 n_kv_heads × d_k 维，比 d_model 窄"),
        (count(swiglu_mats=2), "swiglu_two", "SwiGLU 有三个矩阵：W_1、门 W_3（都是 d_model→d_ff，带偏置）和 W_2"),
        (count(norm_params=2 * d), "rms_bias", "RMSNorm 只有 γ，没有 β"),
        (count(pos=False), "no_pos", "学习的位置嵌入（learned）有 max_len × d_model 个参数；正弦、RoPE 没有参数"),
        (count(final=False), "no_final_norm", "pre-LN 的模型在输出层前还有一个末层归一化"),
    ]


def check_lm_param_count(fn: Callable[..., Any], *, verbose: bool = True) -> CheckResult:
    """检查 ``fn(config: LMConfig) -> int``：``make_lm(config)`` 的参数个数（共享的矩阵只算一次），在 10 个随机配置上核对。"""

    def cases(f):
        for g in random_cases(10, seed=104):
            c = _random_config(g)
            with torch.random.fork_rng(devices=[]):
                want = count_parameters(make_lm(c))
            desc = (f"LMConfig(vocab_size={c.vocab_size}, d_model={c.d_model}, n_heads={c.n_heads}, "
                    f"n_kv_heads={c.n_kv_heads}, n_layers={c.n_layers}, d_ff={c.d_ff}, max_len={c.max_len}, "
                    f"positional={c.positional!r}, norm={c.norm!r}, norm_first={c.norm_first}, "
                    f"activation={c.activation!r}, tie_embeddings={c.tie_embeddings})")
            got = as_int(f(LMConfig.from_dict(c.to_dict())), "lm_param_count 的返回值")
            if got == want:
                continue
            for value, key, hint in _param_variants(c):
                if got == value and value != want:
                    raise Mistake(f"{desc}：你算出 {got:,}，应为 {want:,}。{hint}", key=key)
            raise Mistake(f"{desc}：你算出 {got:,}，应为 {want:,}。逐块数：注意力 4 个 nn.Linear、FFN 2 或 3 个、"
                          "每块 2 个归一化，再加嵌入、位置与输出层", key="values")

    return run_checks("语言模型的参数量", fn, [("10 个随机配置（GQA、SwiGLU、RMSNorm、RoPE、共享与否）", cases)],
                      verbose=verbose, forbidden=_model_answers())
