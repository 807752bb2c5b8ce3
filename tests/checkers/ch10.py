"""第 10 章检查器的用例：参考答案（与 notebooks/solutions/10_solutions.ipynb 一致）和已知错误答案。"""

import math

import torch

from checkers import Case, Wrong
from tformer_lib import count_parameters, scaled_dot_product_attention
from tformer_lib.lm import DecoderOnlyLM, LMConfig, make_lm
from tformer_lib.parts.norms import RMSNorm
from tformer_lib.exercises.ch10 import (
    buggy_grouped_attention,
    check_fixed_grouped_attention,
    check_interleaved_to_halves,
    check_lm_param_count,
    check_rms_equals_layer,
)


# ---- 练习 1（预测再验证）：均值为 0 时两者相同 ----
def ref_rms_equals_layer(x):
    return abs(float(x.mean())) < 1e-6


def _computes_both(x):  # 两种归一化都算一遍再比：结果对，但这是测量不是预测
    d = x.shape[0]
    return torch.allclose(torch.nn.functional.layer_norm(x, (d,), eps=1e-5), x / x.pow(2).mean().add(1e-6).sqrt(), atol=1e-4)


def _library_rmsnorm(x):
    d = x.shape[0]
    centred = (x - x.mean()) / (x.var(unbiased=False) + 1e-5).sqrt()
    return torch.allclose(centred.float(), RMSNorm(d)(x.float()), atol=1e-4)


RMS = Case(check_rms_equals_layer, ref_rms_equals_layer, returns="bool",
           also_correct=[lambda x: bool(x.mean().abs() <= 1e-6 * torch.linalg.vector_norm(x))],  # 求范数不是归一化
           wrong=[
    Wrong("hard_coded", lambda x: True),
    Wrong("exact_zero", lambda x: float(x.mean()) == 0.0, key="exact_zero"),
    Wrong("computes_both", _computes_both, key="computed"),
    Wrong("library_rmsnorm", _library_rmsnorm, key="library_call"),
    Wrong("always_different", lambda x: False, key="values"),
    Wrong("unit_rms", lambda x: abs(float(x.pow(2).mean()) - 1) < 0.1, key="values"),
])


# ---- 练习 2（找错）：查询头 i 属于第 i // g 组 ----
def ref_grouped_attention(q, k, v, mask=None):
    B, h, T, d_k = q.shape
    h_kv = k.shape[1]
    g = h // h_kv
    qg = q.reshape(B, h_kv, g, T, d_k)  # (B, h_kv, g, T, d_k)：相邻的 g 个查询头是一组
    scores = qg @ k[:, :, None].transpose(-2, -1) / math.sqrt(d_k)  # (B, h_kv, g, T, T_k)
    if mask is not None:
        scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
    out = scores.softmax(dim=-1) @ v[:, :, None]  # (B, h_kv, g, T, d_k)
    return out.reshape(B, h, T, d_k)  # (B, h, T, d_k)


def _repeat_interleave(q, k, v, mask=None):
    g = q.shape[1] // k.shape[1]
    return scaled_dot_product_attention(q, k.repeat_interleave(g, 1), v.repeat_interleave(g, 1), mask)[0]


def _repeat(q, k, v, mask=None):
    g = q.shape[1] // k.shape[1]
    return scaled_dot_product_attention(q, k.repeat(1, g, 1, 1), v.repeat(1, g, 1, 1), mask)[0]


def _expand_then_reshape(q, k, v, mask=None):  # expand 是视图，reshape 却把它复制成 h 个头
    B, h, T, d_k = q.shape
    h_kv, T_k = k.shape[1], k.shape[2]
    k = k[:, :, None].expand(B, h_kv, h // h_kv, T_k, d_k).reshape(B, h, T_k, d_k)  # (B, h, T_k, d_k)
    v = v[:, :, None].expand(B, h_kv, h // h_kv, T_k, d_k).reshape(B, h, T_k, d_k)  # (B, h, T_k, d_k)
    return scaled_dot_product_attention(q, k, v, mask)[0]


def _cat_copies(q, k, v, mask=None):
    g = q.shape[1] // k.shape[1]
    k = torch.stack([k] * g, dim=2).flatten(1, 2)  # (B, h, T_k, d_k)：第 i 个查询头用第 i // g 个 K/V 头
    v = torch.stack([v] * g, dim=2).flatten(1, 2)  # (B, h, T_k, d_k)
    return scaled_dot_product_attention(q, k, v, mask)[0]


GQA = Case(check_fixed_grouped_attention, ref_grouped_attention, wrong=[
    Wrong("hard_coded", lambda q, k, v, mask=None: torch.zeros(1, 4, 3, 2)),
    Wrong("the_bug", buggy_grouped_attention, key="groups_interleaved"),
    Wrong("repeat", _repeat, key="groups_interleaved"),
    Wrong("no_mask", lambda q, k, v, mask=None: _repeat_interleave(q, k, v), key="mask_ignored"),
    Wrong("repeat_interleave", _repeat_interleave, key="copies_kv"),  # 题目不许复制：结果对也不收
    Wrong("expand_then_reshape", _expand_then_reshape, key="copies_kv"),
    Wrong("stack_copies", _cat_copies, key="copies_kv"),
])


# ---- 练习 3（实现）：每个头里，第 2i 行 → 第 i 行，第 2i+1 行 → 第 i + d_k/2 行 ----
def ref_interleaved_to_halves(w, n_heads):
    rows, d_in = w.shape
    d_k = rows // n_heads
    pairs = w.reshape(n_heads, d_k // 2, 2, d_in)  # (h, d_k/2, 2, d_in)：相邻两行一对
    return pairs.transpose(1, 2).reshape(rows, d_in)  # (h, 2, d_k/2, d_in) → 每头先偶数行、再奇数行


def _by_index(w, n_heads):  # 先算出行号再取行：同一个答案的另一种写法
    d_k = w.shape[0] // n_heads
    order = [head * d_k + 2 * i + j for head in range(n_heads) for j in (0, 1) for i in range(d_k // 2)]
    return w[order]


def _halves_to_interleaved(w, n_heads):
    rows, d_in = w.shape
    return w.reshape(n_heads, 2, rows // n_heads // 2, d_in).transpose(1, 2).reshape(rows, d_in)


def _whole_matrix(w, n_heads):
    rows, d_in = w.shape
    return w.reshape(rows // 2, 2, d_in).transpose(0, 1).reshape(rows, d_in)


def _columns(w, n_heads):
    rows, d_in = w.shape
    return w.reshape(rows, d_in // 2, 2).transpose(1, 2).reshape(rows, d_in)


def _in_place(w, n_heads):
    w.copy_(ref_interleaved_to_halves(w.clone(), n_heads))
    return w


def _sign_flipped(w, n_heads):  # 配对对了，但后半取了相反数：旋转方向反了
    out = ref_interleaved_to_halves(w, n_heads).clone()
    d_k = w.shape[0] // n_heads
    out.view(n_heads, d_k, -1)[:, d_k // 2:] *= -1
    return out


def _filled_float32(w, n_heads):  # 先建 float32 的零矩阵再逐行填：正确的排列，只是精度是 float32
    out = torch.zeros(w.shape[0], w.shape[1])
    out[:] = ref_interleaved_to_halves(w, n_heads)
    return out


def _scales_by_call_order():  # 交替乘 2 与 0.5：两次调用的缩放相抵，打分不变，但换出的不是原矩阵的行
    calls = []

    def fn(w, n_heads):
        calls.append(1)
        return ref_interleaved_to_halves(w, n_heads) * (2.0 if len(calls) % 2 else 0.5)
    return fn


ROPE = Case(check_interleaved_to_halves, ref_interleaved_to_halves, also_correct=[_by_index, _filled_float32], wrong=[
    Wrong("hard_coded", lambda w, n_heads: torch.zeros_like(w)),
    Wrong("unchanged", lambda w, n_heads: w.clone(), key="unchanged"),
    Wrong("inverse", _halves_to_interleaved, key="inverse"),
    Wrong("whole_matrix", _whole_matrix, key="whole_matrix"),
    Wrong("columns", _columns, key="columns"),
    Wrong("swapped_in_pair", lambda w, n_heads: w.reshape(n_heads, -1, 2, w.shape[1]).flip(2).transpose(1, 2)
          .reshape(w.shape), key="swapped"),
    Wrong("in_place", _in_place, key="in_place"),
    Wrong("transposed", lambda w, n_heads: ref_interleaved_to_halves(w, n_heads).T, key="shape"),
    Wrong("sign_flipped", _sign_flipped, key="values"),
    Wrong("scales_by_call_order", _scales_by_call_order(), key="not_permutation"),
    Wrong("negated", lambda w, n_heads: -ref_interleaved_to_halves(w, n_heads), key="not_permutation"),
])


# ---- 练习 4（推导并核对）：任意配置的参数量 ----
def ref_lm_param_count(c):
    d, f, V, kv = c.d_model, c.d_ff, c.vocab_size, c.kv_heads * c.d_k
    attn = 2 * (d * d + d) + 2 * (d * kv + kv)  # W^Q、W^O：d×d；W^K、W^V：d×(h_kv·d_k)，都带偏置
    ffn = 3 * d * f + 2 * f + d if c.activation == "swiglu" else 2 * d * f + f + d
    norm = 2 * d if c.norm == "layer" else d  # LayerNorm 有 γ、β；RMSNorm 只有 γ
    n_norms = 2 * c.n_layers + (1 if c.norm_first else 0)  # pre-LN 末尾还有一个
    emb = V * d + (c.max_len * d if c.positional == "learned" else 0)
    head = 0 if c.tie_embeddings else V * d
    return c.n_layers * (attn + ffn) + n_norms * norm + emb + head


def _tied_twice(c):
    return ref_lm_param_count(c) + (c.vocab_size * c.d_model if c.tie_embeddings else 0)


def _full_kv(c):
    kv = c.kv_heads * c.d_k
    return ref_lm_param_count(c) + c.n_layers * 2 * (c.d_model * (c.d_model - kv) + (c.d_model - kv))


def _swiglu_two(c):
    return ref_lm_param_count(c) - (c.n_layers * (c.d_model * c.d_ff + c.d_ff) if c.activation == "swiglu" else 0)


PARAMS = Case(check_lm_param_count, ref_lm_param_count, returns="int", wrong=[
    Wrong("hard_coded", lambda c: 1_234_567),
    Wrong("counts_a_model", lambda c: count_parameters(make_lm(c)), key="library_call"),
    Wrong("sums_numel", lambda c: sum(p.numel() for p in dict(DecoderOnlyLM(c).named_parameters()).values()),
          key="library_call"),
    Wrong("tied_twice", _tied_twice, key="tied_twice"),
    Wrong("gqa_full_kv", _full_kv, key="gqa_full_kv"),
    Wrong("swiglu_two", _swiglu_two, key="swiglu_two"),
])

CASES = [RMS, GQA, ROPE, PARAMS]
