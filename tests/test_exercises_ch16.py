"""第 16 章检查器里共享测试（tests/test_checkers_shared.py + tests/checkers/ch16.py）管不到的细节。"""

import sys
from pathlib import Path

import pytest
import torch

from tformer_lib.exercises import ch16
from tformer_lib.exercises._core import LIBRARY_CALL_HINT
from tformer_lib.exercises.ch16 import (
    buggy_merge_partials,
    check_capacity_keep,
    check_predict_dropped,
    check_ring_attention_bytes,
)

sys.path.insert(0, str(Path(__file__).parent))
from checkers.ch16 import (  # noqa: E402
    CASES,
    _dropped_library,
    _keep_library,
    _ring_library,
    ref_merge_partials,
    ref_predict_dropped,
)

_LIBRARY_CALL = LIBRARY_CALL_HINT.split("{")[0]  # 那一句提示点名禁用对象之前的部分


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_every_case_has_a_library_answer_and_at_least_four_wrong_ones(case):
    # hard_coded 由共享测试要求；本章每题还要有一个直接调用库里答案的错误答案
    assert "library" in {w.name for w in case.wrong}
    assert len(case.wrong) >= 4


def test_dropped_count_as_a_float32_zero_dim_tensor_passes(capsys):
    # 共享测试的 returns="int" 换型里只有 float64 的 0 维浮点张量
    assert check_predict_dropped(lambda *a: torch.tensor(float(ref_predict_dropped(*a)))).passed, \
        capsys.readouterr().out


def test_the_ban_names_the_library_function(capsys):
    result = check_capacity_keep(_keep_library)
    out = capsys.readouterr().out
    assert result.mistake == "library_call" and "within_capacity" in out and _LIBRARY_CALL in out
    result = check_ring_attention_bytes(_ring_library)
    assert "ring_attention_payload" in capsys.readouterr().out
    result = check_predict_dropped(_dropped_library)
    assert "expert_capacity" in capsys.readouterr().out


def test_buggy_merge_is_exact_for_small_scores_and_overflows_for_large_ones():
    out_a, out_b = torch.randn(3, 4), torch.randn(3, 4)
    a, b = torch.tensor([0.5, -1.0, 2.0]), torch.tensor([1.5, 0.0, -3.0])
    bug_out, bug_lse = buggy_merge_partials(out_a, a, out_b, b)
    ref_out, ref_lse = ref_merge_partials(out_a, a, out_b, b)
    assert torch.allclose(bug_out, ref_out, atol=1e-6) and torch.allclose(bug_lse, ref_lse, atol=1e-6)
    a, b = torch.tensor([400.0, 95.0, 300.0]), torch.tensor([401.0, 90.0, -float("inf")])
    _, bug_lse = buggy_merge_partials(out_a, a, out_b, b)
    assert torch.isinf(bug_lse).any()  # float32 的 e^95 已经是 inf
    ref_out, ref_lse = ref_merge_partials(out_a, a, out_b, b)
    assert torch.isfinite(ref_out).all() and torch.isfinite(ref_lse).all()
    assert torch.allclose(ref_out[2], out_a[2])  # 块 b 是空的：结果就是块 a


def test_merging_block_by_block_around_the_ring_equals_one_softmax():
    g = torch.Generator().manual_seed(0)
    scores = torch.randn(5, 12, generator=g) * 3 + 200  # (n, T)
    scores[:, 4:8] = float("-inf")  # 中间一整块被屏蔽
    v = torch.randn(12, 3, generator=g)  # (T, d)
    out, lse = torch.zeros(5, 3), torch.full((5,), float("-inf"))
    for start in range(0, 12, 4):
        out_b, lse_b = ch16._partial(scores[:, start:start + 4], v[start:start + 4])
        out, lse = ref_merge_partials(out, lse, out_b, lse_b)
    assert torch.allclose(out, torch.softmax(scores, -1) @ v, atol=1e-5)
    assert torch.allclose(lse, torch.logsumexp(scores, -1), atol=1e-4)


def test_library_functions_still_work_after_the_checks(capsys):
    from tformer_lib.moe import within_capacity

    check_capacity_keep(_keep_library)
    check_predict_dropped(_dropped_library)
    capsys.readouterr()
    assert within_capacity(torch.tensor([[0], [0], [0]]), 2, 2).tolist() == [[True], [True], [False]]


def test_module_exports():
    for name in ch16.__all__:
        assert hasattr(ch16, name), name


# ---- 禁用库函数：静态检查看得到的拐弯，运行时看得到其余的 ----


def _static_library_calls(fn):
    from tformer_lib import moe
    from tformer_lib.exercises._core import library_calls

    return library_calls(fn, [getattr(moe, name) for name in moe.__all__])


def test_static_scan_sees_default_arguments_code_copies_and_callable_objects():
    import types

    from tformer_lib import moe

    name = "tformer_lib.moe.dispatch.within_capacity"
    copy = types.FunctionType(moe.within_capacity.__code__, moe.within_capacity.__globals__, "mine")
    code = moe.within_capacity.__code__

    def default_arg(c, e, cap, _w=moe.within_capacity):
        return _w(c, e, cap)

    def uses_copy(c, e, cap):
        return copy(c, e, cap)

    def rebuilds_from_code(c, e, cap):
        return types.FunctionType(code, moe.within_capacity.__globals__)(c, e, cap)

    class Callable:
        def __call__(self, c, e, cap):
            from tformer_lib.moe import within_capacity

            return within_capacity(c, e, cap)

    class Holder:
        def __init__(self):
            self.rule = moe.within_capacity

        def __call__(self, c, e, cap):
            return self.rule(c, e, cap)

    for fn in (default_arg, uses_copy, rebuilds_from_code, Callable(), Callable().__call__, Holder(), copy):
        assert _static_library_calls(fn) == [name], fn

    def own(c, e, cap, _k=3):
        return c < cap

    class Own:
        def __call__(self, c, e, cap):
            return own(c, e, cap)

    assert _static_library_calls(own) == [] and _static_library_calls(Own()) == []


def test_watch_calls_records_every_route_and_restores_the_profiler():
    import importlib

    from tformer_lib import moe
    from tformer_lib.exercises._sandbox import watch_calls

    choices = torch.tensor([[0, 1], [0, 1]])
    record = []
    with watch_calls([moe.within_capacity, moe.TopKRouter], record):
        getattr(importlib.import_module("tformer_lib.moe"), "within_" + "capacity")(choices, 2, 1)
        moe.TopKRouter(4, 2, 1)  # 类：它的 __init__ 也算
    assert record == ["tformer_lib.moe.dispatch.within_capacity", "tformer_lib.moe.router.TopKRouter"]
    assert sys.getprofile() is None
    with watch_calls([moe.within_capacity], record := []):
        moe.expert_capacity(4, 2, 1, 1.0)  # 不禁用的函数不记
    assert record == []

    def other_profiler(frame, event, arg):  # 已有别的 profile 函数时不装，也不弄坏它
        pass

    sys.setprofile(other_profiler)
    try:
        with watch_calls([moe.within_capacity], record := []):
            moe.within_capacity(choices, 2, 1)
        assert sys.getprofile() is other_profiler and record == []
    finally:
        sys.setprofile(None)


def test_checkers_leave_no_profiler_behind(capsys):
    from checkers.ch16 import _KeepCallable, ref_keep

    for fn in (ref_keep, _KeepCallable()):
        check_capacity_keep(fn)
        assert sys.getprofile() is None
    capsys.readouterr()


def test_going_through_the_model_is_named_as_a_runtime_use(capsys):
    from checkers.ch16 import _freq_through_the_model
    from tformer_lib.exercises.ch16 import check_scaled_rope_frequencies

    result = check_scaled_rope_frequencies(_freq_through_the_model)
    out = capsys.readouterr().out
    assert result.mistake == "library_call" and _LIBRARY_CALL in out and "rope_frequencies" in out


# ---- 其余几处提示 ----


def test_int32_choices_get_a_cast_hint_not_a_raw_error(capsys):
    from checkers.ch16 import _keep_int32_one_hot

    result = check_capacity_keep(_keep_int32_one_hot)
    out = capsys.readouterr().out
    assert result.mistake == "index_dtype" and "torch.int32" in out and ".long()" in out


def test_forgotten_heads_are_named_on_the_first_real_case(capsys):
    from checkers.ch16 import _ring_no_batch, _ring_no_heads

    result = check_ring_attention_bytes(_ring_no_heads)
    out = capsys.readouterr().out
    assert result.mistake == "no_heads" and "heads=8" in out and "头数 h = 8" in out and "字节" in out
    assert check_ring_attention_bytes(_ring_no_batch).mistake == "no_batch"
    capsys.readouterr()


def test_the_bug_in_float64_is_told_that_float64_overflows_too(capsys):
    from checkers.ch16 import _merge_bug_in_float64_nan_to_num
    from tformer_lib.exercises.ch16 import check_merge_partials

    result = check_merge_partials(_merge_bug_in_float64_nan_to_num)
    out = capsys.readouterr().out
    assert result.mistake == "overflow" and "float64" in out and "709" in out


def test_huge_rows_overflow_float64_both_ways():
    g = torch.Generator().manual_seed(0)
    level = ch16._huge_level(g)
    rows = ch16._row_levels(g, 6, level)  # (6, 1)
    assert 709.78 < level < 1024 and rows.shape == (6, 1)
    assert rows.max() == level and rows.min() == -level  # 正负都有：减一个常数救不了
    assert torch.isinf(torch.exp(rows.double().max())) and torch.exp(rows.double().min()) == 0
    assert (ch16._row_levels(g, 3, 400.0) == 400.0).all()
