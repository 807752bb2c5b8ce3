"""第 7 章检查器：接受参考答案，对每种典型错误给出对应提示，对未完成的存根不抛异常。"""

import math

import pytest
import torch
import torch.nn.functional as F

from tformer_lib.exercises.ch07 import check_beam_score, check_noam_rate, check_smoothed_loss, check_smoothed_targets
from tformer_lib.training import label_smoothing_loss, noam_rate


def noam_ref(step, d_model, warmup):
    step = max(step, 1)
    return d_model ** -0.5 * min(step ** -0.5, step * warmup ** -1.5)


def targets_ref(target, vocab_size, eps, pad_id):
    q = torch.full((len(target), vocab_size), eps / vocab_size)
    q[torch.arange(len(target)), target] += 1 - eps
    q[target == pad_id] = 0.0
    return q


def loss_ref(logits, target, eps, pad_id):
    return label_smoothing_loss(logits, target, eps, pad_id)


def beam_ref(logps, alpha):
    return sum(logps) / ((5 + len(logps)) / 6) ** alpha


def _stub(*args):
    raise NotImplementedError


CHECKERS = [(check_noam_rate, noam_ref), (check_smoothed_targets, targets_ref), (check_smoothed_loss, loss_ref),
            (check_beam_score, beam_ref)]


@pytest.mark.parametrize(("checker", "ref"), CHECKERS)
def test_accepts_reference_and_stub_is_pending(checker, ref, capsys):
    res = checker(ref)
    assert res.passed and "✅" in capsys.readouterr().out
    for stub in (_stub, lambda *a: None):
        res = checker(stub)
        assert res.pending and not res.passed and "尚未完成" in capsys.readouterr().out


def test_library_functions_pass():
    assert check_noam_rate(lambda s, d, w: noam_rate(s, d, w), verbose=False).passed
    assert check_smoothed_loss(lambda lg, t, e, p: F.cross_entropy(lg.reshape(-1, lg.shape[-1]), t.reshape(-1),
                                                                   label_smoothing=e, ignore_index=p),
                               verbose=False).passed


@pytest.mark.parametrize(
    ("wrong", "key", "hint"),
    [
        (lambda s, d, w: d ** -0.5 * min(s ** -0.5, s * w ** -1.5), "step_zero", "max(step, 1)"),
        (lambda s, d, w: d ** -0.5 * max(max(s, 1) ** -0.5, max(s, 1) * w ** -1.5), "max", "min 写成了 max"),
        (lambda s, d, w: d ** -0.5 * min(max(s, 1) ** -0.5, max(s, 1) * w ** -0.5), "warmup_exponent", "−1.5"),
        (lambda s, d, w: d ** 0.5 * min(max(s, 1) ** -0.5, max(s, 1) * w ** -1.5), "d_model_sign", "−0.5"),
        (lambda s, d, w: min(max(s, 1) ** -0.5, max(s, 1) * w ** -1.5), "no_d_model", "d_model^-0.5"),
        (lambda s, d, w: d ** -0.5 * min(1 / max(s, 1), max(s, 1) * w ** -1.5), "sqrt_missing", "1/√step"),
        (lambda s, d, w: torch.tensor([noam_ref(s, d, w)] * 2), "shape", "应是一个数"),
        (lambda s, d, w: 0.001, "values", "学习率应为"),
    ],
)
def test_noam_rejects(wrong, key, hint, capsys):
    res = check_noam_rate(wrong)
    out = capsys.readouterr().out
    assert not res.passed and res.mistake == key and "❌" in out and hint in out


def test_noam_inf_at_step_zero_named(capsys):
    res = check_noam_rate(lambda s, d, w: float("inf") if s == 0 else noam_ref(s, d, w))
    assert res.mistake == "step_zero" and "step = 1" in capsys.readouterr().out


def _no_pad(t, V, e, p):
    q = torch.full((len(t), V), e / V)
    q[torch.arange(len(t)), t] += 1 - e
    return q


def _v_minus_1(t, V, e, p):
    q = torch.full((len(t), V), e / (V - 1))
    q[torch.arange(len(t)), t] = 1 - e
    q[t == p] = 0
    return q


@pytest.mark.parametrize(
    ("wrong", "key", "hint"),
    [
        (_no_pad, "no_pad", "全为 0"),
        (_v_minus_1, "v_minus_1", "V−1"),
        (lambda t, V, e, p: targets_ref(t, V, e, p) + e * F.one_hot(t, V) * (t != p)[:, None], "no_one_minus_eps", "1+ε/V"),
        (lambda t, V, e, p: F.one_hot(t, V).float() * (t != p)[:, None], "onehot", "one-hot"),
        (lambda t, V, e, p: targets_ref(t, V, e, p) - e / V * F.one_hot(t, V) * (t != p)[:, None],
         "forgot_uniform_on_correct", "ε/V 的那一份"),
        (lambda t, V, e, p: targets_ref(t, V, e, p).T, "shape", "形状"),
    ],
)
def test_targets_reject(wrong, key, hint, capsys):
    res = check_smoothed_targets(wrong)
    out = capsys.readouterr().out
    assert not res.passed and res.mistake == key and "❌" in out and hint in out


def _per_token(lg, t, e, p):
    V = lg.shape[-1]
    logp = lg.reshape(-1, V).log_softmax(-1)
    tf = t.reshape(-1)
    q = torch.full_like(logp, e / V)
    q[torch.arange(len(tf)), tf] += 1 - e
    return -(q * logp).sum(-1), tf != p, q


@pytest.mark.parametrize(
    ("wrong", "key", "hint"),
    [
        (lambda lg, t, e, p: (lambda per, keep, q: (per * keep).sum() / keep.numel())(*_per_token(lg, t, e, p)),
         "pad_in_mean", "分母是真实词元数"),
        (lambda lg, t, e, p: _per_token(lg, t, e, p)[0].mean(), "pad_not_masked", "完全不计入"),
        (lambda lg, t, e, p: (lambda per, keep, q: (per * keep).sum())(*_per_token(lg, t, e, p)), "sum", "取平均"),
        (lambda lg, t, e, p: F.cross_entropy(lg.reshape(-1, lg.shape[-1]), t.reshape(-1), ignore_index=p),
         "no_smoothing", "不带平滑"),
        (lambda lg, t, e, p: -loss_ref(lg, t, e, p), "sign", "符号反了"),
        (lambda lg, t, e, p: label_smoothing_loss(lg, t, e, p, reduction="none"), "not_reduced", "应是一个数"),
    ],
)
def test_loss_rejects(wrong, key, hint, capsys):
    res = check_smoothed_loss(wrong)
    out = capsys.readouterr().out
    assert not res.passed and res.mistake == key and "❌" in out and hint in out


@pytest.mark.parametrize(
    ("wrong", "key", "hint"),
    [
        (lambda lp, a: sum(lp) * ((5 + len(lp)) / 6) ** a, "multiply", "应当除"),
        (lambda lp, a: math.prod(math.exp(x) for x in lp) / ((5 + len(lp)) / 6) ** a, "prob_product", "连乘"),
        (lambda lp, a: sum(lp) / len(lp) ** a, "plain_length", "GNMT"),
        (lambda lp, a: sum(lp), "no_penalty", "忘了除以"),
        (lambda lp, a: sum(lp) / ((4 + len(lp)) / 6) ** a, "len_without_eos", "EOS"),
        (lambda lp, a: "x", "type", "应是一个数"),
    ],
)
def test_beam_rejects(wrong, key, hint, capsys):
    res = check_beam_score(wrong)
    out = capsys.readouterr().out
    assert not res.passed and res.mistake == key and "❌" in out and hint in out


def test_beam_accepts_tensor_input_solution():
    def sol(lp, a):
        t = torch.tensor(lp)
        return t.sum() / ((5 + t.numel()) / 6) ** a

    assert check_beam_score(sol, verbose=False).passed
