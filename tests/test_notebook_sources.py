"""笔记本里 ``show_source`` 的输出必须是库的当前源码。

nbval 也会发现过期的源码清单，但要在 CI 的最后几步、重跑全部笔记本之后；这里几秒钟内就能指出
哪个笔记本的哪一格需要重新执行。
"""

from __future__ import annotations

import ast
import json
import textwrap
from pathlib import Path

import pytest

from tformer_lib.notebook.source import _drop_docstrings

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").rglob("*.ipynb"))


def _listings():
    """(笔记本, 格序号, 文件, 显示的代码)：每个以 ``# tformer_lib/…`` 开头的纯文本输出。"""
    for nb_path in NOTEBOOKS:
        cells = json.loads(nb_path.read_text(encoding="utf-8"))["cells"]
        for index, cell in enumerate(cells):
            for output in cell.get("outputs", []):
                text = output.get("data", {}).get("text/plain")
                text = "".join(text) if isinstance(text, list) else text
                if not text or not text.startswith("# tformer_lib/"):
                    continue
                location, _, code = text.partition("\n")
                yield nb_path.relative_to(ROOT).as_posix(), index, location[2:], code


def _candidates(path: Path):
    """文件里每个函数与类（含装饰器）的源码，与 ``inspect.getsourcelines`` 取的一样；再加整个文件。"""
    source = path.read_text(encoding="utf-8")
    lines = source.splitlines(keepends=True)
    yield source
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            start = min([node.lineno] + [d.lineno for d in node.decorator_list])
            yield textwrap.dedent("".join(lines[start - 1: node.end_lineno]))


LISTINGS = list(_listings())


def test_the_notebooks_show_library_source():
    assert len(LISTINGS) >= 20, f"只找到 {len(LISTINGS)} 处 show_source 输出：扫描方式坏了？"


@pytest.mark.parametrize("notebook, cell, location, code", LISTINGS,
                         ids=[f"{nb}[{cell}]" for nb, cell, _, _ in LISTINGS])
def test_listing_is_current_source(notebook, cell, location, code):
    path = ROOT / location
    assert path.is_file(), f"{notebook} 第 {cell} 格显示的 {location} 已不存在：重新执行这个笔记本"
    shown = code.rstrip()
    for candidate in _candidates(path):
        if shown in (candidate.rstrip(), _drop_docstrings(candidate).rstrip()):
            return
    pytest.fail(f"{notebook} 第 {cell} 格显示的 {location} 源码已过期：重新执行这个笔记本")
