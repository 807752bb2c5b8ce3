"""生成随书字体子集（subset）的维护脚本，运行时不会被导入。

来源：Debian 软件包 ``fonts-noto-cjk``（1:20220127+repack1-1）中的
``NotoSansCJK-Regular.ttc``，取其中的 “Noto Sans CJK SC” 字面（face），SIL OFL 1.1 许可。

保留的字符：ASCII、Latin-1、希腊字母、常用标点/数学符号/箭头/上下标、CJK 标点、全角字符、
GB2312 全部字符（含一级、二级汉字共 6763 个），随库唐诗语料（:mod:`tformer_lib.data.poems`，三个划分的
题目、作者与正文）里出现的每一个字符（第 9–10 章的图里画的是真实的诗，其中约 1,460 个字不在 GB2312 里，
例如扩展 A 区的「㑹」），以及 ``--extra-text`` 给出的文本文件里出现的所有字符。随书的子集用了各章笔记本，
外加本书所依据的几篇原文（不在本仓库里）：只用笔记本重建时，子集可能少几个只在原文里出现的字。

用法（维护者）::

    apt-get download fonts-noto-cjk && dpkg-deb -x fonts-noto-cjk_*.deb x
    python -m tformer_lib.plotting._fontsubset x/usr/share/fonts/opentype/noto/NotoSansCJK-Regular.ttc \\
        --extra-text notebooks/*.ipynb notebooks/solutions/*.ipynb
"""

from __future__ import annotations

import argparse
from pathlib import Path

FAMILY = "Noto Sans CJK SC Subset"
OUT_NAME = "NotoSansCJKsc-Regular-subset.otf"


def base_codepoints() -> set[int]:
    """书中可能出现的全部字符的码位集合（不含额外文本）。"""
    cps: set[int] = set()
    ranges = [
        (0x0020, 0x007E),  # ASCII
        (0x00A0, 0x00FF),  # Latin-1
        (0x0391, 0x03C9),  # 希腊字母
        (0x2000, 0x206F),  # 通用标点（— – … ‘ ’ “ ” ‖ ′）
        (0x2070, 0x209F),  # 上标、下标
        (0x2100, 0x214F),  # 字母式符号
        (0x2150, 0x218F),  # 数字形式
        (0x2190, 0x21FF),  # 箭头
        (0x2200, 0x22FF),  # 数学运算符（− √ ∑ ≈ ≤ ≥ ∞ ⊙ ⊕）
        (0x2300, 0x23FF),  # 杂项技术符号（⏳）
        (0x2460, 0x24FF),  # 带圈数字 ①
        (0x2500, 0x257F),  # 制表符
        (0x25A0, 0x25FF),  # 几何图形 ■ ▲ ●
        (0x2600, 0x26FF),  # 杂项符号
        (0x2700, 0x27BF),  # 装饰符号（✅ ❌ ✓ ✗）
        (0x3000, 0x303F),  # CJK 标点
        (0x3200, 0x32FF),  # 带圈 CJK
        (0xFE30, 0xFE4F),  # CJK 兼容形式
        (0xFF00, 0xFFEF),  # 全角 ASCII 与半角片假名
        (0x1D400, 0x1D7FF),  # 数学字母数字符号（字体里有则保留）
    ]
    for lo, hi in ranges:
        cps.update(range(lo, hi + 1))
    cps.add(0x1D40)  # ᵀ（上标 T）
    cps.update({0x1D48, 0x1D4F, 0x1D50, 0x1D57, 0x1D58, 0x1D62})  # ᵈ ᵏ ᵐ ᵗ ᵘ ᵢ
    for hi in range(0xA1, 0xF8):
        for lo in range(0xA1, 0xFF):
            try:
                ch = bytes([hi, lo]).decode("gb2312")
            except UnicodeDecodeError:
                continue
            cps.add(ord(ch))
    return cps


def corpus_codepoints() -> set[int]:
    """随库唐诗语料三个划分里（题目、作者、正文）出现的全部字符的码位。"""
    from tformer_lib.data.poems import POEM_SPLITS, load_poems

    cps: set[int] = set()
    for split in POEM_SPLITS:
        for poem in load_poems(split):
            cps.update(ord(c) for c in poem.title + poem.author + poem.text)
    return cps


def build(ttc: Path, out_dir: Path, extra_texts: list[Path]) -> Path:
    from fontTools import subset
    from fontTools.ttLib import TTCollection

    coll = TTCollection(str(ttc))
    font = next(f for f in coll.fonts if f["name"].getDebugName(1) == "Noto Sans CJK SC")
    cps = base_codepoints() | corpus_codepoints()
    for p in extra_texts:
        cps.update(ord(c) for c in p.read_text(encoding="utf-8") if ord(c) >= 0x20)
    cmap = font.getBestCmap()
    wanted = sorted(c for c in cps if c in cmap)
    opts = subset.Options()
    opts.layout_features = ["*"]  # 保留 locl/vert 等特性，竖排与本地化字形都能用
    opts.name_IDs = ["*"]
    opts.name_languages = ["*"]
    opts.notdef_outline = True
    opts.glyph_names = False
    opts.hinting = False  # 去掉 hinting 节省体积，屏幕渲染由 FreeType 自动处理
    sub = subset.Subsetter(opts)
    sub.populate(unicodes=wanted)
    sub.subset(font)
    # 改族名，避免与系统上完整的 Noto Sans CJK SC 重名（Noto 无保留字体名，OFL 允许修改）
    name = font["name"]
    for rec in list(name.names):
        if rec.nameID in (1, 16):
            rec.string = FAMILY
        elif rec.nameID == 4:
            rec.string = FAMILY + " Regular"
        elif rec.nameID == 6:
            rec.string = FAMILY.replace(" ", "") + "-Regular"
        elif rec.nameID == 3:
            rec.string = "tformer_lib subset of NotoSansCJKsc-Regular 2.004"
    cff = font["CFF "].cff
    cff.fontNames = [FAMILY.replace(" ", "") + "-Regular"]
    out = out_dir / OUT_NAME
    font.save(str(out))
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("ttc", type=Path)
    ap.add_argument("--out-dir", type=Path, default=Path(__file__).resolve().parent.parent / "fonts")
    ap.add_argument("--extra-text", type=Path, nargs="*", default=[])
    a = ap.parse_args(argv)
    out = build(a.ttc, a.out_dir, a.extra_text)
    print(out, out.stat().st_size)


if __name__ == "__main__":
    main()
