"""第 11 章的图：内存账本、精度对比的损失曲线、剖析占比——内容对得上输入、中文画得出、坏输入给出清楚的错误。"""

import pytest

from tformer_lib.lm import LMConfig, make_lm
from tformer_lib.measurement.memory import lm_activation_bytes, model_state_bytes, parameter_count
from tformer_lib.plotting.memory import plot_memory_account, plot_precision_losses, plot_profile

pytestmark = pytest.mark.filterwarnings("error")


def test_memory_account_stacks_every_part(render):
    config = LMConfig(50, d_model=32, n_heads=4, n_layers=2, d_ff=64, max_len=16)
    n = parameter_count(make_lm(config))
    accounts = {
        "float32": {**model_state_bytes(n), **lm_activation_bytes(config, 8, 16)},
        "激活重算": {**model_state_bytes(n), **lm_activation_bytes(config, 8, 16, checkpointing=True)},
    }
    fig = render(plot_memory_account(accounts, unit=1024))
    ax = fig.axes[0]
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert labels[:4] == ["参数", "梯度", "Adam 一阶矩 m", "Adam 二阶矩 v"] and "每块的输入" in labels
    assert "fp32 主权重" not in labels  # fp32 训练没有主权重：处处为 0 的项不画
    # 每根条的总长 = 账本里各项之和（不含汇总键）
    for y, name in enumerate(accounts):
        widths = [p.get_width() for p in ax.patches if abs(p.get_y() + p.get_height() / 2 - y) < 1e-9]
        total = model_state_bytes(n)["total"] + lm_activation_bytes(config, 8, 16, checkpointing=y == 1)["total"]
        assert sum(widths) == pytest.approx(total / 1024)
    with pytest.raises(ValueError, match="accounts"):
        plot_memory_account({})
    with pytest.raises(TypeError, match="字典"):
        plot_memory_account({"a": 3})


def test_precision_losses_draw_curves_and_differences(render):
    fig = render(plot_precision_losses({"fp32": [3.0, 2.5, 2.0], "bf16": [3.0, 2.51, 2.02]}))
    top, bottom = fig.axes
    assert [line.get_label() for line in top.get_lines()] == ["fp32", "bf16"]
    assert list(bottom.get_lines()[0].get_ydata()) == pytest.approx([0.0, 0.01, 0.02])
    with pytest.raises(ValueError, match="参照"):
        plot_precision_losses({"bf16": [1.0]})
    with pytest.raises(ValueError, match="步"):
        plot_precision_losses({"fp32": [1.0, 2.0], "bf16": [1.0]})


def test_profile_bars_are_percentages(render):
    rows = [{"name": "aten::mm", "share": 0.45}, {"name": "aten::_log_softmax", "share": 0.1}]
    ax = render(plot_profile(rows)).axes[0]
    assert [p.get_width() for p in ax.patches] == pytest.approx([45, 10])
    assert [t.get_text() for t in ax.get_yticklabels()] == ["mm", "_log_softmax"]
    with pytest.raises(ValueError, match="rows"):
        plot_profile([])
