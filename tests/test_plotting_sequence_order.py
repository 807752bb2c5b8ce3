"""第 2 章的距离曲线：每个 d_model 一条线、数值与库的位置编码一致、与起点无关、坏输入报清楚的错。"""

import numpy as np
import pytest
from matplotlib.figure import Figure

from tformer_lib import sinusoidal_positional_encoding
from tformer_lib.plotting.sequence_order import plot_position_distance


# 本文件的每个测试里，任何警告（包括缺字 “Glyph missing”）都算失败。
pytestmark = pytest.mark.filterwarnings("error")


def test_one_curve_per_d_model_matching_the_library():
    fig = plot_position_distance(max_offset=50, d_models=(16, 128))
    assert isinstance(fig, Figure)
    ax = fig.axes[0]
    curves = [line for line in ax.get_lines() if len(line.get_xdata()) == 51]
    assert len(curves) == 2
    pe = sinusoidal_positional_encoding(51, 128).double().numpy()
    np.testing.assert_allclose(curves[1].get_ydata(), np.linalg.norm(pe - pe[0], axis=1), atol=1e-6)
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["d_model=16", "d_model=128"]


def test_distance_does_not_depend_on_start():
    a = plot_position_distance(max_offset=40, d_models=(32,), start=0).axes[0].get_lines()[0].get_ydata()
    b = plot_position_distance(max_offset=40, d_models=(32,), start=123).axes[0].get_lines()[0].get_ydata()
    np.testing.assert_allclose(a, b, atol=1e-5)


def test_draws_into_given_axes_without_missing_glyphs(render):
    outer = Figure()
    ax = outer.add_subplot()
    assert plot_position_distance(max_offset=10, ax=ax) is outer
    render(outer)


@pytest.mark.parametrize(
    "kwargs, error",
    [
        ({"max_offset": 0}, ValueError),
        ({"d_models": ()}, ValueError),
        ({"d_models": (8.5,)}, TypeError),
        ({"start": -1}, ValueError),
    ],
)
def test_bad_input(kwargs, error):
    with pytest.raises(error):
        plot_position_distance(**kwargs)


def test_sequence_mixing_figure_renders_with_step_labels(render):
    from tformer_lib.plotting.sequence_order import plot_sequence_mixing

    result = {"lengths": [8, 32], "rnn_seconds": [1e-3, 4e-3], "attention_seconds": [5e-4, 6e-4],
              "rnn_steps": [8, 32], "attention_steps": [1, 1], "threads": 1}
    fig = render(plot_sequence_mixing(result))
    ax = fig.axes[0]
    assert len(ax.get_lines()) == 2 and "1 个线程" in ax.get_title()
    assert [t.get_text() for t in ax.texts] == ["8 步", "32 步"]
    with pytest.raises(ValueError):
        plot_sequence_mixing({"lengths": [8]})


def test_length_generalization_figure_renders(render):
    from tformer_lib.plotting.sequence_order import plot_length_generalization

    fig = render(plot_length_generalization({"正弦余弦": {4: 1.0, 12: 0.2}, "可学习": {4: 1.0, 12: 0.0}},
                                            train_max_len=8))
    assert len(fig.axes[0].get_lines()) == 3  # 两条曲线 + 竖线
    with pytest.raises(ValueError):
        plot_length_generalization({}, train_max_len=8)
