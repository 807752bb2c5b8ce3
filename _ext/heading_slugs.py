"""标题锚点（heading anchor）的名字：``## 练习 3（找错 ★★）：……`` 的锚点是 ``练习-3``。

_config.yml 里 ``myst_heading_slug_func: heading_slugs.slugify``。每章的练习用
``[参考答案](solutions/05_solutions.ipynb#练习-3)`` 链到参考答案笔记本里的 ``## 练习 3 …`` 一节；
MyST 默认的 GitHub 式锚点会把括号里的题型、难度也拼进去（``练习-3找错-掩码``），题目一改链接就断。
其余标题仍用 MyST 的默认规则。
"""

from __future__ import annotations

import re

from myst_parser.mdit_to_docutils.base import default_slugify

_EXERCISE = re.compile(r"^\s*练习\s*(\d+)(?!\d)")


def slugify(title: str) -> str:
    m = _EXERCISE.match(title)
    if m:
        return f"练习-{m.group(1)}"
    return default_slugify(title)
