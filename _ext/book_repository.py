"""仓库地址只写一处：``_config.yml`` 的 ``repository``（url、branch、path_to_book）与 ``launch_buttons``。

jupyter-book 1.x 会从这两节生成主题的 ``html_theme_options``（仓库按钮、Colab/Binder 启动按钮），可是
``_config.yml`` 里 ``sphinx.config.html_theme_options`` 一旦出现（我们要用它设 ``show_toc_level`` 等），就整个
替换掉生成的那份。这个扩展在 ``config-inited`` 时把 ``repository`` 与 ``launch_buttons`` 补回主题选项
（已显式写了的键不动），于是 ``html_theme_options`` 里不必、也不应再抄一遍仓库地址。

页面里写 ``{{REPO_URL}}``、``{{REPO_PIP}}`` 会在读入时换成仓库地址和 pip 能装的地址
（``git+<url>@<branch>``），代码块里也一样——改地址只改 ``_config.yml``。
"""

from __future__ import annotations

from pathlib import Path


def book_repository(srcdir: str | Path) -> dict:
    """读 ``_config.yml``，返回 {url, branch, path_to_book, launch_buttons}（缺的键不出现）。"""
    import yaml

    cfg = yaml.safe_load((Path(srcdir) / "_config.yml").read_text(encoding="utf-8")) or {}
    repo = dict(cfg.get("repository") or {})
    if cfg.get("launch_buttons"):
        repo["launch_buttons"] = dict(cfg["launch_buttons"])
    return repo


def _on_config_inited(app, config) -> None:
    repo = book_repository(app.srcdir)
    options = dict(config.html_theme_options or {})
    for option, key in (("repository_url", "url"), ("repository_branch", "branch"),
                        ("path_to_docs", "path_to_book"), ("launch_buttons", "launch_buttons")):
        if key in repo and option not in options:
            options[option] = repo[key]
    config.html_theme_options = options
    app.env_repository = repo


def _on_source_read(app, docname, source) -> None:
    repo = book_repository(app.srcdir)
    url = str(repo.get("url", "")).rstrip("/")
    branch = repo.get("branch")
    pip = f"git+{url}" + (f"@{branch}" if branch else "")
    source[0] = source[0].replace("{{REPO_URL}}", url).replace("{{REPO_PIP}}", pip)


def setup(app):
    app.connect("config-inited", _on_config_inited)
    app.connect("source-read", _on_source_read)
    return {"version": "1.0", "parallel_read_safe": True, "parallel_write_safe": True}
