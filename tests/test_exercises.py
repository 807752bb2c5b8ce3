"""检查器的测试：接受参考答案、拒绝每一种已知错误写法并给出对应的提示，桩只提示“尚未完成”而不抛异常。"""

import math

import pytest
import torch

from tformer_lib import causal_mask, padding_mask, scaled_dot_product_attention, sinusoidal_positional_encoding
from tformer_lib.exercises import (
    CheckResult,
    Mistake,
    Variant,
    check_attention,
    check_causal_mask,
    check_label_smoothing,
    check_lr_schedule,
    check_merge_heads,
    check_padding_mask,
    check_positional_encoding,
    check_softmax,
    check_split_heads,
    compare,
    run_checks,
)


def _quiet(check, fn):
    return check(fn, verbose=False)


# ---------------------------------------------------------------- framework

def _stub(*args, **kwargs):
    raise NotImplementedError


ALL_CHECKERS = [check_softmax, check_attention, check_causal_mask, check_padding_mask, check_positional_encoding,
                check_split_heads, check_merge_heads, check_lr_schedule, check_label_smoothing]


@pytest.mark.parametrize("check", ALL_CHECKERS)
def test_stub_is_pending_and_never_raises(check, capsys):
    r = check(_stub)
    assert isinstance(r, CheckResult) and r.pending and not r.passed and not r
    assert capsys.readouterr().out.startswith("⏳ 尚未完成")
    r = check(lambda *a, **k: None, verbose=False)  # 忘了 return：与桩分开，点名“返回了 None”
    assert r.status == "failed" and r.mistake == "returned_none"


@pytest.mark.parametrize("check", ALL_CHECKERS)
def test_crashing_function_is_reported_not_raised(check):
    def broken(*args, **kwargs):
        raise KeyError("oops")

    r = _quiet(check, broken)
    assert r.status == "failed" and r.mistake == "exception" and "KeyError" in r.hint


def test_result_display_and_messages(capsys):
    r = check_softmax(lambda x: torch.softmax(x, -1))
    out = capsys.readouterr().out
    assert out.startswith("✅ 通过：softmax") and r.passed and bool(r)
    assert r._ipython_display_() is None  # 笔记本里不重复显示
    assert "status='passed'" in repr(r)
    r = check_softmax(lambda x: torch.softmax(x, 0))
    out = capsys.readouterr().out
    assert out.startswith("❌ 未通过：softmax") and "提示：" in out


def test_run_checks_and_compare_are_reusable_for_chapter_checkers():
    def check_relu(fn, verbose=False):
        def values(f):
            x = torch.tensor([-2.0, 0.0, 3.0])
            compare(f(x), torch.relu(x), variants=[Variant("abs", "用了绝对值", x.abs())])

        def shape(f):
            if f(torch.zeros(2, 3)).shape != (2, 3):
                raise Mistake("形状变了", key="shape")

        return run_checks("ReLU", fn, [("数值", values), ("形状", shape)], verbose=verbose)

    assert check_relu(torch.relu).passed
    r = check_relu(torch.abs)
    assert r.mistake == "abs" and r.hint == "用了绝对值"
    r = check_relu(lambda x: x.clamp(min=0) + 1)
    assert r.mistake == "values" and "数值不对" in r.hint
    r = check_relu(lambda x: [0.0, 0.0, 3.0])
    assert r.mistake == "type"
    assert check_relu(lambda x: (_ for _ in ()).throw(NotImplementedError)).pending
    assert run_checks("x", 3, [], verbose=False).mistake == "not_callable"  # 不抛异常


def test_checkers_do_not_touch_the_global_rng():
    torch.manual_seed(5)
    a = torch.rand(2)
    torch.manual_seed(5)
    check_attention(scaled_dot_product_attention, verbose=False)
    assert torch.equal(torch.rand(2), a)


# ---------------------------------------------------------------- softmax

def _softmax_ref(x):
    z = x - x.max(dim=-1, keepdim=True).values
    return z.exp() / z.exp().sum(dim=-1, keepdim=True)


@pytest.mark.parametrize("fn, key", [
    (lambda x: torch.softmax(x, 0), "wrong_axis"),
    (lambda x: torch.softmax(x, 1), "wrong_axis"),  # 二维时碰巧对，三维时错
    (lambda x: x.exp() / x.exp().sum(-1, keepdim=True), "overflow"),
    (lambda x: x.exp(), "no_normalization"),
    (lambda x: x / x.sum(-1, keepdim=True), "exp_missing"),
    (lambda x: x.sub_(x.max(-1, keepdim=True).values).exp_().div_(x.sum(-1, keepdim=True)), "inplace"),
])
def test_softmax_mistakes(fn, key):
    assert _quiet(check_softmax, _softmax_ref).passed
    r = _quiet(check_softmax, fn)
    assert r.status == "failed" and r.mistake == key, (r.mistake, r.hint)


def test_softmax_hints_name_the_mistake():
    assert "维度" in _quiet(check_softmax, lambda x: torch.softmax(x, 0)).hint
    assert "最大值" in _quiet(check_softmax, lambda x: x.exp() / x.exp().sum(-1, keepdim=True)).hint


# ---------------------------------------------------------------- attention

def _attn(q, k, v, mask=None, *, scale=None, axis=-1, flip=False, fill=None, use_mask=True):
    d_k = q.shape[-1]
    s = q @ k.transpose(-2, -1) / (math.sqrt(d_k) if scale is None else scale)
    if mask is not None and use_mask:
        s = s.masked_fill(mask if flip else ~mask, float("-inf") if fill is None else fill)
    w = s.softmax(dim=axis)
    return w @ v, w


@pytest.mark.parametrize("fn, key", [
    (lambda q, k, v, mask=None: _attn(q, k, v, mask, scale=1.0), "no_scale"),
    (lambda q, k, v, mask=None: _attn(q, k, v, mask, scale=q.shape[-1]), "scale_by_dk"),
    (lambda q, k, v, mask=None: _attn(q, k, v, mask, axis=-2), "wrong_axis"),
    (lambda q, k, v, mask=None: _attn(q, k, v, mask, flip=True), "mask_polarity"),
    (lambda q, k, v, mask=None: _attn(q, k, v, mask, fill=0.0), "mask_fill_zero"),
    (lambda q, k, v, mask=None: _attn(q, k, v, mask, use_mask=False), "mask_ignored"),
])
def test_attention_mistakes(fn, key):
    r = _quiet(check_attention, fn)
    assert r.status == "failed" and r.mistake == key, (r.mistake, r.hint)


def test_attention_accepts_library_and_output_only_and_minus_inf():
    assert _quiet(check_attention, scaled_dot_product_attention).passed
    assert _quiet(check_attention, lambda q, k, v, mask=None: _attn(q, k, v, mask)[0]).passed  # 只返回 output
    assert _quiet(check_attention, lambda q, k, v, mask=None: _attn(q, k, v, mask)).passed  # -inf 填充也可以
    r = _quiet(check_attention, lambda q, k, v, mask=None: _attn(q, k, v, mask, scale=1.0))
    assert "√d_k" in r.hint
    r = _quiet(check_attention, lambda q, k, v, mask=None: _attn(q, k, v, mask, flip=True))
    assert "极性" in r.hint
    # 写死 transpose(1, 2)：三维输入时碰巧对，四维 (B, h, T, d_k) 时错
    r = _quiet(check_attention, lambda q, k, v, mask=None: _attn(q, k.transpose(1, 2).transpose(-2, -1), v, mask))
    assert r.status == "failed" and r.checks_passed == ["不带掩码", "带掩码（True = 可以关注）"]


# ---------------------------------------------------------------- causal mask

@pytest.mark.parametrize("fn, key", [
    (lambda n: torch.ones(n, n, dtype=torch.bool).tril(-1), "diagonal_excluded"),
    (lambda n: torch.ones(n, n, dtype=torch.bool).triu(1), "polarity"),
    (lambda n: torch.ones(n, n, dtype=torch.bool).triu(), "upper_triangle"),
    (lambda n: torch.ones(n, n).tril(), "dtype"),
    (lambda n: torch.ones(n, n + 1, dtype=torch.bool).tril(), "shape"),
])
def test_causal_mask_mistakes(fn, key):
    assert _quiet(check_causal_mask, causal_mask).passed
    r = _quiet(check_causal_mask, fn)
    assert r.status == "failed" and r.mistake == key, (r.mistake, r.hint)
    if key == "diagonal_excluded":
        assert "对角线" in r.hint


# ---------------------------------------------------------------- padding mask

@pytest.mark.parametrize("fn, key", [
    (lambda t, pad_id: (t == pad_id)[:, None, None, :], "polarity"),
    (lambda t, pad_id: t != pad_id, "shape_2d"),
    (lambda t, pad_id: (t != pad_id)[:, None, :, None], "shape_query_axis"),
    (lambda t, pad_id: (t != pad_id)[:, None, :], "shape_3d"),
    (lambda t, pad_id: (t != 0)[:, None, None, :], "pad_id_ignored"),
    (lambda t, pad_id: (t != pad_id)[:, None, None, :].float(), "dtype"),
])
def test_padding_mask_mistakes(fn, key):
    assert _quiet(check_padding_mask, padding_mask).passed
    r = _quiet(check_padding_mask, fn)
    assert r.status == "failed" and r.mistake == key, (r.mistake, r.hint)


# ---------------------------------------------------------------- positional encoding

def _pe(max_len, d_model, *, swap=False, exp_i=False, exp_j=False, concat=False, start=0):
    pos = torch.arange(start, start + max_len, dtype=torch.float64)[:, None]
    pe = torch.zeros(max_len, d_model, dtype=torch.float64)
    for j in range(d_model):
        i = j // 2
        e = (i / d_model) if exp_i else (j / d_model if exp_j else 2 * i / d_model)
        angle = pos[:, 0] / 10000 ** e
        even = j % 2 == 0
        pe[:, j] = torch.sin(angle) if even != swap else torch.cos(angle)
    if concat:
        a = pos / 10000 ** (torch.arange(0, d_model, 2, dtype=torch.float64) / d_model)
        pe = torch.cat([a.sin(), a.cos()], dim=1)
    return pe.float()


@pytest.mark.parametrize("fn, key", [
    (lambda L, d: _pe(L, d, swap=True), "sin_cos_swapped"),
    (lambda L, d: _pe(L, d, exp_i=True), "exponent_i"),
    (lambda L, d: _pe(L, d, exp_j=True), "exponent_j"),
    (lambda L, d: _pe(L, d, concat=True), "concatenated"),
    (lambda L, d: _pe(L, d, start=1), "pos_from_1"),
    (lambda L, d: _pe(L, d).T, "transposed"),
])
def test_positional_encoding_mistakes(fn, key):
    assert _quiet(check_positional_encoding, sinusoidal_positional_encoding).passed
    assert _quiet(check_positional_encoding, _pe).passed
    r = _quiet(check_positional_encoding, fn)
    assert r.status == "failed" and r.mistake == key, (r.mistake, r.hint)
    if key == "sin_cos_swapped":
        assert "sin" in r.hint and "cos" in r.hint


# ---------------------------------------------------------------- split / merge heads

def _split_ok(x, h):
    B, T, d = x.shape
    return x.view(B, T, h, d // h).transpose(1, 2)


@pytest.mark.parametrize("fn, key", [
    (lambda x, h: x.reshape(x.shape[0], h, x.shape[1], x.shape[2] // h), "view_wrong_order"),
    (lambda x, h: x.view(x.shape[0], x.shape[1], h, x.shape[2] // h), "no_transpose"),
    (lambda x, h: x.view(x.shape[0], x.shape[1], x.shape[2] // h, h).permute(0, 3, 1, 2), "interleaved"),
    (lambda x, h: x.view(2, 3, 2, 4).transpose(1, 2), "exception"),  # 写死形状：其他尺寸时 view 报错
])
def test_split_heads_mistakes(fn, key):
    assert _quiet(check_split_heads, _split_ok).passed
    r = _quiet(check_split_heads, fn)
    assert r.status == "failed" and r.mistake == key, (r.mistake, r.hint)
    if key == "view_wrong_order":
        assert "view(B, T, h, d_k)" in r.hint


def test_merge_heads():
    ok = lambda x: x.transpose(1, 2).reshape(x.shape[0], x.shape[2], -1)  # noqa: E731
    assert _quiet(check_merge_heads, ok).passed
    r = _quiet(check_merge_heads, lambda x: x.reshape(x.shape[0], x.shape[2], -1))
    assert r.mistake == "no_transpose"
    r = _quiet(check_merge_heads, lambda x: x.transpose(1, 2).view(x.shape[0], x.shape[2], -1))
    assert r.mistake == "exception" and "contiguous" in r.hint


# ---------------------------------------------------------------- LR schedule / label smoothing

def _noam_ok(step, d_model, warmup):
    return d_model ** -0.5 * min(step ** -0.5, step * warmup ** -1.5)


@pytest.mark.parametrize("fn, key", [
    (lambda s, d, w: d ** -0.5 * max(s ** -0.5, s * w ** -1.5), "max_instead_of_min"),
    (lambda s, d, w: d ** -0.5 * min(s ** -0.5, s * w ** -0.5), "warmup_exponent"),
    (lambda s, d, w: min(s ** -0.5, s * w ** -1.5), "no_d_model_factor"),
    (lambda s, d, w: [0.001], "type"),
])
def test_lr_schedule_mistakes(fn, key):
    from tformer_lib.exercises import check_lr_schedule
    from tformer_lib.training.schedule import noam_rate

    assert _quiet(check_lr_schedule, _noam_ok).passed
    assert _quiet(check_lr_schedule, noam_rate).passed  # 库里的实现
    r = _quiet(check_lr_schedule, fn)
    assert r.status == "failed" and r.mistake == key, (r.mistake, r.hint)


def _smooth(target, V, eps, *, true=None, other=None):
    d = torch.full((len(target), V), eps / V if other is None else other(eps, V), dtype=torch.float64)
    d[torch.arange(len(target)), target] = 1 - eps + eps / V if true is None else true(eps, V)
    return d


@pytest.mark.parametrize("fn, key", [
    (lambda t, V, e: _smooth(t, V, e, true=lambda e, V: 1 - e, other=lambda e, V: e / (V - 1)), "spread_over_others"),
    (lambda t, V, e: _smooth(t, V, e, true=lambda e, V: 1 - e), "rows_do_not_sum_to_one"),
    (lambda t, V, e: _smooth(t, V, e, true=lambda e, V: e / V, other=lambda e, V: 1 - e + e / V), "swapped"),
    (lambda t, V, e: _smooth(t, V, e).T, "shape"),
])
def test_label_smoothing_mistakes(fn, key):
    import torch.nn.functional as F

    from tformer_lib.exercises import check_label_smoothing
    from tformer_lib.plotting import label_smoothing_targets

    assert _quiet(check_label_smoothing, _smooth).passed
    assert _quiet(check_label_smoothing, lambda t, V, e: torch.from_numpy(label_smoothing_targets(t.tolist(), V, e))).passed
    # 约定与 F.cross_entropy(label_smoothing=ε) 一致
    logits = torch.randn(3, 5, dtype=torch.float64)
    t = torch.tensor([2, 0, 4])
    assert torch.allclose(F.cross_entropy(logits, t, label_smoothing=0.1),
                          -(_smooth(t, 5, 0.1) * logits.log_softmax(-1)).sum(-1).mean())
    r = _quiet(check_label_smoothing, fn)
    assert r.status == "failed" and r.mistake == key, (r.mistake, r.hint)
