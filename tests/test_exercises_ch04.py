"""第 4 章检查器：接受参考答案；未完成时只提示不抛异常；对每个典型错误给出对应提示。"""

import pytest
import torch

from tformer_lib.exercises.ch04 import check_mha_param_count, check_pre_ln_block


def _stub(*args):
    raise NotImplementedError


def ref_mha_count(d, h):
    return 4 * (d * d + d)


def ref_pre_ln(x, sublayer, norm):
    return x + sublayer(norm(x))


@pytest.mark.parametrize("checker, ref", [(check_mha_param_count, ref_mha_count), (check_pre_ln_block, ref_pre_ln)])
def test_accepts_reference_and_reports_stub(checker, ref, capsys):
    assert checker(ref).passed
    assert "✅" in capsys.readouterr().out
    for stub in (_stub, lambda *a: None):
        result = checker(stub)
        assert result.pending and not result.passed
        assert "尚未完成" in capsys.readouterr().out


@pytest.mark.parametrize(
    "wrong, key, hint",
    [
        (lambda d, h: h * 4 * (d * d + d), "times_h", "与 h 无关"),
        (lambda d, h: 4 * d * d, "no_bias", "偏置"),
        (lambda d, h: 3 * (d * d + d), "no_w_o", "W^O"),
        (lambda d, h: 4 * (d * (d // h) + d // h), "one_head", "单个头"),
        (lambda d, h: "many", "type", "整数"),
        (lambda d, h: 4 * d * d + 3 * d, "values", "含偏置"),
    ],
)
def test_mha_count_hints(wrong, key, hint, capsys):
    result = check_mha_param_count(wrong)
    out = capsys.readouterr().out
    assert not result.passed and result.mistake == key
    assert "❌" in out and hint in out


@pytest.mark.parametrize(
    "wrong, key, hint",
    [
        (lambda x, s, n: n(x + s(x)), "post_ln", "post-LN"),
        (lambda x, s, n: s(n(x)), "no_residual", "忘了残差"),
        (lambda x, s, n: x + n(s(x)), "norm_after", "放错了位置"),
        (lambda x, s, n: n(x) + s(n(x)), "normed_residual", "原始的 x"),
        (lambda x, s, n: x[:, :1], "shape", "形状"),
        (lambda x, s, n: x + 2 * s(n(x)), "values", "ResidualNorm"),
        (lambda x, s, n: 1 / 0, "exception", "ZeroDivisionError"),
    ],
)
def test_pre_ln_hints(wrong, key, hint, capsys):
    result = check_pre_ln_block(wrong)
    out = capsys.readouterr().out
    assert not result.passed and result.mistake == key
    assert "❌" in out and hint in out


def test_checkers_do_not_touch_global_rng():
    torch.manual_seed(0)
    a = torch.rand(1)
    torch.manual_seed(0)
    check_pre_ln_block(ref_pre_ln)
    check_mha_param_count(ref_mha_count)
    assert torch.equal(torch.rand(1), a)
