"""读取与比较读者的返回值：一个数（:func:`as_number`、:func:`as_int`、:func:`as_bool`、:func:`compare_number`）
或一个张量（:func:`as_tensor`、:func:`compare`、:func:`expect_shape`、:func:`expect_dtype`）。

规则：正确的数无论以什么数值类型给出都接受（Python int/float、NumPy 标量、0 维/单元素张量），字符串一律
拒绝并提示“直接 return 数值本身”；不一致时若恰好等于某个已知错误写法（:class:`~._mistakes.Variant`）就用它的提示。
所有函数发现问题时抛 :class:`~._mistakes.Mistake`，由 :func:`~._core.run_checks` 转成 ❌ 结论。
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence
from typing import Any

import torch

from tformer_lib.exercises._mistakes import Mistake, Variant


def _describe(x: Any) -> str:
    text = repr(x)
    return text if len(text) <= 40 else text[:37] + "..."


def _string_mistake(x: str, what: str, kind: str = "一个数") -> Mistake:
    return Mistake(f"{what}应是{kind}，你返回的是字符串 {_describe(x)}：直接 return 数值本身，"
                   "不要用 str()、f-string 或加引号", key="string")


def _numpy():
    try:
        import numpy as np
    except ImportError:  # pragma: no cover
        return None
    return np


def _numpy_bool() -> type:
    np = _numpy()
    return np.bool_ if np is not None else bool


def as_number(value: Any, what: str = "结果") -> float:
    """把读者返回的一个数读成 ``float``。

    接受 Python int/float、NumPy 标量（``np.int64``、``np.float32``……）、0 维或单元素的张量/数组；
    拒绝字符串（key ``"string"``）、布尔值与其他类型（key ``"type"``），并给出提示。
    """
    np = _numpy()
    if isinstance(value, str):
        raise _string_mistake(value, what)
    if isinstance(value, torch.Tensor):
        if value.numel() != 1:
            raise Mistake(f"{what}应是一个数，你返回的是形状 {tuple(value.shape)} 的张量", key="type")
        if value.dtype == torch.bool or value.is_complex():
            raise Mistake(f"{what}应是一个实数，你返回的是 dtype 为 {value.dtype} 的张量", key="type")
        value = value.item()
    elif np is not None and isinstance(value, np.ndarray):
        if value.size != 1:
            raise Mistake(f"{what}应是一个数，你返回的是形状 {tuple(value.shape)} 的数组", key="type")
        if value.dtype.kind not in "iuf":
            raise Mistake(f"{what}应是一个实数，你返回的是 dtype 为 {value.dtype} 的数组", key="type")
        value = value.item()
    if np is not None and isinstance(value, np.generic):
        if isinstance(value, np.bool_):
            raise Mistake(f"{what}应是一个数，你返回的是布尔值 {value!r}", key="type")
        if isinstance(value, (np.integer, np.floating)):
            return float(value)
    if isinstance(value, bool):
        raise Mistake(f"{what}应是一个数，你返回的是布尔值 {value!r}", key="type")
    if isinstance(value, numbers.Real):  # int、float，也包括 fractions.Fraction 这类标准库的实数
        try:
            return float(value)
        except OverflowError:  # 比 float 能表示的还大的整数（如 10**400）：当作 ±inf，与答案比较时照常判错
            return math.inf if value > 0 else -math.inf
    if isinstance(value, (list, tuple)):
        raise Mistake(f"{what}应是一个数，你返回的是 {type(value).__name__} {_describe(value)}", key="type")
    raise Mistake(f"{what}应是一个数，你返回的是 {type(value).__name__}", key="type")


def as_int(value: Any, what: str = "结果") -> int:
    """把读者返回的整数读成 ``int``：接受 :func:`as_number` 接受的一切，只要值是整数（``12.0`` 也行）。"""
    if isinstance(value, numbers.Integral) and not isinstance(value, (bool, _numpy_bool())):
        return int(value)  # 大整数不经过 float，免得丢精度或溢出
    x = as_number(value, what)
    if not math.isfinite(x) or x != math.floor(x):
        raise Mistake(f"{what}应是整数，你返回的是 {x!r}", key="not_integer")
    if isinstance(value, numbers.Integral) and not isinstance(value, bool):
        return int(value)  # 大整数不经过 float，免得丢精度
    np = _numpy()
    if np is not None and isinstance(value, np.integer):
        return int(value)
    if isinstance(value, torch.Tensor) and not value.is_floating_point():
        return int(value.item())
    return int(x)


def as_bool(value: Any, what: str = "结果") -> bool:
    """把读者返回的真假值读成 ``bool``：接受 ``True``/``False``、``np.bool_``、单元素布尔张量；拒绝字符串和数。"""
    np = _numpy()
    if isinstance(value, str):
        raise _string_mistake(value, what, "True 或 False")
    if isinstance(value, torch.Tensor) and value.numel() == 1 and value.dtype == torch.bool:
        return bool(value.item())
    if np is not None and isinstance(value, np.ndarray) and value.size == 1 and value.dtype == np.bool_:
        return bool(value.item())
    if np is not None and isinstance(value, np.bool_):
        return bool(value)
    if isinstance(value, bool):
        return value
    raise Mistake(f"{what}应是 True 或 False，你返回的是 {type(value).__name__} {_describe(value)}", key="type")


def compare_number(
    actual: Any,
    expected: float,
    *,
    variants: Sequence[Variant] = (),
    what: str = "结果",
    atol: float = 1e-8,
    rtol: float = 1e-6,
    default_hint: str | None = None,
) -> None:
    """像 :func:`compare`，但比较的是一个数（读者的返回值先经 :func:`as_number`；``Variant.value`` 也是数）。"""
    got = as_number(actual, what)
    ref = float(expected)
    if math.isclose(got, ref, rel_tol=rtol, abs_tol=atol) or (math.isnan(got) and math.isnan(ref)):
        return
    for v in variants:
        if math.isclose(got, float(v.value), rel_tol=rtol, abs_tol=atol):
            raise Mistake(v.hint, key=v.key)
    if not math.isfinite(got):
        raise Mistake(f"{what}是 {got}：出现了 NaN 或 inf", key="nonfinite")
    raise Mistake(default_hint or f"{what}不对：应为 {ref:.6g}，你的是 {got:.6g}", key="values")


# ---------------------------------------------------------------- 比较张量


def as_tensor(x: Any, what: str = "结果") -> torch.Tensor:
    """把读者的返回值转成 float64 张量（布尔张量保持布尔）。

    接受张量、NumPy 数组，以及一个数（Python/NumPy 标量 → 0 维张量）；字符串、列表等抛 :class:`Mistake`。
    """
    if isinstance(x, torch.Tensor):
        if x.is_complex():
            raise Mistake(f"{what}应是实数张量，你返回的是复数张量", key="type")
        return x.detach().cpu().to(torch.float64) if x.dtype != torch.bool else x.detach().cpu()
    np = _numpy()
    if np is not None and isinstance(x, np.ndarray):
        if x.dtype == np.bool_:
            return torch.from_numpy(x.copy())
        if x.dtype.kind in "iuf":
            return torch.from_numpy(x.astype(np.float64))
        raise Mistake(f"{what}应是数值数组，你返回的数组 dtype 是 {x.dtype}", key="type")
    if isinstance(x, str):
        raise _string_mistake(x, what, "torch 张量（Tensor）")
    if isinstance(x, (list, tuple)):
        raise Mistake(f"{what}应是 torch 张量（Tensor），你返回的是 {type(x).__name__}：用 torch.tensor(...) "
                      "或 torch.stack(...) 把它变成张量", key="type")
    if isinstance(x, numbers.Real) and not isinstance(x, (bool, np.bool_ if np is not None else bool)):
        return torch.tensor(float(x), dtype=torch.float64)
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
    出现 NaN/inf → 形状不同 → 通用提示 ``default_hint``。参考答案是张量时，读者返回一个数会被指出（key ``"type"``）。
    """
    got = as_tensor(actual, what)
    ref = as_tensor(expected, "参考答案")
    if got.dim() == 0 and ref.dim() > 0 and not isinstance(actual, torch.Tensor):
        raise Mistake(f"{what}应是形状 {tuple(ref.shape)} 的张量，你返回的是一个数 {_describe(actual)}", key="type")
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
    if isinstance(actual, str):
        raise _string_mistake(actual, what, "torch 张量（Tensor）")
    if not isinstance(actual, torch.Tensor):
        raise Mistake(f"{what}应是 torch 张量（Tensor），你返回的是 {type(actual).__name__}", key="type")
    if actual.dtype != dtype:
        raise Mistake(hint or f"{what}的 dtype 应为 {dtype}，你的是 {actual.dtype}", key="dtype")
