"""第 2 章检查器：接受参考答案，拒绝每一种已知的错误写法并给出对应提示，占位函数只提示“尚未完成”。"""

import math

import pytest
import torch

from tformer_lib.exercises.ch02 import check_order_blindness_test, check_shift_rotation, check_wavelength


def _stub(*args):
    raise NotImplementedError


def _returns_none(*args):
    return None


@pytest.mark.parametrize("checker", [check_wavelength, check_shift_rotation, check_order_blindness_test])
def test_stub_reports_not_done_without_raising(checker, capsys):
    result = checker(_stub)
    assert result.pending and not result.passed
    assert "尚未完成" in capsys.readouterr().out
    assert checker(_returns_none).mistake == "returned_none"


@pytest.mark.parametrize("checker", [check_wavelength, check_shift_rotation, check_order_blindness_test])
def test_reader_error_becomes_message(checker, capsys):
    def broken(*args):
        raise RuntimeError("boom")

    result = checker(broken)
    assert not result.passed and result.mistake == "exception"
    assert "RuntimeError" in capsys.readouterr().out


def test_checker_does_not_touch_global_rng():
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    check_order_blindness_test(lambda layer, x: True)
    assert torch.equal(torch.rand(3), expected)


# ---- wavelength ------------------------------------------------------------------------------
def _wavelength(i, d_model):
    return 2 * math.pi * 10000 ** (2 * i / d_model)


def test_wavelength_accepts_reference_and_tensor(capsys):
    assert check_wavelength(_wavelength).passed
    assert check_wavelength(lambda i, d: torch.tensor(_wavelength(i, d), dtype=torch.float64)).passed
    assert "✅" in capsys.readouterr().out


@pytest.mark.parametrize(
    "wrong, key",
    [
        (lambda i, d: 10000 ** (2 * i / d), "no_2pi"),
        (lambda i, d: 2 * math.pi * 10000 ** (i / d), "exponent_i"),
        (lambda i, d: 10000 ** (-2 * i / d), "angular_frequency"),
        (lambda i, d: 1 / _wavelength(i, d), "frequency"),
        (lambda i, d: 2 * math.pi * 10000 ** ((2 * i + 1) / d), "exponent_2i_plus_1"),
        (lambda i, d: 7.0, "values"),
        (lambda i, d: "6.28", "type"),
    ],
)
def test_wavelength_rejects_classic_mistakes(wrong, key, capsys):
    result = check_wavelength(wrong)
    assert not result.passed and result.mistake == key
    assert "❌" in capsys.readouterr().out


# ---- shift rotation --------------------------------------------------------------------------
def _rotation(k, d, sign=1.0, scale=True, half_split=False):
    omega = 10000 ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    theta = k * omega if scale else torch.full_like(omega, float(k))
    c, s = torch.cos(theta), sign * torch.sin(theta)
    r = torch.zeros(d, d, dtype=torch.float64)
    if half_split:
        h = d // 2
        r[:h, :h], r[:h, h:], r[h:, :h], r[h:, h:] = torch.diag(c), torch.diag(s), torch.diag(-s), torch.diag(c)
    else:
        r[0::2, 0::2], r[0::2, 1::2] = torch.diag(c), torch.diag(s)
        r[1::2, 0::2], r[1::2, 1::2] = torch.diag(-s), torch.diag(c)
    return r


def test_shift_rotation_accepts_reference(capsys):
    assert check_shift_rotation(_rotation).passed
    assert check_shift_rotation(lambda k, d: _rotation(k, d).float().numpy()).passed  # numpy float32 也行
    assert "✅" in capsys.readouterr().out


@pytest.mark.parametrize(
    "wrong, key",
    [
        (lambda k, d: _rotation(k, d, sign=-1.0), "sin_sign"),
        (lambda k, d: _rotation(k, d, scale=False), "angle_k"),
        (lambda k, d: _rotation(k, d, half_split=True), "half_split"),
        (lambda k, d: torch.eye(d), "values"),
        (lambda k, d: torch.eye(d + 1), "shape"),
        (lambda k, d: [[1.0]], "type"),
    ],
)
def test_shift_rotation_rejects_classic_mistakes(wrong, key, capsys):
    result = check_shift_rotation(wrong)
    assert not result.passed and result.mistake == key
    assert "❌" in capsys.readouterr().out


# ---- order-blindness test --------------------------------------------------------------------
def _is_order_blind(layer, x):
    perm = torch.randperm(x.shape[1])
    while torch.equal(perm, torch.arange(x.shape[1])):
        perm = torch.randperm(x.shape[1])
    with torch.no_grad():
        return torch.allclose(layer(x[:, perm]), layer(x)[:, perm], atol=1e-5)


def test_order_blindness_accepts_reference(capsys):
    assert check_order_blindness_test(_is_order_blind).passed
    assert "✅" in capsys.readouterr().out


def _forgot_to_permute_output(layer, x):
    perm = torch.tensor([4, 3, 2, 1, 0])
    with torch.no_grad():
        return torch.allclose(layer(x[:, perm]), layer(x), atol=1e-5)


def _permutes_batch_dim(layer, x):
    perm = torch.tensor([1, 0])
    with torch.no_grad():
        return torch.allclose(layer(x[perm]), layer(x)[perm], atol=1e-5)


@pytest.mark.parametrize(
    "wrong, key",
    [
        (_forgot_to_permute_output, "forgot_to_permute_output"),
        (_permutes_batch_dim, "wrong_dimension"),
        (lambda layer, x: "yes", "type"),
    ],
)
def test_order_blindness_rejects_classic_mistakes(wrong, key, capsys):
    result = check_order_blindness_test(wrong)
    assert not result.passed and result.mistake == key
    assert "❌" in capsys.readouterr().out
