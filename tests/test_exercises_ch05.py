"""第 5 章检查器：接受参考答案；未完成时只提示不抛异常；对每个典型错误给出对应提示。"""

import pytest
import torch

from tformer_lib import BOS, EOS
from tformer_lib.exercises.ch05 import (
    check_cached_greedy_decode,
    check_decoder_mask,
    check_greedy_decode,
    check_shift_targets,
)


def _stub(*args):
    raise NotImplementedError


def ref_shift(y):
    return [BOS] + y, y + [EOS]


def ref_mask(tgt_in, pad_id):
    T = tgt_in.shape[1]
    return (tgt_in != pad_id)[:, None, None, :] & torch.ones(T, T, dtype=torch.bool).tril()


def ref_greedy(model, src, max_len):
    memory = model.encode(src)
    ys = torch.tensor([[BOS]])
    out = []
    for _ in range(max_len):
        tok = int(model.generator(model.decode(memory, ys))[0, -1].argmax())
        out.append(tok)
        if tok == EOS:
            break
        ys = torch.cat([ys, torch.tensor([[tok]])], dim=1)
    return out


def ref_cached(model, src, max_len):
    memory = model.encode(src)
    cache = model.new_cache()
    last = torch.tensor([[BOS]])
    out = []
    for _ in range(max_len):
        tok = int(model.generator(model.decode(memory, last, cache=cache))[0, -1].argmax())
        out.append(tok)
        if tok == EOS:
            break
        last = torch.tensor([[tok]])
    return out


CHECKERS = [
    (check_shift_targets, ref_shift),
    (check_decoder_mask, ref_mask),
    (check_greedy_decode, ref_greedy),
    (check_cached_greedy_decode, ref_cached),
]


@pytest.mark.parametrize("checker, ref", CHECKERS)
def test_accepts_reference_and_reports_stub(checker, ref, capsys):
    assert checker(ref).passed
    assert "✅" in capsys.readouterr().out
    for stub in (_stub, lambda *a: None):
        result = checker(stub)
        assert result.pending and not result.passed
        assert "尚未完成" in capsys.readouterr().out


def test_cached_reference_also_passes_uncached_checker():
    assert check_greedy_decode(ref_cached, verbose=False).passed


@pytest.mark.parametrize(
    "wrong, key, hint",
    [
        (lambda y: (y + [EOS], [BOS] + y), "swapped", "放反"),
        (lambda y: ([BOS] + y + [EOS], [BOS] + y + [EOS]), "both_specials", "同一个序列"),
        (lambda y: ([BOS] + y, list(y)), "no_eos", "少了 EOS"),
        (lambda y: (list(y), y + [EOS]), "no_bos", "少了 BOS"),
        (lambda y: (list(y), list(y)), "not_shifted", "错开一位"),
        (lambda y: ([BOS] + y, y + [EOS, EOS]), "length", "n + 1"),
        (lambda y: ([BOS] + y[::-1], y[::-1] + [EOS]), "values", "应为"),
        (lambda y: [BOS] + y, "type", "两个列表"),
    ],
)
def test_shift_hints(wrong, key, hint, capsys):
    result = check_shift_targets(wrong)
    out = capsys.readouterr().out
    assert not result.passed and result.mistake == key
    assert "❌" in out and hint in out


def _causal(T):
    return torch.ones(T, T, dtype=torch.bool).tril()


@pytest.mark.parametrize(
    "wrong, key, hint",
    [
        (lambda t, p: _causal(t.shape[1]).expand(t.shape[0], 1, -1, -1), "causal_only", "只有因果"),
        (lambda t, p: (t != p)[:, None, None, :].expand(-1, 1, t.shape[1], -1), "padding_only", "只有填充"),
        (lambda t, p: (t != p)[:, None, None, :] | _causal(t.shape[1]), "or", "逻辑“或”"),
        (lambda t, p: ~ref_mask(t, p), "polarity", "极性"),
        (lambda t, p: (t != p)[:, None, None, :] & _causal(t.shape[1]).T, "upper", "下三角"),
        (lambda t, p: (t != p)[:, None, None, :] & _causal(t.shape[1]).tril(-1), "no_diagonal", "对角线"),
        (lambda t, p: (t != p)[:, None, :, None] & _causal(t.shape[1]), "query_axis", "列"),
        (lambda t, p: (t != 0)[:, None, None, :] & _causal(t.shape[1]), "pad_id_ignored", "pad_id"),
        (lambda t, p: ref_mask(t, p)[:, 0], "no_head_dim", "(B, 1, T, T)"),
        (lambda t, p: _causal(t.shape[1]), "causal_only", "填充信息丢了"),
        (lambda t, p: ref_mask(t, p).int(), "dtype", "bool"),
        (lambda t, p: ref_mask(t, p) & (torch.rand(1) > 2), "values", "padding_mask"),
    ],
)
def test_decoder_mask_hints(wrong, key, hint, capsys):
    result = check_decoder_mask(wrong)
    out = capsys.readouterr().out
    assert not result.passed and result.mistake == key
    assert "❌" in out and hint in out


def _encode_each_step(model, src, max_len):
    ys = torch.tensor([[BOS]])
    out = []
    for _ in range(max_len):
        tok = int(model(src, ys)[0, -1].argmax())
        out.append(tok)
        if tok == EOS:
            break
        ys = torch.cat([ys, torch.tensor([[tok]])], dim=1)
    return out


def _no_feedback(model, src, max_len):
    memory = model.encode(src)
    out = []
    for _ in range(max_len):
        tok = int(model.generator(model.decode(memory, torch.tensor([[BOS]])))[0, -1].argmax())
        out.append(tok)
        if tok == EOS:
            break
    return out


def _first_position(model, src, max_len):
    memory = model.encode(src)
    ys = torch.tensor([[BOS]])
    out = []
    for _ in range(max_len):
        tok = int(model.generator(model.decode(memory, ys))[0, 0].argmax())
        out.append(tok)
        if tok == EOS:
            break
        ys = torch.cat([ys, torch.tensor([[tok]])], dim=1)
    return out


def _no_stop(model, src, max_len):
    memory = model.encode(src)
    ys = torch.tensor([[BOS]])
    for _ in range(max_len):
        tok = int(model.generator(model.decode(memory, ys))[0, -1].argmax())
        ys = torch.cat([ys, torch.tensor([[tok]])], dim=1)
    return ys[0, 1:].tolist()


def _double_decode(model, src, max_len):
    memory = model.encode(src)
    model.decode(memory, torch.tensor([[BOS]]))  # 多余的一次
    return _greedy_with_memory(model, memory, max_len)


def _greedy_with_memory(model, memory, max_len):
    ys = torch.tensor([[BOS]])
    out = []
    for _ in range(max_len):
        tok = int(model.generator(model.decode(memory, ys))[0, -1].argmax())
        out.append(tok)
        if tok == EOS:
            break
        ys = torch.cat([ys, torch.tensor([[tok]])], dim=1)
    return out


@pytest.mark.parametrize(
    "wrong, key, hint",
    [
        (_encode_each_step, "encode_each_step", "只需跑一次"),
        (lambda m, s, n: [BOS] + ref_greedy(m, s, n), "includes_bos", "BOS"),
        (lambda m, s, n: [t for t in ref_greedy(m, s, n) if t != EOS], "drops_eos", "少了最后的 EOS"),
        (_no_stop, "no_stop", "没有停下"),
        (lambda m, s, n: ref_greedy(m, s, n - 1), "max_len", "max_len"),
        (_no_feedback, "no_feedback", "hidden[:, -1]"),
        (_first_position, "no_feedback", "hidden[:, 0]"),
        (_double_decode, "decode_calls", "恰好调用一次"),
        (lambda m, s, n: [4] * n, "no_encode", "model.encode"),
        (lambda m, s, n: ref_greedy(m, s.flip(1), n), "values", "greedy_decode"),
        (lambda m, s, n: "done", "type", "id 列表"),
    ],
)
def test_greedy_hints(wrong, key, hint, capsys):
    result = check_greedy_decode(wrong)
    out = capsys.readouterr().out
    assert not result.passed and result.mistake == key, (result.mistake, out)
    assert "❌" in out and hint in out


def _cached_full_prefix(model, src, max_len):
    memory = model.encode(src)
    cache = model.new_cache()
    ys = torch.tensor([[BOS]])
    out = []
    for _ in range(max_len):
        tok = int(model.generator(model.decode(memory, ys, cache=cache))[0, -1].argmax())
        out.append(tok)
        if tok == EOS:
            break
        ys = torch.cat([ys, torch.tensor([[tok]])], dim=1)
    return out


def _new_cache_each_step(model, src, max_len):
    memory = model.encode(src)
    last = torch.tensor([[BOS]])
    out = []
    for _ in range(max_len):
        tok = int(model.generator(model.decode(memory, last, cache=model.new_cache()))[0, -1].argmax())
        out.append(tok)
        if tok == EOS:
            break
        last = torch.tensor([[tok]])
    return out


@pytest.mark.parametrize(
    "wrong, key, hint",
    [
        (ref_greedy, "no_cache", "new_cache"),
        (_cached_full_prefix, "full_prefix_with_cache", "(1, 1)"),
        (_new_cache_each_step, "new_cache_each_step", "循环之前"),
        (lambda m, s, n: [BOS] + ref_cached(m, s, n), "includes_bos", "BOS"),
    ],
)
def test_cached_greedy_hints(wrong, key, hint, capsys):
    result = check_cached_greedy_decode(wrong)
    out = capsys.readouterr().out
    assert not result.passed and result.mistake == key, (result.mistake, out)
    assert "❌" in out and hint in out


def test_model_methods_restored_after_check():
    def sneaky(model, src, max_len):
        sneaky.model = model
        return ref_greedy(model, src, max_len)

    check_greedy_decode(sneaky, verbose=False)
    assert "encode" not in vars(sneaky.model) and "decode" not in vars(sneaky.model)


def test_checkers_do_not_touch_global_rng():
    torch.manual_seed(0)
    a = torch.rand(1)
    torch.manual_seed(0)
    for checker, ref in CHECKERS:
        checker(ref, verbose=False)
    assert torch.equal(torch.rand(1), a)
