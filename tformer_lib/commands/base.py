"""命令行的共同部分：错误类型 :class:`CLIError`、说中文的参数解析器 :class:`Parser`、把异常压成一行的 :func:`one_line`。

``cli.py``（train / translate / evaluate）、``lm.py``、``serve.py`` 与 ``finetune.py`` 都从这里取，
彼此不必互相导入。

argparse 自己的话（``usage:``、``options``、“缺少参数”“不是可选的值”……）默认是英文，由它内部的
``argparse._``（gettext）取出；:class:`Parser` 在建解析器、解析与排版帮助的那一刻把它换成下面的中文对照表，
用完即换回——不改这个进程里别的 argparse 解析器（只有在这几个时刻里新建或使用的解析器，例如在 ``type=`` 的
转换函数里，才会跟着说中文）。对照表只收本书的命令行会遇到的句子；其余的（``FileType``、``version``、
``parse_intermixed_args``、新版本 Python 新加的）原样是英文。
"""

from __future__ import annotations

import argparse
import contextlib

__all__ = ["ARGPARSE_ZH", "CLIError", "Parser", "one_line"]

#: argparse（Python 3.10–3.13）的英文模板 → 中文；占位符不变
ARGPARSE_ZH = {
    "usage: ": "用法：",
    "options": "选项",
    "positional arguments": "位置参数",
    "show this help message and exit": "显示这段帮助并退出",
    "the following arguments are required: %s": "缺少必需的参数：%s",
    "unrecognized arguments: %s": "不认识的参数：%s",
    "invalid choice: %(value)r (choose from %(choices)s)": "%(value)r 不是可选的值（可选：%(choices)s）",
    "argument %(argument_name)s: %(message)s": "参数 %(argument_name)s：%(message)s",
    "expected one argument": "后面要跟一个值",
    "expected at most one argument": "后面至多跟一个值",
    "expected at least one argument": "后面至少跟一个值",
    "expected %s argument": "后面要跟 %s 个值",
    "expected %s arguments": "后面要跟 %s 个值",
    "invalid %(type)s value: %(value)r": "%(value)r 不是合法的 %(type)s 值",
    "ambiguous option: %(option)s could match %(matches)s": "选项 %(option)s 有歧义，可能是 %(matches)s",
    "not allowed with argument %s": "不能与参数 %s 一起用",
    "one of the arguments %s is required": "参数 %s 中必须给一个",
    "ignored explicit argument %r": "这个选项不带值，却给了 %r",
}


class CLIError(Exception):
    """命令行层面的错误：打印消息，退出码 1。"""


@contextlib.contextmanager
def _chinese():
    """这段时间里 argparse 取的句子换成 :data:`ARGPARSE_ZH` 的中文。"""
    saved = argparse._, argparse.ngettext
    argparse._ = lambda text: ARGPARSE_ZH.get(text, text)
    argparse.ngettext = lambda one, many, n: ARGPARSE_ZH.get(one if n == 1 else many, one if n == 1 else many)
    try:
        yield
    finally:
        argparse._, argparse.ngettext = saved


class Parser(argparse.ArgumentParser):
    """说中文的 ``ArgumentParser``：帮助与报错用中文；参数写错时只打印一行（argparse 默认先打印整段 usage），
    退出码 2。子命令沿用这个类（``add_subparsers`` 默认用父解析器的类）。"""

    def __init__(self, *args, **kwargs):
        with _chinese():  # “位置参数”“选项”的标题与 -h 的说明在这里定下
            super().__init__(*args, **kwargs)

    def parse_args(self, args=None, namespace=None):  # “不认识的参数”在这一层报
        with _chinese():
            return super().parse_args(args, namespace)

    def parse_known_args(self, args=None, namespace=None):
        with _chinese():
            return super().parse_known_args(args, namespace)

    def format_usage(self) -> str:
        with _chinese():
            return super().format_usage()

    def format_help(self) -> str:
        with _chinese():
            return super().format_help()

    def error(self, message: str):
        self.exit(2, f"错误：{self.prog}：{message}（用 --help 查看用法）\n")


def one_line(exc: BaseException) -> str:
    """错误消息压成一行：多行的（如 PyTorch 的报错）只保留各行要点，用“；”连接，最多 300 个字符。"""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    text = "；".join(lines) if lines else type(exc).__name__
    return text if len(text) <= 300 else text[:297] + "…"
