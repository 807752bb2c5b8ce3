"""笔记本里打印的表：汉字占两列，中英文混排的列也对得齐。"""

import pytest

from tformer_lib.notebook import display_width, format_table


def test_display_width_counts_wide_characters_twice():
    assert display_width("abc") == 3
    assert display_width("字节级 BPE") == 3 * 2 + 4
    assert display_width("，。") == 4  # 全角标点
    assert display_width("%") == 1


def test_columns_line_up_by_display_width():
    text = format_table(["分词器", "词表大小"], [["字符", 4669], ["SentencePiece BPE", 8000]])
    lines = text.splitlines()
    assert len({display_width(line) for line in lines}) == 1  # 右对齐的最后一列：每行一样宽
    assert lines == ["分词器" + " " * 11 + "  " + "词表大小",  # 17 列宽的第一列、两个空格、8 列宽的第二列
                     "字符" + " " * 13 + "  " + " " * 4 + "4669",
                     "SentencePiece BPE" + "  " + " " * 4 + "8000"]


def test_bad_shapes_are_named():
    with pytest.raises(ValueError, match=r"rows\[1\]"):
        format_table(["a", "b"], [[1, 2], [3]])
    with pytest.raises(ValueError, match="align"):
        format_table(["a", "b"], [[1, 2]], align="<")


def test_zero_width_characters_take_no_column():
    assert display_width("e\u0301") == 1  # 组合重音
    assert display_width("a\u200bb") == 2  # 零宽空格
    assert display_width("中\ufe0f") == 2  # 变体选择符
    lines = format_table(["a", "b"], [["中\u0301", "x"], ["e", "y"]]).splitlines()
    assert len({display_width(line) for line in lines}) == 1
    with pytest.raises(TypeError, match="text"):
        display_width(None)


def test_rows_that_are_not_lists_are_refused():
    with pytest.raises(TypeError, match=r"rows\[0\]"):
        format_table(["a", "b"], [{"a": 1, "b": 2}])
    with pytest.raises(TypeError, match=r"rows\[0\]"):
        format_table(["a", "b"], ["ab"])
    with pytest.raises(ValueError, match="headers"):
        format_table([], [])
    with pytest.raises(ValueError, match="换行"):
        format_table(["a"], [["x\ny"]])
    with pytest.raises(ValueError, match="align"):
        format_table(["a"], [[1]], align=5)
