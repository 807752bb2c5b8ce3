"""第 4 章的图：能画、不缺字、数据与输入对得上、参数错误时给出清楚的报错。"""

import numpy as np
import pytest
import torch

from tformer_lib.plotting.blocks import (
    plot_activation_curves,
    plot_head_split,
    plot_layer_curves,
    plot_seed_curves,
    plot_param_share,
)


# 本文件的每个测试里，任何警告（包括缺字 “Glyph missing”）都算失败。
pytestmark = pytest.mark.filterwarnings("error")


def test_head_split_panels_are_column_slices(render):
    x = torch.arange(6 * 8, dtype=torch.float32).reshape(6, 8)
    fig = render(plot_head_split(x, 4, "我爱人工智能", name="Q"))
    top, *heads = fig.axes[:5]
    assert len(heads) == 4
    np.testing.assert_allclose(top.images[0].get_array(), x.numpy())
    for h, ax in enumerate(heads):
        np.testing.assert_allclose(ax.images[0].get_array(), x[:, 2 * h:2 * h + 2].numpy())
    assert plot_head_split(x[None], 2) is not None  # (1, T, d_model) 也可以


@pytest.mark.parametrize(
    ("x", "h", "msg"),
    [(torch.zeros(3, 6), 4, "整除"), (torch.zeros(2, 3, 6), 3, "batch"), (torch.zeros(3, 6), 0, "n_heads")],
)
def test_head_split_rejects_bad_input(x, h, msg):
    with pytest.raises(ValueError, match=msg):
        plot_head_split(x, h)


def test_activation_curves_match_torch(render):
    fig = render(plot_activation_curves(("relu", "gelu", "gelu_tanh"), x_min=-2, x_max=2, n_points=5))
    lines = fig.axes[0].get_lines()[:3]
    xs = torch.linspace(-2, 2, 5, dtype=torch.float64)
    np.testing.assert_allclose(lines[0].get_ydata(), torch.relu(xs).numpy())
    np.testing.assert_allclose(lines[1].get_ydata(), torch.nn.functional.gelu(xs).numpy())
    with pytest.raises(ValueError, match="不认识"):
        plot_activation_curves(("swish",))
    with pytest.raises(ValueError, match="x_min"):
        plot_activation_curves(x_min=1, x_max=0)


def test_param_share_bars_sum_to_total(render):
    fig = render(plot_param_share({"注意力": 100, "前馈网络 FFN": 200, "LayerNorm": 4}))
    ax = fig.axes[0]
    assert [round(p.get_width()) for p in ax.patches] == [100, 200, 4]
    assert ax.get_xlim() == (0.0, 304.0)
    with pytest.raises(ValueError):
        plot_param_share({})
    with pytest.raises(ValueError):
        plot_param_share({"a": -1})


def test_layer_curves(render):
    fig = render(plot_layer_curves({"向量长度": {"post-LN": [1, 1, 1], "pre-LN": [1, 2, 3]}, "梯度": {"x": [3, 2]}},
                                  title="对比", logy=True))
    assert len(fig.axes) == 2
    np.testing.assert_allclose(fig.axes[0].lines[1].get_ydata(), [1, 2, 3])
    np.testing.assert_allclose(fig.axes[0].lines[1].get_xdata(), [1, 2, 3])
    with pytest.raises(ValueError):
        plot_layer_curves({})
    with pytest.raises(ValueError):
        plot_layer_curves({"空": {}})


def test_seed_curves_show_the_mean_and_the_range(render):
    runs = {"有 FFN": [[3.0, 2.0, 1.0], [5.0, 2.0, 0.0]], "没有 FFN": [[4.0, 3.0, 2.0]]}
    fig = render(plot_seed_curves({"验证集损失": runs, "准确率": {"a": [[0.1, 0.9]]}}, title="消融"))
    ax = fig.axes[0]
    assert len(fig.axes) == 2
    np.testing.assert_allclose(ax.lines[0].get_ydata(), [4.0, 2.0, 0.5])  # 两个种子的平均
    np.testing.assert_allclose(ax.lines[0].get_xdata(), [1, 2, 3])
    assert "2 个种子" in ax.get_legend().get_texts()[0].get_text()
    band = ax.collections[0].get_paths()[0].vertices[:, 1]
    assert band.min() == 0.0 and band.max() == 5.0  # 阴影是最小–最大范围
    with pytest.raises(ValueError):
        plot_seed_curves({})
    with pytest.raises(ValueError):
        plot_seed_curves({"空": {}})
    with pytest.raises(ValueError):
        plot_seed_curves({"长度不同": {"a": [[1.0, 2.0], [1.0]]}})
