"""第 12 章的探索器：流水线调度（静态滑块 = 微批数 m）与 ZeRO 显存（静态滑块 = 进程数 p）——每档一帧、jslink 换帧、帧小。"""

import ipywidgets as widgets
import pytest

from tformer_lib.widgets import CHAPTER_FRAME_BUDGET, figure_to_png
from tformer_lib.widgets.parallel import PIPELINE_MICRO_BATCHES, pipeline_schedule_explorer, zero_memory_explorer

PNG = b"\x89PNG"


def _check_static(ex, static, values):
    ctl = ex.controls[static]
    assert ex.static == static and ex._option_values() == values
    pngs = [bytes(f.value) for f in ex.frames]
    assert len(pngs) == len(values) and all(p.startswith(PNG) for p in pngs) and len(set(pngs)) == len(pngs)
    assert ex.link.source == (ctl, "index") and ex.link.target == (ex.stack, "selected_index")
    i = (ctl.index + 1) % len(values)
    assert pngs[i] == figure_to_png(ex.figure(**{static: values[i]}), colors=256)
    assert ex.frame_bytes() * 1.34 <= CHAPTER_FRAME_BUDGET / 4, ex.frame_bytes()  # 两个加起来不到一章预算的一半
    return pngs


@pytest.mark.distributed
def test_pipeline_explorer_frames_per_micro_batch_count():
    ex = pipeline_schedule_explorer()
    _check_static(ex, "micro_batches", list(PIPELINE_MICRO_BATCHES))
    assert ex.figure().texts[0].get_text() == "p = 4 段、m = 8 个微批：气泡 (p−1)/(m+p−1) = 27.3%"
    ex.update(stages=2)  # 非静态控件：Jupyter 里当前帧重画
    assert ex.status.value == "" and bytes(ex.image.value) == figure_to_png(ex.figure(), colors=256)
    title = ex.figure().axes[1].get_title()
    assert title.startswith("1F1B") and "在飞" not in title  # 在飞的微批数是练习 4 的答案，不写在图上
    assert pipeline_schedule_explorer(micro_batches=3)._option_values() == [1, 2, 3, 4, 8, 16]


@pytest.mark.distributed
def test_zero_explorer_frames_per_world_size_with_measured_at_its_size():
    measured = {"parameters": 400.0, "gradients": 400.0, "optimizer": 800.0}
    ex = zero_memory_explorer(200, measured=measured)
    _check_static(ex, "world_size", [1, 2, 4, 8, 16, 64])
    labels = lambda fig: [t.get_text() for t in fig.axes[0].get_yticklabels()]  # noqa: E731
    assert labels(ex.figure())[-1] == "FSDP2 实测"  # p = 2 = 实测时的进程数
    assert "FSDP2 实测" not in labels(ex.figure(world_size=4))
    assert "FSDP2 实测" not in labels(ex.figure(precision="mixed"))
    ex.update(precision="mixed")
    assert ex.status.value == ""
    assert isinstance(ex.controls["precision"], widgets.ToggleButtons)


def test_explorers_refuse_what_a_slider_would_silently_clamp():
    import numpy as np

    for kwargs, match in [({"stages": 0}, "stages 应是 2…8 之间的整数，收到 0"), ({"stages": 9}, "stages 应是 2…8"),
                          ({"options": (0, 2)}, "options 里的值 应是 ≥ 1 的整数，收到 0"),
                          ({"options": ()}, "options 应是非空"), ({"micro_batches": 2.5}, "micro_batches"),
                          ({"backward_time": float("nan")}, "backward_time 应是 > 0 的有限数")]:
        with pytest.raises(ValueError, match=match):
            pipeline_schedule_explorer(**kwargs)
    assert pipeline_schedule_explorer(stages=np.int64(3), options=(2,)).controls["stages"].value == 3
    for kwargs, match in [({"n_params": 0}, "n_params"), ({"world_size": True}, "world_size"),
                          ({"options": (1, -2)}, "options 里的值"),
                          ({"measured": {"parameters": 1.0}}, r"measured 缺少 \['gradients', 'optimizer'\]")]:
        with pytest.raises(ValueError, match=match):
            zero_memory_explorer(**{"n_params": 200, **kwargs})
