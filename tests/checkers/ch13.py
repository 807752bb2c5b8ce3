"""第 13 章检查器的用例：参考答案（与 notebooks/solutions/13_solutions.ipynb 一致）和已知错误答案。"""

import math

import torch

from torch.utils.flop_counter import FlopCounterMode

from checkers import Case, Wrong
from tformer_lib.lm import make_lm
from tformer_lib.serving import BlockManager
from tformer_lib.exercises.ch13 import (
    _reference_accept,
    buggy_accept,
    check_accept,
    check_linear_intensity,
    check_prefix_cache_blocks,
    check_tokens_per_pass_distribution,
)


# ---- 练习 1（推导并核对）：每条提示 ⌈L/b⌉ 块，减去能共用的整段前缀块（至多 ⌊(L−1)/b⌋ 块）----
def _common(a, b):
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def ref_prefix_cache_blocks(prompts, block_size):
    total = 0
    for i, p in enumerate(prompts):
        longest = max((_common(p, q) for q in prompts[:i]), default=0)  # 与先前任何一条提示的最长相同开头
        shared = min(longest // block_size, (len(p) - 1) // block_size)  # 只共用写满的块；最后一个词元总要算
        total += math.ceil(len(p) / block_size) - shared
    return total


def _registered_prefixes(prompts, block_size):  # 另一种写法：像块管理器那样，登记每个写满的前缀
    seen, total = set(), 0
    for p in prompts:
        shared = 0
        while shared < (len(p) - 1) // block_size and tuple(p[:(shared + 1) * block_size]) in seen:
            shared += 1
        total += -(-len(p) // block_size) - shared
        seen |= {tuple(p[:(j + 1) * block_size]) for j in range(len(p) // block_size)}
    return total


def _no_last_token_rule(prompts, b):
    return sum(-(-len(p) // b) - max((_common(p, q) for q in prompts[:i]), default=0) // b for i, p in enumerate(prompts))


def _partial_blocks(prompts, b):
    return sum(-(-len(p) // b) - min((len(p) - 1) // b, -(-max((_common(p, q) for q in prompts[:i]), default=0) // b))
               for i, p in enumerate(prompts))


def _by_block_content(prompts, b):
    def same(p, q):
        return sum(1 for j in range(min(len(p), len(q)) // b) if p[j * b:(j + 1) * b] == q[j * b:(j + 1) * b])
    return sum(-(-len(p) // b) - min((len(p) - 1) // b, max((same(p, q) for q in prompts[:i]), default=0))
               for i, p in enumerate(prompts))


def _previous_only(prompts, b):
    return sum(-(-len(p) // b) - (min((len(p) - 1) // b, _common(p, prompts[i - 1]) // b) if i else 0)
               for i, p in enumerate(prompts))


def _stop_at_first_miss(prompts, b, seen):
    total = 0
    for i, p in enumerate(prompts):
        n = 0
        while n < (len(p) - 1) // b and seen(prompts[:i], n, p[n * b:(n + 1) * b]):
            n += 1
        total += -(-len(p) // b) - n
    return total


def _content_anywhere(prompts, b):  # 块的内容在先前任何位置出现过就算共用（一位攻击者的写法）
    return _stop_at_first_miss(prompts, b, lambda earlier, j, blk: any(
        blk == q[k * b:(k + 1) * b] for q in earlier for k in range(len(q) // b)))


def _mixed_prefixes(prompts, b):  # 每一块可以各自来自不同的先前提示
    return _stop_at_first_miss(prompts, b, lambda earlier, j, blk: any(
        len(q) >= (j + 1) * b and blk == q[j * b:(j + 1) * b] for q in earlier))


def _uses_block_manager(prompts, block_size):  # 让真的块管理器去数：对，但绕过了推导
    manager = BlockManager(num_blocks=1000, block_size=block_size)
    for i, p in enumerate(prompts):
        manager.allocate(i, p)
        manager.register_prefix(i, p)
    return manager.used_blocks


PREFIX = Case(check_prefix_cache_blocks, ref_prefix_cache_blocks, returns="int", also_correct=[_registered_prefixes], wrong=[
    Wrong("hard_coded", lambda prompts, b: 5),
    Wrong("no_sharing", lambda prompts, b: sum(-(-len(p) // b) for p in prompts), key="no_sharing"),
    Wrong("no_last_token_rule", _no_last_token_rule, key="last_token"),
    Wrong("partial_blocks", _partial_blocks, key="partial_block"),
    Wrong("by_block_content", _by_block_content, key="block_content"),
    Wrong("previous_only", _previous_only, key="previous_only"),
    Wrong("content_anywhere", _content_anywhere, key="content_anywhere"),
    Wrong("mixed_prefixes", _mixed_prefixes, key="mixed_prefixes"),
    Wrong("uses_block_manager", _uses_block_manager, key="library_call"),
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



CASES = [PREFIX, INTENSITY, DISTRIBUTION, ACCEPT]
