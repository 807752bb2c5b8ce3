"""检查器报告读者错误的两种对象：:class:`Mistake`（发现了一个错误）和 :class:`Variant`（一个已知的错误写法）。

单独成一个模块，让 :mod:`._core`（运行检查）与 :mod:`._compare`（比较返回值）都从这里导入，彼此不循环依赖。
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["Mistake", "Variant"]


class Mistake(Exception):
    """检查函数发现了错误：``hint`` 是给读者的中文提示，``key`` 是机器可读的错误名（测试用）。"""

    def __init__(self, hint: str, key: str | None = None):
        super().__init__(hint)
        self.hint = hint
        self.key = key


@dataclass(frozen=True)
class Variant:
    """一个“已知错误写法”：名字 ``key``、提示 ``hint``，以及这种写法在同一输入上会得到的输出 ``value``。"""

    key: str
    hint: str
    value: Any
