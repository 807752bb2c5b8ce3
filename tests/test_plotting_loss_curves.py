"""第 7 章的图：训练器回调记录并能出图（两次出图坐标轴个数不变），对比曲线与得分柱状图的内容对得上。"""

import numpy as np
import pytest

from tformer_lib.plotting.loss_curves import LiveLossPlot, plot_loss_curves, plot_score_bars


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


def test_seed_runs_draws_one_line_per_seed_with_lr_axis(render):
    from tformer_lib.plotting.loss_curves import plot_seed_runs

    groups = {"Post-LN": [[4.0, 3.9, 3.9], [4.1, 3.8, 3.9]], "Pre-LN": [[4.0, 3.0, 2.0], [4.2, 2.9, 1.8]]}
    fig = render(plot_seed_runs(groups, smooth=2, lr=[0.01, 0.02, 0.015], hline=(3.8, "只按词频猜"), title="测试"))
    ax = fig.axes[0]
    assert len(fig.axes) == 2  # 右侧的学习率纵轴
    assert len(ax.lines) == 4 + 1  # 每个种子一条线 + 参考线
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["Post-LN（2 个种子）", "Pre-LN（2 个种子）", "只按词频猜"]
    with pytest.raises(ValueError, match="groups"):
        plot_seed_runs({})
    with pytest.raises(ValueError, match="没有任何一次运行"):
        plot_seed_runs({"a": []})


def test_shipped_norm_placement_study_covers_three_seeds_past_the_warmup():
    from tformer_lib.experiments.norm_placement import EXPERIMENTS, NORMS, load_study

    study = load_study()
    assert {"cpu", "torch", "threads"} <= set(study["machine"]) and study["date"]
    for exp, spec in EXPERIMENTS.items():
        for norm in NORMS:
            runs = study["by"][exp][norm]
            assert [r["seed"] for r in runs] == [0, 1, 2]
            for r in runs:
                warmup = spec["training"].get("warmup", 200)
                assert len(r["step_loss"]) > warmup  # 训练到预热结束之后
                assert len(r["epochs"]) == spec["epochs"]
