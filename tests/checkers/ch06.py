"""第 6 章检查器的用例：参考答案（与 notebooks/solutions/06_solutions.ipynb 一致）和已知错误答案。

练习 1（数值稳定的 softmax）用的是 ``tformer_lib.exercises.checks`` 里的经典检查器 ``check_softmax``；
第 6 章是现在唯一用它的章，它的用例也放在这里。
"""

import torch
import torch.nn.functional as F

from checkers import Case, Wrong
from tformer_lib.exercises.checks import check_softmax
from tformer_lib.translation.decoding import greedy_decode, ids_to_lists, sample_decode
from tformer_lib.exercises.ch06 import (
    check_cross_entropy,
    check_greedy_agreement,
    check_log_softmax,
    check_softmax_temperature,
    check_temperature_grad,
    check_top_k_probs,
)


# ---- 练习 1：数值稳定的 softmax ----
def ref_softmax(x):
    z = x - x.max(dim=-1, keepdim=True).values  # 减去每行最大值：exp 不会溢出，结果不变
    e = z.exp()
    return e / e.sum(dim=-1, keepdim=True)  # 沿最后一维归一化


def _naive_softmax(x):
    e = x.exp()
    return e / e.sum(dim=-1, keepdim=True)


SOFTMAX = Case(check_softmax, ref_softmax, also_correct=[lambda x: x.softmax(-1)], wrong=[
    Wrong("hard_coded", lambda x: torch.tensor([0.7275, 0.2676, 0.0049])),
    Wrong("wrong_axis", lambda x: x.softmax(dim=0), key="wrong_axis"),
    Wrong("no_normalization", lambda x: x.exp(), key="no_normalization"),
    Wrong("overflow", _naive_softmax, key="overflow"),
    Wrong("inplace", lambda x: x.sub_(x.max(-1, keepdim=True).values).exp_().div_(x.sum(-1, keepdim=True)),
          key="inplace"),
])


# ---- 练习 2：带温度的 softmax ----
def ref_temperature(logits, temperature):
    z = logits / temperature  # 先除以温度
    z = z - z.max(dim=-1, keepdim=True).values  # 再减最大值防溢出
    e = z.exp()
    return e / e.sum(dim=-1, keepdim=True)


def _naive_temp(z, t):
    e = (z / t).exp()
    return e / e.sum(-1, keepdim=True)


TEMPERATURE = Case(check_softmax_temperature, ref_temperature, also_correct=[lambda z, t: (z / t).softmax(-1)], wrong=[
    Wrong("hard_coded", lambda z, t: torch.tensor([0.8808, 0.1192, 0.0])),
    Wrong("multiply", lambda z, t: ref_temperature(z * t * t, t), key="multiply"),
    Wrong("after_softmax", lambda z, t: ref_temperature(z, 1.0) / t, key="after_softmax"),
    Wrong("wrong_axis", lambda z, t: (z / t).softmax(dim=0), key="wrong_axis"),
    Wrong("ignored", lambda z, t: ref_temperature(z, 1.0), key="ignored"),
    Wrong("overflow", _naive_temp, key="overflow"),
])


# ---- 练习 3（找错）：数值稳定的 log-softmax ----
def ref_log_softmax(logits):
    m = logits.max(dim=-1, keepdim=True).values  # (..., 1)：每一行自己的最大值
    lse = m + (logits - m).exp().sum(dim=-1, keepdim=True).log()  # 稳定的 logsumexp
    return logits - lse


def buggy_log_softmax(logits):  # 本章给读者的有错版本：减的是整个张量的最大值
    m = logits.max()
    lse = m + (logits - m).exp().sum(dim=-1, keepdim=True).log()
    return logits - lse


LOG_SOFTMAX = Case(check_log_softmax, ref_log_softmax, also_correct=[lambda z: z.log_softmax(-1)], wrong=[
    Wrong("hard_coded", lambda z: torch.tensor([-0.0067, -200.0067, -5.0067])),
    Wrong("global_max", buggy_log_softmax, key="global_max"),
    Wrong("log_of_softmax", lambda z: z.softmax(-1).log(), key="log_of_softmax"),
    Wrong("naive_logsumexp", lambda z: z - z.exp().sum(-1, keepdim=True).log(), key="naive_logsumexp"),
    Wrong("no_logsumexp", lambda z: z - z.max(-1, keepdim=True).values, key="no_logsumexp"),
    Wrong("forgot_log", lambda z: z.softmax(-1), key="forgot_log"),
    Wrong("wrong_axis", lambda z: z.log_softmax(0), key="wrong_axis"),
    Wrong("sign", lambda z: -z.log_softmax(-1), key="sign"),
])


# ---- 练习 4：由 logits 直接算交叉熵 ----
def ref_cross_entropy(logits, targets):
    log_probs = logits.log_softmax(dim=-1)  # (N, V)
    picked = log_probs.gather(-1, targets[:, None]).squeeze(-1)  # (N,)：每个位置正确词的 ln p
    return -picked.mean()


CROSS_ENTROPY = Case(check_cross_entropy, ref_cross_entropy, also_correct=[lambda z, y: F.cross_entropy(z, y)],
                     wrong=[
    Wrong("hard_coded", lambda z, y: torch.tensor(0.0587)),
    Wrong("unstable", lambda z, y: z.softmax(-1).log().gather(-1, y[:, None]).mean().neg(), key="unstable"),
    Wrong("sign", lambda z, y: -ref_cross_entropy(z, y), key="sign"),
    Wrong("sum", lambda z, y: F.cross_entropy(z, y, reduction="sum"), key="sum"),
    Wrong("no_mean", lambda z, y: F.cross_entropy(z, y, reduction="none"), key="no_mean"),
    Wrong("no_log", lambda z, y: -z.softmax(-1).gather(-1, y[:, None]).mean(), key="no_log"),
    Wrong("raw_logits", lambda z, y: -z.gather(-1, y[:, None]).mean(), key="raw_logits"),
    Wrong("v_from_targets", lambda z, y: F.cross_entropy(z[:, : int(y.max()) + 1], y), key="values"),
])


# ---- 练习 5（推导并核对）：带温度的交叉熵的梯度 ----
def ref_temperature_grad(logits, target, temperature):
    p = (logits / temperature).softmax(dim=-1)  # 前向用的概率 softmax(z / T)
    onehot = torch.zeros_like(p)
    onehot[target] = 1.0
    return (p - onehot) / temperature  # 链式法则：∂(z/T)/∂z = 1/T


def _p_minus_onehot(z, y, t, p):
    return p - F.one_hot(torch.tensor(y), z.shape[-1]).to(p.dtype)


GRAD = Case(check_temperature_grad, ref_temperature_grad, wrong=[
    Wrong("hard_coded", lambda z, y, t: torch.tensor([-0.2725, 0.2676, 0.0049])),
    Wrong("no_inv_t", lambda z, y, t: _p_minus_onehot(z, y, t, (z / t).softmax(-1)), key="no_inv_t"),
    Wrong("times_t", lambda z, y, t: _p_minus_onehot(z, y, t, (z / t).softmax(-1)) * t, key="times_t"),
    Wrong("p_at_t1", lambda z, y, t: _p_minus_onehot(z, y, t, z.softmax(-1)) / t, key="p_at_t1"),
    Wrong("sign", lambda z, y, t: -ref_temperature_grad(z, y, t), key="sign"),
    Wrong("probabilities_only", lambda z, y, t: (z / t).softmax(-1), key="values"),
])


# ---- 练习 6（扩展）：top-k 截断后的分布 ----
def ref_top_k(logits, k):
    k = min(k, logits.shape[-1])
    kth = logits.topk(k, dim=-1).values[..., -1:]  # (..., 1)：第 k 大的分数
    return logits.masked_fill(logits < kth, float("-inf")).softmax(dim=-1)  # exp(−inf) = 0


def _topk_mask(z, k, largest=True):
    k = min(k, z.shape[-1])
    idx = z.topk(k, dim=-1, largest=largest).indices
    return torch.zeros_like(z, dtype=torch.bool).scatter(-1, idx, True)


TOP_K = Case(check_top_k_probs, ref_top_k, wrong=[
    Wrong("hard_coded", lambda z, k: torch.tensor([0.0073, 0.9864, 0.0062])),
    Wrong("not_renormalized", lambda z, k: z.softmax(-1) * _topk_mask(z, k), key="not_renormalized"),
    Wrong("fill_zero", lambda z, k: z.masked_fill(~_topk_mask(z, k), 0.0).softmax(-1), key="fill_zero"),
    Wrong("smallest", lambda z, k: z.masked_fill(~_topk_mask(z, k, False), float("-inf")).softmax(-1),
          key="smallest"),
    Wrong("k_fixed_3", lambda z, k: ref_top_k(z, 3), key="values"),
])



# ---- 练习 7（动手实验）：温度与“照抄贪心”的概率 ----
def ref_greedy_agreement(model, src, temperature, n, generator):
    greedy = ids_to_lists(greedy_decode(model, src))[0]  # 贪心译文（截到 EOS）
    samples = sample_decode(model, src.expand(n, -1), temperature=temperature,
                            generator=generator)  # (n, L)：一次采 n 句
    same = [s == greedy for s in ids_to_lists(samples)]
    return sum(same) / n


AGREEMENT = Case(check_greedy_agreement, ref_greedy_agreement, returns="number", wrong=[
    Wrong("hard_coded", lambda *a: 0.8125, key="constant"),
    Wrong("count", lambda m, s, t, n, g: ref_greedy_agreement(m, s, t, n, g) * n, key="count"),
    Wrong("temperature_ignored", lambda m, s, t, n, g: ref_greedy_agreement(m, s, 1.0, n, g),
          key="temperature_ignored"),
    Wrong("squared", lambda m, s, t, n, g: ref_greedy_agreement(m, s, t, n, g) ** 2, key="values"),
])

CASES = [SOFTMAX, TEMPERATURE, LOG_SOFTMAX, CROSS_ENTROPY, GRAD, TOP_K, AGREEMENT]
