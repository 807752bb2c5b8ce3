"""第 6 章的图：能画（无缺字警告）、画的数据与 softmax 的性质一致、参数错误时报错清楚。"""

import math

import numpy as np
import pytest
import torch

from tformer_lib.plotting.output_layer import (
    plot_sigmoid_vs_softmax,
    plot_softmax_properties,
    plot_temperature_entropy,
    plot_top_k,
    plot_top_k_steps,
)


# 本文件的每个测试里，任何警告（包括缺字 “Glyph missing”）都算失败。
pytestmark = pytest.mark.filterwarnings("error")


def test_top_k_sorted_with_rest_bar(render):
    p = torch.tensor([0.1, 0.5, 0.05, 0.3, 0.05])
    fig = render(plot_top_k(p, ["a", "b", "c", "d", "e"], 2, highlight="b"))
    ax = fig.axes[0]
    widths = [r.get_width() for r in ax.patches]
    np.testing.assert_allclose(widths, [0.5, 0.3, 0.2], atol=1e-6)
    assert [t.get_text() for t in ax.get_yticklabels()] == ["b", "d", "其余 3 个词"]


@pytest.mark.parametrize(("probs", "msg"), [([0.5, 0.6], "和为 1"), ([[0.5, 0.5]], "probs")])
def test_top_k_rejects_non_distribution(probs, msg):
    with pytest.raises(ValueError, match=msg):
        plot_top_k(probs, ["x", "y"])


def test_top_k_steps_one_panel_per_step(render):
    p = torch.tensor([[0.7, 0.2, 0.1], [0.1, 0.1, 0.8]])
    fig = render(plot_top_k_steps(p, ["x", "y", "z"], ["第一步", "第二步"], 2, chosen=["x", "z"], ncols=3))
    assert sum(ax.get_visible() and ax.axison for ax in fig.axes) == 2
    assert fig.axes[1].get_title() == "第二步"


def test_softmax_properties_panels(render):
    fig = render(plot_softmax_properties())
    a1, a2, a3 = fig.axes[:3]
    probs = [r.get_height() for r in a1.patches[3:6]]
    np.testing.assert_allclose(probs, [0.7275, 0.2676, 0.0049], atol=1e-4)
    x, y = a2.lines[0].get_data()
    np.testing.assert_allclose(y, np.exp(x))
    tops = {}
    for r in a3.patches:
        tops[round(r.get_x(), 3)] = max(tops.get(round(r.get_x(), 3), 0), r.get_y() + r.get_height())
    np.testing.assert_allclose(list(tops.values()), 1.0)


def test_sigmoid_vs_softmax_sums(render):
    fig = render(plot_sigmoid_vs_softmax())
    texts = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert "总和 2.475" in texts[0] and "总和 1.000" in texts[1]


def test_temperature_entropy_limits(render):
    fig = render(plot_temperature_entropy({"甲": [5.0, 4.0, 0.0], "乙": [1.0, 0.0]}))
    line = fig.axes[0].lines[0]
    y = line.get_ydata()
    assert y[0] < 1e-6 and abs(y[-1] - math.log(3)) < 1e-2 and np.all(np.diff(y) >= -1e-12)
    with pytest.raises(ValueError, match="正数"):
        plot_temperature_entropy([1.0, 2.0], [0.0, 1.0])
