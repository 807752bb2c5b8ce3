"""书的设置（_config.yml、_toc.yml、_ext、_static、nbval 清洗规则）的快速检查。

真正的构建（-W -n）与浏览器测试在 scripts/test.sh 的第 2、3 步；这里只检查几秒内能查清、
却会让那两步失败或让读者看到问题的前提条件，失败信息直接指出该改哪个文件。
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

yaml = pytest.importorskip("yaml")

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "_ext"))
sys.path.insert(0, str(ROOT / "scripts"))

import tformer_book  # noqa: E402


def _config() -> dict:
    return yaml.safe_load((ROOT / "_config.yml").read_text(encoding="utf-8"))


def _toc_files() -> list[str]:
    toc = yaml.safe_load((ROOT / "_toc.yml").read_text(encoding="utf-8"))
    files = [toc["root"]]
    for part in toc["parts"]:
        files += [c["file"] for c in part["chapters"]]
    return files


def test_every_toc_entry_exists():
    missing = [f for f in _toc_files()
               if not any((ROOT / (f + ext)).exists() for ext in (".md", ".ipynb"))]
    assert not missing, f"_toc.yml 列出的这些页面还不存在（构建会失败）：{missing}"


def test_every_chapter_notebook_is_in_the_toc():
    listed = set(_toc_files())
    # 以下划线开头的是作者的草稿，不进书
    chapters = sorted(p for p in (ROOT / "notebooks").glob("[0-9]*.ipynb"))
    orphans = [str(p.relative_to(ROOT)) for p in chapters
               if str(p.relative_to(ROOT).with_suffix("")) not in listed]
    assert not orphans, f"这些章节笔记本不在 _toc.yml 里，书里看不到：{orphans}"


def test_toc_parts_are_numbered_and_captioned():
    toc = yaml.safe_load((ROOT / "_toc.yml").read_text(encoding="utf-8"))
    captions = [p["caption"] for p in toc["parts"]]
    assert captions[0].startswith("第一部分") and captions[1].startswith("第二部分")
    assert captions[-1] == "附录"
    assert toc["parts"][0].get("numbered") and toc["parts"][1].get("numbered")


def test_config_is_chinese_offline_and_does_not_execute():
    cfg = _config()
    sphinx = cfg["sphinx"]["config"]
    assert sphinx["language"] == "zh_CN"
    assert cfg["execute"]["execute_notebooks"] == "off"
    assert cfg["only_build_toc_files"] is True
    # 所有需要的脚本都是 _static 下的本地文件，不经 CDN
    scripts = [sphinx["mathjax_path"], *sphinx["nb_ipywidgets_js"]]
    for path in scripts:
        assert "://" not in path, f"{path} 不是本地文件"
        assert (ROOT / "_static" / path).is_file(), f"_static/{path} 不存在"
    assert (ROOT / "_static/thirdparty/mathjax/output/chtml/fonts/woff-v2/MathJax_Main-Regular.woff").is_file()
    assert (ROOT / cfg["sphinx"]["config"]["html_search_options"]["dict"]).is_file()


def test_vendored_files_stay_small():
    total = sum(p.stat().st_size for p in (ROOT / "_static").rglob("*") if p.is_file())
    assert total < 8 * 1024 * 1024, f"_static/ 有 {total / 2**20:.1f} MB，超出了“几 MB”的预算"


def test_search_dictionary_format():
    for n, line in enumerate((ROOT / "book/search_dict.txt").read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        parts = line.split()
        assert len(parts) == 3 and parts[1].isdigit(), f"book/search_dict.txt 第 {n} 行应为“词 词频 词性”：{line!r}"


def test_chinese_search_segments_book_terms():
    jieba = pytest.importorskip("jieba")
    jieba.load_userdict(str(ROOT / "book/search_dict.txt"))
    words = set(jieba.cut_for_search("正弦位置编码与多头注意力"))
    assert {"位置编码", "注意力", "多头注意力"} <= words


def test_glossary_rows_have_three_columns():
    rows = [l for l in (ROOT / "book/glossary.md").read_text(encoding="utf-8").splitlines()
            if l.startswith("|")]
    assert rows[0].replace(" ", "") == "|中文|English|首次出现|"
    bad = [r for r in rows if r.count("|") != 4]
    assert not bad, f"术语表里这些行不是三列：{bad}"


@pytest.mark.parametrize("text, position, expected", [
    ("第1章 文本如何进入网络", 1, "文本如何进入网络"),
    ("第 3 章 Q、K、V 与一次注意力", 1, "Q、K、V 与一次注意力"),
    ("1.1 先回顾", 1, "先回顾"),
    ("2 掩码：哪些位置不许看", 2, "掩码：哪些位置不许看"),
    ("1.10 预览：权重共享", 10, "预览：权重共享"),
    ("练习 1：编码", 3, "练习 1：编码"),
    ("2017 年的论文", 5, "2017 年的论文"),
    ("10000 的由来", 3, "10000 的由来"),
    ("小结", 4, "小结"),
])
def test_strip_manual_number(text, position, expected):
    assert tformer_book.strip_manual_number(text, position) == expected


def test_nbval_sanitizers_parse_and_work():
    from nbval.plugin import get_sanitize_patterns

    patterns = get_sanitize_patterns((ROOT / "nbval_sanitize.cfg").read_text(encoding="utf-8"))
    assert len(patterns) >= 6, "nbval 只认紧挨着的 'regex: ' / 'replace: ' 两行"

    def clean(s):
        for regex, replace in patterns:
            s = re.sub(regex, replace, s)
        return s

    assert clean("<Foo object at 0x7f3a12bc90>") == "<Foo object at 0xADDRESS>"
    assert clean("用时 0.83 秒，共 12.5 ms") == "用时 TIME，共 TIME"
    assert clean(" 45%|████▌     | 45/100 [00:01<00:02, 30.1it/s]") == "PROGRESS"
    # 普通的数值输出不能被抹掉
    assert clean("loss 0.1234, d_model=512, 2 个头") == "loss 0.1234, d_model=512, 2 个头"


def test_strip_volatile_metadata():
    nbformat = pytest.importorskip("nbformat")
    import execute_notebooks

    nb = nbformat.v4.new_notebook()
    nb.metadata["widgets"] = {"application/vnd.jupyter.widget-state+json": {}}
    nb.metadata["vscode"] = {"x": 1}
    cell = nbformat.v4.new_code_cell("1")
    cell.metadata["execution"] = {"iopub.status.busy": "2026-01-01"}
    cell.metadata["tags"] = ["hide-cell"]
    cell.outputs = [nbformat.v4.new_output("stream", name="stdout", text="a\n"),
                    nbformat.v4.new_output("stream", name="stdout", text="b\n"),
                    nbformat.v4.new_output("stream", name="stderr", text="w\n")]
    nb.cells.append(cell)
    execute_notebooks.strip_volatile(nb)
    assert set(nb.metadata) == {"kernelspec", "widgets"}
    assert cell.metadata == {"tags": ["hide-cell"]}
    assert [(o.name, o.text) for o in cell.outputs] == [("stdout", "a\nb\n"), ("stderr", "w\n")]
    nbformat.validate(nb)


def test_exercise_index_lists_exercise_headings(tmp_path):
    nbformat = pytest.importorskip("nbformat")
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_markdown_cell("## 练习\n\n### 练习 1：因果掩码\n正文"),
                nbformat.v4.new_markdown_cell("### 3.2 练习 2：拆头 | 形状"),
                nbformat.v4.new_markdown_cell("## 小结\n练习很重要")]
    (tmp_path / "notebooks").mkdir()
    nbformat.write(nb, tmp_path / "notebooks/04_x.ipynb")
    assert tformer_book.find_exercises(tmp_path / "notebooks/04_x.ipynb") == ["练习 1：因果掩码", "练习 2：拆头 | 形状"]
    table = tformer_book.exercise_index(tmp_path, ["notebooks/04_x"])
    assert "{doc}`第 4 章 <../notebooks/04_x>`" in table and "练习 2：拆头 \\| 形状" in table


def test_exercise_index_accepts_unnumbered_subsections(tmp_path):
    nbformat = pytest.importorskip("nbformat")
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_markdown_cell("## 练习\n\n说明"),
                nbformat.v4.new_markdown_cell("### 预热学习率\n\n#### 提示\n```\n# 不是标题\n```"),
                nbformat.v4.new_markdown_cell("### 标签平滑\n## 小结\n### 不是练习")]
    nbformat.write(nb, tmp_path / "07.ipynb")
    assert tformer_book.find_exercises(tmp_path / "07.ipynb") == ["预热学习率", "标签平滑"]


def test_solutions_page_uses_the_generated_index():
    assert tformer_book.EXERCISE_MARKER in (ROOT / "book/solutions.md").read_text(encoding="utf-8")


def test_widgets_setup_maps_every_bundled_amd_module_to_the_local_copy():
    """embed-amd.js 里每个具名 AMD 模块按自己的地址推算字体目录；每个都要映射到本地副本，否则图标字体 404。"""
    bundle = (ROOT / "_static/thirdparty/html-manager/embed-amd.js").read_text(encoding="utf-8")
    setup_js = (ROOT / "_static/thirdparty/widgets-setup.js").read_text(encoding="utf-8")
    defined = set(re.findall(r'define\("@jupyter-widgets/([^"/]+)"', bundle))
    assert {"base", "controls", "html-manager"} <= defined
    mapped = set(re.findall(r'"([a-z0-9-]+)"', setup_js.split("var modules =", 1)[1].split(";", 1)[0]))
    assert defined <= mapped, f"widgets-setup.js 没有映射：{defined - mapped}"
    assert '"_static/thirdparty/html-manager"' in setup_js


def test_exercise_headings_get_stable_anchors():
    sys.path.insert(0, str(ROOT / "_ext"))
    import heading_slugs

    assert heading_slugs.slugify("练习 3（找错 ★★）：掩码的真假") == "练习-3"
    assert heading_slugs.slugify("练习 12（扩展 ★★★）：x") == "练习-12"
    assert heading_slugs.slugify("练习") == "练习"  # 不是编号练习：MyST 默认规则
    assert heading_slugs.slugify("小结 Summary") == "小结-summary"
    cfg = _config()["sphinx"]["config"]
    assert cfg["myst_heading_slug_func"] == "heading_slugs.slugify" and cfg["myst_heading_anchors"] >= 3


def test_browser_test_reads_toc_globs_and_has_an_explorer_per_chapter():
    import browser_test

    docs, chapters = browser_test.pages_from_toc(ROOT / "_toc.yml")
    solutions = sorted(p.relative_to(ROOT).with_suffix("").as_posix() for p in (ROOT / "notebooks/solutions").glob("*.ipynb"))
    assert all(s in docs and s in chapters for s in solutions)
    numbered = [d for d in docs if re.fullmatch(r"notebooks/\d\d_\w+", d)]
    missing = [d for d in numbered if d not in browser_test.STATIC_EXPLORERS and _has_explorer(d)]
    assert not missing, f"这些章节页有探索器，却不在 scripts/browser_test.py 的 STATIC_EXPLORERS 表里：{missing}"


def _has_explorer(doc: str) -> bool:
    text = (ROOT / f"{doc}.ipynb").read_text(encoding="utf-8")
    return "_explorer(" in text


def test_execute_notebooks_also_runs_the_solutions():
    import execute_notebooks

    paths = [p.relative_to(ROOT).as_posix() for p in execute_notebooks.default_notebooks()]
    assert any(p.startswith("notebooks/0") for p in paths)
    assert all(p in paths for p in (q.relative_to(ROOT).as_posix() for q in (ROOT / "notebooks/solutions").glob("*.ipynb")))


def test_repository_settings_reach_the_theme_and_the_pages():
    sys.path.insert(0, str(ROOT / "_ext"))
    from types import SimpleNamespace

    import book_repository

    cfg = _config()
    config = SimpleNamespace(html_theme_options=dict(cfg["sphinx"]["config"]["html_theme_options"]))
    app = SimpleNamespace(srcdir=str(ROOT))
    book_repository._on_config_inited(app, config)
    options = config.html_theme_options
    assert options["repository_url"] == cfg["repository"]["url"]
    assert options["repository_branch"] == cfg["repository"]["branch"]
    assert options["launch_buttons"]["colab_url"] == cfg["launch_buttons"]["colab_url"]
    assert options["show_toc_level"] == 2  # 显式写的主题选项保留
    source = ["装：`pip install \"{{REPO_PIP}}\"`，见 {{REPO_URL}}"]
    book_repository._on_source_read(app, "book/how_to_run", source)
    url, branch = cfg["repository"]["url"].rstrip("/"), cfg["repository"]["branch"]
    assert source[0] == f"装：`pip install \"git+{url}@{branch}\"`，见 {url}"
