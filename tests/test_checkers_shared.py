"""所有练习检查器共用的一份测试：框架本身的规则，加上每章 ``tests/checkers/chNN.py`` 里的用例。

契约（每章的检查器作者照这个写 ``tests/checkers/chNN.py``）
================================================================

``tests/checkers/chNN.py``（NN = 章号，两位数）定义模块级变量 ``CASES``：一个
:class:`checkers.Case` 列表，每个检查器一项::

    from checkers import Case, Wrong
    from tformer_lib.exercises.ch02 import check_wavelength

    def ref(i, d_model):                     # 参考答案：与 notebooks/solutions/02_solutions.ipynb 一致
        return 2 * math.pi * 10000 ** (2 * i / d_model)

    CASES = [
        Case(check_wavelength, ref, returns="number", wrong=[
            Wrong("hard_coded", lambda i, d: 6.2832),          # 必需：只会返回本章例子答案的函数
            Wrong("no_2pi", lambda i, d: 10000 ** (2 * i / d), key="no_2pi"),
        ]),
    ]

对每个 ``Case``，本文件自动检查：

1. 参考答案（以及 ``also_correct`` 里的每个函数）→ ✅（``passed``），并且检查器运行前后全局随机状态
   （torch、``random``、NumPy）不变，两次运行的结论逐字相同；
2. ``wrong`` 里的每个错误答案 → ❌（``status == "failed"``，不是 ``"error"``）；给了 ``key`` 时
   ``CheckResult.mistake == key``；
3. ``wrong`` 里至少有一个 ``Wrong("hard_coded", ...)``：写死本章例子答案的函数必须不通过
   （检查器要用几组随机情形和大小，见 :func:`tformer_lib.exercises._core.random_cases`）；
4. 没动过的桩（``raise NotImplementedError``）→ ⏳（``pending``），只打印、不抛异常；
5. 返回 ``None`` 的函数（忘了 ``return``）→ ❌，``mistake == "returned_none"``，提示里有“返回了 None”；
6. 抛出异常的函数（一个检查器不可能专门处理的异常类 ``ReadersOwnError``）→ ❌，``mistake == "exception"``，
   提示里点名异常类（怪读者的函数，因为确实是它抛的）；返回莫名其妙的对象时检查器也不抛异常；
7. ``returns="number"``/``"int"``/``"bool"`` 时：参考答案的返回值换成 Python/NumPy 标量、0 维张量
   （``"int"`` 还有 ``12.0`` 这样的整值浮点数）都必须 ✅；换成字符串必须 ❌ 且 ``mistake == "string"``。

某个 chNN.py 导入失败时只有它自己的一条测试失败，不影响别章。
"""

from __future__ import annotations

import importlib
import math
from fractions import Fraction
import random
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from tformer_lib.exercises import _core
from tformer_lib.exercises._core import (
    Mistake,
    Variant,
    as_bool,
    as_int,
    as_number,
    as_tensor,
    compare,
    compare_number,
    draw_choice,
    draw_int,
    randn,
    random_cases,
    run_checks,
    student_code,
)

sys.path.insert(0, str(Path(__file__).parent))
from checkers import Case, Wrong  # noqa: E402


# ================================================================ 收集每章的用例


def _load_case_modules() -> list[tuple[str, object]]:
    """[(模块名, 模块或导入时的异常)]。"""
    out = []
    for path in sorted((Path(__file__).parent / "checkers").glob("*.py")):
        if path.stem.startswith("_"):
            continue
        name = f"checkers.{path.stem}"
        try:
            out.append((path.stem, importlib.import_module(name)))
        except Exception as exc:  # 只让这一章的测试失败
            out.append((path.stem, exc))
    return out


_MODULES = _load_case_modules()
_CASES: list[tuple[str, Case]] = []
for _mod_name, _mod in _MODULES:
    if not isinstance(_mod, Exception):
        for _case in getattr(_mod, "CASES", []):
            _CASES.append((_mod_name, _case))
_WRONGS = [(m, c, w) for m, c in _CASES for w in c.wrong]


def _cid(item) -> str:
    return f"{item[0]}-{item[1].id}" if len(item) == 2 else f"{item[0]}-{item[1].id}-{item[2].name}"


#: 在几个进程里运行读者函数的检查器（pytest -m distributed 选中它们的用例）
_MULTI_PROCESS = {"check_allreduce_gradients"}


def _params(items, ids=_cid) -> list:
    """参数化用的 pytest.param：id 由 ``ids(item)`` 给出，多进程检查器的用例带 ``distributed`` 标记。"""
    return [pytest.param(item, id=ids(item),
                         marks=[pytest.mark.distributed] if item[1].id in _MULTI_PROCESS else [])
            for item in items]


@pytest.mark.parametrize("mod_name, mod", _MODULES, ids=[m for m, _ in _MODULES])
def test_case_module_is_well_formed(mod_name, mod):
    assert not isinstance(mod, Exception), f"tests/checkers/{mod_name}.py 导入失败：{mod!r}"
    cases = getattr(mod, "CASES", None)
    assert isinstance(cases, list) and cases, f"{mod_name}.py 应定义非空列表 CASES"
    for case in cases:
        assert isinstance(case, Case), f"{mod_name}.py 的 CASES 里应是 Case，收到 {type(case).__name__}"
        assert all(isinstance(w, Wrong) for w in case.wrong)
    ids = [c.id for c in cases]
    assert len(ids) == len(set(ids)), f"{mod_name}.py 里的 Case id 重复：{ids}"


def _stub(*args, **kwargs):
    raise NotImplementedError


class ReadersOwnError(Exception):
    """读者的函数里抛出的、检查器不可能特别处理的异常。"""


def _rng_snapshot():
    return torch.get_rng_state(), random.getstate(), np.random.get_state()[1].copy()


def _same_rng(a, b) -> bool:
    return torch.equal(a[0], b[0]) and a[1] == b[1] and np.array_equal(a[2], b[2])


@pytest.mark.parametrize("item", _params(_CASES))
def test_reference_passes_deterministically_without_touching_global_rng(item, capsys):
    _, case = item
    torch.manual_seed(123)
    random.seed(123)
    np.random.seed(123)
    before = _rng_snapshot()
    first = case.checker(case.reference)
    out1 = capsys.readouterr().out
    assert first.passed, out1
    assert out1.startswith("✅")
    assert _same_rng(before, _rng_snapshot()), "检查器改变了全局随机状态"
    second = case.checker(case.reference)
    assert capsys.readouterr().out == out1, "同一个答案检查两次，结论应逐字相同"
    assert second.passed


@pytest.mark.parametrize("item", _params([(m, c, f) for m, c in _CASES for f in c.also_correct],
                                         ids=lambda it: f"{it[0]}-{it[1].id}-{getattr(it[2], '__name__', 'alt')}"))
def test_other_correct_answers_pass(item, capsys):
    _, case, fn = item
    result = case.checker(fn)
    assert result.passed, capsys.readouterr().out


@pytest.mark.parametrize("item", _params(_CASES))
def test_a_hard_coded_answer_is_among_the_wrong_ones(item):
    _, case = item
    assert any(w.name == "hard_coded" for w in case.wrong), \
        f"{case.id}：wrong 里应有 Wrong('hard_coded', …)——只会返回本章例子答案的函数必须不通过"


@pytest.mark.parametrize("item", _params(_WRONGS))
def test_wrong_answer_is_rejected(item, capsys):
    _, case, wrong = item
    result = case.checker(wrong.fn)
    out = capsys.readouterr().out
    assert result.status == "failed", f"{wrong.name} 应 ❌ 未通过，实际 {result.status}：{out}"
    assert out.startswith("❌") and "提示：" in out
    if wrong.key is not None:
        assert result.mistake == wrong.key, f"{wrong.name}：期望认出 {wrong.key!r}，实际 {result.mistake!r}：{out}"


@pytest.mark.parametrize("item", _params(_CASES))
def test_stub_is_pending_and_prints_without_raising(item, capsys):
    _, case = item
    result = case.checker(_stub)
    out = capsys.readouterr().out
    assert result.pending and not result.passed and not result
    assert out.startswith("⏳ 尚未完成")


@pytest.mark.parametrize("item", _params(_CASES))
def test_missing_return_is_named_not_pending(item, capsys):
    _, case = item
    result = case.checker(lambda *a, **k: None)
    out = capsys.readouterr().out
    assert result.status == "failed" and result.mistake == "returned_none", out
    assert "返回了 None" in out


@pytest.mark.parametrize("item", _params(_CASES))
def test_exception_in_readers_function_is_reported_not_raised(item, capsys):
    _, case = item

    def broken(*args, **kwargs):
        raise ReadersOwnError("oops")

    result = case.checker(broken)
    assert result.status == "failed" and result.mistake == "exception" and "ReadersOwnError" in result.hint
    weird = case.checker(lambda *a, **k: object())  # 不抛异常，也不通过
    assert not weird.passed
    capsys.readouterr()


def _as_types(kind: str, value) -> list:
    if isinstance(value, torch.Tensor):
        value = value.item()
    if kind == "bool":
        v = bool(value)
        return [v, np.bool_(v), torch.tensor(v)]
    if kind == "int":
        v = int(value)
        return [v, float(v), np.int64(v), np.int32(v) if abs(v) < 2**31 else np.int64(v), torch.tensor(v),
                torch.tensor(float(v), dtype=torch.float64)]
    v = float(value)
    return [v, np.float64(v), np.float32(v), torch.tensor(v, dtype=torch.float64),
            torch.tensor(v, dtype=torch.float32), torch.tensor([v], dtype=torch.float64)]


_NUMERIC = [(m, c) for m, c in _CASES if c.returns != "other"]


@pytest.mark.parametrize("item", _params(_NUMERIC))
def test_numeric_answers_of_any_type_pass_and_strings_fail(item, capsys):
    _, case = item
    for k in range(len(_as_types(case.returns, 1))):
        def converted(*args, _k=k, **kwargs):
            return _as_types(case.returns, case.reference(*args, **kwargs))[_k]

        result = case.checker(converted)
        out = capsys.readouterr().out
        sample = _as_types(case.returns, 1)[k]
        assert result.passed, f"返回 {type(sample).__name__}（{getattr(sample, 'dtype', '')}）的正确答案应通过：{out}"

    def as_text(*args, **kwargs):
        out = case.reference(*args, **kwargs)
        return str(out.item() if isinstance(out, torch.Tensor) else out)

    result = case.checker(as_text)
    out = capsys.readouterr().out
    assert result.status == "failed" and result.mistake == "string", out
    assert "字符串" in out


# ================================================================ 框架本身（用一个小检查器演示）


def _check_square(fn, verbose=False):
    """一个按规则写的小检查器：fn(x) 应返回 x 的平方和。"""

    def values(f):
        for g in random_cases(4, seed=7):
            x = randn(draw_int(g, 1, 5), generator=g).double()
            compare_number(f(x.clone()), float((x ** 2).sum()), what="平方和", variants=[
                Variant("no_square", "忘了平方", float(x.sum())),
            ])

    return run_checks("平方和", fn, [("随机向量", values)], verbose=verbose)


def test_framework_verdicts(capsys):
    assert _check_square(lambda x: (x ** 2).sum()).passed
    assert _check_square(lambda x: float((x ** 2).sum())).passed
    assert _check_square(lambda x: np.float32((x ** 2).sum())).passed
    assert _check_square(lambda x: x.sum()).mistake == "no_square"
    assert _check_square(lambda x: 1.0).mistake == "values"  # 写死的答案在随机情形上不通过
    assert _check_square(lambda x: str(float((x ** 2).sum()))).mistake == "string"
    assert _check_square(lambda x: True).mistake == "type"
    assert _check_square(_stub).pending
    r = _check_square(lambda x: None)
    assert r.status == "failed" and r.mistake == "returned_none"
    r = _check_square(lambda x: {}["k"])
    assert r.mistake == "exception" and "KeyError" in r.hint
    r = run_checks("x", 3, [], verbose=False)  # 不是函数：❌，不抛异常
    assert r.status == "failed" and r.mistake == "not_callable"
    capsys.readouterr()


def test_checker_bug_is_not_blamed_on_the_reader(capsys):
    def buggy_checker(fn):
        def body(f):
            f(1)
            raise ZeroDivisionError("检查器自己的除零")

        return run_checks("有毛病的检查器", fn, [("任意", body)])

    r = buggy_checker(lambda x: x)
    out = capsys.readouterr().out
    assert r.status == "error" and r.mistake == "checker_error" and not r.passed
    assert out.startswith("⚠️ 检查器出错") and "不是你的" in out and "你的函数抛出了" not in out
    # 读者的函数抛出同一种异常时才怪读者
    r = buggy_checker(lambda x: 1 / 0)
    assert r.status == "failed" and r.mistake == "exception" and "你的函数抛出了 ZeroDivisionError" in r.hint


def test_checkers_can_still_catch_the_readers_exception_for_a_special_hint():
    def check(fn):
        def body(f):
            try:
                f({})
            except KeyError as exc:
                raise Mistake("用 dict.get 处理查不到的键", key="key_error") from exc

        return run_checks("查表", fn, [("缺键", body)], verbose=False)

    assert check(lambda d: d["x"]).mistake == "key_error"


def test_objects_returned_by_the_reader_run_under_student_code():
    def check(fn):
        def body(f):
            module = f()
            with student_code():
                module(3)

        return run_checks("返回一个模块", fn, [("调用它", body)], verbose=False)

    def make_broken():
        return lambda x: [][x]

    def make_stub():
        def inner(x):
            raise NotImplementedError
        return inner

    assert check(make_broken).mistake == "exception"
    assert check(make_stub).pending


def test_global_random_state_is_restored_and_readers_randomness_is_reproducible():
    seen = []

    def check(fn):
        return run_checks("随机", fn, [("x", lambda f: seen.append(f()))], verbose=False)

    def noisy():
        random.random()
        np.random.rand()
        return float(torch.rand(()))

    torch.manual_seed(1)
    random.seed(1)
    np.random.seed(1)
    before = _rng_snapshot()
    check(noisy)
    check(noisy)
    assert _same_rng(before, _rng_snapshot())
    assert seen[0] == seen[1]


@pytest.mark.parametrize("value", [3, 3.0, np.int64(3), np.int32(3), np.float32(3), np.float64(3),
                                   torch.tensor(3), torch.tensor(3.0), torch.tensor([3.0]), np.array(3.0),
                                   Fraction(6, 2)])
def test_numbers_of_every_type_are_read(value):
    assert as_number(value) == 3.0
    assert as_int(value) == 3 and isinstance(as_int(value), int)


@pytest.mark.parametrize("value, key", [("3", "string"), (" 3.0", "string"), (True, "type"), (np.bool_(True), "type"),
                                        ([3], "type"), (torch.ones(2), "type"), (torch.tensor(True), "type"),
                                        (None, "type"), (1 + 2j, "type")])
def test_non_numbers_are_rejected_with_a_hint(value, key):
    with pytest.raises(Mistake) as info:
        as_number(value, "结果")
    assert info.value.key == key and info.value.hint.startswith("结果应是")


def test_int_bool_and_tensor_readers():
    with pytest.raises(Mistake) as info:
        as_int(2.5)
    assert info.value.key == "not_integer"
    assert as_int(2**62) == 2**62
    for v in (True, np.bool_(True), torch.tensor(True), torch.tensor([True])):
        assert as_bool(v) is True
    for v, key in (("True", "string"), (1, "type"), (torch.tensor([True, False]), "type")):
        with pytest.raises(Mistake) as info:
            as_bool(v)
        assert info.value.key == key
    assert as_tensor(np.float32(2.0)).dim() == 0
    with pytest.raises(Mistake) as info:
        as_tensor("tensor([1.])")
    assert info.value.key == "string"
    with pytest.raises(Mistake) as info:
        as_tensor([1.0, 2.0])
    assert info.value.key == "type" and "torch.tensor" in info.value.hint
    with pytest.raises(Mistake) as info:
        compare(3.0, torch.ones(2))  # 该返回张量却返回了一个数
    assert info.value.key == "type"
    compare(np.float64(3.0), torch.tensor(3.0))  # 0 维参考答案：一个数就行
    compare(np.ones((2, 2), dtype=np.float32), torch.ones(2, 2))
    with pytest.raises(Mistake):
        compare_number(float("nan"), 1.0)


def test_random_cases_are_reproducible_distinct_and_leave_global_state_alone():
    torch.manual_seed(0)
    state = torch.get_rng_state()
    a = [draw_int(g, 0, 10**6) for g in random_cases(5, seed=3)]
    b = [draw_int(g, 0, 10**6) for g in random_cases(5, seed=3)]
    c = [draw_int(g, 0, 10**6) for g in random_cases(5, seed=4)]
    assert a == b and a != c and len(set(a)) == 5
    assert torch.equal(state, torch.get_rng_state())
    g = random_cases(1)[0]
    assert {draw_int(g, 2, 4) for _ in range(50)} == {2, 3, 4}
    assert draw_choice(g, ["x"]) == "x"
    with pytest.raises(ValueError):
        random_cases(0)
    assert math.isfinite(float(randn(3, generator=g).sum()))
    assert torch.equal(randn(2, 3, seed=5), randn(2, 3, seed=5))


def test_core_exports_the_whole_toolkit():
    for name in _core.__all__:
        assert hasattr(_core, name), name


# ================================================================ “直接调用答案”的静态检查


def test_library_calls_sees_globals_attributes_local_imports_and_helpers():
    import tformer_lib
    from tformer_lib.parts.masks import causal_mask

    def direct(n):
        return causal_mask(n)

    def through_module(n):
        return tformer_lib.causal_mask(n)

    def local_import(n):
        from tformer_lib.parts.masks import causal_mask as cm

        return cm(n)

    def helper(n):
        return direct(n)

    def own(n):
        return torch.ones(n, n, dtype=torch.bool).tril()

    def own_with_same_attribute_name(n, obj):
        return obj.causal_masks(n)  # 名字不同的属性不算

    for fn in (direct, through_module, local_import, helper, lambda n: [causal_mask(n) for _ in range(1)][0]):
        assert _core.library_calls(fn, [causal_mask]) == ["tformer_lib.parts.masks.causal_mask"], fn
    for fn in (own, own_with_same_attribute_name):
        assert _core.library_calls(fn, [causal_mask]) == []
    # 检查全部通过、但调用了答案 → ❌ library_call；同一个函数不禁用时 → ✅
    ref = lambda f: compare(f(4), causal_mask(4))  # noqa: E731
    assert run_checks("t", direct, [("n=4", ref)], verbose=False, forbidden=[causal_mask]).mistake == "library_call"
    assert run_checks("t", direct, [("n=4", ref)], verbose=False).passed
    assert run_checks("t", own, [("n=4", ref)], verbose=False, forbidden=[causal_mask]).passed
    # 桩仍然是 ⏳，写错的仍然按写错报告
    def stub(n):
        raise NotImplementedError

    assert run_checks("t", stub, [("n=4", ref)], verbose=False, forbidden=[causal_mask]).pending
    wrong = lambda n: ~causal_mask(n)  # noqa: E731
    assert run_checks("t", wrong, [("n=4", ref)], verbose=False, forbidden=[causal_mask]).mistake != "library_call"


def test_huge_numbers_system_exit_and_bad_forbidden():
    """10**400 这样 float 放不下的整数判错（❌，不是 ⚠️）；as_int 原样收下大整数；读者调用 sys.exit 也只是 ❌；
    检查器作者传错 forbidden 时立刻报错。"""
    check = [("n=3", lambda f: compare_number(f(3), 9))]
    assert run_checks("t", lambda n: 10**400, check, verbose=False).status == "failed"
    assert run_checks("t", lambda n: -(10**400), check, verbose=False).status == "failed"
    assert as_int(10**400) == 10**400 and as_int(np.int64(7)) == 7
    result = run_checks("t", lambda n: sys.exit(3), check, verbose=False)
    assert result.status == "failed" and result.mistake == "exception" and "SystemExit" in result.hint
    for bad in (None, "sum", [5]):
        with pytest.raises(TypeError, match="forbidden"):
            run_checks("t", lambda n: 9, check, verbose=False, forbidden=bad)
