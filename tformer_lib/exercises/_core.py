"""练习检查器（exercise checker）的小框架。

读者在笔记本里写一个函数，检查器用几组性质测试（property test）去调用它，然后打印一行中文结论：

- 函数还是桩（stub）——抛出 ``NotImplementedError`` 或返回 ``None``：打印 “⏳ 尚未完成……”，**不抛异常**，
  这样提交的笔记本能在 CI 里从头跑到尾；
- 全部通过：打印 “✅ 通过……”；
- 未通过：打印 “❌ ……” 和一句点名错误的提示（hint），例如“忘了除以 √d_k”。

检查器返回 :class:`CheckResult`（``.passed`` 为 True/False），结果已经打印过，所以在笔记本里
它作为单元格最后一个表达式时不会再显示一遍。

章节作者写自己的检查器（放在 ``tformer_lib/exercises/chNN.py``）只需要三样东西::

    from tformer_lib.exercises._core import Mistake, Variant, compare, run_checks

    def check_relu(fn):
        def values(f):
            x = torch.tensor([-2.0, 0.0, 3.0])
            compare(f(x), torch.relu(x), variants=[Variant("abs", "用了绝对值而不是把负数截成 0", x.abs())])
        return run_checks("ReLU", fn, [("数值与 torch.relu 一致", values)])

``compare`` 把读者的输出与参考答案比较；不一致时，若恰好等于某个“已知错误写法”（:class:`Variant`）的输出，
就用那个错误的提示，否则给通用提示。检查函数里也可以直接 ``raise Mistake("提示", key="...")``。
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

PENDING, PASSED, FAILED = "pending", "passed", "failed"


class Mistake(Exception):
    """检查函数发现了错误：``hint`` 是给读者的中文提示，``key`` 是机器可读的错误名（测试用）。"""

    def __init__(self, hint: str, key: str | None = None):
        super().__init__(hint)
        self.hint = hint
        self.key = key


class _Pending(Exception):
    """读者的函数仍是桩（抛 NotImplementedError 或返回 None）。"""


@dataclass(frozen=True)
class Variant:
    """一个“已知错误写法”：名字 ``key``、提示 ``hint``，以及这种写法在同一输入上会得到的输出 ``value``。"""

    key: str
    hint: str
    value: Any


@dataclass
class CheckResult:
    """一次检查的结果。``status`` 为 ``"pending"``、``"passed"`` 或 ``"failed"``。"""

    title: str
    status: str
    message: str
    hint: str | None = None
    mistake: str | None = None
    checks_passed: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        """全部检查通过时为 True（桩与未通过都是 False）。"""
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


def _guard(fn: Callable[..., Any]) -> Callable[..., Any]:
    """包装读者的函数：桩 → _Pending。"""

    def wrapped(*args: Any, **kwargs: Any) -> Any:
        try:
            out = fn(*args, **kwargs)
        except NotImplementedError as exc:
            raise _Pending() from exc
        if out is None:
            raise _Pending()
        return out

    wrapped.__name__ = getattr(fn, "__name__", "fn")
    return wrapped


def run_checks(
    title: str,
    fn: Callable[..., Any],
    checks: Sequence[tuple[str, Callable[[Callable[..., Any]], None]]],
    *,
    verbose: bool = True,
) -> CheckResult:
    """依次运行 ``checks``（每项是 ``(说明, 检查函数)``，检查函数接收被包装过的读者函数），打印并返回结论。

    - 读者函数抛 ``NotImplementedError`` 或返回 ``None`` → “⏳ 尚未完成”（pending），不抛异常；
    - 检查函数抛 :class:`Mistake` → “❌” + 它的提示；抛 ``AssertionError`` → “❌” + 断言信息；
    - 读者函数自己抛出其他异常 → “❌” + 异常类型与信息（不打印回溯，输出保持稳定）。
    """
    if not callable(fn):
        raise TypeError(f"要检查的应是一个函数，收到 {type(fn).__name__}")
    guarded = _guard(fn)
    done: list[str] = []
    result: CheckResult | None = None
    for desc, check in checks:
        try:
            check(guarded)
        except _Pending:
            result = CheckResult(title, PENDING, f"⏳ 尚未完成：{title}——把函数里的 raise NotImplementedError 换成你的实现，再运行本单元。")
        except Mistake as exc:
            result = CheckResult(title, FAILED, f"❌ 未通过：{title}（检查“{desc}”）\n   提示：{exc.hint}", exc.hint, exc.key, done)
        except AssertionError as exc:
            hint = str(exc) or "结果与参考答案不一致"
            result = CheckResult(title, FAILED, f"❌ 未通过：{title}（检查“{desc}”）\n   提示：{hint}", hint, "assertion", done)
        except Exception as exc:  # 读者代码里的任何错误都转成结论，不让笔记本中断
            hint = f"你的函数抛出了 {type(exc).__name__}：{str(exc).rstrip('. ')}"
            if isinstance(exc, RuntimeError) and "view" in str(exc) and "contiguous" in str(exc):
                hint += "。transpose 之后的张量在内存里不连续：先 .contiguous() 再 .view，或者直接用 .reshape"
            result = CheckResult(title, FAILED, f"❌ 未通过：{title}（检查“{desc}”）\n   提示：{hint}", hint, "exception", done)
        if result is not None:
            break
        done.append(desc)
    if result is None:
        result = CheckResult(title, PASSED, f"✅ 通过：{title}（{len(done)} 项检查全部通过）", checks_passed=done)
    if verbose:
        print(result.message)
    return result


# ---------------------------------------------------------------- 比较工具


def as_tensor(x: Any, what: str = "结果") -> torch.Tensor:
    """把读者的返回值转成 float64 张量；不是张量/数组时抛 :class:`Mistake`。"""
    if isinstance(x, torch.Tensor):
        return x.detach().to(torch.float64) if x.dtype != torch.bool else x.detach()
    try:
        import numpy as np

        if isinstance(x, np.ndarray):
            return torch.from_numpy(x).to(torch.float64) if x.dtype != bool else torch.from_numpy(x)
    except ImportError:  # pragma: no cover
        pass
    raise Mistake(f"{what}应是 torch 张量（Tensor），你返回的是 {type(x).__name__}", key="type")


def _close(a: torch.Tensor, b: torch.Tensor, atol: float, rtol: float) -> bool:
    if a.shape != b.shape:
        return False
    if a.dtype == torch.bool or b.dtype == torch.bool:
        return bool((a.bool() == b.bool()).all()) if a.dtype == b.dtype else False
    a, b = a.to(torch.float64), b.to(torch.float64)
    both_nan = torch.isnan(a) & torch.isnan(b)
    ok = torch.isclose(a, b, atol=atol, rtol=rtol) | both_nan
    return bool(ok.all())


def compare(
    actual: Any,
    expected: Any,
    *,
    variants: Sequence[Variant] = (),
    what: str = "结果",
    atol: float = 1e-5,
    rtol: float = 1e-4,
    default_hint: str | None = None,
) -> None:
    """比较读者的输出与参考答案；不一致时抛出点名错误的 :class:`Mistake`。

    顺序：类型 → 与参考一致则返回 → 与某个已知错误写法（``variants``）一致则用它的提示 →
    出现 NaN/inf → 形状不同 → 通用提示 ``default_hint``。
    """
    got = as_tensor(actual, what)
    ref = as_tensor(expected, "参考答案")
    if _close(got, ref, atol, rtol):
        return
    for v in variants:
        if _close(got, as_tensor(v.value, v.key), atol, rtol):
            raise Mistake(v.hint, key=v.key)
    if got.dtype != torch.bool and not bool(torch.isfinite(got).all()):
        raise Mistake(f"{what}里出现了 NaN 或 inf", key="nonfinite")
    if got.shape != ref.shape:
        raise Mistake(f"{what}的形状应为 {tuple(ref.shape)}，你的是 {tuple(got.shape)}", key="shape")
    if got.dtype == torch.bool:
        bad = (got != ref).nonzero()[:3].tolist()
        raise Mistake(default_hint or f"{what}有 {int((got != ref).sum())} 个位置不对，例如下标 {bad}", key="values")
    err = float((got - ref).abs().max())
    raise Mistake(default_hint or f"{what}的数值不对（与参考答案最大相差 {err:.3g}）", key="values")


def expect_shape(actual: Any, shape: Sequence[int], what: str = "结果", hint: str | None = None) -> None:
    """检查形状，不符时抛 :class:`Mistake`（key="shape"）。"""
    got = as_tensor(actual, what)
    if tuple(got.shape) != tuple(shape):
        raise Mistake(hint or f"{what}的形状应为 {tuple(shape)}，你的是 {tuple(got.shape)}", key="shape")


def expect_dtype(actual: Any, dtype: torch.dtype, what: str = "结果", hint: str | None = None) -> None:
    """检查 dtype（例如掩码必须是 ``torch.bool``）。"""
    if not isinstance(actual, torch.Tensor):
        raise Mistake(f"{what}应是 torch 张量（Tensor），你返回的是 {type(actual).__name__}", key="type")
    if actual.dtype != dtype:
        raise Mistake(hint or f"{what}的 dtype 应为 {dtype}，你的是 {actual.dtype}", key="dtype")


def generator(seed: int = 0) -> torch.Generator:
    """检查器专用的随机数生成器：不动全局随机状态，笔记本后面的随机结果不受检查器影响。"""
    g = torch.Generator()
    g.manual_seed(seed)
    return g


def randn(*shape: int, seed: int = 0) -> torch.Tensor:
    """用 :func:`generator` 生成的标准正态张量（float32）。"""
    return torch.randn(*shape, generator=generator(seed))


def is_close_number(a: float, b: float, tol: float = 1e-6) -> bool:
    """两个标量是否近似相等。"""
    return math.isclose(float(a), float(b), rel_tol=tol, abs_tol=tol)
