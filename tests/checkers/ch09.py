"""第 9 章检查器的用例：参考答案（与 notebooks/solutions/09_solutions.ipynb 一致）和已知错误答案。"""

import math

import torch
import torch.nn.functional as F

from checkers import Case, Wrong
from tformer_lib.lm.data import loss_targets
from tformer_lib.lm.quality import lm_perplexity
from tformer_lib.specials import PAD
from tformer_lib.exercises.ch09 import (
    buggy_lm_loss,
    check_char_perplexity,
    check_fixed_lm_loss,
    check_initial_loss,
    check_min_p,
)


# ---- 练习 1（预测再验证）：未训练模型的损失 ≈ ln V ----
def ref_initial_loss(vocab_size):
    return math.log(vocab_size)


INITIAL = Case(check_initial_loss, ref_initial_loss, returns="number", wrong=[
    Wrong("hard_coded", lambda V: math.log(4457)),
    Wrong("log2", lambda V: math.log2(V), key="log2"),
    Wrong("perplexity", lambda V: float(V), key="perplexity"),
    Wrong("zero", lambda V: 0.0, key="values"),
])


# ---- 练习 2（找错）：PAD 不计入损失 ----
def ref_lm_loss(model, block):
    inputs, targets = loss_targets(block)  # (B, L), (B, L)
    logits = model(inputs)  # (B, L, V)
    return F.cross_entropy(logits.flatten(0, 1), targets.flatten(), ignore_index=PAD)


def _masked_mean(model, block):  # 自己求平均：等价，也对
    inputs, targets = loss_targets(block)
    nll = F.cross_entropy(model(inputs).flatten(0, 1), targets.flatten(), reduction="none")
    keep = targets.flatten() != PAD
    return float(nll[keep].mean())


def _with_bos(model, block):
    inputs, targets = block[:, :-1], block[:, 1:]
    return F.cross_entropy(model(inputs).flatten(0, 1), targets.flatten(), ignore_index=PAD)


def _not_shifted(model, block):
    inputs, _ = loss_targets(block)
    return F.cross_entropy(model(inputs).flatten(0, 1), inputs.flatten(), ignore_index=PAD)


LM_LOSS = Case(check_fixed_lm_loss, ref_lm_loss, also_correct=[_masked_mean], returns="number", wrong=[
    Wrong("hard_coded", lambda model, block: 3.4),
    Wrong("the_bug", buggy_lm_loss, key="counts_pad"),
    Wrong("bos_counted", _with_bos, key="bos_counted"),
    Wrong("not_shifted", _not_shifted, key="not_shifted"),
    Wrong("calls_lm_perplexity", lambda model, block: lm_perplexity(model, *loss_targets(block))[0], key="library_call"),
])


# ---- 练习 3（推导并核对）：按字的困惑度 ----
def ref_char_perplexity(token_ppl, tokens_per_char):
    return token_ppl ** tokens_per_char


CHAR_PPL = Case(check_char_perplexity, ref_char_perplexity, returns="number",
                also_correct=[lambda p, t: math.exp(math.log(p) * t)], wrong=[
    Wrong("hard_coded", lambda p, t: 181.6),
    Wrong("multiplied", lambda p, t: p * t, key="multiplied"),
    Wrong("divided", lambda p, t: p / t, key="divided"),
    Wrong("inverse", lambda p, t: p ** (1 / t), key="inverse"),
    Wrong("unchanged", lambda p, t: p, key="unchanged"),
])


# ---- 练习 4（扩展）：min-p ----
def ref_min_p(logits, min_p):
    probs = logits.softmax(dim=-1)  # (B, V)
    keep = probs >= min_p * probs.max(dim=-1, keepdim=True).values
    return logits.masked_fill(~keep, float("-inf"))


def _min_p_in_log_space(logits, min_p):  # 等价：log p − log p_max = z − z_max
    return logits.masked_fill(logits - logits.max(-1, keepdim=True).values < math.log(min_p), float("-inf"))


def _in_place(logits, min_p):
    probs = logits.softmax(-1)
    logits[probs < min_p * probs.max(-1, keepdim=True).values] = float("-inf")
    return logits


MIN_P = Case(check_min_p, ref_min_p, also_correct=[_min_p_in_log_space], wrong=[
    Wrong("hard_coded", lambda logits, min_p: torch.zeros(2, 5)),
    Wrong("absolute", lambda z, p: z.masked_fill(z.softmax(-1) < p, float("-inf")), key="absolute"),
    Wrong("on_logits", lambda z, p: z.masked_fill(z < p * z.max(-1, keepdim=True).values, float("-inf")), key="on_logits"),
    Wrong("probs", lambda z, p: ref_min_p(z, p).softmax(-1), key="probs"),
    Wrong("in_place", _in_place, key="in_place"),
    Wrong("unfiltered", lambda z, p: z.clone(), key="values"),
])

CASES = [INITIAL, LM_LOSS, CHAR_PPL, MIN_P]
