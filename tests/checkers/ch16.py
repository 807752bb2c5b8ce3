"""第 16 章（混合专家、环形注意力、RoPE 缩放）检查器的用例：参考答案（与 notebooks/solutions/16_solutions.ipynb 一致）和已知错误答案。

参考答案都不调用被禁用的库函数；每题还有一个直接调用库里答案的 ``Wrong("library", …, key="library_call")``，
以及几个拐着弯调用它的（``getattr``、默认参数、``types.FunctionType`` 造的副本、``vars(sys.modules[…])``、
``importlib``、可调用对象的 ``__call__``、经由 ``make_lm`` 之类别的库代码）——它们也都必须 ❌ ``library_call``。
"""

import importlib
import math
import sys
import types

import torch

from checkers import Case, Wrong
from tformer_lib import moe
from tformer_lib.exercises.ch16 import (
    buggy_merge_partials,
    check_capacity_keep,
    check_merge_partials,
    check_predict_dropped,
    check_ring_attention_bytes,
    check_scaled_rope_frequencies,
)


# ---- 练习 1（实现）：先排全体第一选择、再排第二选择，同一选择按词元顺序；每个专家最多 capacity 份 ----
def ref_keep(choices, n_experts, capacity):
    n, k = choices.shape
    queue = choices.t().reshape(-1).long()  # (k·N,)：第一选择在前，同一选择里按词元顺序
    counts = torch.zeros(n_experts, dtype=torch.int64)
    keep = torch.zeros(k * n, dtype=torch.bool)
    for i, e in enumerate(queue.tolist()):
        keep[i] = bool(counts[e] < capacity)
        counts[e] += 1
    return keep.reshape(k, n).t()  # (k·N,) → (k, N) → (N, k)


def _keep_vectorised(choices, n_experts, capacity):  # one-hot 的累加和，也对
    n, k = choices.shape
    queue = choices.t().reshape(-1).long()  # (k·N,)
    arrivals = torch.nn.functional.one_hot(queue, n_experts).cumsum(0)  # (k·N, E)
    place = arrivals.gather(1, queue[:, None]).squeeze(1) - 1  # (k·N,)
    return (place < capacity).reshape(k, n).t()  # (k·N,) → (k, N) → (N, k)


def _keep_token_major(choices, n_experts, capacity):
    n, k = choices.shape
    counts, keep = [0] * n_experts, torch.zeros(n, k, dtype=torch.bool)
    for t in range(n):  # 逐个词元排它的 k 个选择：第一选择不再优先
        for j in range(k):
            e = int(choices[t, j])
            keep[t, j] = counts[e] < capacity
            counts[e] += 1
    return keep


def _keep_off_by_one(choices, n_experts, capacity):
    n, k = choices.shape
    queue = choices.t().reshape(-1).long()  # (k·N,)
    place = torch.nn.functional.one_hot(queue, n_experts).cumsum(0).gather(1, queue[:, None]).squeeze(1) - 1  # (k·N,)
    return (place <= capacity).reshape(k, n).t()  # (k·N,) → (k, N) → (N, k)；多收了一份


def _keep_per_column(choices, n_experts, capacity):
    columns = [ref_keep(choices[:, j:j + 1], n_experts, capacity) for j in range(choices.shape[1])]  # 每列各自从 0 数
    return torch.cat(columns, dim=1)


def _keep_library(choices, n_experts, capacity):
    from tformer_lib.moe import within_capacity

    return within_capacity(choices.long(), n_experts, capacity)


def _keep_int32_one_hot(choices, n_experts, capacity):  # 对，但忘了 .long()：int32 的 choices 上 F.one_hot 出错
    n, k = choices.shape
    queue = choices.t().reshape(-1)  # (k·N,)
    place = torch.nn.functional.one_hot(queue, n_experts).cumsum(0).gather(1, queue[:, None]).squeeze(1) - 1
    return (place < capacity).reshape(k, n).t()


def _keep_getattr(choices, n_experts, capacity):
    return getattr(moe, "within_" + "capacity")(choices.long(), n_experts, capacity)


def _keep_default_arg(choices, n_experts, capacity, _w=moe.within_capacity):
    return _w(choices.long(), n_experts, capacity)


_within_copy = types.FunctionType(moe.within_capacity.__code__, moe.within_capacity.__globals__, "mine")
_copies = {"keep": types.FunctionType(moe.within_capacity.__code__, moe.within_capacity.__globals__, "mine")}


def _keep_code_copy(choices, n_experts, capacity):
    return _within_copy(choices.long(), n_experts, capacity)


def _keep_code_copy_in_a_dict(choices, n_experts, capacity):  # 静态看不到（藏在字典里），运行时看得到
    return _copies["keep"](choices.long(), n_experts, capacity)


def _keep_sys_modules(choices, n_experts, capacity):
    return vars(sys.modules["tformer_lib.moe.dispatch"])["within_capacity"](choices.long(), n_experts, capacity)


def _keep_importlib(choices, n_experts, capacity):
    return importlib.import_module("tformer_lib.moe").__dict__["within_capacity"](choices.long(), n_experts, capacity)


class _KeepCallable:  # 交上来的是可调用对象，它的 __call__ 按名字调用库函数
    def __call__(self, choices, n_experts, capacity):
        from tformer_lib.moe import within_capacity

        return within_capacity(choices.long(), n_experts, capacity)


class _KeepHoldsIt:  # 库函数存在对象的属性里
    def __init__(self):
        self.rule = moe.within_capacity

    def __call__(self, choices, n_experts, capacity):
        return self.rule(choices.long(), n_experts, capacity)


KEEP = Case(check_capacity_keep, ref_keep, also_correct=[_keep_vectorised], wrong=[
    Wrong("hard_coded", lambda c, e, cap: torch.tensor([[True, True], [True, True], [False, False], [True, False],
                                                       [True, True], [False, True]])),
    Wrong("keep_all", lambda c, e, cap: torch.ones(c.shape, dtype=torch.bool), key="no_drop"),
    Wrong("token_major", _keep_token_major, key="token_major"),
    Wrong("off_by_one", _keep_off_by_one, key="off_by_one"),
    Wrong("per_column", _keep_per_column, key="per_column"),
    Wrong("as_int", lambda c, e, cap: ref_keep(c, e, cap).long(), key="dtype"),
    Wrong("transposed", lambda c, e, cap: ref_keep(c, e, cap).t(), key="shape"),
    Wrong("library", _keep_library, key="library_call"),
    Wrong("int32_one_hot", _keep_int32_one_hot, key="index_dtype"),
    Wrong("library_getattr", _keep_getattr, key="library_call"),
    Wrong("library_default_arg", _keep_default_arg, key="library_call"),
    Wrong("library_code_copy", _keep_code_copy, key="library_call"),
    Wrong("library_code_copy_in_a_dict", _keep_code_copy_in_a_dict, key="library_call"),
    Wrong("library_sys_modules", _keep_sys_modules, key="library_call"),
    Wrong("library_importlib", _keep_importlib, key="library_call"),
    Wrong("library_callable_object", _KeepCallable(), key="library_call"),
    Wrong("library_held_by_an_object", _KeepHoldsIt(), key="library_call"),
])


# ---- 练习 2（推导并核对）：一块 B·h·(T/p)·d·b；前向 K、V 各 p − 1 次，反向 K、V、dK、dV 各 p 次；p = 1 时都是 0 ----
def ref_ring_attention_bytes(batch, heads, local_len, d_head, world_size, element_bytes):
    block = batch * heads * local_len * d_head * element_bytes  # 一块 K（或 V、dK、dV）的字节
    if world_size == 1:  # 环上只有自己：什么都不传
        return 0, 0
    return 2 * (world_size - 1) * block, 4 * world_size * block


def _ring_dict(*args):
    forward, backward = ref_ring_attention_bytes(*args)
    return {"forward": forward, "backward": backward}


def _ring_with(forward_passes, backward_blocks, backward_passes, *, elements=False):
    def fn(b, h, n, d, p, e):
        block = b * h * n * d * (1 if elements else e)
        return forward_passes(p) * block, (backward_blocks * backward_passes(p) * block if p > 1 else 0)

    return fn


def _ring_library(b, h, n, d, p, e):
    from tformer_lib.parallel.ring_attention import ring_attention_payload

    out = ring_attention_payload(b, h, n, d, p, element_bytes=e)
    return out["forward"], out["backward"]


def _ring_no_heads(b, h, n, d, p, e):  # 一块只算了 B·(T/p)·d·b：漏乘头数
    return ref_ring_attention_bytes(b, 1, n, d, p, e)


def _ring_no_batch(b, h, n, d, p, e):
    return ref_ring_attention_bytes(1, h, n, d, p, e)


def _ring_getattr(b, h, n, d, p, e):
    ring = importlib.import_module("tformer_lib.parallel.ring_attention")
    out = getattr(ring, "ring_attention_" + "payload")(b, h, n, d, p, element_bytes=e)
    return out["forward"], out["backward"]


RING = Case(check_ring_attention_bytes, ref_ring_attention_bytes, also_correct=[
    _ring_dict, lambda *a: [float(x) for x in ref_ring_attention_bytes(*a)],
], wrong=[
    Wrong("hard_coded", lambda *a: (0, 0)),
    Wrong("forward_p", _ring_with(lambda p: 2 * p, 4, lambda p: p), key="forward_p"),
    Wrong("one_block", _ring_with(lambda p: p - 1, 4, lambda p: p), key="kv_one"),
    Wrong("backward_p_minus_1", _ring_with(lambda p: 2 * (p - 1), 4, lambda p: p - 1), key="backward_p_minus_1"),
    Wrong("grads_only", _ring_with(lambda p: 2 * (p - 1), 2, lambda p: p), key="grads_only"),
    Wrong("p1_backward", lambda b, h, n, d, p, e: (2 * (p - 1) * b * h * n * d * e, 4 * p * b * h * n * d * e),
          key="p1_backward"),
    Wrong("elements", lambda b, h, n, d, p, e: ref_ring_attention_bytes(b, h, n, d, p, 1), key="elements"),
    Wrong("one_number", lambda *a: sum(ref_ring_attention_bytes(*a)), key="type"),
    Wrong("library", _ring_library, key="library_call"),
    Wrong("no_heads", _ring_no_heads, key="no_heads"),
    Wrong("no_batch", _ring_no_batch, key="no_batch"),
    Wrong("library_getattr", _ring_getattr, key="library_call"),
])


# ---- 练习 3（找错）：先减 m = max(lse_a, lse_b)；m 是 -inf（两块都空）时用 0 代替 ----
def ref_merge_partials(out_a, lse_a, out_b, lse_b):
    m = torch.maximum(lse_a, lse_b)  # (n,)
    m = torch.where(torch.isneginf(m), torch.zeros_like(m), m)  # 两块都空：避免 -inf − (-inf) = NaN
    w_a, w_b = torch.exp(lse_a - m), torch.exp(lse_b - m)  # (n,)：都 ≤ 1，不上溢
    total = w_a + w_b  # (n,)
    lse = m + torch.log(total)  # (n,)：两块都空时 log 0 = -inf
    safe = torch.where(total == 0, torch.ones_like(total), total)  # (n,)
    out = (out_a * w_a[:, None] + out_b * w_b[:, None]) / safe[:, None]  # (n, d)
    return out, lse


def _merge_logsumexp(out_a, lse_a, out_b, lse_b):  # 用 torch.logsumexp，也对
    lse = torch.logsumexp(torch.stack([lse_a, lse_b]), dim=0)  # (n,)
    safe = torch.where(torch.isneginf(lse), torch.zeros_like(lse), lse)  # (n,)
    out = out_a * torch.exp(lse_a - safe)[:, None] + out_b * torch.exp(lse_b - safe)[:, None]  # (n, d)
    return out, lse


def _merge_no_safe_max(out_a, lse_a, out_b, lse_b):
    m = torch.maximum(lse_a, lse_b)  # 减了最大值，但两块都空时 m = -inf
    lse = m + torch.log(torch.exp(lse_a - m) + torch.exp(lse_b - m))
    return out_a * torch.exp(lse_a - lse)[:, None] + out_b * torch.exp(lse_b - lse)[:, None], lse


def _merge_mean(out_a, lse_a, out_b, lse_b):
    return (out_a + out_b) / 2, ref_merge_partials(out_a, lse_a, out_b, lse_b)[1]


def _merge_lse_max(out_a, lse_a, out_b, lse_b):
    m = torch.maximum(lse_a, lse_b)
    safe = torch.where(torch.isneginf(m), torch.zeros_like(m), m)
    w_a, w_b = torch.exp(lse_a - safe), torch.exp(lse_b - safe)
    return out_a * w_a[:, None] + out_b * w_b[:, None], m  # 没有归一，lse 也只取了最大值


def _merge_lse_sum(out_a, lse_a, out_b, lse_b):
    return ref_merge_partials(out_a, lse_a, out_b, lse_b)[0], lse_a + lse_b


def _merge_swapped(out_a, lse_a, out_b, lse_b):
    lse = ref_merge_partials(out_a, lse_a, out_b, lse_b)[1]
    m = torch.maximum(lse_a, lse_b)
    safe = torch.where(torch.isneginf(m), torch.zeros_like(m), m)
    w_a, w_b = torch.exp(lse_a - safe), torch.exp(lse_b - safe)
    total = torch.where(w_a + w_b == 0, torch.ones_like(w_a), w_a + w_b)
    return (out_a * w_b[:, None] + out_b * w_a[:, None]) / total[:, None], lse  # 权重配反了


def _merge_library(out_a, lse_a, out_b, lse_b):
    from tformer_lib.parts.flash import online_softmax

    weights = online_softmax(torch.stack([lse_a, lse_b], dim=-1), block_size=1)  # (n, 2)
    weights = torch.nan_to_num(weights)
    return (out_a * weights[:, :1] + out_b * weights[:, 1:]), torch.logsumexp(torch.stack([lse_a, lse_b]), dim=0)


def _merge_logaddexp(out_a, lse_a, out_b, lse_b):  # torch.logaddexp，也对
    lse = torch.logaddexp(lse_a, lse_b)  # (n,)
    safe = torch.where(torch.isneginf(lse), torch.zeros_like(lse), lse)  # (n,)
    return out_a * torch.exp(lse_a - safe)[:, None] + out_b * torch.exp(lse_b - safe)[:, None], lse


def _merge_in_float64(out_a, lse_a, out_b, lse_b):  # 改好的写法在 float64 里算，再转回来：也对
    out, lse = ref_merge_partials(out_a.double(), lse_a.double(), out_b.double(), lse_b.double())
    return out.float(), lse.float()


def _merge_bug_in_float64(out_a, lse_a, out_b, lse_b):  # 没改，只换成 float64：LSE 过了 709 仍上溢
    out, lse = buggy_merge_partials(out_a.double(), lse_a.double(), out_b.double(), lse_b.double())
    return out.float(), lse.float()


def _merge_bug_in_float64_nan_to_num(out_a, lse_a, out_b, lse_b):  # 再把 NaN 抹成 0 也不行
    out, lse = _merge_bug_in_float64(out_a, lse_a, out_b, lse_b)
    return torch.nan_to_num(out), lse


def _merge_bug_shifted_by_a_constant(out_a, lse_a, out_b, lse_b):  # float64 里减一个常数：正负 ±1000 的行总有一头溢出
    c = 300.0
    a, b = lse_a.double() - c, lse_b.double() - c
    lse = torch.log(torch.exp(a) + torch.exp(b))  # (n,)
    safe = torch.where(torch.isneginf(lse), torch.zeros_like(lse), lse)
    out = out_a.double() * torch.exp(a - safe)[:, None] + out_b.double() * torch.exp(b - safe)[:, None]
    return out.float(), (lse + c).float()


def _merge_calls_the_bug_on_shifted_scores(out_a, lse_a, out_b, lse_b):  # 结果对，但调用了题目给的错版本
    m = torch.maximum(lse_a, lse_b)
    m = torch.where(torch.isneginf(m), torch.zeros_like(m), m)
    out, lse = buggy_merge_partials(out_a, lse_a - m, out_b, lse_b - m)
    return torch.nan_to_num(out), lse + m


MERGE = Case(check_merge_partials, ref_merge_partials, also_correct=[_merge_logsumexp, _merge_logaddexp,
                                                                     _merge_in_float64], wrong=[
    Wrong("hard_coded", lambda out_a, lse_a, out_b, lse_b: (torch.zeros_like(out_a), torch.zeros_like(lse_a))),
    Wrong("the_bug", buggy_merge_partials, key="overflow"),
    Wrong("no_safe_max", _merge_no_safe_max, key="both_empty"),
    Wrong("mean", _merge_mean, key="unweighted_mean"),
    Wrong("not_normalised", _merge_lse_max, key="not_normalised"),
    Wrong("lse_sum", _merge_lse_sum, key="lse_sum"),
    Wrong("swapped", _merge_swapped, key="swapped"),
    Wrong("out_only", lambda *a: ref_merge_partials(*a)[0], key="type"),
    Wrong("library", _merge_library, key="library_call"),
    Wrong("bug_in_float64", _merge_bug_in_float64, key="overflow"),
    Wrong("bug_in_float64_nan_to_num", _merge_bug_in_float64_nan_to_num, key="overflow"),
    Wrong("bug_shifted_by_a_constant", _merge_bug_shifted_by_a_constant, key="overflow"),
    Wrong("calls_the_bug", _merge_calls_the_bug_on_shifted_scores, key="library_call"),
])


# ---- 练习 4（预测再验证）：C = ⌈c·N·k/E⌉ = ⌈c·Σloads/E⌉，丢弃 Σ max(0, load_e − C) ----
def ref_predict_dropped(loads, top_k, capacity_factor):
    n_tokens = sum(loads) // top_k
    capacity = math.ceil(capacity_factor * n_tokens * top_k / len(loads))  # 容量按任务（每个词元 k 份）算
    return sum(max(0, load - capacity) for load in loads)  # 每个专家单独丢掉超出的部分


def _dropped_with_capacity(capacity_of):
    return lambda loads, k, c: sum(max(0, load - capacity_of(loads, k, c)) for load in loads)


def _dropped_library(loads, k, c):
    from tformer_lib.moe import expert_capacity

    capacity = expert_capacity(sum(loads) // k, len(loads), k, c)
    return sum(max(0, load - capacity) for load in loads)


def _dropped_getattr(loads, k, c):
    capacity = getattr(moe, "expert_" + "capacity")(sum(loads) // k, len(loads), k, c)
    return sum(max(0, load - capacity) for load in loads)


DROPPED = Case(check_predict_dropped, ref_predict_dropped, returns="int", wrong=[
    Wrong("hard_coded", lambda loads, k, c: 0),
    Wrong("floor", _dropped_with_capacity(lambda loads, k, c: math.floor(c * sum(loads) / len(loads))), key="floor"),
    Wrong("extra_k", _dropped_with_capacity(lambda loads, k, c: math.ceil(c * sum(loads) * k / len(loads))),
          key="extra_k"),
    Wrong("no_top_k", _dropped_with_capacity(lambda loads, k, c: math.ceil(c * sum(loads) / k / len(loads))),
          key="no_top_k"),
    Wrong("total_excess", lambda loads, k, c: max(0, sum(loads) - len(loads) * math.ceil(c * sum(loads) / len(loads))),
          key="total_excess"),
    Wrong("kept", lambda loads, k, c: sum(loads) - ref_predict_dropped(loads, k, c), key="kept"),
    Wrong("fraction", lambda loads, k, c: ref_predict_dropped(loads, k, c) / sum(loads) + 0.5, key="not_integer"),
    Wrong("library", _dropped_library, key="library_call"),
    Wrong("library_getattr", _dropped_getattr, key="library_call"),
])


# ---- 练习 5（实现）：linear：θ_i / s；ntk：(b·s^(d/(d−2)))^(−2i/d) ----
def ref_scaled_frequencies(d, base, kind, factor):
    exponents = torch.arange(0, d, 2, dtype=torch.float64) / d  # (d/2,)：2i/d
    if kind == "linear":
        return base ** -exponents / factor  # 位置插值：位置 t 当作 t/s
    return (base * factor ** (d / (d - 2))) ** -exponents  # NTK-aware：只换 base


def _freq_float32(d, base, kind, factor):  # float32 里算，也对（相对误差 1e-7 量级）
    return ref_scaled_frequencies(d, base, kind, factor).float()


def _freq_library(d, base, kind, factor):
    from tformer_lib.parts.rope_scaling import RopeScaling, rope_frequencies

    return rope_frequencies(d, base, RopeScaling(kind, factor))[0]


def _freq_through_the_model(d, base, kind, factor):  # 经由 LMConfig 与 make_lm 的 RoPE 表：库代码替它算
    from tformer_lib.lm import LMConfig, make_lm

    config = LMConfig(vocab_size=8, d_model=d, n_heads=1, n_layers=1, positional="rope", rope_base=base,
                      rope_scaling={"kind": kind, "factor": factor})
    tables = make_lm(config).rope_tables(torch.tensor([1]))  # 位置 1 的角度就是频率
    cos, sin = tables._by_dtype[torch.float64]
    return torch.atan2(sin, cos).reshape(-1)


def _freq_getattr(d, base, kind, factor):
    rs = importlib.import_module("tformer_lib.parts.rope_scaling")
    return getattr(rs, "rope_" + "frequencies")(d, base, getattr(rs, "Rope" + "Scaling")(kind, factor))[0]


ROPE = Case(check_scaled_rope_frequencies, ref_scaled_frequencies, also_correct=[_freq_float32], wrong=[
    Wrong("hard_coded", lambda d, base, kind, s: 10000.0 ** -(torch.arange(0, 128, 2, dtype=torch.float64) / 128) / 4),
    Wrong("linear_multiplied", lambda d, b, kind, s: ref_scaled_frequencies(d, b, kind, 1 / s) if kind == "linear"
          else ref_scaled_frequencies(d, b, kind, s), key="linear_multiplied"),
    Wrong("ntk_is_pi", lambda d, b, kind, s: ref_scaled_frequencies(d, b, "linear", s), key="ntk_is_pi"),
    Wrong("ntk_no_exponent", lambda d, b, kind, s: ref_scaled_frequencies(d, b, kind, s) if kind == "linear"
          else (b * s) ** -(torch.arange(0, d, 2, dtype=torch.float64) / d), key="ntk_no_exponent"),
    Wrong("exponent", lambda d, b, kind, s: ref_scaled_frequencies(d, b, kind, s).sqrt()
          * (s ** -0.5 if kind == "linear" else 1.0), key="exponent"),
    Wrong("all_dims", lambda d, b, kind, s: ref_scaled_frequencies(d, b, kind, s).repeat(2), key="shape"),
    Wrong("library", _freq_library, key="library_call"),
    Wrong("library_through_the_model", _freq_through_the_model, key="library_call"),
    Wrong("library_getattr", _freq_getattr, key="library_call"),
])

CASES = [KEEP, RING, MERGE, DROPPED, ROPE]
