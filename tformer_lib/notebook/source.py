"""在笔记本里显示库的真实源码（``inspect.getsource``），用 Pygments 高亮。

章节不抄一份代码，而是 ``show_source(tformer_lib.scaled_dot_product_attention)``：书里看到的
就是正在运行的代码，两者不会走样（drift）。

输出同时带两种表示：``text/html``（高亮，内联样式，不依赖任何 CSS 文件）与 ``text/plain``
（首行是文件路径，其后是纯源码）。两者都不含行号——行号随每次编辑漂移，nbval 会把它当成差异；
只有代码本身变了，输出才会变。
"""

from __future__ import annotations

import ast
import html
import inspect
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class SourceView:
    """一段源码及其出处；在笔记本里显示为高亮的 HTML，纯文本环境里就是源码本身。"""

    code: str
    location: str  # 所在文件，例如 "tformer_lib/parts/attention.py"（不含行号：行号随每次编辑漂移，会让 nbval 误报）
    name: str

    def _repr_html_(self) -> str:
        from pygments import highlight
        from pygments.formatters import HtmlFormatter
        from pygments.lexers import PythonLexer

        body = highlight(self.code, PythonLexer(), HtmlFormatter(noclasses=True, style="friendly", nowrap=False))
        return (
            '<div class="tformer-source">'
            f'<div style="font-size:0.8em;color:#666;margin-bottom:2px">{html.escape(self.location)}</div>'
            f"{body}</div>"
        )

    def _repr_pretty_(self, p: Any, cycle: bool) -> None:
        p.text(str(self))

    def __str__(self) -> str:
        return f"# {self.location}\n{self.code.rstrip()}"

    def __repr__(self) -> str:
        return str(self)


def _location(obj: Any) -> str:
    try:
        path = Path(inspect.getsourcefile(obj) or "")
    except TypeError:
        path = Path("?")
    parts = path.parts
    if "tformer_lib" in parts:
        rel = "/".join(parts[len(parts) - 1 - parts[::-1].index("tformer_lib"):])
    else:
        rel = path.name
    return rel


def _drop_docstrings(code: str) -> str:
    """去掉函数/类（含其中方法）的文档字符串，只留代码。"""
    tree = ast.parse(code)
    spans = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Module)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(getattr(first, "value", None), ast.Constant) \
                    and isinstance(first.value.value, str):
                spans.append((first.lineno, first.end_lineno))
    lines = code.splitlines()
    drop = {i for a, b in spans for i in range(a - 1, b)}
    return "\n".join(line for i, line in enumerate(lines) if i not in drop) + "\n"


def source_view(obj: Any, *, docstring: bool = True) -> SourceView:
    """取得 ``obj``（函数、类、方法或模块）的源码，返回 :class:`SourceView`（不显示）。

    ``docstring=False`` 时去掉文档字符串，只看代码。
    """
    target = inspect.unwrap(obj) if callable(obj) else obj
    try:
        lines, _ = inspect.getsourcelines(target)
    except (TypeError, OSError) as exc:
        raise TypeError(f"无法取得 {obj!r} 的源码：show_source 需要 Python 写的函数、类、方法或模块（{exc}）") from exc
    code = textwrap.dedent("".join(lines))
    location = _location(target)
    if not docstring:
        code = _drop_docstrings(code)
    name = getattr(target, "__qualname__", getattr(target, "__name__", type(target).__name__))
    return SourceView(code=code, location=location, name=name)


def show_source(obj: Any, *, docstring: bool = True) -> None:
    """在笔记本里显示 ``obj`` 的真实源码（高亮 HTML + 纯文本后备）；不在 IPython 中时直接打印源码。

    例：``show_source(tformer_lib.scaled_dot_product_attention)``；
    ``show_source(tformer_lib.MultiHeadAttention.forward, docstring=False)`` 只看代码。
    """
    view = source_view(obj, docstring=docstring)
    try:
        from IPython import get_ipython
        from IPython.display import display
    except ImportError:  # pragma: no cover
        print(view)
        return
    if get_ipython() is None:
        print(view)
    else:
        display(view)


__all__ = ["SourceView", "source_view", "show_source"]
