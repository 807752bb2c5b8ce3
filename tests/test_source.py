"""show_source：显示库的真实源码，HTML 高亮 + 稳定的纯文本。"""

import inspect

import pytest

import tformer_lib
from tformer_lib.notebook.source import SourceView, show_source, source_view


def test_source_view_is_the_real_source_with_location():
    view = source_view(tformer_lib.scaled_dot_product_attention)
    assert isinstance(view, SourceView)
    assert view.code == inspect.getsource(tformer_lib.scaled_dot_product_attention)
    assert view.location == "tformer_lib/parts/attention.py"  # 不带行号：行号随编辑漂移
    assert str(view).startswith("# tformer_lib/parts/attention.py") and "def scaled_dot_product_attention" in str(view)
    assert repr(view) == str(view)


def test_html_is_highlighted_with_inline_styles_and_stable():
    view = source_view(tformer_lib.causal_mask)
    html1, html2 = view._repr_html_(), source_view(tformer_lib.causal_mask)._repr_html_()
    assert html1 == html2  # 确定性
    assert "<span style=" in html1 and "class=\"tformer-source\"" in html1
    assert "0x" not in html1
    assert "tformer_lib/parts/masks.py" in html1 and "行" not in html1.split("</div>")[0]


def test_methods_classes_and_docstring_removal():
    view = source_view(tformer_lib.MultiHeadAttention.forward, docstring=False)
    assert view.code.lstrip().startswith("def forward")
    assert '"""' not in view.code
    cls = source_view(tformer_lib.MultiHeadAttention)
    assert cls.code.startswith("class MultiHeadAttention") and '"""' in cls.code
    nodoc = source_view(tformer_lib.MultiHeadAttention, docstring=False)
    assert '"""' not in nodoc.code and "def forward" in nodoc.code
    compile(nodoc.code, "<nodoc>", "exec")  # 去掉文档字符串后仍是合法代码


def test_show_source_prints_outside_ipython(capsys):
    show_source(tformer_lib.causal_mask)
    out = capsys.readouterr().out
    assert out.startswith("# tformer_lib/parts/masks.py") and "def causal_mask" in out


def test_show_source_in_ipython_publishes_html_and_text():
    from IPython.core.formatters import DisplayFormatter

    fmt = DisplayFormatter().format(source_view(tformer_lib.causal_mask))[0]
    assert set(fmt) >= {"text/plain", "text/html"}
    assert fmt["text/plain"].startswith("# tformer_lib/parts/masks.py\ndef causal_mask")


def test_builtins_raise_a_clear_error():
    with pytest.raises(TypeError, match="无法取得"):
        source_view(len)
