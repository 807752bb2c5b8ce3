"""第 7 章的图：训练器回调记录并能出图（两次出图坐标轴个数不变），对比曲线与得分柱状图的内容对得上。"""

import numpy as np
import pytest

from tformer_lib.plotting.ch07 import LiveLossPlot, plot_loss_curves, plot_score_bars


# 本文件的每个测试里，任何警告（包括缺字 “Glyph missing”）都算失败。
pytestmark = pytest.mark.filterwarnings("error")


def test_live_loss_plot_records_steps_and_epochs_outside_ipython(render):
    live = LiveLossPlot(every=2, reference=[3.0, 2.0, 1.5, 1.2], smooth=2, total_steps=4)
    empty_axes = len(live.figure().axes)
    for s, loss in enumerate([3.1, 2.2, 1.4, 1.1], start=1):
        live("step", {"step": s, "epoch": 1, "loss": loss, "lr": 0.1})
    live("epoch", {"epoch": 1, "valid_loss": 0.9, "valid_token_accuracy": 0.7, "history": object()})
    assert live.steps == [1, 2, 3, 4] and live.losses == [3.1, 2.2, 1.4, 1.1]
    assert live.epochs == [{"epoch": 1, "valid_loss": 0.9, "valid_token_accuracy": 0.7}]
    fig = live.figure()
    render(fig)
    assert len(fig.axes) == empty_axes == 3  # nbval 比较 "<Figure … with 3 Axes>"：第一次与最后一次出图必须一致
    a1 = fig.axes[0]
    np.testing.assert_allclose(a1.lines[1].get_ydata(), [3.1, 2.65, 1.8, 1.25])  # 本次训练，2 步滑动平均
    np.testing.assert_allclose(a1.lines[2].get_ydata(), [3.0, 2.5, 1.75, 1.35])  # 参考曲线，同样平滑
    assert "第 4 步" in a1.get_title()


def test_live_loss_plot_validates():
    with pytest.raises(ValueError, match="every"):
        LiveLossPlot(every=0)


def test_loss_curves_and_smoothing(render):
    fig = plot_loss_curves({"post-LN": [4.0, 3.0, 3.0], "pre-LN": [4.0, 2.0, 1.0]}, smooth=2,
                           styles={"pre-LN": "--"})
    render(fig)
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["post-LN", "pre-LN"]
    np.testing.assert_allclose(ax.lines[2].get_ydata(), [4.0, 3.0, 1.5])
    with pytest.raises(ValueError, match="curves"):
        plot_loss_curves({})
    with pytest.raises(ValueError, match="一维"):
        plot_loss_curves({"a": []})


def test_score_bars_heights_and_labels(render):
    fig = plot_score_bars({"有位置编码": {"验证集": 0.99, "测试集": 1.0}, "无位置编码": {"验证集": 0.29, "测试集": 0.27}})
    render(fig)
    ax = fig.axes[0]
    heights = [p.get_height() for p in ax.patches]
    np.testing.assert_allclose(heights, [0.99, 1.0, 0.29, 0.27])
    assert [t.get_text() for t in ax.texts] == ["99%", "100%", "29%", "27%"]
    with pytest.raises(ValueError, match="scores"):
        plot_score_bars({})
