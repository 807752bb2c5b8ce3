"""第 3 章检查器：接受参考答案，对每种典型错误给出对应提示，对未完成的存根不抛异常。"""

import math

import pytest
import torch

from tformer_lib.exercises.ch03 import check_attention_entropy, check_simple_self_attention, check_softmax_jacobian


def _gram(x):
    return x @ x.transpose(-2, -1)


def simple_ref(x):
    w = _gram(x).softmax(dim=-1)
    return w @ x, w


def entropy_ref(w):
    return -torch.special.xlogy(w, w).sum(dim=-1)


def jac_ref(s):
    a = s.softmax(dim=-1)
    return torch.diag(a) - torch.outer(a, a)


def _stub(*args):
    raise NotImplementedError


CHECKERS = [(check_simple_self_attention, simple_ref), (check_attention_entropy, entropy_ref),
            (check_softmax_jacobian, jac_ref)]


@pytest.mark.parametrize(("checker", "ref"), CHECKERS)
def test_accepts_reference_and_stub_is_pending(checker, ref, capsys):
    res = checker(ref)
    assert res.passed and "✅" in capsys.readouterr().out
    for stub in (_stub, lambda *a: None):
        res = checker(stub)
        assert res.pending and not res.passed and "尚未完成" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("wrong", "key", "hint"),
    [
        (lambda x: (_gram(x).softmax(dim=-2) @ x, _gram(x).softmax(dim=-2)), "wrong_axis", "softmax 的方向不对"),
        (lambda x: (_gram(x) @ x, _gram(x)), "no_softmax", "忘了做 softmax"),
        (lambda x: ((x.transpose(-2, -1) @ x).softmax(-1), (x.transpose(-2, -1) @ x).softmax(-1)),
         "gram_transposed", "Xᵀ X"),
        (lambda x: (x, simple_ref(x)[1]), "no_weighted_sum", "忘了按权重加权求和"),
        (lambda x: ((_gram(x) / math.sqrt(x.shape[-1])).softmax(-1) @ x,
                    (_gram(x) / math.sqrt(x.shape[-1])).softmax(-1)), "scaled", "不要除以 √d"),
        (lambda x: (simple_ref(x)[1].transpose(-2, -1) @ x, simple_ref(x)[1]), "transposed_weights", "转置"),
        (lambda x: simple_ref(x)[0], "type", "二元组"),
    ],
)
def test_simple_rejects(wrong, key, hint, capsys):
    res = check_simple_self_attention(wrong)
    out = capsys.readouterr().out
    assert not res.passed and res.mistake == key and "❌" in out and hint in out


@pytest.mark.filterwarnings("ignore:The use of `x.T`")
def test_simple_rejects_dot_T_on_batches(capsys):
    res = check_simple_self_attention(lambda x: ((x @ x.T).softmax(-1) @ x, (x @ x.T).softmax(-1)))
    assert not res.passed and res.mistake == "exception"


@pytest.mark.parametrize(
    ("wrong", "key", "hint"),
    [
        (lambda w: -(w * torch.log(w)).sum(dim=-1), "nan", "NaN"),
        (lambda w: (w * torch.log(w.clamp_min(1e-30))).sum(dim=-1), "sign", "符号反了"),
        (lambda w: -(w * torch.log2(w.clamp_min(1e-30))).sum(dim=-1), "log2", "以 2 为底"),
        (lambda w: -(w * torch.log(w.clamp_min(1e-30))).sum(dim=-2), "wrong_axis", "dim=-1"),
        (lambda w: -(w * torch.log(w.clamp_min(1e-30))).mean(dim=-1), "mean", "mean"),
    ],
)
def test_entropy_rejects(wrong, key, hint, capsys):
    res = check_attention_entropy(wrong)
    out = capsys.readouterr().out
    assert not res.passed and res.mistake == key and hint in out


def test_entropy_accepts_clamp_style():
    assert check_attention_entropy(lambda w: -(w * torch.log(w.clamp_min(1e-30))).sum(-1), verbose=False).passed


@pytest.mark.parametrize(
    ("wrong", "key", "hint"),
    [
        (lambda s: -torch.outer(s.softmax(-1), s.softmax(-1)), "no_diag", "少了对角项"),
        (lambda s: torch.diag(s) - torch.outer(s, s), "scores", "原始分数"),
        (lambda s: -jac_ref(s), "sign", "符号反了"),
        (lambda s: torch.diag(s.softmax(-1)), "diag_only", "只写了 diag(a)"),
        (lambda s: jac_ref(s) * 2, "values", "J = diag(a) − a aᵀ"),
        (lambda s: jac_ref(s)[:-1], "shape", "形状"),
    ],
)
def test_jacobian_rejects(wrong, key, hint, capsys):
    res = check_softmax_jacobian(wrong)
    out = capsys.readouterr().out
    assert not res.passed and res.mistake == key and hint in out


def test_reader_errors_do_not_raise(capsys):
    res = check_softmax_jacobian(lambda s: 1 / 0)
    assert not res.passed and "ZeroDivisionError" in capsys.readouterr().out


def test_checkers_leave_global_rng_alone():
    torch.manual_seed(0)
    expected = torch.rand(3)
    torch.manual_seed(0)
    for checker, ref in CHECKERS:
        checker(ref, verbose=False)
    assert torch.equal(torch.rand(3), expected)
