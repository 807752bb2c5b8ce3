"""第 6 章检查器：接受参考答案，对每种典型错误给出对应提示，对未完成的存根不抛异常。"""

import pytest
import torch
import torch.nn.functional as F

from tformer_lib.exercises.ch06 import (
    check_cross_entropy,
    check_log_softmax,
    check_softmax_temperature,
    check_top_k_probs,
)


def temp_ref(z, t):
    z = z / t
    z = z - z.max(dim=-1, keepdim=True).values
    e = z.exp()
    return e / e.sum(dim=-1, keepdim=True)


def log_softmax_ref(z):
    m = z.max(dim=-1, keepdim=True).values
    return z - m - (z - m).exp().sum(dim=-1, keepdim=True).log()


def top_k_ref(z, k):
    k = min(k, z.shape[-1])
    kth = z.topk(k, dim=-1).values[..., -1:]
    return z.masked_fill(z < kth, float("-inf")).softmax(dim=-1)


def ce_ref(z, y):
    return -log_softmax_ref(z).gather(-1, y[:, None]).mean()


def _stub(*args):
    raise NotImplementedError


CHECKERS = [(check_softmax_temperature, temp_ref), (check_log_softmax, log_softmax_ref),
            (check_top_k_probs, top_k_ref), (check_cross_entropy, ce_ref),
            (check_cross_entropy, lambda z, y: F.cross_entropy(z, y)),
            (check_log_softmax, lambda z: z.log_softmax(-1)),
            (check_softmax_temperature, lambda z, t: (z / t).softmax(-1))]


@pytest.mark.parametrize(("checker", "ref"), CHECKERS)
def test_accepts_reference_and_stub_is_pending(checker, ref, capsys):
    res = checker(ref)
    out = capsys.readouterr().out
    assert res.passed and "✅" in out, out
    for stub in (_stub, lambda *a: None):
        res = checker(stub)
        assert res.pending and not res.passed and "尚未完成" in capsys.readouterr().out


def _naive_temp(z, t):
    e = (z / t).exp()
    return e / e.sum(-1, keepdim=True)


@pytest.mark.parametrize(
    ("wrong", "key", "hint"),
    [
        (lambda z, t: temp_ref(z * t * t, t), "multiply", "温度用反了"),
        (lambda z, t: temp_ref(z, 1.0) / t, "after_softmax", "之前"),
        (lambda z, t: (z / t).softmax(dim=0), "wrong_axis", "dim=-1"),
        (lambda z, t: temp_ref(z, 1.0), "ignored", "没有起作用"),
        (_naive_temp, "overflow", "减去每行最大值"),
    ],
)
def test_temperature_rejects(wrong, key, hint, capsys):
    res = check_softmax_temperature(wrong)
    out = capsys.readouterr().out
    assert not res.passed and res.mistake == key and "❌" in out and hint in out, out


@pytest.mark.parametrize(
    ("wrong", "key", "hint"),
    [
        (lambda z: z.softmax(-1).log(), "log_of_softmax", "下溢"),
        (lambda z: z - z.exp().sum(-1, keepdim=True).log(), "naive_logsumexp", "溢出"),
        (lambda z: z - z.max(-1, keepdim=True).values, "no_logsumexp", "只减去了最大值"),
        (lambda z: z.softmax(-1), "forgot_log", "取对数"),
        (lambda z: z.log_softmax(0), "wrong_axis", "dim=-1"),
        (lambda z: -z.log_softmax(-1), "sign", "符号反了"),
    ],
)
def test_log_softmax_rejects(wrong, key, hint, capsys):
    res = check_log_softmax(wrong)
    out = capsys.readouterr().out
    assert not res.passed and res.mistake == key and "❌" in out and hint in out, out


def _topk_mask(z, k, largest=True):
    k = min(k, z.shape[-1])
    idx = z.topk(k, dim=-1, largest=largest).indices
    return torch.zeros_like(z, dtype=torch.bool).scatter(-1, idx, True)


@pytest.mark.parametrize(
    ("wrong", "key", "hint"),
    [
        (lambda z, k: z.softmax(-1) * _topk_mask(z, k), "not_renormalized", "重新归一化"),
        (lambda z, k: z.masked_fill(~_topk_mask(z, k), 0.0).softmax(-1), "fill_zero", "−inf"),
        (lambda z, k: z.masked_fill(~_topk_mask(z, k, False), float("-inf")).softmax(-1), "smallest", "最小"),
    ],
)
def test_top_k_rejects(wrong, key, hint, capsys):
    res = check_top_k_probs(wrong)
    out = capsys.readouterr().out
    assert not res.passed and res.mistake == key and "❌" in out and hint in out, out


@pytest.mark.parametrize(
    ("wrong", "key", "hint"),
    [
        (lambda z, y: z.softmax(-1).log().gather(-1, y[:, None]).mean().neg(), "unstable", "log_softmax"),
        (lambda z, y: -ce_ref(z, y), "sign", "符号反了"),
        (lambda z, y: F.cross_entropy(z, y, reduction="sum"), "sum", "平均"),
        (lambda z, y: F.cross_entropy(z, y, reduction="none"), "no_mean", "标量"),
        (lambda z, y: -z.softmax(-1).gather(-1, y[:, None]).mean(), "no_log", "−log p"),
        (lambda z, y: -z.gather(-1, y[:, None]).mean(), "raw_logits", "log_softmax"),
    ],
)
def test_cross_entropy_rejects(wrong, key, hint, capsys):
    res = check_cross_entropy(wrong)
    out = capsys.readouterr().out
    assert not res.passed and res.mistake == key and "❌" in out and hint in out, out


def test_reader_exception_becomes_failure(capsys):
    res = check_top_k_probs(lambda z, k: z.topk(k, dim=3))
    assert not res.passed and res.mistake == "exception"
