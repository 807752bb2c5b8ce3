"""第 1 章的分组柱状图：返回 Figure、柱子数目与数值标签正确、坏输入报清楚的错。"""

import pytest
from matplotlib.figure import Figure

from tformer_lib.plotting.tokens import plot_grouped_bars

VALUES = {
    "d_model=64": {"词嵌入（未缩放）": 1.0, "词嵌入 ×√d_model": 8.0, "位置编码": 5.657},
    "d_model=512": {"词嵌入（未缩放）": 1.0, "词嵌入 ×√d_model": 22.6, "位置编码": 16.0},
}


def test_returns_figure_with_one_bar_per_value():
    fig = plot_grouped_bars(VALUES, title="范数", ylabel="L2")
    assert isinstance(fig, Figure)
    ax = fig.axes[0]
    assert len(ax.patches) == 6
    assert [t.get_text() for t in ax.get_xticklabels()] == list(VALUES)
    labels = {t.get_text() for t in ax.texts}
    assert {"8.00", "5.66", "16.00"} <= labels
    assert [t.get_text() for t in ax.get_legend().get_texts()] == list(VALUES["d_model=64"])


def test_draws_into_given_axes_and_log_scale():
    outer = Figure()
    ax = outer.add_subplot()
    assert plot_grouped_bars(VALUES, ax=ax, log=True) is outer
    assert ax.get_yscale() == "log"


@pytest.mark.parametrize(
    "values, match",
    [
        ({}, "非空"),
        ({"a": {}}, "至少要有一个系列"),
        ({"a": {"x": 1.0}, "b": {"y": 1.0}}, "不一致"),
        ({"a": {"x": float("nan")}}, "nan"),
    ],
)
def test_bad_input(values, match):
    with pytest.raises(ValueError, match=match):
        plot_grouped_bars(values)


def test_log_needs_positive_values():
    with pytest.raises(ValueError, match="> 0"):
        plot_grouped_bars({"a": {"x": 0.0}}, log=True)


# ---- plot_input_matrix ---------------------------------------------------------------------------
import math  # noqa: E402

import torch  # noqa: E402

from tformer_lib.data import Vocab  # noqa: E402
from tformer_lib.plotting.tokens import plot_input_matrix  # noqa: E402


def _image(fig):
    return fig.axes[0].images[0].get_array()


def test_input_matrix_same_token_same_row_without_pe():
    a = _image(plot_input_matrix("狗 咬 人", add_pe=False))
    b = _image(plot_input_matrix("人 咬 狗", add_pe=False))
    assert a.shape == (3, 16)
    assert (a[0] == b[2]).all() and (a[2] == b[0]).all()
    # 加上位置编码后，句首的狗与句尾的狗不再相同
    a = _image(plot_input_matrix("狗 咬 人"))
    b = _image(plot_input_matrix("人 咬 狗"))
    assert not (a[0] == b[2]).all()


def test_input_matrix_labels_title_and_rng_untouched():
    torch.manual_seed(5)
    expected = torch.rand(2)
    torch.manual_seed(5)
    fig = plot_input_matrix(["人工智能", "改变", "世界"], d_model=512, scale=False, n_dims=8)
    assert torch.equal(torch.rand(2), expected)
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.get_yticklabels()] == ["人工智能", "改变", "世界"]
    assert "d_model=512" in ax.get_title() and f"{math.sqrt(256):.2f}" in ax.get_title()


def test_input_matrix_custom_vocab_and_unknown_token():
    v = Vocab(["狗", "咬", "人"])
    fig = plot_input_matrix("狗 咬 熊", vocab=v, d_model=16, n_dims=4)
    assert _image(fig).shape == (3, 4)


def test_input_matrix_bad_args():
    with pytest.raises(ValueError, match="n_dims"):
        plot_input_matrix(d_model=8, n_dims=16)
    with pytest.raises(ValueError, match="至少要有一个词元"):
        plot_input_matrix("   ")
