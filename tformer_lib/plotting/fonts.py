"""随书中文字体：运行时注册，不写 matplotlib 自己的任何文件。

包里附带一个 SIL OFL 1.1 许可的字体子集（subset）``fonts/NotoSansCJKsc-Regular-subset.otf``
（族名 “Noto Sans CJK SC Subset”，含 ASCII、Latin-1、希腊字母、常用数学符号与 CJK 标点、
GB2312 全部 6763 个汉字以及文章 A、B 里出现的所有字符）。:func:`register_cjk_font` 用
``matplotlib.font_manager.fontManager.addfont`` 把它加入本进程的字体表，并设置 rcParams，
于是图中的中文标题、坐标轴标签与负号都能正常显示，不会出现方块（tofu）。
"""

from __future__ import annotations

from functools import lru_cache
from importlib import resources
from pathlib import Path

#: 随书字体的族名（font family）。
FONT_FAMILY = "Noto Sans CJK SC Subset"
#: 字体文件名（位于 ``tformer_lib/fonts/``）。
FONT_FILE = "NotoSansCJKsc-Regular-subset.otf"
#: 字体缺字时的后备字体（matplotlib 自带，总是存在）。
FALLBACK_FAMILY = "DejaVu Sans"


def font_path() -> Path:
    """返回随书字体文件的绝对路径。"""
    return Path(str(resources.files("tformer_lib") / "fonts" / FONT_FILE))


def register_cjk_font(set_rcparams: bool = True) -> str:
    """注册随书中文字体并（默认）把它设为 matplotlib 的默认字体，返回族名。

    可重复调用（幂等，idempotent）。``set_rcparams=True`` 时设置：

    - ``font.family`` = [随书字体, DejaVu Sans]（逐字后备，fallback：中文缺字时再查 DejaVu）；
    - ``font.sans-serif`` 的首位为随书字体（写 ``fontfamily="sans-serif"`` 也能显示中文）；
    - ``axes.unicode_minus = False``：负号用 ASCII 连字符 “-” 绘制，任何字体都有这个字形。
    """
    import matplotlib as mpl
    from matplotlib import font_manager

    path = font_path()
    if not path.is_file():  # pragma: no cover - 安装不完整时才会发生
        raise FileNotFoundError(f"随书字体缺失：{path}；请重新安装 tformer_lib")
    known = {Path(f.fname).resolve() for f in font_manager.fontManager.ttflist}
    if path.resolve() not in known:
        font_manager.fontManager.addfont(str(path))  # addfont 自己会清空 findfont 的缓存
    if set_rcparams:
        sans = [FONT_FAMILY, FALLBACK_FAMILY] + [
            f for f in mpl.rcParams["font.sans-serif"] if f not in (FONT_FAMILY, FALLBACK_FAMILY)
        ]
        mpl.rcParams["font.sans-serif"] = sans
        mpl.rcParams["font.family"] = [FONT_FAMILY, FALLBACK_FAMILY]
        mpl.rcParams["axes.unicode_minus"] = False
    return FONT_FAMILY


@lru_cache(maxsize=2)
def _covered_codepoints(include_fallback: bool) -> frozenset[int]:
    from fontTools.ttLib import TTFont

    with TTFont(str(font_path()), lazy=True) as font:  # lazy 会一直开着文件：读完就关，免得 ResourceWarning
        cps = set(font.getBestCmap())
    if include_fallback:
        from matplotlib import font_manager

        dejavu = font_manager.findfont(font_manager.FontProperties(family=FALLBACK_FAMILY))
        with TTFont(dejavu, lazy=True, fontNumber=0) as font:
            cps.update(font.getBestCmap())
    return frozenset(cps)


def missing_glyphs(text: str, include_fallback: bool = True) -> list[str]:
    """返回图中画不出来的 ``text`` 字符（去重、按出现顺序；空白与控制字符忽略）。

    默认把后备字体 DejaVu Sans 也算上（图中缺字时 matplotlib 会逐字改用它）；
    ``include_fallback=False`` 只查随书字体。章节作者可以这样检查图里要用的文字：
    ``assert not missing_glyphs("注意力权重")``。两种字体都没有的字符，matplotlib 会警告
    “Glyph … missing” 并画成方块（例如 ✅ 这类彩色表情：它们只适合打印输出，不适合放进图里）。
    """
    if not isinstance(text, str):
        raise TypeError(f"text 应为 str，收到 {type(text).__name__}")
    covered = _covered_codepoints(bool(include_fallback))
    out: list[str] = []
    for ch in text:
        if ch.isspace() or ord(ch) < 0x20 or ch in out:
            continue
        if ord(ch) not in covered:
            out.append(ch)
    return out
