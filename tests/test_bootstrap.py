"""每个笔记本的引导单元（bootstrap cell）与仓库地址。

- 仓库地址只写在 ``_config.yml`` 的 ``repository.url``：主题选项里不再重复，README 与 how_to_run.md 的安装命令用的是它；
- 每个笔记本（各章与参考答案）的第一个代码单元就是 ``scripts/sync_bootstrap.py`` 按这个地址生成的引导单元，
  没有输出（改了地址或模板之后运行 ``python scripts/sync_bootstrap.py`` 即可让本测试通过）；
- 引导单元在已装好 tformer_lib 的环境里什么也不打印；在没装的环境里调用的正是
  ``pip install --quiet git+<url>@<branch>``。真正对本地克隆执行安装在 scripts/test_installed.sh 里。
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

import sync_bootstrap as B  # noqa: E402

URL, BRANCH = B.repository()
NOTEBOOKS = B.notebooks()


def test_repository_url_lives_in_one_place():
    cfg = yaml.safe_load((ROOT / "_config.yml").read_text(encoding="utf-8"))
    theme = cfg["sphinx"]["config"].get("html_theme_options", {})
    for key in ("repository_url", "repository_branch", "launch_buttons"):
        assert key not in theme, f"html_theme_options.{key} 重复了 _config.yml 的 repository/launch_buttons"
    assert "book_repository" in cfg["sphinx"]["local_extensions"]
    for page in ("README.md", "book/how_to_run.md"):
        text = (ROOT / page).read_text(encoding="utf-8")
        assert B.requirement(URL, BRANCH) in text or "{{REPO_PIP}}" in text, (
            f"{page} 的安装命令应使用 _config.yml 的仓库地址：{B.requirement(URL, BRANCH)}")


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_notebook_starts_with_the_current_bootstrap_cell(path):
    nb = nbformat.read(path, as_version=4)
    i = B.find_bootstrap(nb)
    assert i is not None, f"{path.name} 没有引导单元：运行 python scripts/sync_bootstrap.py"
    first_code = next(k for k, c in enumerate(nb.cells) if c.cell_type == "code")
    assert i == first_code, "引导单元必须是第一个代码单元（在 setup() 之前）"
    cell = nb.cells[i]
    assert cell.source == B.render(URL, BRANCH), "引导单元与模板/仓库地址不一致：运行 python scripts/sync_bootstrap.py"
    assert cell.outputs == [] and set(B.TAGS) <= set(cell.metadata.get("tags", []))


def test_bootstrap_cell_is_silent_when_the_package_is_importable():
    result = subprocess.run([sys.executable, "-c", B.render(URL, BRANCH)], capture_output=True, text=True,
                            timeout=60, cwd=ROOT)
    assert result.returncode == 0 and result.stdout == "" and result.stderr == ""


def test_bootstrap_cell_installs_from_the_repository_when_missing(monkeypatch):
    import importlib.util

    calls = []
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None)
    monkeypatch.setattr(subprocess, "run", lambda args, **kw: calls.append((args, kw)))
    exec(compile(B.render("https://example.org/me/book", "dev"), "<bootstrap>", "exec"), {})
    assert calls == [([sys.executable, "-m", "pip", "install", "--quiet",
                       "git+https://example.org/me/book@dev"], {"check": True})]


def test_sync_inserts_once_before_the_first_code_cell_and_then_is_a_no_op():
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_markdown_cell("# 标题"), nbformat.v4.new_code_cell("print(1)")]
    assert B.sync(nb, B.render(URL, BRANCH)) is True
    assert [c.cell_type for c in nb.cells] == ["markdown", "code", "code"] and B.find_bootstrap(nb) == 1
    assert B.sync(nb, B.render(URL, BRANCH)) is False
    assert B.sync(nb, B.render("https://example.org/x", None)) is True and len(nb.cells) == 3
    assert "git+https://example.org/x\"" in nb.cells[1].source
    nbformat.validate(nb)


def test_bootstrap_cell_fits_the_book_code_column():
    import unicodedata

    def width(line):  # 中日韩字符占两列
        return sum(2 if unicodedata.east_asian_width(c) in "WF" else 1 for c in line)

    assert max(width(line) for line in B.render(URL, BRANCH).splitlines()) <= 79
