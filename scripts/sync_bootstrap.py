#!/usr/bin/env python
"""给每个笔记本放一个“引导单元”（bootstrap cell）：读者的环境里没有 tformer_lib 时，先从本书仓库安装它。

在 Colab、课程服务器或自己的 Jupyter 里直接打开一章时，环境里通常还没有本书的库。每个笔记本
（``notebooks/*.ipynb`` 与 ``notebooks/solutions/*.ipynb``）的第一个代码单元因此是：

* ``tformer_lib`` 不可导入时：``pip install --quiet git+<url>@<branch>`` 从 ``_config.yml`` 的 ``repository.url``（和
  ``repository.branch``）安装本包——包的元数据对 torch 只写下界，所以读者环境里已有的 torch 不会被换掉；
* 可导入时：什么也不做，什么也不打印（nbval 比较的输出不变，笔记本不必重新执行）。

单元带标签 ``bootstrap``（本脚本据此找到并更新它）和 ``remove-cell``（HTML 书里不显示；下载的 .ipynb 里有）。
仓库地址只写在 ``_config.yml`` 一处；改了地址就重新运行本脚本::

    .venv/bin/python scripts/sync_bootstrap.py            # 插入或更新全部笔记本的引导单元
    .venv/bin/python scripts/sync_bootstrap.py --check    # 只检查，有不一致就列出并返回 1

``tests/test_bootstrap.py`` 检查每个笔记本的引导单元与这里的模板一致；``scripts/test_installed.sh`` 在一个
新的虚拟环境里对本地克隆执行这个单元的安装命令。
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TAG = "bootstrap"
TAGS = [TAG, "remove-cell"]
CELL_ID = "bootstrap"

TEMPLATE = '''\
# 引导单元：环境里没有本书的库（如新开的 Colab）时先安装它，
# 已经装好时什么也不做。由 scripts/sync_bootstrap.py 生成，请勿手改。
import importlib.util

if importlib.util.find_spec("tformer_lib") is None:
    import subprocess
    import sys

    url = "{url}"
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", url],
                   check=True)
    importlib.invalidate_caches()'''


def repository(config_path: Path = ROOT / "_config.yml") -> tuple[str, str | None]:
    """``_config.yml`` 里的 (repository.url, repository.branch)。"""
    import yaml

    cfg = yaml.safe_load(config_path.read_text(encoding="utf-8"))
    repo = cfg.get("repository") or {}
    url = repo.get("url")
    if not url:
        raise ValueError(f"{config_path} 里没有 repository.url")
    return str(url).rstrip("/"), repo.get("branch")


def pip_url(url: str, branch: str | None = None) -> str:
    """pip 能装的仓库地址：``git+<url>[@<branch>]``。"""
    ref = f"@{branch}" if branch else ""
    return f"git+{url}{ref}"


def requirement(url: str, branch: str | None = None) -> str:
    """README 与 how_to_run.md 的安装命令装的东西：``git+<url>[@<branch>]``。

    不写成 ``tformer_lib @ git+…``：旧一些的 pip（如 23.2）不接受 ``file:///`` 这种没有主机名的直接引用，
    而 CI 正是对本地克隆（file:// 地址）执行这条命令。
    """
    return pip_url(url, branch)


def render(url: str, branch: str | None = None) -> str:
    """引导单元的源代码。"""
    return TEMPLATE.format(url=pip_url(url, branch))


def notebooks(root: Path = ROOT) -> list[Path]:
    """要有引导单元的笔记本：各章与参考答案，以下划线开头的草稿除外。"""
    return [p for pattern in ("notebooks/*.ipynb", "notebooks/solutions/*.ipynb")
            for p in sorted(root.glob(pattern)) if not p.name.startswith("_")]


def find_bootstrap(nb) -> int | None:
    for i, cell in enumerate(nb.cells):
        if cell.cell_type == "code" and TAG in cell.metadata.get("tags", []):
            return i
    return None


def sync(nb, source: str) -> bool:
    """让 nb 的引导单元等于 source（没有就插到第一个代码单元之前）；返回是否有改动。"""
    import nbformat

    i = find_bootstrap(nb)
    if i is not None:
        cell = nb.cells[i]
        tags = cell.metadata.get("tags", [])
        if cell.source == source and all(t in tags for t in TAGS) and not cell.outputs:
            return False
        cell.source = source
        cell.metadata["tags"] = tags + [t for t in TAGS if t not in tags]
        cell.outputs = []
        cell.execution_count = None
        return True
    cell = nbformat.v4.new_code_cell(source=source, metadata={"tags": list(TAGS)})
    if "id" in cell:
        taken = {c.get("id") for c in nb.cells}
        cell["id"] = CELL_ID if CELL_ID not in taken else f"{CELL_ID}-{len(taken)}"
    first_code = next((k for k, c in enumerate(nb.cells) if c.cell_type == "code"), len(nb.cells))
    nb.cells.insert(first_code, cell)
    return True


def main(argv: list[str] | None = None) -> int:
    import nbformat

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("paths", nargs="*", type=Path, help="笔记本（默认：notebooks/ 与 notebooks/solutions/ 全部）")
    parser.add_argument("--check", action="store_true", help="只检查，不写文件；有不一致就返回 1")
    args = parser.parse_args(argv)
    source = render(*repository())
    stale = []
    for path in args.paths or notebooks():
        nb = nbformat.read(path, as_version=4)
        if not sync(nb, source):
            continue
        stale.append(path)
        if not args.check:
            nbformat.validate(nb)
            tmp = path.with_suffix(".ipynb.tmp")
            nbformat.write(nb, tmp)
            tmp.replace(path)
    verb = "需要更新" if args.check else "已更新"
    for path in stale:
        print(f"{verb}：{path}")
    if not stale:
        print("所有笔记本的引导单元都是最新的。")
    return 1 if (args.check and stale) else 0


if __name__ == "__main__":
    sys.exit(main())
