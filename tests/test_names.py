"""一个东西一个名字：两篇文章只叫“文章 A”“文章 B”，缓存只叫“K/V 缓存”，书名只属于本书。

扫描读者会读到的全部文字：各章与参考答案的笔记本（源码与输出）、``book/`` 的页面、README 与库的源码
（检查器的提示、图里的字、文档字符串都会出现在书里）。术语表“又作”一栏专门列别名，不算。
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

#: 别的叫法 → 该用的名字
OTHER_NAMES = {
    r"种子文章": "文章 A / 文章 B（两篇合称“两篇文章”）",
    r"文章\s*([AB]\s*)?00[02]": "文章 A（000）/ 文章 B（002）",
    r"文章 [AB](?=[\u4e00-\u9fff])": "“文章 A”“文章 B”后面跟汉字时留一个空格",
    r"主参数": "主权重（master weights，第 11 章）",
    r"(两篇|对应|与)原文|原文(小节|给的|那句|之外|没有展开)": "文章 A / 文章 B（“原文”只指翻译的源句、论文或许可证的原文）",
    r"原理深讲\W{0,2}系列": "书名《Transformer 原理深讲》只指本书；两篇文章的出处写“作者讲 Transformer 原理的系列文章”",
    r"KV 缓存": "K/V 缓存",
}


def _texts():
    """(位置, 一行文字)：笔记本逐格（源码与文本输出）、book/*.md、README、库的 .py。"""
    for path in sorted((ROOT / "notebooks").rglob("*.ipynb")):
        if ".ipynb_checkpoints" in path.parts:
            continue
        for index, cell in enumerate(json.loads(path.read_text(encoding="utf-8"))["cells"]):
            chunks = ["".join(cell["source"])]
            for output in cell.get("outputs", []):
                chunks.append("".join(output.get("text", "")))
                chunks.append("".join(output.get("data", {}).get("text/plain", "")))
                chunks.append("".join(output.get("data", {}).get("text/html", "")))
            for line in "\n".join(chunks).splitlines():
                yield f"{path.relative_to(ROOT)} 格 {index}", line
    pages = sorted((ROOT / "book").glob("*.md")) + [ROOT / "README.md"] + sorted((ROOT / "tformer_lib").rglob("*.py"))
    for path in pages:
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if path.name == "glossary.md" and "又作" in line:
                continue  # 术语表的别名栏
            yield f"{path.relative_to(ROOT)}:{number}", line


@pytest.mark.parametrize("pattern", OTHER_NAMES)
def test_one_name_each(pattern):
    found = [f"{where}：{line.strip()[:80]}" for where, line in _texts() if re.search(pattern, line)]
    assert not found, f"应写“{OTHER_NAMES[pattern]}”，这些地方还用别的叫法：\n" + "\n".join(found)


def test_the_scan_sees_what_it_should():
    """扫描确实读到了笔记本的输出、术语表与库：否则上面的测试什么也证明不了。"""
    texts = list(_texts())
    assert any("08_inference_efficiency" in where and "K/V 缓存" in line for where, line in texts)
    assert any(where.startswith("book/preface.md") and "文章 A" in line for where, line in texts)
    assert any(where.startswith("tformer_lib/") and "K/V 缓存" in line for where, line in texts)
    assert any("格" in where and "原文" in line for where, line in texts)  # 翻译的源句仍叫原文（第 5 章）
    glossary = (ROOT / "book/glossary.md").read_text(encoding="utf-8")
    assert sum("paged" in row for row in glossary.splitlines()) == 1  # 分页只有一条
