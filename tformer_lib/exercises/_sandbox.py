"""检查器的几个机关：

- :func:`watch_calls`：在读者的函数运行期间**记下**它（经任何途径）执行到了哪些禁用的库函数——不拦、不改结果，
  ``run_checks(..., trace_forbidden=True)`` 据此判 ❌ ``library_call``；子进程里也一样装上
  （:func:`~tformer_lib.exercises._core.run_in_workers`），记下的名字交回父进程一起判；
- :func:`ship` / :func:`unship`：把读者的函数送进 ``spawn`` 出的子进程。笔记本里定义的函数属于 ``__main__``，
  子进程里按名字导入不到，所以送它的字节码（``marshal``，父子进程是同一个 Python）、默认值、闭包，以及它用到的
  全局名字（模块按名字、函数递归地送、其余能 pickle 的按值）。
"""

from __future__ import annotations

import builtins
import contextlib
import functools
import marshal
import pickle
import sys
import types
from collections.abc import Iterable, Iterator
from typing import Any

def _label(obj: Any) -> str:
    return f"{getattr(obj, '__module__', '?')}.{getattr(obj, '__qualname__', getattr(obj, '__name__', repr(obj)))}"


def python_functions(obj: Any) -> Iterator[types.FunctionType]:
    """``obj`` 背后的 Python 函数：函数本身与 ``functools.wraps`` 包着的各层；绑定方法的函数；``functools.partial`` 的
    ``func``；类则是它自己（``vars(cls)``，不含继承来的）定义的每个方法（静态方法、类方法、property 也拆开）。
    内建函数、C 写的类没有 Python 代码，什么也不给。"""
    seen: set[int] = set()
    stack = [obj]
    while stack:
        item = stack.pop()
        if id(item) in seen:
            continue
        seen.add(id(item))
        if isinstance(item, types.FunctionType):
            yield item
            if getattr(item, "__wrapped__", None) is not None:
                stack.append(item.__wrapped__)
        elif isinstance(item, types.MethodType):
            stack.append(item.__func__)
        elif isinstance(item, (staticmethod, classmethod)):
            stack.append(item.__func__)
        elif isinstance(item, property):
            stack.extend(f for f in (item.fget, item.fset, item.fdel) if f is not None)
        elif isinstance(item, type):
            stack.extend(vars(item).values())
        elif isinstance(item, functools.partial):
            stack.append(item.func)


def banned_codes(functions: Iterable[Any]) -> dict[types.CodeType, str]:
    """``{代码对象: 禁用对象的全名}``：``functions`` 里每个禁用对象（函数或类）背后所有 Python 函数的 ``__code__``。"""
    codes: dict[types.CodeType, str] = {}
    for obj in functions:
        for f in python_functions(obj):
            codes.setdefault(f.__code__, _label(obj))
    return codes


@contextlib.contextmanager
def watch_calls(functions: Iterable[Any], record: list[str]) -> Iterator[None]:
    """在这段代码里，凡是执行到 ``functions`` 里某个禁用对象的代码（它本身、它的类的方法），就把那个对象的全名记进
    ``record``（每个名字记一次）。不拦截、不改变任何结果。

    用 ``sys.setprofile`` 看每一个进入的 Python 帧的代码对象，所以不论读者怎样拿到那个函数——别名、``getattr``、
    默认参数、闭包、``sys.modules``/``importlib``、可调用对象的 ``__call__``、用它的 ``__code__`` 造的副本、
    或者经由另一个库函数（``make_lm`` → ``rope_frequencies``）——都记得到。只看本线程。已经有别的 profile 函数
    （如 cProfile）时不装，免得弄坏它——那时只剩 :func:`~tformer_lib.exercises._core.library_calls` 的静态检查。
    """
    codes = banned_codes(functions)  # 持有这些代码对象，下面按 id 比较才可靠
    by_id = {id(code): label for code, label in codes.items()}
    if not by_id or sys.getprofile() is not None:
        yield
        return

    def hook(frame, event, arg):
        if event == "call":
            label = by_id.get(id(frame.f_code))
            if label is not None and label not in record:
                record.append(label)

    sys.setprofile(hook)
    try:
        yield
    finally:
        sys.setprofile(None)


def ship(obj: Any, depth: int = 0) -> tuple:
    """把 ``obj`` 变成能经 pickle 传给子进程的描述；子进程里用 :func:`unship` 还原。"""
    if isinstance(obj, types.ModuleType):
        return ("module", obj.__name__)
    if isinstance(obj, types.FunctionType):
        if obj.__module__ not in (None, "__main__") and "<" not in obj.__qualname__:
            try:
                if pickle.loads(pickle.dumps(obj)) is obj:
                    return ("pickle", pickle.dumps(obj))
            except Exception:  # noqa: BLE001 — 不能按名字 pickle 就送字节码
                pass
        if depth > 4:
            return ("missing",)
        code = obj.__code__
        names: set[str] = set()
        stack = [code]
        while stack:  # 嵌套的函数、推导式里用到的名字也要
            c = stack.pop()
            names.update(c.co_names)
            stack += [k for k in c.co_consts if isinstance(k, types.CodeType)]
        glob = {}
        for name in sorted(names):
            if name in obj.__globals__:
                value = obj.__globals__[name]
                glob[name] = ("self",) if value is obj else ship(value, depth + 1)
        closure = [ship(cell.cell_contents, depth + 1) for cell in obj.__closure__ or ()]
        defaults = [ship(v, depth + 1) for v in obj.__defaults__ or ()]
        kwdefaults = {k: ship(v, depth + 1) for k, v in (obj.__kwdefaults__ or {}).items()}
        return ("code", marshal.dumps(code), obj.__name__, glob, closure, defaults, kwdefaults)
    try:
        return ("pickle", pickle.dumps(obj))
    except Exception:  # noqa: BLE001 — 送不过去的值就不送（读者的函数用到它时会得到 NameError）
        return ("missing",)


_MISSING = object()


def unship(item: tuple) -> Any:
    """:func:`ship` 的逆：在（子）进程里重建模块、值或函数。"""
    kind = item[0]
    if kind == "module":
        import importlib

        return importlib.import_module(item[1])
    if kind == "pickle":
        return pickle.loads(item[1])
    if kind == "missing":
        return _MISSING
    _, code, name, glob, closure, defaults, kwdefaults = item
    ns: dict[str, Any] = {"__builtins__": builtins, "__name__": "__reader__"}
    selfs = []
    for k, v in glob.items():
        if v[0] == "self":
            selfs.append(k)
            continue
        value = unship(v)
        if value is not _MISSING:
            ns[k] = value
    cells = tuple(types.CellType(unship(c)) for c in closure)
    fn = types.FunctionType(marshal.loads(code), ns, name, tuple(unship(d) for d in defaults) or None, cells or None)
    fn.__kwdefaults__ = {k: unship(v) for k, v in kwdefaults.items()} or None
    for k in selfs:
        ns[k] = fn
    return fn
