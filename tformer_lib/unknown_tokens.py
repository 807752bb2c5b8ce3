"""词表外的词元（未登录词，out-of-vocabulary）：全库一种处理办法。

词表外的字或词只能编码成 ``<unk>``，模型把它当成“某个不认识的东西”，结果多半不可信。凡是把文本变成 id 的
公开入口（``translate``、字符分词器的 ``encode``、``sample_poems``、命令行的 ``translate`` / ``lm-generate``）
都按同一个参数 ``on_unknown`` 处理：

- ``"warn"``（默认）：发出 :class:`UnknownTokenWarning`，列出这些字/词，照常继续；
- ``"error"``：抛出 :class:`UnknownTokenError`（``ValueError`` 的子类）；命令行的 ``--strict`` 就是它；
- ``"ignore"``：不作声（库内部编码留出数据时用：低频字本来就按设计记作 ``<unk>``）。
"""

from __future__ import annotations

import warnings

from ._checks import one_of

__all__ = ["ON_UNKNOWN", "UnknownTokenWarning", "UnknownTokenError", "report_unknown"]

#: ``on_unknown`` 的取值
ON_UNKNOWN = ("warn", "error", "ignore")


class UnknownTokenWarning(UserWarning):
    """输入里有词表外的词（未登录词），它们被当作 ``<unk>``，结果多半不可信。

    ``summary`` 是不带处理建议的那一句说明（命令行用它换上自己的选项名）。
    """

    def __init__(self, message: str, summary: str = ""):
        super().__init__(message)
        self.summary = summary or message


class UnknownTokenError(ValueError):
    """``on_unknown="error"`` 时遇到词表外的词；``summary`` 同 :class:`UnknownTokenWarning`。"""

    def __init__(self, message: str, summary: str = ""):
        super().__init__(message)
        self.summary = summary or message


def report_unknown(summary: str, on_unknown: str, stacklevel: int = 3) -> None:
    """按 ``on_unknown`` 报告一句说明 ``summary``（它应列出那些词）：警告、报错或什么也不做。"""
    one_of("on_unknown", on_unknown, ON_UNKNOWN)
    if on_unknown == "error":
        raise UnknownTokenError(f"{summary}；请换成词表里的词，或传 on_unknown='warn' 只警告", summary)
    if on_unknown == "warn":
        warnings.warn(UnknownTokenWarning(f"{summary}；传 on_unknown='error' 可改为报错", summary), stacklevel=stacklevel + 1)
