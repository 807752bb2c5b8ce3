"""第 10 章（现代大模型的结构改动）练习的检查器，和“找错”题里那段有错的代码。

- :func:`check_rms_equals_layer`（预测再验证）：什么样的输入上 LayerNorm 与 RMSNorm 给出同样的结果；
- :func:`buggy_grouped_attention` + :func:`check_fixed_grouped_attention`（找错）：不复制 K/V 的分组查询注意力，
  MHA 与 MQA 时都对，真正分组时错了；
- :func:`check_kv_bytes_per_token`（推导并核对）：每生成一个词元，K/V 缓存长多少字节；
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

from tformer_lib.attention import scaled_dot_product_attention
from tformer_lib.exercises._core import (
    CheckResult,
    Mistake,
    TorchCalls,
    Variant,
    as_bool,
    as_int,
    compare,
    draw_choice,
    draw_int,
    random_cases,
    run_checks,
)
from tformer_lib.lm.config import LMConfig
from tformer_lib.lm.model import make_lm
from tformer_lib.masks import causal_mask
from tformer_lib.model import count_parameters
from tformer_lib.norms import RMSNorm

__all__ = [
    "check_rms_equals_layer",
    "buggy_grouped_attention",
    "check_fixed_grouped_attention",
    "check_kv_bytes_per_token",
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


# ---- 推导并核对：K/V 缓存每个词元多少字节 -----------------------------------------------------------------

_DTYPES = ((torch.float32, 4), (torch.float64, 8), (torch.bfloat16, 2))


def _model_answers() -> tuple:
    """推导题要读者从配置算出来：建一个模型再去量（或数参数）就绕过了推导，检查器不收。"""
    from tformer_lib.costs import kv_cache_bytes, kv_cache_bytes_per_token as enc_dec_kv_bytes_per_token
    from tformer_lib.lm import DecoderOnlyLM, LMCache
    from tformer_lib.memory import parameter_count
    from tformer_lib.model import count_parameters
    from tformer_lib.modern_variants import kv_cache_bytes_per_token

    return (make_lm, DecoderOnlyLM, LMCache, count_parameters, parameter_count, kv_cache_bytes_per_token,
            enc_dec_kv_bytes_per_token, kv_cache_bytes)


def check_kv_bytes_per_token(fn: Callable[..., Any], *, verbose: bool = True) -> CheckResult:
    """检查 ``fn(n_layers, d_model, n_heads, n_kv_heads, bytes_per_value) -> int``：K/V 缓存每个词元占的字节数，
    与真实模型的 :class:`~tformer_lib.lm.LMCache` 量出的 ``nbytes()`` 比较。"""

    def cases(f):
        pending: Mistake | None = None  # 一组尺寸上两种错误写法恰好同值时，留到能区分它们的那组再点名
        for g in random_cases(6, seed=103):
            h_kv = draw_int(g, 1, 3)
            h = h_kv * draw_int(g, 1, 3)
            d_k = 2 * draw_int(g, 1, 4)
            N = draw_int(g, 1, 3)
            dtype, nbytes = draw_choice(g, _DTYPES)
            config = LMConfig(30, d_model=h * d_k, n_heads=h, n_kv_heads=h_kv, n_layers=N, d_ff=16, max_len=16)
            model = make_lm(config).to(dtype).eval()
            B, T = draw_int(g, 1, 3), draw_int(g, 2, 9)
            cache = model.new_cache()
            with torch.no_grad():
                model(torch.randint(4, 30, (B, T), generator=g), cache=cache)
            want = cache.nbytes() // (B * T)
            call = f"kv_bytes_per_token(n_layers={N}, d_model={h * d_k}, n_heads={h}, n_kv_heads={h_kv}, bytes_per_value={nbytes})"
            got = as_int(f(N, h * d_k, h, h_kv, nbytes), f"{call} 的返回值")
            if got == want:
                continue
            wrong = [
                (2 * N * h * d_k * nbytes, "n_heads", "缓存里存的是 K/V 头（n_kv_heads 个），不是查询头：GQA 省的正是这里"),
                (N * h_kv * d_k * nbytes, "k_only", "K 和 V 都要缓存：少了一个 2"),
                (2 * h_kv * d_k * nbytes, "one_layer", "每一层都有自己的 K/V 缓存：还要乘层数"),
                (2 * N * h_kv * d_k, "elements", "算出的是元素个数，还要乘每个数的字节数"),
                (2 * N * h_kv * h * d_k * nbytes, "d_model_per_head", "每个 K/V 头只有 d_k = d_model / n_heads 维"),
            ]
            hits = [(key, hint) for value, key, hint in wrong if got == value and value != want]
            if len(hits) == 1:
                raise Mistake(f"{call} 返回 {got}，应为 {want}。{hits[0][1]}", key=hits[0][0])
            mistake = Mistake(f"{call} 返回 {got}，实测 {want}", key="values")
            if not hits:
                raise mistake
            pending = pending or mistake
        if pending is not None:
            raise pending

    return run_checks("K/V 缓存每个词元的字节数", fn, [("6 个随机配置与数据类型，量真实的缓存", cases)], verbose=verbose,
                      forbidden=_model_answers())


# ---- 推导并核对：任意配置的参数量 ----------------------------------------------------------------------------


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
