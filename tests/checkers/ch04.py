"""第 4 章检查器的用例：参考答案（与 notebooks/solutions/04_solutions.ipynb 一致）和已知错误答案。"""

import math

import torch

from checkers import Case, Wrong
from tformer_lib import scaled_dot_product_attention
from tformer_lib.exercises.ch04 import (
    _changed_truth,
    buggy_masked_attention,
    buggy_mha_forward,
    check_changed_positions,
    check_fixed_masked_attention,
    check_fixed_mha_forward,
    check_layer_param_count,
    check_sliding_window_mask,
)


# ---- 练习 1（找错）：掩码放在 softmax 之前 ----
def ref_masked(q, k, v, mask):
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])  # (..., T_q, T_k)
    scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)  # softmax 之前屏蔽
    weights = scores.softmax(dim=-1)
    return weights @ v, weights


def _renormalised(q, k, v, mask):  # softmax 之后置 0 再重新归一化：数学上等价，也是对的
    w = (q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])).softmax(-1).masked_fill(~mask, 0.0)
    w = w / w.sum(-1, keepdim=True)
    return w @ v, w


def _polarity(q, k, v, mask):
    s = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    w = s.masked_fill(mask, torch.finfo(s.dtype).min).softmax(-1)
    return w @ v, w


def _fill_zero(q, k, v, mask):
    w = (q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])).masked_fill(~mask, 0.0).softmax(-1)
    return w @ v, w


_Q = torch.randn(1, 1, 3, 4)

MASKED = Case(check_fixed_masked_attention, ref_masked, also_correct=[_renormalised], wrong=[
    Wrong("calls_the_library", lambda q, k, v, m: scaled_dot_product_attention(q, k, v, mask=m), key="library_call"),
    Wrong("hard_coded", lambda q, k, v, m: scaled_dot_product_attention(_Q, _Q, _Q)),
    Wrong("the_bug", buggy_masked_attention, key="mask_after_softmax"),
    Wrong("polarity", _polarity, key="polarity"),
    Wrong("mask_ignored", lambda q, k, v, m: scaled_dot_product_attention(q, k, v), key="mask_ignored"),
    Wrong("fill_zero", _fill_zero, key="fill_zero"),
])


# ---- 练习 2（找错）：拼接各头前先 transpose ----
def ref_mha_forward(mha, x):
    B, T, d_model = x.shape
    h, d_k = mha.n_heads, mha.d_k
    q = mha.w_q(x).view(B, T, h, d_k).transpose(1, 2)  # (B, h, T, d_k)
    k = mha.w_k(x).view(B, T, h, d_k).transpose(1, 2)  # (B, h, T, d_k)
    v = mha.w_v(x).view(B, T, h, d_k).transpose(1, 2)  # (B, h, T, d_k)
    out, _ = scaled_dot_product_attention(q, k, v)  # (B, h, T, d_k)
    concat = out.transpose(1, 2).reshape(B, T, d_model)  # (B, T, h·d_k)
    return mha.w_o(concat)  # (B, T, d_model)


def _view_after_transpose(mha, x):
    B, T, d_model = x.shape
    q, k, v = (mha.split_heads(lin(x)) for lin in (mha.w_q, mha.w_k, mha.w_v))
    out, _ = scaled_dot_product_attention(q, k, v)
    return mha.w_o(out.transpose(1, 2).view(B, T, d_model))  # RuntimeError：不连续


def _no_w_o(mha, x):
    B, T, d_model = x.shape
    q, k, v = (mha.split_heads(lin(x)) for lin in (mha.w_q, mha.w_k, mha.w_v))
    out, _ = scaled_dot_product_attention(q, k, v)
    return out.transpose(1, 2).reshape(B, T, d_model)


_X = torch.randn(2, 5, 8)

MHA = Case(check_fixed_mha_forward, ref_mha_forward, wrong=[
    Wrong("calls_mha", lambda mha, x: mha(x, x, x), key="library_call"),
    Wrong("calls_merge_heads", lambda mha, x: mha.w_o(mha.merge_heads(scaled_dot_product_attention(
        *(mha.split_heads(lin(x)) for lin in (mha.w_q, mha.w_k, mha.w_v)))[0])), key="library_call"),
    Wrong("hard_coded", lambda mha, x: _X),
    Wrong("the_bug", buggy_mha_forward, key="merge_without_transpose"),
    Wrong("view_after_transpose", _view_after_transpose, key="exception"),
    Wrong("no_w_o", _no_w_o, key="no_w_o"),
])


# ---- 练习 3：一层的参数量 ----
def ref_layer_params(d_model, d_ff, decoder=False):
    attn = 4 * (d_model * d_model + d_model)  # W^Q、W^K、W^V、W^O，含偏置
    ffn = d_model * d_ff + d_ff + d_ff * d_model + d_model  # W_1、b_1、W_2、b_2
    norm = 2 * d_model  # 每个 LayerNorm 的 γ、β
    return (2 * attn + ffn + 3 * norm) if decoder else (attn + ffn + 2 * norm)


def _build_and_count(d_model, d_ff, decoder=False):
    from tformer_lib.parts.layers import DecoderLayer, EncoderLayer
    from tformer_lib.translation.model import count_parameters

    heads = next(h for h in range(8, 0, -1) if d_model % h == 0)
    return count_parameters((DecoderLayer if decoder else EncoderLayer)(d_model, heads, d_ff))


PARAMS = Case(check_layer_param_count, ref_layer_params, returns="int", wrong=[
    Wrong("hard_coded", lambda d, f, dec=False: 3_152_384),
    Wrong("no_layernorm", lambda d, f, dec=False: ref_layer_params(d, f, dec) - (3 if dec else 2) * 2 * d,
          key="no_layernorm"),
    Wrong("layernorm_half", lambda d, f, dec=False: ref_layer_params(d, f, dec) - (3 if dec else 2) * d,
          key="layernorm_half"),
    Wrong("decoder_like_encoder", lambda d, f, dec=False: ref_layer_params(d, f, False), key="decoder_like_encoder"),
    Wrong("one_ffn_matrix", lambda d, f, dec=False: ref_layer_params(d, f, dec) - d * f, key="one_ffn_matrix"),
    Wrong("times_h", lambda d, f, dec=False: ref_layer_params(d, f, dec) * 8),
    Wrong("builds_the_layer", _build_and_count, key="library_call"),  # 数对了，但绕过了推导
])


# ---- 练习 4：改一个输入，哪些输出会变 ----
def ref_changed(T, t, causal, t_is_pad):
    if t_is_pad:  # 没有查询能把 t 当键看见；t 自己的查询变了（2 ≤ t，它至少看得见两个键）
        return [i == t for i in range(T)]
    return [i >= t if causal else True for i in range(T)]


CHANGED = Case(check_changed_positions, ref_changed, also_correct=[
    lambda T, t, c, p: torch.tensor(ref_changed(T, t, c, p)), _changed_truth], wrong=[
    Wrong("hard_coded", lambda T, t, c, p: [False, False, True, True, True]),
    Wrong("all_change", lambda T, t, c, p: [True] * T),
    Wrong("causal_reversed", lambda T, t, c, p: [i == t for i in range(T)] if p else
          [i <= t if c else True for i in range(T)]),
    Wrong("pad_nothing", lambda T, t, c, p: [False] * T if p else ref_changed(T, t, c, p)),
    Wrong("pad_ignored", lambda T, t, c, p: ref_changed(T, t, c, False)),
    Wrong("string", lambda T, t, c, p: str(ref_changed(T, t, c, p)), key="string"),
])

CASES = [MASKED, MHA, PARAMS, CHANGED]


# ---- 练习 5（扩展）：滑动窗口的因果掩码 ----
def ref_sliding_window(n, window):
    i = torch.arange(n)[:, None]  # (n, 1)：查询位置
    j = torch.arange(n)[None, :]  # (1, n)：键位置
    return (j <= i) & (i - j < window)  # (n, n)


SLIDING = Case(check_sliding_window_mask, ref_sliding_window, also_correct=[
    lambda n, w: torch.ones(n, n, dtype=torch.bool).tril().triu(-(w - 1))], wrong=[
    Wrong("hard_coded", lambda n, w: ref_sliding_window(5, 3)),
    Wrong("plain_causal", lambda n, w: torch.ones(n, n, dtype=torch.bool).tril(), key="plain_causal"),
    Wrong("off_by_one_wide", lambda n, w: torch.ones(n, n, dtype=torch.bool).tril().triu(-w), key="off_by_one_wide"),
    Wrong("not_causal", lambda n, w: (torch.arange(n)[:, None] - torch.arange(n)[None, :]).abs() < w,
          key="not_causal"),
    Wrong("transposed", lambda n, w: ref_sliding_window(n, w).T.contiguous(), key="transposed"),
    Wrong("polarity", lambda n, w: ~ref_sliding_window(n, w), key="polarity"),
    Wrong("int_mask", lambda n, w: ref_sliding_window(n, w).int(), key="dtype"),
])

CASES.append(SLIDING)
