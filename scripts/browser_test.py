#!/usr/bin/env python
"""在真实的无头 Chromium 里检查构建好的 HTML 书（``_build/html``）。

用法（先构建：``bash scripts/build_book.sh``）::

    .venv/bin/python scripts/browser_test.py                  # 检查全部页面
    .venv/bin/python scripts/browser_test.py --screenshots /tmp/shots   # 另存每页的整页截图

需要 Debian 的 ``chromium``（``apt-get install -y chromium``，路径 ``/usr/bin/chromium``，可用
``--chromium`` 或环境变量 ``CHROMIUM`` 改）和 Python 包 ``playwright``（test extra；不需要
``playwright install``，我们直接驱动系统的 Chromium）。

它在本机起一个只服务 ``_build/html`` 的 HTTP 服务器，**拦截一切发往别处的请求**（书必须离线可读），
然后对 ``_toc.yml`` 里的每一页检查：

* 页面加载，控制台没有错误、没有未捕获的异常、没有失败或 4xx/5xx 的请求（任何一个 404 都算失败），
  也没有请求外部网址；页面上所有样式表（包括小部件脚本注入的）里 ``@font-face`` 的每个字体地址都取得到
  （每条规则的第一个地址，即浏览器会取的那个；不论这次是否真的用到那个字体——图标字体只在某些小部件
  出现时才下载，404 因此时有时无）；
* 公式已由 MathJax 排版：有 ``mjx-container``，且正文（不含代码块）里不再残留 ``$$``、``\\(``、``\\[``；
* 每个 ``<img>``（包括小部件里的图）都加载成功（``naturalWidth > 0``）；
* 章节页有 Colab、Binder 启动按钮，且“下载 .ipynb”链接确实能取到笔记本；
* 章节页的每道练习（``### 练习 N …`` 一节）都链到 ``notebooks/solutions/`` 里的参考答案页，链接的页面存在、
  锚点（``#…``）在那一页上确有其元素；参考答案页本身也在目录里，和其他页面一样逐项检查；
* 带小部件状态的页面确实渲染出了小部件；
* 有静态探索器的章节页（表 :data:`STATIC_EXPLORERS`）：在浏览器里把那个控件挪一档，显示的图确实换了
  （比较前后图像像素的 SHA-256）——这只靠 jslink 与预先画好的帧，没有内核；
* 版面（``_static/tformer.css``）：1280 px 宽的窗口里正文（``.bd-article`` 去掉内边距）至少
  :data:`MIN_ARTICLE_WIDTH` px 宽，页面没有横向滚动条，切换按钮（ToggleButtons）的标签没有被截断；
  每一页再在 400 px 宽的手机窗口里打开一次，同样不许横向滚动、不许截断标签；:data:`LAYOUT_PAGES` 里的几章
  还在 1280、1440、1680 px 宽时检查正文宽度，以及右侧“本页目录”——是抽屉时（< 1600 px）顶栏按钮真能打开它，
  占一列时（≥ 1600 px）没有被裁掉；窄屏上顶栏的导航按钮真能打开目录导航；

最后在搜索页查询“注意力”和“位置编码”，要求都有结果。任何一项失败都会列出原因并以非零状态退出。
"""

from __future__ import annotations

import argparse
import functools
import http.server
import os
import sys
import threading
import urllib.parse
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_QUERIES = ("注意力", "位置编码")
LAUNCH_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-quic",
]

# 正文中不应残留的未排版 TeX 片段（代码块、MathJax 输出本身除外）
RAW_TEX_JS = r"""
() => {
  const main = document.querySelector('main') || document.body;
  const clone = main.cloneNode(true);
  clone.querySelectorAll('pre, code, script, style, mjx-container, .highlight, textarea')
       .forEach(e => e.remove());
  const text = clone.textContent || '';
  const found = [];
  for (const pat of ['$$', '\\(', '\\[', '\\frac', '\\sqrt', '\\begin{']) {
    const i = text.indexOf(pat);
    if (i >= 0) found.push(pat + ' …' + text.slice(Math.max(0, i - 30), i + 40).replace(/\s+/g, ' ') + '…');
  }
  return found;
}
"""

MATH_STATE_JS = r"""
() => ({
  sphinxMath: document.querySelectorAll('main .math, main span.math, main div.math').length,
  mjx: document.querySelectorAll('mjx-container').length,
  mjxErrors: document.querySelectorAll('mjx-merror, mjx-container [data-mjx-error]').length,
})
"""

#: 每个有静态探索器的章节页 → 网页上可拖动的那个控件的说明文字（``description``）。
#: 笔记本还没按新的探索器重新执行时，这一页会明确地失败（“没有找到……”），重新执行即可。
STATIC_EXPLORERS = {
    "notebooks/01_tokens_embeddings": "句子",
    "notebooks/02_positional_encoding": "位置 pos",
    "notebooks/03_attention": "d_k",
    "notebooks/04_multihead_masks_ffn": "序列 1 长度",
    "notebooks/05_encoder_decoder": "头",
    "notebooks/06_output_softmax": "温度 T",
    "notebooks/07_training": "预热步数 warmup",
    "notebooks/08_inference_efficiency": "d_model",
    "notebooks/09_language_model": "采样设置",
    "notebooks/11_memory_precision": "批大小 B",
    "notebooks/12_distributed": "微批数 m",
    "notebooks/13_serving": "引擎步",
}

#: 1280 px（以及 :data:`WIDE_VIEWPORTS`）宽的窗口里，正文（``.bd-article`` 的内容区，不含左右内边距）至少这么宽。
#: 主题默认只有 688 px（代码单元横向滚动、三联图的刻度缩到约 7 px）；_static/tformer.css 把它放宽到约 960 px
#: （1280 px 时右侧目录收进抽屉）。issue 21 §5。
MIN_ARTICLE_WIDTH = 900
#: 手机的窗口：每一页都在这里再打开一次
NARROW_VIEWPORT = {"width": 400, "height": 800}
#: 再在宽屏窗口里检查版面的几章（三联图、长代码、表格多的几章）：1280、1440 px 时右侧目录是抽屉，1680 px 时占一列
LAYOUT_PAGES = ("notebooks/10_modern_architecture", "notebooks/11_memory_precision", "notebooks/12_distributed",
                "notebooks/13_serving", "notebooks/16_experts_long_context")
WIDE_VIEWPORTS = ({"width": 1280, "height": 900}, {"width": 1440, "height": 900}, {"width": 1680, "height": 1000})

# 版面：正文宽度、横向滚动、被截断的切换按钮标签、右侧目录（是一列时是否被裁掉）
LAYOUT_JS = r"""
() => {
  const art = document.querySelector('.bd-article');
  let article = null;
  if (art) {
    const cs = getComputedStyle(art);
    article = Math.round(art.clientWidth - parseFloat(cs.paddingLeft) - parseFloat(cs.paddingRight));
  }
  const root = document.documentElement;
  const truncated = Array.from(document.querySelectorAll('main .widget-toggle-button'))
    .filter(b => b.getBoundingClientRect().width > 0 && b.scrollWidth > b.clientWidth + 1)
    .map(b => `“${b.textContent.trim()}”（${b.clientWidth}/${b.scrollWidth} px）`);
  const toc = document.getElementById('pst-secondary-sidebar');
  const tr = toc ? toc.getBoundingClientRect() : null;
  const tocColumn = !!(toc && tr.width > 0 && getComputedStyle(toc).visibility !== 'hidden'
                       && tr.left >= 0 && tr.right <= window.innerWidth + 1);
  return {article, scrollWidth: root.scrollWidth, clientWidth: root.clientWidth, truncated, tocColumn,
          tocClipped: tocColumn && toc.scrollWidth > toc.clientWidth + 1 ? [toc.clientWidth, toc.scrollWidth] : null};
}
"""

# 所有样式表里 @font-face 的字体地址，逐个取一次
FONT_FACES_JS = r"""
async () => {
  const urls = new Set();
  const walk = (rules, base) => {
    for (const r of rules) {
      if (r.type === CSSRule.FONT_FACE_RULE) {
        // 浏览器按顺序取第一个它支持的格式：Chromium 取的就是第一个 url(...)（woff2）
        const src = r.style.getPropertyValue('src') || '';
        const m = src.match(/url\(\s*["']?([^"')]+)["']?\s*\)/);
        if (m && !m[1].startsWith('data:')) urls.add(new URL(m[1], base).href);
      } else if (r.cssRules) {
        walk(r.cssRules, base);
      }
    }
  };
  for (const sheet of document.styleSheets) {
    let rules;
    try { rules = sheet.cssRules; } catch (e) { continue; }
    walk(rules, sheet.href || document.baseURI);
  }
  const bad = [];
  for (const u of urls) {
    try {
      const r = await fetch(u);
      if (!r.ok) bad.push(`${u} → HTTP ${r.status}`);
    } catch (e) {
      bad.push(`${u} → ${e}`);
    }
  }
  return {n: urls.size, bad};
}
"""

# 一个探索器盒子里当前看得见的那张图的像素指纹（SHA-256）；没有可见的图时返回 null
SHOWN_IMAGE_JS = r"""
async (box) => {
  const img = Array.from(box.querySelectorAll('img'))
    .find(i => i.complete && i.naturalWidth > 0 && i.getBoundingClientRect().height > 0);
  if (!img) return null;
  const c = document.createElement('canvas');
  c.width = img.naturalWidth; c.height = img.naturalHeight;
  c.getContext('2d').drawImage(img, 0, 0);
  const bytes = new TextEncoder().encode(c.toDataURL('image/png'));
  const digest = await crypto.subtle.digest('SHA-256', bytes);
  return Array.from(new Uint8Array(digest)).map(b => b.toString(16).padStart(2, '0')).join('');
}
"""

# 页面上的练习标题（去掉章节编号与 ¶），以及各自那一节里指向参考答案页的链接
EXERCISES_JS = r"""
() => Array.from(document.querySelectorAll('main section > h2, main section > h3, main section > h4'))
  .map(h => ({h, text: h.textContent.replace(/[#¶]/g, '').replace(/^[\d.\s]+/, '').trim()}))
  .filter(e => /^练习\s*\d+/.test(e.text))
  .map(e => ({
    title: e.text.slice(0, 60),
    links: Array.from(e.h.parentElement.querySelectorAll('a[href]'))
      .map(a => a.href).filter(u => u.includes('/notebooks/solutions/')),
  }))
"""

IMAGES_JS = r"""
() => Array.from(document.querySelectorAll('main img')).map(img => ({
  src: img.getAttribute('src') || '(no src)',
  ok: img.complete && img.naturalWidth > 0,
  w: img.naturalWidth,
}))
"""


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):  # 不打印每个请求
        pass


def start_server(directory: Path) -> tuple[http.server.ThreadingHTTPServer, str]:
    handler = functools.partial(_QuietHandler, directory=str(directory))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    return server, f"http://127.0.0.1:{server.server_address[1]}"


def pages_from_toc(toc_path: Path) -> tuple[list[str], set[str]]:
    """返回 (全部页面, 其中的笔记本章节页)，都是相对于 html 目录、不带后缀的 docname。"""
    import yaml

    toc = yaml.safe_load(toc_path.read_text(encoding="utf-8"))
    book = toc_path.resolve().parent
    docs: list[str] = [toc["root"]]

    def walk(entries):
        for entry in entries or []:
            if "file" in entry:
                docs.append(entry["file"])
            if "glob" in entry:  # 如 notebooks/solutions/*：按文件名排序展开，和 jupyter-book 一样
                found = sorted({str(p.relative_to(book).with_suffix("")) for p in book.glob(entry["glob"])
                                if p.suffix in (".md", ".ipynb")})
                docs.extend(found)
            walk(entry.get("sections"))
            walk(entry.get("chapters"))

    walk(toc.get("parts"))
    walk(toc.get("chapters"))
    walk(toc.get("sections"))
    docs = [str(Path(d).with_suffix("")) if Path(d).suffix in (".md", ".ipynb") else d for d in docs]
    notebooks = {d for d in docs if (book / (d + ".ipynb")).exists() or d.startswith("notebooks/")}
    return docs, notebooks


class Checker:
    def __init__(self, base: str, timeout_ms: int, screenshot_dir: Path | None,
                 explorers: dict[str, str] | None = None, docs: list[str] | None = None):
        self.base = base
        self.explorers = STATIC_EXPLORERS if explorers is None else explorers
        self.docs = set(docs or [])
        self.timeout_ms = timeout_ms
        self.screenshot_dir = screenshot_dir
        self.failures: list[str] = []
        self.notes: list[str] = []

    def fail(self, page: str, msg: str) -> None:
        self.failures.append(f"{page}: {msg}")

    # ---- 每页的监听 -------------------------------------------------------
    def _attach(self, page, label: str, problems: list[str]) -> None:
        host = urllib.parse.urlsplit(self.base).netloc

        def on_console(msg):
            if msg.type == "error":
                problems.append(f"控制台错误：{msg.text}")

        def on_pageerror(exc):
            problems.append(f"未捕获的异常：{exc}")

        def on_requestfailed(req):
            if urllib.parse.urlsplit(req.url).netloc == host:
                problems.append(f"请求失败：{req.url} ({req.failure})")

        def on_response(resp):
            if resp.status >= 400 and urllib.parse.urlsplit(resp.url).netloc == host:
                problems.append(f"HTTP {resp.status}：{resp.url}")

        page.on("console", on_console)
        page.on("pageerror", on_pageerror)
        page.on("requestfailed", on_requestfailed)
        page.on("response", on_response)

    def _route(self, context, external: list[str]) -> None:
        host = urllib.parse.urlsplit(self.base).netloc

        def handler(route):
            url = route.request.url
            parts = urllib.parse.urlsplit(url)
            if parts.scheme in ("data", "blob", "about") or parts.netloc == host:
                route.continue_()
            else:
                external.append(url)
                route.abort()

        context.route("**/*", handler)

    # ---- 检查一页 ---------------------------------------------------------
    def check_page(self, context, doc: str, is_chapter: bool) -> None:
        url = f"{self.base}/{urllib.parse.quote(doc)}.html"
        problems: list[str] = []
        page = context.new_page()
        self._attach(page, doc, problems)
        try:
            resp = page.goto(url, wait_until="load", timeout=self.timeout_ms)
            if resp is None or resp.status != 200:
                self.fail(doc, f"页面打不开（HTTP {resp.status if resp else '无响应'}）")
                return
            self._check_math(page, doc)
            self._check_widgets(page, doc)  # 先等小部件渲染完，它们里面的图也要参加下面的检查
            self._check_images(page, doc)
            self._check_layout(page, doc, min_width=MIN_ARTICLE_WIDTH)
            self._check_font_faces(page, doc)
            if is_chapter:
                self._check_launch_and_download(page, doc)
            if is_chapter and not doc.startswith("notebooks/solutions/"):
                self._check_solution_links(page, doc)
            if doc in self.explorers:
                self._check_static_explorer(page, doc, self.explorers[doc])
            page.wait_for_timeout(300)  # 让迟到的控制台消息也被收集
            if self.screenshot_dir is not None:
                out = self.screenshot_dir / (doc.replace("/", "__") + ".png")
                page.screenshot(path=str(out), full_page=True)
        except Exception as exc:  # playwright 超时等
            self.fail(doc, f"检查时出错：{type(exc).__name__}: {exc}")
        finally:
            page.close()
        for p in problems:
            self.fail(doc, p)

    def _check_math(self, page, doc: str) -> None:
        has_mathjax = page.evaluate("() => !!document.querySelector('script[src*=\"mathjax\"]')")
        if has_mathjax:
            try:
                page.wait_for_function(
                    "() => window.MathJax && MathJax.startup && MathJax.startup.promise",
                    timeout=self.timeout_ms,
                )
            except Exception:
                self.fail(doc, f"MathJax 没有在 {self.timeout_ms // 1000} 秒内启动（脚本没加载到？）")
                return
            page.evaluate("() => MathJax.startup.promise")
        state = page.evaluate(MATH_STATE_JS)
        if state["sphinxMath"] and not has_mathjax:
            self.fail(doc, "页面有公式，却没有加载 MathJax")
        if state["sphinxMath"] and state["mjx"] == 0:
            self.fail(doc, f"{state['sphinxMath']} 处公式没有被 MathJax 排版（没有 mjx-container）")
        if state["mjxErrors"]:
            self.fail(doc, f"MathJax 报告了 {state['mjxErrors']} 处 TeX 错误")
        for raw in page.evaluate(RAW_TEX_JS):
            self.fail(doc, f"正文残留未排版的 TeX：{raw}")
        self.notes.append(f"{doc}: {state['mjx']} 个公式")

    def _check_images(self, page, doc: str) -> None:
        # 图片可能在 load 之后才解码完，给一点时间
        page.wait_for_function(
            "() => Array.from(document.querySelectorAll('main img')).every(i => i.complete)",
            timeout=self.timeout_ms,
        )
        images = page.evaluate(IMAGES_JS)
        for img in images:
            if not img["ok"]:
                self.fail(doc, f"图片没有显示（naturalWidth={img['w']}）：{img['src'][:120]}")
        if images:
            self.notes.append(f"{doc}: {len(images)} 张图")

    def _check_widgets(self, page, doc: str) -> None:
        views = page.evaluate(
            "() => document.querySelectorAll('script[type=\"application/vnd.jupyter.widget-view+json\"]').length"
        )
        if not views:
            return
        try:
            page.wait_for_function(
                "() => document.querySelectorAll('.jupyter-widgets, .widget-inline-hbox, .widget-slider').length > 0",
                timeout=self.timeout_ms,
            )
        except Exception:
            self.fail(doc, f"有 {views} 个小部件视图，但没有一个被渲染出来（html-manager 没有加载？）")
            return
        self.notes.append(f"{doc}: {views} 个小部件视图已渲染")

    def _check_launch_and_download(self, page, doc: str) -> None:
        hrefs = page.evaluate("() => Array.from(document.querySelectorAll('a[href]')).map(a => a.href)")
        for needle, what in (("colab.research.google.com", "Colab 启动按钮"), ("mybinder.org", "Binder 启动按钮")):
            if not any(needle in h for h in hrefs):
                self.fail(doc, f"没有{what}")
        downloads = [h for h in hrefs if "/_sources/" in h and h.endswith(".ipynb")]
        if not downloads:
            self.fail(doc, "没有下载 .ipynb 的按钮")
            return
        resp = page.request.get(downloads[0])
        if resp.status != 200 or b'"cells"' not in resp.body():
            self.fail(doc, f"下载的笔记本打不开（HTTP {resp.status}）：{downloads[0]}")

    def _check_font_faces(self, page, doc: str) -> None:
        result = page.evaluate(FONT_FACES_JS)
        for bad in result["bad"]:
            self.fail(doc, f"@font-face 的字体取不到：{bad}")
        if result["n"]:
            self.notes.append(f"{doc}: {result['n']} 个 @font-face 字体地址都取得到")

    def _check_solution_links(self, page, doc: str) -> None:
        exercises = page.evaluate(EXERCISES_JS)
        if not exercises:
            self.fail(doc, "章节页没有找到练习（“### 练习 N …”标题）")
            return
        targets: set[str] = set()
        for ex in exercises:
            if not ex["links"]:
                self.fail(doc, f"练习“{ex['title']}”没有指向参考答案页（notebooks/solutions/…）的链接")
            targets.update(ex["links"])
        pages: dict[str, str] = {}
        for url in sorted(targets):
            parts = urllib.parse.urlsplit(url)
            page_url = urllib.parse.urlunsplit(parts._replace(fragment=""))
            if page_url not in pages:
                resp = page.request.get(page_url)
                pages[page_url] = resp.text() if resp.status == 200 else ""
                if resp.status != 200:
                    self.fail(doc, f"参考答案页打不开（HTTP {resp.status}）：{page_url}")
                    continue
                target_doc = urllib.parse.unquote(parts.path).lstrip("/").removesuffix(".html")
                if self.docs and target_doc not in self.docs:
                    self.fail(doc, f"参考答案页 {target_doc} 不在 _toc.yml 里（浏览器测试没有检查它的渲染）")
            frag = urllib.parse.unquote(parts.fragment)
            text = pages[page_url]
            if text and frag and f'id="{frag}"' not in text:
                self.fail(doc, f"参考答案链接的锚点 #{frag} 在 {page_url} 上不存在")
        self.notes.append(f"{doc}: {len(exercises)} 道练习都链到参考答案（{len(pages)} 页）")

    def _check_static_explorer(self, page, doc: str, label: str) -> None:
        """把说明文字为 label 的控件挪一档，要求探索器里显示的图换掉（没有内核，只靠 jslink）。"""
        import re

        name = re.compile(rf"^\s*{re.escape(label)}\s*$")
        control = page.locator(".widget-slider, .widget-dropdown").filter(
            has=page.locator(".widget-label", has_text=name)).first
        if control.count() == 0:
            self.fail(doc, f"没有找到静态探索器的控件“{label}”（笔记本需要按新的探索器重新执行："
                           "python scripts/execute_notebooks.py）")
            return
        box = control.locator("xpath=ancestor::div[contains(@class, 'widget-vbox')][.//img][1]")
        if box.count() == 0 or not box.locator(".widget-stack, .jupyter-widget-stack, img").count():
            self.fail(doc, f"控件“{label}”不在一个带图的探索器里")
            return
        control.scroll_into_view_if_needed()
        before = box.evaluate(SHOWN_IMAGE_JS)
        if before is None:
            self.fail(doc, f"控件“{label}”的探索器里没有显示任何图")
            return
        select = control.locator("select")
        if select.count():
            n = select.evaluate("s => s.options.length")
            i = select.evaluate("s => s.selectedIndex")
            select.select_option(index=(i + 1) % n)
        else:
            handle = control.locator(".noUi-handle").first
            at_max = handle.evaluate("h => h.getAttribute('aria-valuenow') === h.getAttribute('aria-valuemax')")
            handle.focus()
            page.keyboard.press("ArrowLeft" if at_max else "ArrowRight")
        try:
            page.wait_for_function(
                "([box, js, before]) => (eval(js))(box).then(h => h !== null && h !== before)",
                arg=[box.element_handle(), SHOWN_IMAGE_JS, before], timeout=self.timeout_ms, polling=200)
        except Exception:
            self.fail(doc, f"挪动“{label}”之后，探索器显示的图没有变（jslink 或预先画好的帧缺失？）")
            return
        self.notes.append(f"{doc}: 挪动“{label}”后图换了（没有内核）")

    # ---- 版面 -------------------------------------------------------------
    def _check_layout(self, page, doc: str, min_width: int | None = None) -> dict:
        """正文够宽（min_width 不为 None 时）、没有横向滚动条、切换按钮的标签完整；返回测得的数。"""
        size = page.viewport_size
        where = f"{size['width']}×{size['height']}"
        m = page.evaluate(LAYOUT_JS)
        if m["article"] is None:
            self.fail(doc, f"{where}：找不到正文（.bd-article），量不了版面——主题换了结构？")
        elif min_width is not None and m["article"] < min_width:
            self.fail(doc, f"{where}：正文只有 {m['article']} px 宽，应至少 {min_width} px（_static/tformer.css）")
        if m["scrollWidth"] > m["clientWidth"]:
            self.fail(doc, f"{where}：页面横向滚动（内容 {m['scrollWidth']} px，窗口 {m['clientWidth']} px）")
        for label in m["truncated"]:
            self.fail(doc, f"{where}：切换按钮的标签被截断：{label}")
        if m["tocClipped"]:
            self.fail(doc, f"{where}：右侧目录被裁掉（宽 {m['tocClipped'][0]} px，内容 {m['tocClipped'][1]} px）")
        if m["article"] is not None:
            self.notes.append(f"{doc}: {where} 正文 {m['article']} px，页面宽 {m['scrollWidth']} px")
        return m

    def _check_drawer(self, page, doc: str, toggle: str, dialog_id: str, what: str) -> None:
        """点看得见的 toggle 按钮，要求 id 为 dialog_id 的抽屉打开且里面有链接；再按 Esc 关上。"""
        where = f"{page.viewport_size['width']} px"
        button = page.locator(f"{toggle}:visible")
        if button.count() != 1:
            self.fail(doc, f"{where}：应有且只有一个看得见的{what}按钮（{toggle}），找到 {button.count()} 个")
            return
        button.click()
        try:
            page.wait_for_function(
                "id => { const d = document.getElementById(id); return d && d.open && d.querySelectorAll('a[href]').length > 0"
                " && d.getBoundingClientRect().width > 0; }",
                arg=dialog_id, timeout=5000)
        except Exception:
            self.fail(doc, f"{where}：点{what}按钮后没有打开{what}（#{dialog_id}）——主题脚本只绑定页面上第一个按钮")
            return
        page.keyboard.press("Escape")
        page.wait_for_function("id => !document.getElementById(id).open", arg=dialog_id, timeout=5000)
        self.notes.append(f"{doc}: {where} 点按钮能打开{what}")

    def _open(self, context, doc: str) -> tuple:
        """打开一页并等公式与小部件排好（它们决定宽度）；返回 (page, problems)。"""
        problems: list[str] = []
        page = context.new_page()
        self._attach(page, doc, problems)
        page.goto(f"{self.base}/{urllib.parse.quote(doc)}.html", wait_until="load", timeout=self.timeout_ms)
        if page.evaluate("() => !!document.querySelector('script[src*=\"mathjax\"]')"):
            page.wait_for_function("() => window.MathJax && MathJax.startup && MathJax.startup.promise",
                                   timeout=self.timeout_ms)
            page.evaluate("() => MathJax.startup.promise")
        if page.evaluate("() => document.querySelectorAll("
                         "'script[type=\"application/vnd.jupyter.widget-view+json\"]').length"):
            page.wait_for_function("() => document.querySelectorAll('.jupyter-widgets, .widget-inline-hbox').length > 0",
                                   timeout=self.timeout_ms)
        page.wait_for_function("() => Array.from(document.querySelectorAll('main img')).every(i => i.complete)",
                               timeout=self.timeout_ms)
        return page, problems

    def check_layouts(self, browser, docs: list[str], chapters: set[str]) -> None:
        """每一页在手机宽度下不横向滚动；LAYOUT_PAGES 在更宽的窗口里正文够宽、右侧目录可用。"""
        first_chapter = next((d for d in docs if d in chapters and not d.startswith("notebooks/solutions/")), None)
        runs = [(NARROW_VIEWPORT, docs)] + [(vp, [d for d in LAYOUT_PAGES if d in self.docs or not self.docs])
                                            for vp in WIDE_VIEWPORTS]
        for viewport, pages in runs:
            narrow = viewport is NARROW_VIEWPORT
            context = browser.new_context(viewport=viewport, locale="zh-CN")
            external: list[str] = []
            self._route(context, external)
            for doc in pages:
                problems: list[str] = []
                page = None
                try:
                    page, problems = self._open(context, doc)
                    m = self._check_layout(page, doc, min_width=None if narrow else MIN_ARTICLE_WIDTH)
                    if narrow and doc == first_chapter:
                        self._check_drawer(page, doc, ".primary-toggle", "pst-primary-sidebar-modal", "目录导航")
                        self._check_drawer(page, doc, ".secondary-toggle", "pst-secondary-sidebar-modal", "本页目录")
                    elif not narrow and not m["tocColumn"]:
                        self._check_drawer(page, doc, ".secondary-toggle", "pst-secondary-sidebar-modal", "本页目录")
                    if self.screenshot_dir is not None:
                        name = f"{doc.replace('/', '__')}_{viewport['width']}.png"
                        page.screenshot(path=str(self.screenshot_dir / name), full_page=False)
                except Exception as exc:
                    self.fail(doc, f"{viewport['width']} px 宽时检查出错：{type(exc).__name__}: {exc}")
                finally:
                    if page is not None:
                        page.close()
                for p in problems:
                    self.fail(doc, f"{viewport['width']} px 宽时：{p}")
            context.close()
            for url in sorted(set(external)):
                self.failures.append(f"请求了外部网址（书必须离线可读）：{url}")

    # ---- 搜索 -------------------------------------------------------------
    def check_search(self, context, queries) -> None:
        for q in queries:
            label = f"search.html?q={q}"
            problems: list[str] = []
            page = context.new_page()
            self._attach(page, label, problems)
            try:
                page.goto(f"{self.base}/search.html?q={urllib.parse.quote(q)}", wait_until="load",
                          timeout=self.timeout_ms)
                # Sphinx 7：结果在 #search-results ul.search 里；搜索结束后出现 .search-summary 文本
                page.wait_for_function(
                    "() => document.querySelectorAll('#search-results ul.search li').length > 0"
                    " || (document.querySelector('#search-results p.search-summary')"
                    "     && document.querySelector('#search-results p.search-summary').textContent.length > 0"
                    "     && !document.querySelector('#search-progress')?.textContent)",
                    timeout=self.timeout_ms,
                )
                page.wait_for_timeout(500)
                hits = page.evaluate(
                    "() => Array.from(document.querySelectorAll('#search-results ul.search li a'))"
                    ".map(a => a.textContent.trim())"
                )
                if not hits:
                    self.fail(label, f"搜索“{q}”没有结果")
                else:
                    self.notes.append(f"搜索“{q}”：{len(hits)} 条结果，如 {hits[:3]}")
                if self.screenshot_dir is not None:
                    page.screenshot(path=str(self.screenshot_dir / f"search_{q}.png"), full_page=False)
            except Exception as exc:
                self.fail(label, f"搜索检查出错：{type(exc).__name__}: {exc}")
            finally:
                page.close()
            for p in problems:
                self.fail(label, p)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="在无头 Chromium 里检查构建好的书")
    parser.add_argument("--html", type=Path, default=ROOT / "_build" / "html", help="HTML 目录")
    parser.add_argument("--toc", type=Path, default=ROOT / "_toc.yml", help="_toc.yml 路径")
    parser.add_argument("--chromium", default=os.environ.get("CHROMIUM", "/usr/bin/chromium"))
    parser.add_argument("--timeout", type=float, default=30.0, help="每步等待的秒数")
    parser.add_argument("--screenshots", type=Path, default=None, help="把每页整页截图存到此目录")
    parser.add_argument("--query", action="append", default=None,
                        help="搜索页要能找到的词（可重复；默认：注意力、位置编码）")
    parser.add_argument("--explorer", action="append", default=None, metavar="页面=控件说明",
                        help="替换静态探索器表（可重复，如 notebooks/03_attention=d_k）；默认用脚本里的表")
    parser.add_argument("-v", "--verbose", action="store_true", help="列出每页的检查摘要")
    args = parser.parse_args(argv)

    if not (args.html / "index.html").exists():
        print(f"找不到 {args.html}/index.html：请先构建（bash scripts/build_book.sh）。", file=sys.stderr)
        return 2
    if not Path(args.chromium).exists():
        print(f"找不到 Chromium：{args.chromium}（Debian：apt-get install -y chromium）。", file=sys.stderr)
        return 2
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        print("缺少 playwright：pip install -e '.[test]'", file=sys.stderr)
        return 2

    docs, chapters = pages_from_toc(args.toc)
    if args.screenshots is not None:
        args.screenshots.mkdir(parents=True, exist_ok=True)
    server, base = start_server(args.html.resolve())
    explorers = None
    if args.explorer:
        explorers = dict(item.split("=", 1) for item in args.explorer)
    checker = Checker(base, int(args.timeout * 1000), args.screenshots, explorers, docs)
    external: list[str] = []
    try:
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=args.chromium, headless=True, args=LAUNCH_ARGS)
            context = browser.new_context(viewport={"width": 1280, "height": 900}, locale="zh-CN")
            checker._route(context, external)
            for doc in docs:
                checker.check_page(context, doc, doc in chapters)
            checker.check_search(context, args.query or DEFAULT_QUERIES)
            context.close()
            checker.check_layouts(browser, docs, chapters)
            browser.close()
    finally:
        server.shutdown()

    for url in sorted(set(external)):
        checker.failures.append(f"请求了外部网址（书必须离线可读）：{url}")

    if args.verbose:
        for note in checker.notes:
            print("  " + note)
    print(f"检查了 {len(docs)} 个页面（其中 {len(chapters)} 个章节页）和 "
          f"{len(args.query or DEFAULT_QUERIES)} 次搜索。")
    if checker.failures:
        print(f"\n浏览器测试失败，共 {len(checker.failures)} 个问题：", file=sys.stderr)
        for f in checker.failures:
            print("  ✗ " + f, file=sys.stderr)
        return 1
    print("浏览器测试通过：无控制台错误、无 404，公式已排版，图片完整，练习都链到参考答案，"
          f"静态探索器能拖动，搜索可用；1280 px 宽时正文 ≥ {MIN_ARTICLE_WIDTH} px，400 px 宽时不横向滚动，侧栏按钮能用。")
    return 0


if __name__ == "__main__":
    sys.exit(main())
