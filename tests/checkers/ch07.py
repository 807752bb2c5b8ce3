"""第 7 章检查器的用例：参考答案（与 notebooks/solutions/07_solutions.ipynb 一致）与已知错误答案。"""

import math

import torch
import torch.nn.functional as F

from checkers import Case, Wrong
from tformer_lib.exercises.ch07 import (
    check_beam_score,
    check_half_peak_step,
    check_initial_loss,
    check_smoothed_loss,
    check_smoothed_targets,
)
from tformer_lib.training import label_smoothing_loss, noam_rate

# ---- 练习 1：学习率何时降到峰值的一半 ---------------------------------------------------------------


def half_peak_ref(d_model, peak_lr):
    warmup = 1 / (d_model * peak_lr ** 2)  # 峰值 (d_model · warmup)^-0.5 = peak_lr
    return 4 * warmup  # 峰值后 lr ∝ step^-0.5：降到一半要走到 4 倍


def half_peak_rounded(d_model, peak_lr):
    return math.ceil(4 / (d_model * peak_lr ** 2) - 1e-6)


def half_peak_by_search(d_model, peak_lr):
    # 另一种正确做法：用库里的 noam_rate 从峰值往后找
    warmup = round(1 / (d_model * peak_lr ** 2))
    step = warmup
    while noam_rate(step, d_model, warmup) > peak_lr / 2 + 1e-15:
        step += 1
    return step


# ---- 练习 2：标签平滑的目标分布 ----------------------------------------------------------------------


def targets_ref(target, vocab_size, smoothing, pad_id):
    q = torch.full((len(target), vocab_size), smoothing / vocab_size)
    q[torch.arange(len(target)), target] += 1 - smoothing
    q[target == pad_id] = 0.0
    return q


def _v_minus_1(t, V, e, p):
    q = torch.full((len(t), V), e / (V - 1))
    q[torch.arange(len(t)), t] = 1 - e
    q[t == p] = 0
    return q


def _no_pad(t, V, e, p):
    q = torch.full((len(t), V), e / V)
    q[torch.arange(len(t)), t] += 1 - e
    return q


# ---- 练习 3（找错）：标签平滑损失 -------------------------------------------------------------------


def loss_ref(logits, target, smoothing, pad_id):
    log_p = logits.log_softmax(dim=-1)  # (..., V)
    keep = target != pad_id  # (...)
    nll = -log_p.gather(-1, target.unsqueeze(-1)).squeeze(-1)  # (...)
    uniform = -log_p.mean(dim=-1)  # (...)
    per_token = (1 - smoothing) * nll + smoothing * uniform
    return (per_token * keep).sum() / keep.sum()


def loss_buggy(logits, target, smoothing, pad_id):
    # 章节里给读者的有错版本：分母用了全部位置数
    log_p = logits.log_softmax(dim=-1)
    keep = target != pad_id
    nll = -log_p.gather(-1, target.unsqueeze(-1)).squeeze(-1)
    uniform = -log_p.mean(dim=-1)
    per_token = (1 - smoothing) * nll + smoothing * uniform
    return (per_token * keep).sum() / keep.numel()


def _per_token(lg, t, e, p):
    V = lg.shape[-1]
    logp = lg.reshape(-1, V).log_softmax(-1)
    tf = t.reshape(-1)
    q = torch.full_like(logp, e / V)
    q[torch.arange(len(tf)), tf] += 1 - e
    return -(q * logp).sum(-1), tf != p


def _wrong_axis(lg, t, e, p):
    V = lg.shape[-1]
    logp = lg.reshape(-1, V).log_softmax(0)  # 错：沿批次维归一化
    tf = t.reshape(-1)
    q = torch.full_like(logp, e / V)
    q[torch.arange(len(tf)), tf] += 1 - e
    keep = tf != p
    return (-(q * logp).sum(-1) * keep).sum() / keep.sum()


# ---- 练习 4：初始损失 --------------------------------------------------------------------------------


def initial_loss_ref(vocab_size, sigma):
    return math.log(vocab_size) + sigma ** 2 / 2


def initial_loss_exact(vocab_size, sigma):
    # 多保留一项 1/V 的修正，也是对的
    return math.log(vocab_size) + sigma ** 2 / 2 - (math.exp(sigma ** 2) - 1) / (2 * vocab_size)


def initial_loss_simulated(vocab_size, sigma):
    g = torch.Generator().manual_seed(0)
    z = sigma * torch.randn(2000, vocab_size, generator=g, dtype=torch.float64)
    return torch.logsumexp(z, dim=-1).mean()


# ---- 练习 5：束搜索得分 ------------------------------------------------------------------------------


def beam_ref(token_log_probs, alpha):
    return sum(token_log_probs) / ((5 + len(token_log_probs)) / 6) ** alpha


def beam_tensor(lp, a):
    t = torch.tensor(lp)
    return t.sum() / ((5 + t.numel()) / 6) ** a


CASES = [
    Case(check_half_peak_step, half_peak_ref, returns="number",
         also_correct=[half_peak_rounded, half_peak_by_search], wrong=[
             Wrong("hard_coded", lambda d, lr: 800.0),
             Wrong("peak_step", lambda d, lr: 1 / (d * lr ** 2), key="peak_step"),
             Wrong("inverse_step", lambda d, lr: 2 / (d * lr ** 2), key="inverse_step"),
             Wrong("sqrt_two", lambda d, lr: math.sqrt(2) / (d * lr ** 2), key="sqrt_two"),
             Wrong("rising_side", lambda d, lr: 0.5 / (d * lr ** 2), key="rising_side"),
             Wrong("no_square", lambda d, lr: 4 / (d * lr), key="no_square"),
         ]),
    Case(check_smoothed_targets, targets_ref, wrong=[
        Wrong("hard_coded", lambda t, V, e, p: torch.full((3, 8), 0.0125)),
        Wrong("no_pad", _no_pad, key="no_pad"),
        Wrong("v_minus_1", _v_minus_1, key="v_minus_1"),
        Wrong("no_one_minus_eps", lambda t, V, e, p: targets_ref(t, V, e, p) + e * F.one_hot(t, V) * (t != p)[:, None],
              key="no_one_minus_eps"),
        Wrong("onehot", lambda t, V, e, p: F.one_hot(t, V).float() * (t != p)[:, None], key="onehot"),
        Wrong("forgot_uniform_on_correct",
              lambda t, V, e, p: targets_ref(t, V, e, p) - e / V * F.one_hot(t, V) * (t != p)[:, None],
              key="forgot_uniform_on_correct"),
        Wrong("transposed", lambda t, V, e, p: targets_ref(t, V, e, p).T, key="shape"),
    ]),
    Case(check_smoothed_loss, loss_ref,
         also_correct=[lambda lg, t, e, p: label_smoothing_loss(lg, t, e, p),
                       lambda lg, t, e, p: float(loss_ref(lg, t, e, p))],
         wrong=[
             Wrong("hard_coded", lambda lg, t, e, p: torch.tensor(0.7837)),
             Wrong("chapter_bug", loss_buggy, key="pad_in_mean"),
             Wrong("pad_not_masked", lambda lg, t, e, p: _per_token(lg, t, e, p)[0].mean(), key="pad_not_masked"),
             Wrong("sum", lambda lg, t, e, p: (lambda per, keep: (per * keep).sum())(*_per_token(lg, t, e, p)),
                   key="sum"),
             Wrong("no_smoothing", lambda lg, t, e, p: F.cross_entropy(lg.reshape(-1, lg.shape[-1]), t.reshape(-1),
                                                                       ignore_index=p), key="no_smoothing"),
             Wrong("sign", lambda lg, t, e, p: -loss_ref(lg, t, e, p), key="sign"),
             Wrong("not_reduced", lambda lg, t, e, p: label_smoothing_loss(lg, t, e, p, reduction="none"),
                   key="not_reduced"),
             Wrong("wrong_axis", _wrong_axis, key="wrong_axis"),
         ]),
    Case(check_initial_loss, initial_loss_ref, returns="number",
         also_correct=[initial_loss_exact, initial_loss_simulated], wrong=[
             Wrong("hard_coded", lambda V, s: 4.52),
             Wrong("ln_v", lambda V, s: math.log(V), key="ln_v"),
             Wrong("sigma_squared", lambda V, s: math.log(V) + s ** 2, key="sigma_squared"),
             Wrong("sigma", lambda V, s: math.log(V) + s / 2, key="sigma"),
             Wrong("sign", lambda V, s: math.log(V) - s ** 2 / 2, key="sign"),
             Wrong("log10", lambda V, s: math.log10(V) + s ** 2 / 2, key="log10"),
         ]),
    Case(check_beam_score, beam_ref, returns="number", also_correct=[beam_tensor], wrong=[
        Wrong("hard_coded", lambda lp, a: -0.45),
        Wrong("multiply", lambda lp, a: sum(lp) * ((5 + len(lp)) / 6) ** a, key="multiply"),
        Wrong("prob_product", lambda lp, a: math.prod(math.exp(x) for x in lp) / ((5 + len(lp)) / 6) ** a,
              key="prob_product"),
        Wrong("plain_length", lambda lp, a: sum(lp) / len(lp) ** a, key="plain_length"),
        Wrong("no_penalty", lambda lp, a: sum(lp), key="no_penalty"),
        Wrong("len_without_eos", lambda lp, a: sum(lp) / ((4 + len(lp)) / 6) ** a, key="len_without_eos"),
    ]),
]
