"""第 3 章的两张图：能画、标签与数据对得上、参数错误时给出清楚的报错。"""

import numpy as np
import pytest
import torch

from tformer_lib.plotting.qkv import plot_dk_curves, plot_weighted_sum


# 本文件的每个测试里，任何警告（包括缺字 “Glyph missing”）都算失败。
pytestmark = pytest.mark.filterwarnings("error")


def test_dk_curves_draws_each_series_and_reference(render):
    fig = plot_dk_curves([4, 16, 64], {"不缩放": [4, 16, 64], "÷√d_k": [1, 1, 1]},
                         reference={"理论值 d_k": [4, 16, 64]}, logy=True, title="方差", ylabel="方差")
    render(fig)
    ax = fig.axes[0]
    assert len(ax.lines) == 3
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["不缩放", "÷√d_k", "理论值 d_k"]
    np.testing.assert_allclose(ax.lines[1].get_ydata(), [1, 1, 1])


@pytest.mark.parametrize(
    ("args", "msg"),
    [(([], {"a": []}), "d_ks"), (([4, 8], {}), "series"), (([4, 8], {"a": [1.0]}), "有 1 个值")],
)
def test_dk_curves_rejects_bad_input(args, msg):
    with pytest.raises(ValueError, match=msg):
        plot_dk_curves(*args)


def test_weighted_sum_diamonds_are_the_output_row(render):
    a = torch.tensor([0.5, 0.3, 0.2])
    v = torch.tensor([[1.0, -2.0], [0.0, 1.0], [3.0, 0.5]])
    fig = plot_weighted_sum(a, v, "人工智", query_label="人", dim_labels=["维度甲", "维度乙"])
    render(fig)
    contrib_ax = fig.axes[1]
    diamonds = [ln for ln in contrib_ax.lines if ln.get_marker() == "D"][0]
    np.testing.assert_allclose(diamonds.get_ydata(), (a @ v).numpy(), rtol=1e-6)
    assert "人" in fig._suptitle.get_text()


def test_weighted_sum_checks_lengths():
    with pytest.raises(ValueError, match="weights 有 2 个"):
        plot_weighted_sum([0.5, 0.5], np.zeros((3, 2)), "人工智")
