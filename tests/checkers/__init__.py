"""每章检查器的测试用例（case files）：``tests/checkers/chNN.py`` 各定义一个 ``CASES`` 列表，
由 ``tests/test_checkers_shared.py`` 统一收集、参数化运行。契约见那个文件的文档字符串。

在 chNN.py 里这样写::

    from checkers import Case, Wrong
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Case", "Wrong", "RETURNS"]

RETURNS = ("other", "number", "int", "bool")


@dataclass(frozen=True)
class Wrong:
    """一个已知错误的答案：``fn`` 必须被检查器判为 ❌（``status == "failed"``）。

    ``key`` 给出时，``CheckResult.mistake`` 必须等于它（检查器认出了这个错误）；``None`` 表示只要求不通过。
    ``name`` 是测试 id；每个 :class:`Case` 至少要有一个 ``name == "hard_coded"`` 的错误答案：
    一个只会返回本章例子答案（写死）的函数。
    """

    name: str
    fn: Callable[..., Any]
    key: str | None = None


@dataclass(frozen=True)
class Case:
    """一个检查器的测试用例。

    - ``checker``：``check_x``，``checker(fn)`` 打印结论并返回 ``CheckResult``；
    - ``reference``：参考答案（与 solutions 笔记本里的一致），必须 ✅；
    - ``wrong``：已知错误答案（:class:`Wrong`），每个都必须 ❌，其中必须有 ``"hard_coded"``；
    - ``also_correct``：其他正确写法（必须 ✅），例如另一种等价实现；
    - ``returns``：读者函数返回什么。``"number"``/``"int"``/``"bool"`` 时共享测试会自动把参考答案的返回值
      换成 NumPy 标量、0 维张量等类型（都必须 ✅），换成字符串（必须 ❌，``mistake == "string"``）；
      ``"other"``（张量、列表、元组……）时不做这项；
    - ``name``：测试 id（默认用检查器的函数名）。
    """

    checker: Callable[..., Any]
    reference: Callable[..., Any]
    wrong: Sequence[Wrong]
    also_correct: Sequence[Callable[..., Any]] = field(default_factory=tuple)
    returns: str = "other"
    name: str | None = None

    def __post_init__(self) -> None:
        if self.returns not in RETURNS:
            raise ValueError(f"returns={self.returns!r} 应是 {RETURNS} 之一")

    @property
    def id(self) -> str:
        return self.name or getattr(self.checker, "__name__", "checker")
