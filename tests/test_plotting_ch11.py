"""第 11 章新增的图与探索器：步时对比、MFU、训练内存账本（探索器的帧）——内容对得上输入、中文画得出、坏输入报清楚。"""

import dataclasses

import pytest

from tformer_lib.lm import LMConfig, make_lm
from tformer_lib.measurement.memory import lm_activation_bytes, model_state_bytes, parameter_count
from tformer_lib.plotting.memory import plot_mfu, plot_step_times, plot_training_memory

pytestmark = pytest.mark.filterwarnings("error")

CONFIG = LMConfig(50, d_model=32, n_heads=4, n_layers=2, d_ff=64, max_len=128)


def test_step_times_show_each_round_and_the_median_ratio(render):
    ax = render(plot_step_times({"不重算": [0.10, 0.12, 0.11], "激活重算": [0.13, 0.14, 0.15]})).axes[0]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["不重算", "激活重算"]
    texts = [t.get_text() for t in ax.texts]
    assert texts[0] == "中位数 110 ms" and texts[1] == "中位数 140 ms（1.27×）"
    assert [len(c.get_offsets()) for c in ax.collections if hasattr(c, "get_sizes")][:2] == [3, 3]
    with pytest.raises(ValueError, match="times"):
        plot_step_times({})
    with pytest.raises(ValueError, match="参照"):
        plot_step_times({"a": [1.0]}, reference="b")
    with pytest.raises(ValueError, match="至少"):
        plot_step_times({"a": []})
    for bad in (float("nan"), -1.0, "0.1", True):
        with pytest.raises(ValueError, match="正的有限秒数"):
            plot_step_times({"a": [0.1, bad]})


def test_mfu_figure_states_the_ratio(render):
    ax = render(plot_mfu(2e10, 8e10)).axes[0]
    assert ax.get_title() == "MFU = 一个训练步 ÷ 峰值 = 0.25"
    ax2 = render(plot_mfu(2e10, 8e10, label="前向 + 反向")).axes[0]
    assert [t.get_text() for t in ax2.get_yticklabels()] == ["实测的方阵乘法（当作峰值）", "前向 + 反向"]
    assert [p.get_width() for p in ax.patches] == pytest.approx([80, 20])
    with pytest.raises(ValueError, match="peak"):
        plot_mfu(1e9, 0)
    with pytest.raises(ValueError, match="achieved"):
        plot_mfu(True, 1e9)
    with pytest.raises(ValueError, match="peak"):
        plot_mfu(1e9, float("inf"))


@pytest.mark.parametrize("fast", [True, False])
def test_training_memory_bars_equal_the_formula(render, fast):
    config = dataclasses.replace(CONFIG, fast_attention=fast)
    n = parameter_count(make_lm(config))
    ax = render(plot_training_memory(config, n, 8, 64, unit=1024)).axes[0]
    assert [t.get_text() for t in ax.get_yticklabels()] == ["不重算", "激活重算"]
    for y, ckpt in enumerate((False, True)):
        widths = [p.get_width() for p in ax.patches if abs(p.get_y() + p.get_height() / 2 - y) < 1e-9]
        want = model_state_bytes(n)["total"] + lm_activation_bytes(config, 8, 64, checkpointing=ckpt)["total"]
        assert sum(widths) == pytest.approx(want / 1024)
    assert ("SDPA" in ax.get_title()) is fast


def test_memory_explorer_frames_differ_and_fit_the_budget():
    import ipywidgets as widgets

    from tformer_lib.widgets import CHAPTER_FRAME_BUDGET, figure_to_png
    from tformer_lib.widgets.memory import BATCH_SIZES, memory_explorer

    n = parameter_count(make_lm(CONFIG))
    ex = memory_explorer(CONFIG, n)
    assert ex.static == "batch" and len(ex.frames) == len(BATCH_SIZES)
    pngs = [bytes(f.value) for f in ex.frames]
    assert len(set(pngs)) == len(pngs)
    assert ex.link.source == (ex.controls["batch"], "index") and isinstance(ex.stack, widgets.Stack)
    assert pngs[0] == figure_to_png(ex.figure(batch=1), colors=256)
    assert ex.frame_bytes() * 1.34 <= CHAPTER_FRAME_BUDGET / 2, ex.frame_bytes()
    ex.update(fast=False)  # Jupyter 里：当前帧按显式注意力重画
    assert "显式" in ex.figure().axes[0].get_title() and ex.status.value == ""
    with pytest.raises(ValueError, match="batch"):
        memory_explorer(CONFIG, n, batch=3)
    with pytest.raises(ValueError, match="length"):
        memory_explorer(CONFIG, n, length=100)
    with pytest.raises(TypeError, match="LMConfig"):
        memory_explorer("config", n)
    with pytest.raises(ValueError, match="n_params"):
        memory_explorer(CONFIG, 0)


def test_edge_inputs_draw_or_raise_clearly(render):
    """边界输入：要么画得出（不出警告），要么给出点名参数的中文错误。"""
    from tformer_lib.plotting.memory import plot_memory_account, plot_precision_losses, plot_profile

    render(plot_profile([{"name": "aten::mm", "share": 0.0}]))  # 全为 0 也画得出
    render(plot_precision_losses({"fp32": [1.0]}))
    with pytest.raises(ValueError, match="每一项都是 0"):
        plot_memory_account({"a": {}})
    for bad in (-5, float("nan"), "3", True):
        with pytest.raises(ValueError, match="非负的有限字节数"):
            plot_memory_account({"a": {"params": bad}})
    with pytest.raises(ValueError, match="unit"):
        plot_memory_account({"a": {"params": 10}}, unit=True)
    with pytest.raises(ValueError, match="share"):
        plot_profile([{"name": "mm", "share": 1.5}])
    with pytest.raises(ValueError, match="name"):
        plot_profile([("mm", 0.5)])
    with pytest.raises(ValueError, match="为空"):
        plot_precision_losses({"fp32": []})
    with pytest.raises(TypeError, match="LMConfig"):
        plot_training_memory("config", 10, 2, 8)
