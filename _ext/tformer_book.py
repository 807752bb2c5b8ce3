"""本书的本地 Sphinx 扩展（由 ``_config.yml`` 的 ``sphinx.local_extensions`` 加载）。

它只做几件小事：

1. **不让第三方脚本被注入两次。** jupyter-book 1.x 会把 ``_static/`` 下找到的每个 ``*.js`` / ``*.css``
   自动加到每一页的 ``<head>`` 里。我们把 MathJax、require.js 和 Jupyter 小部件的 html-manager
   放在 ``_static/thirdparty/``（离线可用的本地副本，来源见 ``_static/thirdparty/README.md``），它们只应由
   ``mathjax_path`` 和 myst-nb 的 ``nb_ipywidgets_js`` 按需加载一次，所以这里把 ``thirdparty/`` 下的条目从
   ``html_js_files`` / ``html_css_files`` 里去掉。
2. **中文搜索词典。** Sphinx 的中文搜索用 jieba 分词；``book/search_dict.txt`` 列出本书的术语
   （如“位置编码”“多头注意力”），使它们作为整词进入搜索索引。Sphinx 以当前工作目录解析这个路径，
   这里把它改成绝对路径，于是在任何目录下构建都能找到。
3. **nbclient 轮询卡顿的规避。** 通过 nbclient 执行笔记本（jupyter-book 的执行模式、
   ``scripts/execute_notebooks.py``）时，``ipywidgets.interact`` 单元偶尔会一直等到单元超时才返回：
   异步 ZMQ 套接字的一次长时间 ``poll`` 错过了唤醒（参见 jupyter/nbclient#312）。
   :func:`patch_zmq_polling` 把长等待切成不超过 ``POLL_SLICE`` 秒的短轮询，语义不变（超时仍按原
   期限抛出 ``queue.Empty``）。本书默认不在构建时执行笔记本，但若有人打开执行模式，补丁同样生效。
4. **去掉重复的内联脚本**（见 :func:`_dedupe_scripts`），否则每页控制台都有一个 JavaScript 错误。
5. **练习索引。** ``book/solutions.md`` 里的 ``<!-- exercises-index -->`` 在构建时换成从各章笔记本
   标题（“练习 N：……”）生成的索引，章节增删练习时索引自动跟上（:func:`exercise_index`）。
6. **章节号只由目录生成。** ``_toc.yml`` 用 ``numbered: true`` 给章和节自动编号（“4.”、“4.2.”……）。
   笔记本标题里手写的“第4章”“2.3”会和自动编号重复，:func:`_strip_manual_numbers` 在构建时把它们去掉
   （只动 ``notebooks/`` 下页面的标题，笔记本文件本身不变）。
   章号取自笔记本文件名的数字前缀（``15_triton_kernels`` 是第 15 章，与前言、术语表和练习索引写的相同）：
   计划中的章还没写好时（例如第 14 章），后面的章不会被自动编号挤到前一个号上（:func:`_chapter_numbers_from_files`）。
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from queue import Empty
from time import monotonic

#: 一次底层 poll 的最长等待（秒）。
POLL_SLICE = 0.5

_VENDOR_PREFIX = "thirdparty/"
_PATCHED_ATTR = "_tformer_sliced_poll"


def patch_zmq_polling(slice_s: float = POLL_SLICE) -> None:
    """把 ``AsyncZMQSocketChannel.get_msg`` 的长等待拆成短轮询（可重复调用，只打一次补丁）。"""
    try:
        from jupyter_client.channels import AsyncZMQSocketChannel
    except ImportError:  # 没装 jupyter_client 就无需补丁
        return
    original = AsyncZMQSocketChannel.get_msg
    if getattr(original, _PATCHED_ATTR, False):
        return

    async def get_msg(self, timeout: float | None = None):
        deadline = None if timeout is None else monotonic() + timeout
        while True:
            if deadline is None:
                step = slice_s
            else:
                step = min(slice_s, max(0.0, deadline - monotonic()))
            try:
                return await original(self, timeout=step)
            except Empty:
                if deadline is not None and monotonic() >= deadline:
                    raise

    setattr(get_msg, _PATCHED_ATTR, True)
    get_msg.__doc__ = original.__doc__
    AsyncZMQSocketChannel.get_msg = get_msg


def _on_config_inited(app, config) -> None:
    # 1. thirdparty/ 下的脚本与样式只按需加载，不注入每一页
    for name in ("html_js_files", "html_css_files"):
        entries = list(getattr(config, name, []) or [])
        kept = []
        for entry in entries:
            filename = entry[0] if isinstance(entry, (tuple, list)) else entry
            if isinstance(filename, str) and filename.startswith(_VENDOR_PREFIX):
                continue
            kept.append(entry)
        setattr(config, name, kept)

    # 2. 搜索词典改为绝对路径（相对于源目录）
    options = dict(config.html_search_options or {})
    dict_path = options.get("dict")
    if dict_path and not os.path.isabs(dict_path):
        options["dict"] = str(Path(app.srcdir, dict_path))
        config.html_search_options = options


def _is_thebe_script(js) -> bool:
    if isinstance(js, str):
        return js.endswith("sphinx-thebe.js")
    filename = os.fspath(js.filename or "")
    body = (js.attributes or {}).get("body", "") or ""
    return filename.endswith("sphinx-thebe.js") or "THEBE_JS_URL" in body


def _dedupe_scripts(app, pagename, templatename, context, doctree) -> None:
    """去掉重复的 ``<script>``。

    sphinx-thebe 0.3.1 注册的内联脚本（``const THEBE_JS_URL = …``）在页面上出现两份
    （一份 filename 为 None，一份为空字符串，Sphinx 的去重认不出来），浏览器报
    “Identifier 'THEBE_JS_URL' has already been declared”。完全相同的脚本只保留第一份。
    没有打开 thebe（``launch_buttons.thebe``）时，sphinx-thebe 的脚本整个去掉：jupyter-book 总是加载这个扩展，
    而它的内联脚本里写着 unpkg 上 thebe 的地址，本书不需要。
    """
    scripts = context.get("script_files")
    if not scripts:
        return
    thebe_on = bool((app.config.html_theme_options or {}).get("launch_buttons", {}).get("thebe"))
    seen = set()
    kept = []
    for js in scripts:
        if not thebe_on and _is_thebe_script(js):
            continue  # 没开 thebe：它的脚本（及其中指向 unpkg 的地址）没有用处
        if isinstance(js, str):  # 旧式写法：只有文件名
            key = (js, ())
        else:  # _JavaScript；内联脚本的 filename 有时是 None、有时是 ""，视为相同
            attrs = js.attributes or {}
            key = (os.fspath(js.filename or ""), tuple(sorted((k, str(v)) for k, v in attrs.items())))
        if key in seen:
            continue
        seen.add(key)
        kept.append(js)
    scripts[:] = kept


#: 标题开头手写的章号：“第4章”“第 4 章”
_CHAPTER_PREFIX = re.compile(r"^\s*第\s*\d+\s*章[\s：:、.．]*")
#: 标题开头手写的节号：“2 ”“2.3 ”“2.3.1. ”（后面必须跟空白）
_SECTION_PREFIX = re.compile(r"^\s*(\d+(?:\.\d+)*)\.?\s+(?=\S)")


def strip_manual_number(text: str, position: int | None = None) -> str:
    """去掉标题开头手写的“第N章”或“N.M”编号；没有就原样返回。

    ``position`` 是这一节在同级各节中的序号（从 1 起）。手写编号的最后一段必须在 1 与 ``position``
    之间才算编号，这样“2017 年的论文”“10000 的由来”之类以数字开头的普通标题不会被误删。
    """
    new = _CHAPTER_PREFIX.sub("", text, count=1)
    if new != text:
        return new if new.strip() else text
    match = _SECTION_PREFIX.match(text)
    if match is None:
        return text
    last = int(match.group(1).split(".")[-1])
    if position is not None and not 1 <= last <= position:
        return text
    new = text[match.end():]
    return new if new.strip() else text


def _strip_manual_numbers(app, doctree) -> None:
    from docutils import nodes

    docname = app.env.docname
    if not docname.startswith("notebooks/"):
        return
    for section in list(doctree.findall(nodes.section)):
        title = section.next_node(nodes.title)
        if title is None or not title.children:
            continue
        siblings = [n for n in section.parent.children if isinstance(n, nodes.section)]
        position = siblings.index(section) + 1
        first = title.children[0]
        if not isinstance(first, nodes.Text):
            continue
        text = str(first)
        if len(title.children) > 1:
            # 标题里还有别的节点（如 `代码`、公式）：第一段文字可能只有“1.7 ”，补一个占位字符再判断
            new = strip_manual_number(text + "\0", position)[:-1]
        else:
            new = strip_manual_number(text, position)
        if new != text:
            if new:
                title.replace(first, nodes.Text(new))
            else:
                title.remove(first)


_HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*$")
_NUMBERED_EXERCISE = re.compile(r"^练习\s*\d+")
_EXERCISE_SECTIONS = ("练习", "练习题", "习题")
EXERCISE_MARKER = "<!-- exercises-index -->"


def find_exercises(notebook_path: Path) -> list[str]:
    """笔记本里的练习标题（按出现顺序）。

    认两种写法：标题本身以“练习 N”开头；或者是“练习”一节下面紧挨着的下一级小标题。
    标题前手写的节号（如“3.2 ”）会去掉。
    """
    import json

    nb = json.loads(Path(notebook_path).read_text(encoding="utf-8"))
    found: list[str] = []
    section_level = None  # 当前所在“练习”一节的标题级别
    for cell in nb.get("cells", []):
        if cell.get("cell_type") != "markdown":
            continue
        source = cell.get("source", "")
        source = "".join(source) if isinstance(source, list) else source
        in_fence = False
        for line in source.splitlines():
            if line.lstrip().startswith(("```", "~~~")):
                in_fence = not in_fence
            match = None if in_fence else _HEADING.match(line.strip())
            if match is None:
                continue
            level, text = len(match.group(1)), strip_manual_number(match.group(2))
            if section_level is not None and level <= section_level:
                section_level = None
            if _NUMBERED_EXERCISE.match(text):
                found.append(text)
            elif section_level is not None and level == section_level + 1:
                found.append(text)
            elif text in _EXERCISE_SECTIONS:
                section_level = level
    return found


def exercise_index(srcdir: Path, chapters: list[str]) -> str:
    """生成练习索引（MyST Markdown）：每章一段，列出该章全部练习的标题。"""
    lines = ["| 章 | 练习 |", "|---|---|"]
    for docname in chapters:
        path = Path(srcdir, docname + ".ipynb")
        number = re.match(r"\d+", Path(docname).name)
        n = int(number.group()) if number else "?"
        if not path.exists():
            continue
        titles = find_exercises(path)
        items = "<br>".join(t.replace("|", "\\|") for t in titles) or "（本章暂无练习）"
        lines.append(f"| {{doc}}`第 {n} 章 <../{docname}>` | {items} |")
    return "\n".join(lines)


def _chapter_docnames(app) -> list[str]:
    site_map = getattr(app.config, "external_site_map", None)
    if site_map is None:
        return []
    return [name for name in site_map if name.startswith("notebooks/")]


def _on_source_read(app, docname, source) -> None:
    if EXERCISE_MARKER not in source[0]:
        return
    chapters = sorted(_chapter_docnames(app))
    source[0] = source[0].replace(EXERCISE_MARKER, exercise_index(Path(app.srcdir), chapters))


def chapter_number_from_file(docname: str) -> int | None:
    """``notebooks/15_triton_kernels`` → 15；不是以数字开头的章节页返回 None。"""
    if not docname.startswith("notebooks/") or "/solutions/" in docname:
        return None
    number = re.match(r"(\d+)_", Path(docname).name)
    return int(number.group(1)) if number else None


def _chapter_numbers_from_files(app, env) -> list[str]:
    """把 Sphinx 自动给的章号（目录里的序号）换成文件名里的章号；节号的其余部分不变。

    挂在 ``env-get-updated`` 上、排在 Sphinx 的目录收集器（它在这个事件里分配节号）之后。
    """
    for docname, numbers in env.toc_secnumbers.items():
        wanted = chapter_number_from_file(docname)
        if wanted is None:
            continue
        for anchor, secnumber in numbers.items():
            if secnumber:
                numbers[anchor] = (wanted, *secnumber[1:])
    # 侧栏与各页目录里的编号存在目录节点上（Sphinx 分配节号时写进去的），一并改
    from docutils import nodes

    for toc in env.tocs.values():
        for ref in toc.findall(nodes.reference):
            wanted = chapter_number_from_file(ref.get("refuri", "").split("#")[0].removesuffix(".html")) \
                if ref.get("refuri") else None
            if ref.get("secnumber") and wanted is not None:
                ref["secnumber"] = (wanted, *ref["secnumber"][1:])
    return []


def setup(app):
    patch_zmq_polling()
    app.connect("env-get-updated", _chapter_numbers_from_files, priority=900)
    app.connect("config-inited", _on_config_inited)
    app.connect("html-page-context", _dedupe_scripts, priority=900)
    # 要在 Sphinx 收集页面标题（TitleCollector，优先级 500）之前改标题
    app.connect("doctree-read", _strip_manual_numbers, priority=100)
    app.connect("source-read", _on_source_read)
    return {"version": "1.0", "parallel_read_safe": True, "parallel_write_safe": True}
