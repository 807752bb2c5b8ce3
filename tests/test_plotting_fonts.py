"""随书中文字体、setup() 与通用热力图的测试。"""

import io
import os
import warnings
from pathlib import Path

import matplotlib
import numpy as np
import pytest
import torch

matplotlib.use("Agg")

from matplotlib import font_manager  # noqa: E402

from tformer_lib.plotting import FONT_FAMILY, font_path, missing_glyphs, plot_heatmap, register_cjk_font  # noqa: E402

SEEDS = Path(__file__).resolve().parents[1].parent / "shared" / "seeds"
BOOK_TEXT = "注意力权重 位置编码 多头注意力 掩码 前馈网络 编码器 解码器 词元 嵌入 标签平滑 学习率 预热 狗咬人 人咬狗 人工智能 ÷√d_k QKᵀ Softmax −1 ⋅ “引号”，（括号）、。：；！？"


def _render(fig) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    return buf.getvalue()


def test_font_file_and_licence_are_shipped():
    path = font_path()
    assert path.is_file() and path.suffix == ".otf"
    assert 1_000_000 < path.stat().st_size < 8_000_000  # 子集：几 MB
    licence = (path.parent / "OFL.txt").read_text(encoding="utf-8")
    assert "SIL OPEN FONT LICENSE Version 1.1" in licence


def test_register_is_idempotent_and_resolves_to_bundled_file():
    assert register_cjk_font() == FONT_FAMILY
    n = len(font_manager.fontManager.ttflist)
    register_cjk_font()
    assert len(font_manager.fontManager.ttflist) == n
    found = font_manager.findfont(font_manager.FontProperties(family=FONT_FAMILY), fallback_to_default=False)
    assert Path(found).resolve() == font_path().resolve()
    assert matplotlib.rcParams["font.family"][0] == FONT_FAMILY
    assert matplotlib.rcParams["font.sans-serif"][0] == FONT_FAMILY
    assert matplotlib.rcParams["axes.unicode_minus"] is False
    # 只在进程内注册：字体没有被复制进 matplotlib 自己的目录
    mpl_data = Path(matplotlib.get_data_path())
    assert not list(mpl_data.rglob(font_path().name))


def test_chinese_labels_and_minus_render_without_missing_glyph_warning():
    register_cjk_font()
    m = np.array([[-1.5, 0.25], [0.75, -0.125]])
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # 任何 “Glyph … missing” 警告都会变成异常
        fig = plot_heatmap(m, ["狗", "咬人"], ["人工", "智能"], title="注意力权重（−1 与 -1）",
                           xlabel="键（key）", ylabel="查询（query）", colorbar_label="分数")
        ax = fig.axes[0]
        ax.set_xticks([0, 1], ["负号-0.5", "÷√d_k"])
        png = _render(fig)
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    # 颜色条刻度含负数：unicode_minus=False 时用 ASCII 连字符
    cbar_labels = [t.get_text() for t in fig.axes[1].get_yticklabels()]
    assert any(t.startswith("-") for t in cbar_labels), cbar_labels
    assert not any("\u2212" in t for t in cbar_labels)


def test_book_vocabulary_is_covered_by_the_subset():
    assert missing_glyphs(BOOK_TEXT) == []
    gb2312_level1 = bytes([0xB0, 0xA1]).decode("gb2312") + bytes([0xD7, 0xF9]).decode("gb2312")  # 啊 … 座
    gb2312_level2 = bytes([0xD8, 0xA1]).decode("gb2312") + bytes([0xF7, 0xFE]).decode("gb2312")  # 亍 … 齄
    assert missing_glyphs(gb2312_level1 + gb2312_level2) == []


@pytest.mark.skipif(not SEEDS.is_dir(), reason="shared/seeds 不在旁边")
def test_every_character_of_the_seed_articles_is_covered():
    text = "".join(p.read_text(encoding="utf-8") for p in sorted(SEEDS.glob("*.txt")))
    assert missing_glyphs(text) == []


def test_every_character_of_the_shipped_poems_is_covered():
    """第 9–10 章的图里画的是真实的唐诗：三个划分的正文逐字都要画得出来（含 GB2312 以外的约 1,460 个字）。

    题目与作者里还有 26 个扩展 B 区（基本多文种平面以外）的字，来源字体 Noto Sans CJK SC 本身就没有；
    它们只允许是这种字，章节不把这样的题目画进图里。
    """
    from tformer_lib.data.poems import POEM_SPLITS, load_poems

    poems = [p for split in POEM_SPLITS for p in load_poems(split)]
    text = set("".join(p.text for p in poems))
    assert len(text) > 6000
    assert missing_glyphs("".join(sorted(text))) == []
    names = set("".join(p.title + p.author for p in poems))
    assert all(ord(c) > 0xFFFF for c in missing_glyphs("".join(sorted(names))))


def test_missing_glyphs_reports_uncovered_characters():
    assert missing_glyphs("a⏳b✅✅") == ["⏳", "✅"]
    assert missing_glyphs("QKᵀ") == []  # ᵀ 由后备字体 DejaVu Sans 提供
    assert missing_glyphs("QKᵀ", include_fallback=False) == ["ᵀ"]
    with pytest.raises(TypeError):
        missing_glyphs(3)


def test_plot_heatmap_contract():
    fig = plot_heatmap(torch.rand(3, 4), "人工智", list("ABCD"), title="热力图")
    from matplotlib.figure import Figure
    import matplotlib.pyplot as plt

    assert isinstance(fig, Figure)
    assert fig not in [plt.figure(n) for n in plt.get_fignums()]  # 不进 pyplot 注册表：不会重复显示
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.get_yticklabels()] == ["人", "工", "智"]
    assert ax.get_title() == "热力图"
    assert len(ax.texts) == 12  # 小矩阵自动写数值
    with pytest.raises(ValueError, match="row_labels"):
        plot_heatmap(np.zeros((2, 2)), ["a"])
    with pytest.raises(ValueError, match="matrix"):
        plot_heatmap(np.zeros(3))
    # nan 格子留空，不报错
    fig = plot_heatmap([[np.nan, 1.0], [0.0, 0.5]], annotate=True)
    assert len(fig.axes[0].texts) == 3
    _render(fig)


def test_plot_heatmap_into_existing_axes():
    from matplotlib.figure import Figure

    host = Figure()
    axes = host.subplots(1, 2)
    assert plot_heatmap(np.eye(2), ax=axes[1], colorbar=False) is host


def test_setup_sets_printing_seed_and_font(monkeypatch):
    from tformer_lib.notebook import setup

    before = torch.get_num_threads()
    try:
        monkeypatch.setenv("TFORMER_THREADS", "1")
        device = setup(seed=123)
        assert device == torch.device("cpu")
        assert torch.get_num_threads() == 1
        a = torch.rand(3)
        setup(seed=123)
        assert torch.equal(a, torch.rand(3))
        assert str(torch.tensor([1 / 3])) == "tensor([0.3333])"
        assert np.array2string(np.array([1 / 3])) == "[0.3333]"
        assert matplotlib.rcParams["font.family"][0] == FONT_FAMILY
        monkeypatch.delenv("TFORMER_THREADS")
        torch.set_num_threads(2)
        setup()
        assert torch.get_num_threads() == 1  # 默认单线程：冷缓存重训与提交的输出逐位一致
        monkeypatch.setenv("TFORMER_THREADS", "zero")
        with pytest.raises(ValueError, match="TFORMER_THREADS"):
            setup()
    finally:
        torch.set_num_threads(before)
        torch.set_printoptions(profile="default")
        np.set_printoptions(precision=8, suppress=False)


def test_every_string_in_the_plotting_modules_can_be_drawn():
    """图里的文字都来自 tformer_lib/plotting/*.py 的字符串常量（含各章的 chNN.py）：逐字检查字体能画出来。"""
    import ast

    import tformer_lib.plotting as plotting_pkg

    root = Path(plotting_pkg.__file__).parent
    bad = {}
    for path in sorted(root.glob("*.py")):
        if path.name == "_fontsubset.py":
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        docstrings = {id(n.value) for n in ast.walk(tree) if isinstance(n, ast.Expr)}  # 文档字符串不进图
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
                missing = missing_glyphs(node.value)
                if missing:
                    bad.setdefault(path.name, set()).update(missing)
    assert not bad, f"这些字符图中画不出来（换成字体里有的字符，或扩充字体子集）：{bad}"


def test_missing_glyphs_closes_the_font_files():
    """fontTools 的 lazy 读取会一直开着字体文件：读完 cmap 要关掉，否则垃圾回收时的 ResourceWarning 会让别的测试失败。"""
    import gc
    import warnings

    from tformer_lib.plotting.fonts import _covered_codepoints

    _covered_codepoints.cache_clear()
    with warnings.catch_warnings():
        warnings.simplefilter("error", ResourceWarning)
        assert missing_glyphs("注意力⏳") == ["⏳"]
        gc.collect()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ResourceWarning)
        gc.collect()
    assert not [w for w in caught if issubclass(w.category, ResourceWarning)]
