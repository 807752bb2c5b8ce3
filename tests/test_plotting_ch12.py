"""第 12 章的图：流水线时间线（理想与实测格式相同）、ZeRO 每进程显存、通信量——内容对得上输入、中文画得出、坏输入报清楚的错。"""

import pytest

from tformer_lib.parallel.schedule import PipelineEvent, ideal_schedule
from tformer_lib.parallel.zero import zero_bytes_per_rank
from tformer_lib.plotting.parallel import (
    plot_comm_volume,
    plot_pipeline_schedules,
    plot_pipeline_timeline,
    plot_zero_memory,
)

pytestmark = pytest.mark.filterwarnings("error")


def _boxes(ax, color):
    from matplotlib.colors import to_hex

    return [p for p in ax.patches if to_hex(p.get_facecolor()) == color]


def test_ideal_timeline_draws_one_box_per_event_and_the_bubble_in_the_title(render):
    events = ideal_schedule("gpipe", 3, 4)
    fig = render(plot_pipeline_timeline(events))
    ax = fig.axes[0]
    forward, backward = _boxes(ax, "#4c72b0"), _boxes(ax, "#dd8452")
    assert len(forward) == len(backward) == 3 * 4
    assert "空闲比例 33.3%" in ax.get_title()  # (p−1)/(m+p−1) = 2/6
    assert [t.get_text() for t in ax.get_yticklabels()] == ["第 0 段", "第 1 段", "第 2 段"]
    assert ax.get_xlabel() == "时间（一次前向 = 1）"
    # 每个框的位置与长度就是事件的起止
    starts = sorted((round(p.get_y() + p.get_height() / 2), round(p.get_x(), 9), round(p.get_width(), 9)) for p in forward)
    want = sorted((e.rank, e.start, e.end - e.start) for e in events if e.kind == "F")
    assert starts == want


def test_several_timelines_stack_and_measured_seconds_become_ms(render):
    measured = [PipelineEvent(r, k, i, 0.0015 * i + 0.002 * r + (0.01 if k == "B" else 0), 0.0015 * i + 0.002 * r
                              + (0.01 if k == "B" else 0) + 0.001) for r in range(2) for k in "FB" for i in range(2)]
    fig = render(plot_pipeline_timeline({"理想 1F1B": ideal_schedule("1f1b", 2, 2), "实测": measured}, title="对比"))
    top, bottom = fig.axes[:2]
    assert top.get_title().startswith("理想 1F1B：空闲") and bottom.get_title().startswith("实测：空闲")
    assert bottom.get_xlabel() == "时间（毫秒）"
    assert max(p.get_x() + p.get_width() for p in _boxes(bottom, "#dd8452")) == pytest.approx(14.5)  # 0.0015 + 0.002 + 0.01 + 0.001 秒
    with pytest.raises(ValueError, match="events"):
        plot_pipeline_timeline([])
    with pytest.raises(ValueError, match="time_unit"):
        plot_pipeline_timeline(measured, time_unit="h")
    with pytest.raises(TypeError, match="PipelineEvent"):
        plot_pipeline_timeline([1, 2])
    from tformer_lib.plotting._common import new_figure

    fig, ax = new_figure()
    assert render(plot_pipeline_timeline(measured, ax=ax)) is fig and ax.get_legend() is not None
    with pytest.raises(ValueError, match="ax"):
        plot_pipeline_timeline({"a": measured, "b": measured}, ax=ax)


def test_auto_time_unit_follows_the_origin_not_whether_times_are_whole(render):
    # 反向 1.5、前向 0.5 的理想调度仍是理想的时间单位（不是“实测秒 → 毫秒”的 0–7575）
    fig = render(plot_pipeline_schedules(2, 2, backward_time=1.5))
    assert [a.get_xlabel() for a in fig.axes] == ["时间（一次前向 = 1）"] * 2
    assert fig.axes[0].get_xlim()[1] == pytest.approx(7.5 * 1.01)
    ax = render(plot_pipeline_timeline(ideal_schedule("gpipe", 2, 2, forward_time=0.5))).axes[0]
    assert ax.get_xlabel() == "时间（一次前向 = 1）"
    panels = {"理想": ideal_schedule("gpipe", 2, 2, backward_time=1.5), "复制成普通列表": list(ideal_schedule("gpipe", 2, 2))}
    assert [a.get_xlabel() for a in render(plot_pipeline_timeline(panels)).axes] == ["时间（一次前向 = 1）"] * 2
    measured = [PipelineEvent(0, "F", 0, 3.0, 4.0), PipelineEvent(0, "B", 0, 4.0, 5.5)]  # 普通列表、非整数 → 实测秒
    assert render(plot_pipeline_timeline(measured)).axes[0].get_xlabel() == "时间（毫秒）"
    assert render(plot_pipeline_timeline(measured, time_unit="s")).axes[0].get_xlabel() == "时间（秒）"


def test_schedules_given_as_one_name_and_measured_without_stage_3(render):
    fig = render(plot_pipeline_schedules(2, 2, schedules="1f1b"))
    assert len(fig.axes) == 1 and fig.axes[0].get_title().startswith("1F1B")
    with pytest.raises(ValueError, match="schedule 应是"):
        plot_pipeline_schedules(2, 2, schedules=("gpipe", "zb"))
    with pytest.raises(ValueError, match="schedules 为空"):
        plot_pipeline_schedules(2, 2, schedules=())
    measured = {k: v for k, v in zero_bytes_per_rank(100, 2, 3).items() if k != "total"}
    with pytest.raises(ValueError, match="stages 里应有 3"):
        plot_zero_memory(100, 2, stages=(0, 1), measured=measured)


def test_comm_volume_refuses_bytes_it_cannot_draw():
    for bad in (float("nan"), -5, "10", True, float("inf")):
        with pytest.raises(ValueError, match=r"volumes\['dp'\]\['formula'\] 应是 ≥ 0 的有限字节数"):
            plot_comm_volume({"dp": {"formula": bad}})
    with pytest.raises(ValueError, match="recorded.*应是 ≥ 0"):
        plot_comm_volume({"dp": {"formula": 1, "recorded": -1}})
    with pytest.raises(ValueError, match="log=True 的对数轴画不了 0"):  # 否则是 matplotlib 的两条 UserWarning
        plot_comm_volume({"dp": {"formula": 0}}, log=True)
    plot_comm_volume({"dp": {"formula": 0}})  # 线性轴上 0 可以画（本文件把警告当错误）


def test_zero_memory_bars_are_the_formula_and_measured_sits_beside_stage_3(render):
    n, p = 10_000, 4
    measured = {k: v for k, v in zero_bytes_per_rank(n, p, 3).items() if k != "total"}
    ax = render(plot_zero_memory(n, p, measured=measured, unit=1024)).axes[0]
    labels = [t.get_text() for t in ax.get_yticklabels()]
    assert labels == ["阶段 0（DDP）", "阶段 1", "阶段 2", "阶段 3（FSDP）", "FSDP2 实测"]
    for y, stage in enumerate([0, 1, 2, 3, 3]):
        widths = [b.get_width() for b in ax.patches if abs(b.get_y() + b.get_height() / 2 - y) < 1e-9]
        assert sum(widths) == pytest.approx(zero_bytes_per_rank(n, p, stage)["total"] / 1024)
    with pytest.raises(ValueError, match="stages"):
        plot_zero_memory(n, p, stages=(4,))
    with pytest.raises(ValueError, match="measured"):
        plot_zero_memory(n, p, measured={"parameters": 1})


def test_comm_volume_formula_beside_recorded(render):
    volumes = {"数据并行": {"formula": 4096, "recorded": 4096}, "流水线": {"formula": 1024}}
    ax = render(plot_comm_volume(volumes)).axes[0]
    assert [round(b.get_width(), 6) for b in ax.patches] == [4.0, 1.0, 4.0, 0.0]
    assert any("未记录" in t.get_text() for t in ax.texts)
    render(plot_comm_volume(volumes, log=True))
    with pytest.raises(ValueError, match="volumes"):
        plot_comm_volume({})
    with pytest.raises(TypeError, match="formula"):
        plot_comm_volume({"x": 3})
