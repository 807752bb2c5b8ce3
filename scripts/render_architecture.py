#!/usr/bin/env python
"""重画前言里的结构图：``book/figures/transformer_architecture.png``。

前言是 Markdown 页面，不能运行代码，所以图以 PNG 提交。它由库函数
:func:`tformer_lib.plotting.architecture.plot_transformer_architecture` 画出（与第 5 章用的是同一个函数），
``tests/test_plotting_architecture.py`` 每次都重画一遍并与提交的 PNG 逐像素比较：改了画图函数却忘了
运行本脚本，测试就会失败。用法::

    .venv/bin/python scripts/render_architecture.py
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUTPUT = ROOT / "book" / "figures" / "transformer_architecture.png"
DPI = 90  # 945×1080 像素：书的正文栏宽里看得清 9 号字


def render(path: Path = OUTPUT) -> Path:
    """画论文基础模型（N = 6，post-LN）的结构图并写入 ``path``。"""
    sys.path.insert(0, str(ROOT))
    from tformer_lib.plotting.architecture import plot_transformer_architecture

    fig = plot_transformer_architecture()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=DPI, metadata={"Software": None})  # 不写 matplotlib 版本号，重画时字节更稳定
    return path


if __name__ == "__main__":
    print("已写入", render().relative_to(ROOT))
