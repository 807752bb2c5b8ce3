"""第 13 章检查器的用例：参考答案（与 notebooks/solutions/13_solutions.ipynb 一致）和已知错误答案。"""

import math

import torch

from torch.utils.flop_counter import FlopCounterMode

from checkers import Case, Wrong
from tformer_lib.lm import make_lm
from tformer_lib.serving import PagedKVCache
from tformer_lib.exercises.ch13 import (
    _reference_accept,
    buggy_accept,
    check_accept,
    check_linear_intensity,
    check_paged_cache_bytes,
    check_tokens_per_pass_distribution,
)


# ---- 练习 1（推导并核对）：Σ⌈L/b⌉ 块 × 每块 2·N·b·h_kv·d_k·e 字节 ----
def ref_paged_cache_bytes(config, lengths, block_size, bytes_per_element):
    blocks = sum(math.ceil(n / block_size) for n in lengths)
    per_block = 2 * config.n_layers * block_size * config.kv_heads * config.d_k * bytes_per_element
    return blocks * per_block


def _per_pos(c, e):
    return 2 * c.n_layers * c.kv_heads * c.d_k * e


def _measure_paged(config, lengths, block_size, bytes_per_element):  # 建一个真的缓存去量：数对，但绕过了推导
    dtype = torch.float16 if bytes_per_element == 2 else torch.float32
    cache = PagedKVCache(make_lm(config).to(dtype), sum(-(-n // block_size) for n in lengths), block_size, False)
    for i, n in enumerate(lengths):
        cache.manager.allocate(i, [4] * n)
    return cache.held_bytes()


PAGED = Case(check_paged_cache_bytes, ref_paged_cache_bytes, returns="int",
             also_correct=[lambda c, ls, b, e: sum((n + b - 1) // b for n in ls) * b * _per_pos(c, e)], wrong=[
    Wrong("hard_coded", lambda c, ls, b, e: 3000),
    Wrong("no_rounding", lambda c, ls, b, e: sum(ls) * _per_pos(c, e), key="no_rounding"),
    Wrong("one_extra_block", lambda c, ls, b, e: sum(n // b + 1 for n in ls) * b * _per_pos(c, e), key="one_extra_block"),
    Wrong("floor", lambda c, ls, b, e: sum(n // b for n in ls) * b * _per_pos(c, e)),
    Wrong("only_k", lambda c, ls, b, e: ref_paged_cache_bytes(c, ls, b, e) // 2),
    Wrong("query_heads", lambda c, ls, b, e: sum(-(-n // b) for n in ls) * b * 2 * c.n_layers * c.d_model * e),
    Wrong("contiguous", lambda c, ls, b, e: len(ls) * c.max_len * _per_pos(c, e), key="contiguous"),
    # 在一组情形里碰巧与“L//b + 1”同值：提示要按每组都吻合的那种错误给
    Wrong("longest_for_all", lambda c, ls, b, e: len(ls) * -(-max(ls) // b) * b * _per_pos(c, e), key="longest_for_all"),
    Wrong("builds_a_cache", _measure_paged, key="library_call"),
])


# ---- 练习 2（预测再验证）：2·B·d_in·d_out ÷ (e·(d_in·d_out + B·d_in + B·d_out)) ----
def ref_linear_intensity(batch, d_in, d_out, bytes_per_element):
    flops = 2 * batch * d_in * d_out
    n_bytes = bytes_per_element * (d_in * d_out + batch * d_in + batch * d_out)
    return flops / n_bytes


def _counted_intensity(batch, d_in, d_out, bytes_per_element):  # 让 FlopCounterMode 去数：绕过了“先预测”
    with FlopCounterMode(display=False) as counter:
        torch.nn.Linear(d_in, d_out, bias=False, device="meta")(torch.empty(batch, d_in, device="meta"))
    return counter.get_total_flops() / (bytes_per_element * (d_in * d_out + batch * d_in + batch * d_out))


INTENSITY = Case(check_linear_intensity, ref_linear_intensity, returns="number", wrong=[
    Wrong("hard_coded", lambda B, i, o, e: 0.5),
    Wrong("weights_only", lambda B, i, o, e: 2 * B / e, key="weights_only"),
    Wrong("flops_without_2", lambda B, i, o, e: ref_linear_intensity(B, i, o, e) / 2, key="flops_without_2"),
    Wrong("per_element", lambda B, i, o, e: ref_linear_intensity(B, i, o, e) * e, key="per_element"),
    Wrong("no_weights", lambda B, i, o, e: 2 * B * i * o / (e * (B * i + B * o)), key="no_weights"),
    Wrong("counts_flops", _counted_intensity, key="library_call"),
])


# ---- 练习 3（推导并核对）：P(n) = α^(n−1)(1−α)（n ≤ k），P(k+1) = α^k ----
def ref_tokens_per_pass_distribution(alpha, k):
    return [alpha ** (n - 1) * (1 - alpha) for n in range(1, k + 1)] + [alpha**k]


DISTRIBUTION = Case(check_tokens_per_pass_distribution, ref_tokens_per_pass_distribution, also_correct=[
    lambda a, k: torch.tensor(ref_tokens_per_pass_distribution(a, k)),
    lambda a, k: tuple(ref_tokens_per_pass_distribution(a, k)),
    lambda a, k: torch.tensor(ref_tokens_per_pass_distribution(a, k), dtype=torch.float16),  # 半精度也对（按它的精度比较）
    lambda a, k: torch.tensor(ref_tokens_per_pass_distribution(a, k), dtype=torch.bfloat16),
], wrong=[
    Wrong("hard_coded", lambda a, k: [0.5, 0.5]),
    Wrong("untruncated", lambda a, k: [a ** (n - 1) * (1 - a) for n in range(1, k + 2)], key="untruncated"),
    Wrong("off_by_one", lambda a, k: [a**n * (1 - a) for n in range(1, k + 1)] + [a ** (k + 1)], key="off_by_one"),
    Wrong("swapped", lambda a, k: ref_tokens_per_pass_distribution(1 - a, k), key="swapped"),
    Wrong("k_terms", lambda a, k: [a ** (n - 1) * (1 - a) for n in range(1, k + 1)], key="length"),
    Wrong("string", lambda a, k: "1-a", key="string"),
    Wrong("fp16_but_wrong", lambda a, k: torch.tensor([a ** (n - 1) * (1 - a) for n in range(1, k + 2)],
                                                      dtype=torch.float16), key="untruncated"),
    Wrong("not_normalized", lambda a, k: [x + 1e-4 for x in ref_tokens_per_pass_distribution(a, k)],
          key="not_normalized"),
])


# ---- 练习 4（找错）：接受到第一个分歧为止，再接上 choices[n] ----
def ref_accept(proposal, choices):
    n = 0
    while n < len(proposal) and proposal[n] == choices[n]:
        n += 1
    return proposal[:n] + [choices[n]]


def _no_bonus(p, c):
    out = ref_accept(p, c)
    return out[:-1] if len(out) == len(p) + 1 else out


ACCEPT = Case(check_accept, ref_accept, also_correct=[
    lambda p, c: torch.tensor(ref_accept(p, c)),
    lambda p, c: [t for t, _ in zip(c, range(next((i for i, (d, t) in enumerate(zip(p, c)) if d != t), len(p)) + 1))],
], wrong=[
    Wrong("hard_coded", lambda p, c: [c[0]]),
    Wrong("the_bug", buggy_accept, key="keeps_after_mismatch"),
    Wrong("no_correction", lambda p, c: ref_accept(p, c)[:-1], key="no_correction"),
    Wrong("no_bonus", _no_bonus, key="no_bonus"),
    Wrong("uses_the_checker", lambda p, c: _reference_accept(p, c), key="library_call"),
    Wrong("wrong_index", lambda p, c: ref_accept(p, c)[:-1] + [c[min(len(ref_accept(p, c)), len(c) - 1)]],
          key="wrong_index"),
])



CASES = [PAGED, INTENSITY, DISTRIBUTION, ACCEPT]
