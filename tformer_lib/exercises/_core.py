"""练习检查器（exercise checker）的小框架。

读者在笔记本里写一个函数，检查器用几组性质测试（property test）去调用它，然后打印一行中文结论：

- 函数还是桩（stub）——抛出 ``NotImplementedError``：打印 “⏳ 尚未完成……”，**不抛异常**，
  这样提交的笔记本能在 CI 里从头跑到尾；
- 函数返回了 ``None``（多半是忘了写 ``return``）：打印 “❌ …… 函数返回了 None”，与桩分开；
- 全部通过：打印 “✅ 通过……”；
- 未通过：打印 “❌ ……” 和一句点名错误的提示（hint），例如“忘了除以 √d_k”；
- 读者的函数自己抛出异常：“❌ …… 你的函数抛出了 KeyError：……”；
- 检查器**自己**出错（不是读者的函数抛的）：“⚠️ 检查器出错……”，不怪读者（``status == "error"``）。

检查器返回 :class:`CheckResult`（``.passed`` 为 True/False），结果已经打印过，所以在笔记本里
它作为单元格最后一个表达式时不会再显示一遍。

章节作者写自己的检查器（放在 ``tformer_lib/exercises/chNN.py``）::

    from tformer_lib.exercises._core import Variant, compare, random_cases, draw_int, randn, run_checks

    def check_relu(fn):
        def values(f):
            for g in random_cases(5, seed=1):              # 几组随机的情形与大小，不只是书里的例子
                x = randn(draw_int(g, 1, 4), draw_int(g, 2, 9), generator=g)
                compare(f(x), torch.relu(x), variants=[Variant("abs", "用了绝对值而不是把负数截成 0", x.abs())])
        return run_checks("ReLU", fn, [("数值与 torch.relu 一致", values)])

规则（每个检查器都要做到；``tests/test_checkers_shared.py`` 逐条检查）：

1. 用几组随机情形和大小（:func:`random_cases`、:func:`draw_int`、:func:`randn`），不要只用本章的例子——
   写死答案的函数必须不通过；
2. 读者返回的数用 :func:`as_number` / :func:`as_int` / :func:`as_bool` / :func:`compare_number` 读取：
   Python int/float、NumPy 标量、0 维（单元素）张量都接受，字符串被拒绝并给出提示；
3. 检查函数里直接 ``raise Mistake("提示", key="...")`` 报告读者的错误；``compare`` 把读者的输出与参考答案比较，
   不一致时若恰好等于某个“已知错误写法”（:class:`Variant`）的输出，就用那个错误的提示；
4. 读者返回的对象（模块、闭包）要再调用时，放在 ``with student_code():`` 里，它抛的异常才算读者的；
5. 找错、实现之类“答案就在库里”的题，把那些库函数/类传给 ``run_checks(..., forbidden=…)``：靠直接调用答案通过的函数
   得到 ❌（``mistake == "library_call"``，提示是 :data:`LIBRARY_CALL_HINT`），而不是 ✅；读者可能拐着弯拿到答案时
   （``getattr``、``sys.modules``、经由别的库函数）再加 ``trace_forbidden=True``，运行时记下实际执行到的禁用代码；
   读者的函数要在子进程里跑时用 :func:`run_in_workers`（结论的走向与本进程里相同，禁用的记录也从子进程带回）；
6. 检查器运行时不改变全局随机状态（``run_checks`` 已经负责：torch、``random``、NumPy 的全局状态都原样恢复），
   并且每次运行结果相同（检查开始前固定 torch 的种子）。
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import math
import random
import types
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

from tformer_lib.exercises._mistakes import Mistake, Variant
from tformer_lib.exercises._sandbox import banned_codes, python_functions, ship, unship, watch_calls

PENDING, PASSED, FAILED, ERROR = "pending", "passed", "failed", "error"

_STUDENT = "_tformer_raised_by_student"  # 读者代码抛出的异常带这个属性


class _Pending(Exception):
    """读者的函数仍是桩（抛 NotImplementedError）。"""


@dataclass
class CheckResult:
    """一次检查的结果。``status`` 为 ``"pending"``、``"passed"``、``"failed"`` 或 ``"error"``（检查器自己出错）。"""

    title: str
    status: str
    message: str
    hint: str | None = None
    mistake: str | None = None
    checks_passed: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        """全部检查通过时为 True（桩、未通过、检查器出错都是 False）。"""
        return self.status == PASSED

    @property
    def pending(self) -> bool:
        """读者还没动手（函数仍是桩）时为 True。"""
        return self.status == PENDING

    def __bool__(self) -> bool:
        """``if check_x(fn): …`` 与 ``.passed`` 等价。"""
        return self.passed

    def __repr__(self) -> str:
        return f"CheckResult(title={self.title!r}, status={self.status!r}, mistake={self.mistake!r})"

    def _ipython_display_(self) -> None:
        """结论已经打印过；在笔记本里作为最后一个表达式时不再重复显示。"""


# ---------------------------------------------------------------- 读者的代码


def _mark_student(exc: BaseException) -> BaseException:
    try:
        setattr(exc, _STUDENT, True)
    except (AttributeError, TypeError):  # pragma: no cover - 极少数不能加属性的异常
        pass
    return exc


def raised_by_student(exc: BaseException) -> bool:
    """``exc`` 是不是读者的代码抛出的（而不是检查器自己）。"""
    return bool(getattr(exc, _STUDENT, False))


@contextlib.contextmanager
def student_code() -> Iterator[None]:
    """在这个块里抛出的异常算作读者代码的异常（例如调用读者返回的模块或闭包时）。

    ``NotImplementedError`` 表示读者还没写完（→ ⏳）；其他异常原样抛出，但带上“读者的”标记，
    这样检查函数仍可以 ``except KeyError`` 给出专门的提示，``run_checks`` 也知道不是检查器自己出错。
    """
    try:
        yield
    except (_Pending, Mistake):
        raise
    except NotImplementedError as exc:
        raise _Pending() from exc
    except (Exception, SystemExit) as exc:  # 读者调用了 exit()/sys.exit() 也只算读者的异常，不让笔记本中断
        raise _mark_student(exc)


_NONE_HINT = ("函数返回了 None：是不是忘了写 return？把算出的结果 return 出来"
              "（如果你还没开始做，保留 raise NotImplementedError 即可）")

#: 读者的函数用到了本题禁用的库对象时的提示（``{names}``：那些对象的全名）
LIBRARY_CALL_HINT = ("你的函数用到了库里的 {names}——这道题要你自己写出它做的事（那个库函数就是答案），"
                     "不论直接调用还是拐个弯（经由别的库函数、getattr）用到它都不算。自己重写一遍，再运行本单元")


def _exception_hint(name: str, text: str, where: str = "") -> str:
    """读者的函数（``where``：在哪个进程里）抛出了 ``name: text`` 时的提示。"""
    hint = f"你的函数{where}抛出了 {name}：{text}"
    if name == "RuntimeError" and "view" in text and "contiguous" in text:
        hint += "。transpose 之后的张量在内存里不连续：先 .contiguous() 再 .view，或者直接用 .reshape"
    return hint


def _guard(fn: Callable[..., Any], watch: Sequence[Any] = (), record: list[str] | None = None) -> Callable[..., Any]:
    """包装读者的函数：桩 → _Pending；返回 None → Mistake("returned_none")；抛出的异常带上“读者的”标记。
    ``watch`` 非空时，每次调用期间把执行到的禁用对象记进 ``record``（:func:`~tformer_lib.exercises._sandbox.watch_calls`）；
    :func:`run_in_workers` 从 ``wrapped._tformer_reader`` 取回这三样，在子进程里照样包装。"""

    def wrapped(*args: Any, **kwargs: Any) -> Any:
        with student_code(), (watch_calls(watch, record) if watch else contextlib.nullcontext()):
            out = fn(*args, **kwargs)
        if out is None:
            raise Mistake(_NONE_HINT, key="returned_none")
        return out

    wrapped.__name__ = getattr(fn, "__name__", "fn")
    wrapped.__wrapped__ = fn  # 检查器要读读者的代码时用它（inspect.unwrap）
    wrapped._tformer_reader = (fn, tuple(watch), record if record is not None else [])
    return wrapped


@contextlib.contextmanager
def _isolated_rng(seed: int = 0) -> Iterator[None]:
    """检查期间固定 torch 的种子；结束后把 torch、``random``、NumPy 的全局随机状态原样恢复。"""
    py_state = random.getstate()
    try:
        import numpy as np

        np_state = np.random.get_state()
    except ImportError:  # pragma: no cover
        np, np_state = None, None
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        try:
            yield
        finally:
            random.setstate(py_state)
            if np is not None:
                np.random.set_state(np_state)


def code_objects(code: types.CodeType) -> Iterator[types.CodeType]:
    """``code`` 以及嵌在里面的所有代码对象（内部函数、lambda、推导式）。"""
    yield code
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            yield from code_objects(const)


def library_calls(fn: Callable[..., Any], forbidden: Sequence[Any]) -> list[str]:
    """读者的函数（及它调用的、读者自己在同一笔记本里写的函数、类与对象）直接用到了 ``forbidden`` 里的哪些库对象。

    静态地看函数的代码：它用到的每个名字，若在读者的全局变量里就是一个禁用对象（``from tformer_lib import
    causal_mask`` 之后调用 ``causal_mask``），或者与禁用对象同名、又不是读者自己定义的东西（``tformer_lib.causal_mask``、
    函数体里的 ``from … import``），就算“直接调用了库”。默认参数（``_w=moe.within_capacity``）与闭包里的值也看；
    用禁用函数的 ``__code__`` 造出的副本（``types.FunctionType(f.__code__, …)``，或那个代码对象本身）也算。
    交上来的是可调用对象或类时，看它的类里定义的方法（``__call__`` 等）和它自己的属性。
    返回这些对象的全名（``模块.名字``），没有就是空列表。运行时的记录见 ``run_checks(..., trace_forbidden=True)``。
    """
    targets = {id(obj): obj for obj in forbidden}
    names = {getattr(obj, "__name__", None): obj for obj in forbidden}
    codes = banned_codes(forbidden)  # 禁用对象背后每个 Python 函数的代码对象 → 全名
    found: dict[str, None] = {}
    seen: set[int] = set()
    stack: list[Any] = []

    def banned(obj: Any) -> str | None:
        if id(obj) in targets:
            return _full_name(obj)
        code = obj if isinstance(obj, types.CodeType) else obj.__code__ if isinstance(obj, types.FunctionType) else None
        if code is not None and code in codes:
            return codes[code]
        return None

    def visit(obj: Any, env: dict | None) -> None:
        """``obj`` 是禁用对象（或它的副本）→ 记下；是读者自己写的函数、类、对象 → 放进 ``stack`` 往里看。"""
        label = banned(obj)
        if label is not None:
            found[label] = None
            return
        if isinstance(obj, (types.FunctionType, types.MethodType, functools.partial)):
            inner = inspect.unwrap(getattr(obj, "__func__", getattr(obj, "func", obj)))
            if env is None or getattr(inner, "__globals__", None) is env:
                stack.append(inner)
                if inner is not obj:
                    visit(inner, env)
            return
        module = env.get("__name__") if env is not None else None
        if isinstance(obj, type):
            if env is None or obj.__module__ == module:
                stack.extend(python_functions(obj))
        elif (env is None and callable(obj)) or (module is not None and type(obj).__module__ == module):
            stack.extend(python_functions(type(obj)))  # 读者的类的对象：它的 __call__ 等方法
            attrs = getattr(obj, "__dict__", None)
            for value in (attrs.values() if isinstance(attrs, dict) else ()):
                label = banned(value)
                if label is not None:
                    found[label] = None

    if callable(fn):
        visit(fn, None)  # 交上来的本身就是禁用对象（或 functools.wraps / functools.partial 包着它）：也算直接用了库
    while stack:
        f = stack.pop()
        code, env = getattr(f, "__code__", None), getattr(f, "__globals__", {})
        if code is None or id(code) in seen:
            continue
        seen.add(id(code))
        label = banned(f)
        if label is not None:
            found[label] = None
        closure = {n: c.cell_contents for n, c in zip(code.co_freevars, getattr(f, "__closure__", None) or ())
                   if _cell_filled(c)}
        for value in (*closure.values(), *(getattr(f, "__defaults__", None) or ()),
                      *(getattr(f, "__kwdefaults__", None) or {}).values()):
            if not isinstance(value, types.ModuleType):
                visit(value, env)
        for c in code_objects(code):
            if c in codes:
                found[codes[c]] = None
            for name in c.co_names + c.co_freevars:
                obj = closure.get(name, env.get(name, None))
                if id(obj) in targets:
                    found[_full_name(obj)] = None
                elif name in names and (obj is None or isinstance(obj, types.ModuleType)):
                    found[_full_name(names[name])] = None
                elif obj is not None and not isinstance(obj, types.ModuleType):
                    visit(obj, env)  # 副本、读者自己写的辅助函数、类和对象：也看进去
    return list(found)


def _cell_filled(cell) -> bool:
    try:
        cell.cell_contents
    except ValueError:
        return False
    return True


def _full_name(obj: Any) -> str:
    return f"{getattr(obj, '__module__', '?')}.{getattr(obj, '__qualname__', getattr(obj, '__name__', repr(obj)))}"


def _failed(title: str, desc: str, hint: str, key: str, done: list[str]) -> CheckResult:
    return CheckResult(title, FAILED, f"❌ 未通过：{title}（检查“{desc}”）\n   提示：{hint}", hint, key, list(done))


def run_checks(
    title: str,
    fn: Callable[..., Any],
    checks: Sequence[tuple[str, Callable[[Callable[..., Any]], None]]],
    *,
    verbose: bool = True,
    forbidden: Sequence[Any] = (),
    trace_forbidden: bool = False,
) -> CheckResult:
    """依次运行 ``checks``（每项是 ``(说明, 检查函数)``，检查函数接收被包装过的读者函数），打印并返回结论。

    - 读者函数抛 ``NotImplementedError`` → “⏳ 尚未完成”（pending），不抛异常；
    - 读者函数返回 ``None`` → “❌ 函数返回了 None”（``mistake == "returned_none"``）；
    - 检查函数抛 :class:`Mistake` → “❌” + 它的提示；抛 ``AssertionError`` → “❌” + 断言信息；
    - 读者函数自己抛出其他异常 → “❌” + 异常类型与信息（不打印回溯，输出保持稳定）；
    - 检查器自己的代码出错 → “⚠️ 检查器出错”（``status == "error"``），提示里说明这不一定是读者的错。

    - ``forbidden``：本题要读者自己写出来的库函数或类（例如找错题的正确版本就是库里的某个函数）；
      读者的函数全部检查都通过、但直接调用了其中之一（:func:`library_calls`）→ “❌”（``mistake == "library_call"``，
      提示 :data:`LIBRARY_CALL_HINT`）。桩仍然是 ⏳，写错的仍按写错报告。
    - ``trace_forbidden=True``：除了静态地看代码，还在读者的函数每次运行期间（子进程里也是，见 :func:`run_in_workers`）
      记下它实际执行到的禁用对象（:func:`~tformer_lib.exercises._sandbox.watch_calls`：不论经由别名、``getattr``、
      默认参数、可调用对象、禁用函数的代码对象副本还是另一个库函数）。只记不拦，结论同上：全部通过而用到了 → ❌
      ``library_call``。它认的是代码对象：把库的源码抄过来重新编译（``exec``）得到的是新的代码，认不出——那已是
      读者自己的一份实现，这道题拦不住也不该靠它拦。

    任何情况下都不抛异常（``fn`` 不是函数时也只打印 ❌）。
    """
    if forbidden is None or isinstance(forbidden, str) or not all(callable(x) for x in forbidden):
        raise TypeError(f"forbidden 应是库函数或类组成的序列（检查器作者的参数），收到 {forbidden!r}")
    done: list[str] = []
    result: CheckResult | None = None
    if not callable(fn):
        hint = f"要检查的应是一个函数，收到的是 {type(fn).__name__}：把函数名本身传进来（不要加括号调用它）"
        result = CheckResult(title, FAILED, f"❌ 未通过：{title}\n   提示：{hint}", hint, "not_callable")
    traced: list[str] = []  # trace_forbidden：读者的函数运行时实际执行到的禁用对象
    guarded = _guard(fn, forbidden if trace_forbidden else (), traced) if callable(fn) else fn
    for desc, check in checks if result is None else ():
        try:
            with _isolated_rng():
                check(guarded)
        except _Pending:
            result = CheckResult(title, PENDING, f"⏳ 尚未完成：{title}——把函数里的 raise NotImplementedError 换成你的实现，再运行本单元。")
        except Mistake as exc:
            result = _failed(title, desc, exc.hint, exc.key or "values", done)
        except AssertionError as exc:
            result = _failed(title, desc, str(exc) or "结果与参考答案不一致", "assertion", done)
        except (Exception, SystemExit) as exc:  # 任何错误都转成结论，不让笔记本中断
            text = str(exc).strip().rstrip("。. ")
            if raised_by_student(exc):
                result = _failed(title, desc, _exception_hint(type(exc).__name__, text), "exception", done)
            else:
                hint = (f"检查器在处理你的返回值时自己出错了（{type(exc).__name__}：{text}）。"
                        "先对照题目确认返回值的类型和形状；如果都没问题，这是检查器的毛病，不是你的")
                result = CheckResult(title, ERROR, f"⚠️ 检查器出错：{title}（检查“{desc}”）\n   提示：{hint}",
                                     hint, "checker_error", list(done))
        if result is not None:
            break
        done.append(desc)
    # 全部通过、却用到了禁用的库对象（代码里看得到的，或运行时执行到的）→ ❌ library_call；写错的仍按写错报告
    if result is None and forbidden:
        used = list(dict.fromkeys(library_calls(fn, forbidden) + traced))
        if used:
            hint = LIBRARY_CALL_HINT.format(names="、".join(f"`{u}`" for u in used))
            result = _failed(title, "没有用到本题禁用的库实现", hint, "library_call", done)
    if result is None:
        # 每项检查的说明写着它试了哪些情形、多少组（“8 个随机向量……”），通过时照列出来，不只说“1 项检查”
        result = CheckResult(title, PASSED, f"✅ 通过：{title}——{'；'.join(done)}", checks_passed=done)
    if verbose:
        print(result.message)
    return result


# ---------------------------------------------------------------- 在子进程里运行读者的函数

#: 对方进程已经退出时集合通信报的错（gloo 的措辞）：是别的进程出错的结果，不是这个进程的错
_COMM_FAILURE_MARKS = ("Connection closed", "Connection reset", "gloo")


def _reader_worker(rank: int, world_size: int, shipped: tuple, watch: tuple, body: Callable[..., Any],
                   args: tuple) -> dict:
    """子进程里：还原读者的函数，按 :func:`_guard` 包装（禁用对象的记录也照装），跑 ``body``；把结局报回父进程。"""
    traced: list[str] = []
    try:
        fn = unship(shipped)
    except Exception as exc:  # noqa: BLE001 — 送不过去是检查器的问题
        return {"status": "ship_error", "text": f"{type(exc).__name__}: {exc}", "traced": traced}
    try:
        return {"status": PASSED, "value": body(rank, world_size, _guard(fn, watch, traced), *args), "traced": traced}
    except _Pending:
        return {"status": PENDING, "traced": traced}
    except Mistake as exc:  # 返回了 None，或 body 自己认出的错
        return {"status": FAILED, "hint": exc.hint, "key": exc.key, "traced": traced}
    except (Exception, SystemExit) as exc:
        if not raised_by_student(exc):
            raise  # 检查器自己的错：launch 报回父进程
        return {"status": "exception", "type": type(exc).__name__, "text": str(exc).strip().rstrip("。. "),
                "traced": traced}


def _comm_failure(report: dict) -> bool:
    text = report.get("text", "") if report["status"] == "exception" else ""
    return any(mark.lower() in text.lower() for mark in _COMM_FAILURE_MARKS)


def run_in_workers(f: Callable[..., Any], body: Callable[..., Any], world_size: int, args: tuple = (), *,
                   probe: tuple | None = None, timeout: float = 90.0) -> list[Any]:
    """在 ``world_size`` 个进程（gloo，:func:`~tformer_lib.parallel.launch.launch`）里运行读者的函数，按 rank 返回
    每个进程里 ``body(rank, world_size, call, *args)`` 的返回值。结论的走向与本进程里调用 ``f`` 完全一样。

    - ``f``：检查函数收到的（:func:`run_checks` 包装过的）读者函数；原函数经
      :func:`~tformer_lib.exercises._sandbox.ship` 送进子进程，在那里照 :func:`_guard` 包装成 ``call``；
    - ``body``：顶层函数（``spawn`` 要能按名字导入它；在 ``.py`` 脚本里调用本函数时，调用要放在
      ``if __name__ == "__main__":`` 之下，否则子进程会重新执行整个脚本），在每个进程里准备输入、用 ``call(...)`` 调用读者的函数，
      返回要交回父进程比较的东西（经 ``torch.save``，可以含张量）；
    - ``probe``：给了就先在本进程里试调一次 ``f(*probe)``：桩 → ⏳、忘了 return → ❌，都不必起进程（读者的函数
      在本进程里因为没有进程组先抛了异常时，这两种结论要等子进程给出）；
      读者的函数因为本进程没有进程组而抛的异常是预料之中的，忽略。

    任一进程里读者的函数是桩 → ⏳；返回 None → ❌ ``returned_none``；抛出异常 → ❌ ``exception``（点名 rank；
    一个进程出错后别的进程的集合通信会报“Connection closed”，先报真正出错的那个，只有这种通信错误 → ❌
    ``collective_mismatch``）；没在 ``timeout`` 秒内全部完成 → ❌ ``timeout``。``run_checks(..., trace_forbidden=True)``
    时子进程里执行到的禁用对象也记下、带回父进程，由 ``run_checks`` 一起判 ❌ ``library_call``。
    """
    from tformer_lib.parallel.launch import DistributedError, launch

    if probe is not None:
        try:
            f(*probe)
        except Exception as exc:
            if not (raised_by_student(exc) and ("process group" in str(exc) or "init_process_group" in str(exc))):
                raise
    fn, watch, record = getattr(f, "_tformer_reader", (f, (), []))
    try:
        reports = launch(_reader_worker, world_size, (ship(fn), watch, body, tuple(args)), timeout=timeout)
    except DistributedError as exc:
        if "timeout" in str(exc):
            raise Mistake(f"{world_size} 个进程没有在 {timeout:g} 秒内全部完成：是不是只有部分进程调用了集合通信"
                          "（如 all_reduce），或者各进程调用的次数、张量形状不一样？集合通信要每个进程都参加",
                          key="timeout") from None
        raise RuntimeError(f"子进程出错：{str(exc).splitlines()[0]}") from None
    for report in reports:
        record.extend(name for name in report["traced"] if name not in record)
    comm_failures = []
    for rank in sorted(range(world_size), key=lambda r: _comm_failure(reports[r])):  # 先报真正的错
        report = reports[rank]
        if report["status"] == "ship_error":
            raise RuntimeError(f"没能把你的函数送进子进程（{report['text']}）")
        if report["status"] == PENDING:
            raise _Pending()
        if report["status"] == FAILED:
            raise Mistake(report["hint"], key=report["key"])
        if report["status"] == "exception":
            if not _comm_failure(report):
                raise Mistake(_exception_hint(report["type"], report["text"], f"在 rank {rank} 上"), key="exception")
            comm_failures.append(rank)
    if comm_failures:
        raise Mistake(f"rank {comm_failures[0]} 上的集合通信失败了：别的进程已经结束、不再参加。是不是只有部分进程调用了"
                      "集合通信（如 all_reduce），或者各进程调用的次数不一样？集合通信要每个进程都参加、顺序相同",
                      key="collective_mismatch")
    return [report["value"] for report in reports]


# ---------------------------------------------------------------- 随机情形


def _new_generator(seed: int) -> torch.Generator:
    g = torch.Generator()
    g.manual_seed(seed)
    return g


def generator(seed: int = 0) -> torch.Generator:
    """检查器专用的随机数生成器：不动全局随机状态，笔记本后面的随机结果不受检查器影响。"""
    return _new_generator(seed)


def random_cases(n: int = 6, *, seed: int = 0) -> list[torch.Generator]:
    """``n`` 个互相独立、可复现的生成器，每个对应一组随机情形：``for g in random_cases(5): ...``。"""
    if n < 1:
        raise ValueError(f"n={n} 应至少为 1")
    return [_new_generator(1_000_003 * seed + k) for k in range(n)]


def draw_int(g: torch.Generator, low: int, high: int) -> int:
    """从 ``[low, high]``（两端都含）里均匀抽一个整数。"""
    if high < low:
        raise ValueError(f"high={high} 小于 low={low}")
    return int(torch.randint(low, high + 1, (1,), generator=g).item())


def draw_choice(g: torch.Generator, options: Sequence[Any]) -> Any:
    """从 ``options`` 里均匀抽一个。"""
    if len(options) == 0:
        raise ValueError("options 不能为空")
    return options[draw_int(g, 0, len(options) - 1)]


def randn(*shape: int, seed: int = 0, generator: torch.Generator | None = None) -> torch.Tensor:
    """标准正态张量（float32）：给 ``generator`` 就用它，否则用种子 ``seed`` 的新生成器（都不动全局随机状态）。"""
    g = generator if generator is not None else _new_generator(seed)
    return torch.randn(*shape, generator=g)


class TorchCalls(TorchFunctionMode):
    """在 ``with TorchCalls() as calls:`` 里记下调用过的 torch 函数与张量方法：``calls.names`` 是名字，
    ``calls.dtypes`` 是每次调用返回的张量的 dtype 集合（与 ``names`` 一一对应）。

    预测题用：答案要从公式推出来，读者的函数若真的在 float16 里算一遍、或调用 LayerNorm 去比，
    就是在测量而不是预测——检查器据此给出 ❌。把答案包成一个张量返回不算（看返回的 dtype 与函数名来区分）。
    """

    def __init__(self):
        super().__init__()
        self.names: list[str] = []
        self.dtypes: list[set[torch.dtype]] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        self.names.append(getattr(func, "__name__", str(func)))
        self.dtypes.append({t.dtype for t in (out if isinstance(out, (tuple, list)) else (out,))
                            if isinstance(t, torch.Tensor)})
        return out

    def producing(self, dtype: torch.dtype) -> list[str]:
        """返回 ``dtype`` 张量的那些调用的名字（去重，按先后）。"""
        return list(dict.fromkeys(n for n, d in zip(self.names, self.dtypes) if dtype in d))


def is_close_number(a: float, b: float, tol: float = 1e-6) -> bool:
    """两个标量是否近似相等。"""
    return math.isclose(float(a), float(b), rel_tol=tol, abs_tol=tol)


# 读取与比较读者返回值的工具在 _compare.py；从这里也能导入，章节检查器只需 ``from ._core import ...``。
from tformer_lib.exercises._compare import (  # noqa: E402
    as_bool,
    as_int,
    as_number,
    as_tensor,
    compare,
    compare_number,
    expect_dtype,
    expect_shape,
)

__all__ = [
    "CheckResult", "Mistake", "Variant", "run_checks", "run_in_workers", "student_code", "raised_by_student",
    "LIBRARY_CALL_HINT",
    "as_bool", "as_int", "as_number", "as_tensor", "code_objects", "compare", "compare_number", "expect_dtype", "expect_shape",
    "generator", "random_cases", "draw_int", "draw_choice", "randn", "is_close_number", "TorchCalls",
    "PENDING", "PASSED", "FAILED", "ERROR",
]
