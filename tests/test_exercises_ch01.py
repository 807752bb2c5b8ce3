"""第 1 章检查器：接受参考答案；未完成时只提示不抛异常；对每个典型错误给出对应的提示与错误名（key）。"""

import math

import pytest
import torch
import torch.nn.functional as F

from tformer_lib import BOS, EOS, PAD, UNK
from tformer_lib.exercises.ch01 import check_encode, check_one_hot_lookup, check_pad_batch, check_token_embedding


def _stub(*args):
    raise NotImplementedError


# ---- 参考答案 -------------------------------------------------------------------------------------
def ref_encode(tokens, stoi):
    return [BOS] + [stoi.get(t, UNK) for t in tokens] + [EOS]


def ref_lookup(ids, weight):
    return F.one_hot(ids, num_classes=weight.shape[0]).to(weight.dtype) @ weight


def ref_embedding(ids, weight):
    return weight[ids] * math.sqrt(weight.shape[1])


def ref_pad(seqs):
    t = max(map(len, seqs))
    ids = torch.full((len(seqs), t), PAD, dtype=torch.long)
    for b, s in enumerate(seqs):
        ids[b, : len(s)] = torch.tensor(s)
    return ids, ids != PAD


CHECKERS = [
    (check_encode, ref_encode),
    (check_one_hot_lookup, ref_lookup),
    (check_token_embedding, ref_embedding),
    (check_pad_batch, ref_pad),
]


@pytest.mark.parametrize("checker, ref", CHECKERS)
def test_accepts_reference(checker, ref, capsys):
    result = checker(ref)
    assert result.passed and bool(result)
    assert "✅" in capsys.readouterr().out


@pytest.mark.parametrize("checker, ref", CHECKERS)
def test_stub_reports_not_done_without_raising(checker, ref, capsys):
    result = checker(_stub)
    assert result.pending and not result
    assert "尚未完成" in capsys.readouterr().out


@pytest.mark.parametrize("checker, ref", CHECKERS)
def test_returning_none_is_named(checker, ref, capsys):
    assert checker(lambda *args: None).mistake == "returned_none"
    assert "返回了 None" in capsys.readouterr().out


@pytest.mark.parametrize("checker, ref", CHECKERS)
def test_not_callable_is_reported_not_raised(checker, ref):
    assert checker(42).mistake == "not_callable"


def _rejects(checker, fn, key, hint, capsys):
    result = checker(fn)
    out = capsys.readouterr().out
    assert not result and result.status == "failed"
    assert result.mistake == key, (result.mistake, out)
    assert "❌" in out and hint in out, out


# ---- 练习 1 的错误变体 -------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "wrong, key, hint",
    [
        (lambda toks, stoi: [stoi.get(t, UNK) for t in toks], "no_bos_eos", "忘了在开头加 BOS"),
        (lambda toks, stoi: [BOS] + [stoi.get(t, UNK) for t in toks], "no_eos", "两端都要加"),
        (lambda toks, stoi: [stoi.get(t, UNK) for t in toks] + [EOS], "no_bos", "两端都要加"),
        (lambda toks, stoi: [EOS] + [stoi.get(t, UNK) for t in toks] + [BOS], "swapped", "放反了"),
        (lambda toks, stoi: [BOS] + [stoi[t] for t in toks if t in stoi] + [EOS], "dropped_unknown", "未登录词被丢掉了"),
        (lambda toks, stoi: [BOS] + [stoi.get(t, PAD) for t in toks] + [EOS], "unknown_as_pad", "不是 PAD"),
        (lambda toks, stoi: [BOS] + [stoi[t] for t in toks] + [EOS], "key_error", "KeyError"),
        (lambda toks, stoi: "狗 咬 人", "type", "应返回 id 列表"),
        (lambda toks, stoi: [BOS, "狗", EOS], "type", "整数 id"),
        (lambda toks, stoi: [BOS] + [stoi.get(t, UNK) + 1 for t in toks] + [EOS], "values", "期望"),
    ],
)
def test_encode_wrong_variants(wrong, key, hint, capsys):
    _rejects(check_encode, wrong, key, hint, capsys)


def test_encode_accepts_tensor_output(capsys):
    assert check_encode(lambda toks, stoi: torch.tensor(ref_encode(toks, stoi)))


# ---- 练习 2 -----------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "wrong, key, hint",
    [
        (lambda ids, w: F.one_hot(ids).float() @ w, "num_classes", "num_classes"),  # 少了 num_classes
        (lambda ids, w: F.one_hot(ids, w.shape[0]).float() @ w.T, "num_classes", "不要转置"),
        (lambda ids, w: F.one_hot(ids, w.shape[0]).float() @ w[:, :-1], "shape", "输出形状应为"),
        (lambda ids, w: F.one_hot(ids, w.shape[0]).float() @ (w * 2), "values", "形状对了但数值不对"),
        (lambda ids, w: [1, 2], "type", "torch 张量"),
    ],
)
def test_lookup_wrong_variants(wrong, key, hint, capsys):
    _rejects(check_one_hot_lookup, wrong, key, hint, capsys)


# ---- 练习 3 -----------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "wrong, key, hint",
    [
        (lambda ids, w: w[ids], "no_scale", "忘了缩放"),
        (lambda ids, w: w[ids] / math.sqrt(w.shape[1]), "divided", "方向反了"),
        (lambda ids, w: w[ids] * w.shape[1], "times_d", "不是 d_model"),
        (lambda ids, w: w[ids] * math.sqrt(w.shape[0]), "sqrt_vocab", "不是词表大小"),
        (lambda ids, w: w[ids] * 8.0, "values", "结果与 TokenEmbedding 不同"),
        (lambda ids, w: w[ids][:, :1] * math.sqrt(w.shape[1]), "shape", "输出形状应为"),
    ],
)
def test_embedding_wrong_variants(wrong, key, hint, capsys):
    _rejects(check_token_embedding, wrong, key, hint, capsys)


# ---- 练习 4 -----------------------------------------------------------------------------------------
def _left_pad(seqs):
    t = max(map(len, seqs))
    ids = torch.full((len(seqs), t), PAD, dtype=torch.long)
    for b, s in enumerate(seqs):
        ids[b, t - len(s):] = torch.tensor(s)
    return ids, ids != PAD


def _wrong_fill(seqs):
    ids, keep = ref_pad(seqs)
    return ids.masked_fill(~keep, UNK), keep


def _fixed_len(seqs):
    ids = torch.full((len(seqs), 8), PAD, dtype=torch.long)
    for b, s in enumerate(seqs):
        ids[b, : len(s)] = torch.tensor(s)
    return ids, ids != PAD


@pytest.mark.parametrize(
    "wrong, key, hint",
    [
        (lambda seqs: (ref_pad(seqs)[0], ~ref_pad(seqs)[1]), "polarity", "极性反了"),
        (lambda seqs: (ref_pad(seqs)[0], ref_pad(seqs)[1].int()), "dtype", "布尔张量"),
        (lambda seqs: (ref_pad(seqs)[0].float(), ref_pad(seqs)[1]), "dtype", "torch.long"),
        (_left_pad, "left_pad", "右侧补 PAD"),
        (_wrong_fill, "pad_value", "应填 PAD"),
        (_fixed_len, "shape", "补到本批最长句"),
        (lambda seqs: ref_pad(seqs)[0], "type", "元组"),
        (lambda seqs: (ref_pad(seqs)[0], ref_pad(seqs)[1][:, :1]), "shape", "keep 形状"),
    ],
)
def test_pad_wrong_variants(wrong, key, hint, capsys):
    _rejects(check_pad_batch, wrong, key, hint, capsys)


def test_checkers_leave_global_rng_untouched():
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    for checker, ref in CHECKERS:
        checker(ref)
    assert torch.equal(torch.rand(3), expected)
