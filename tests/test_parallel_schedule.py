"""流水线调度的时间线：理想调度（GPipe、1F1B）的空闲比例等于 (p−1)/(m+p−1)、在飞微批数的峰值；
手写流水线（GPipe 与 1F1B 两种顺序、2 段与 3 段，PAD 不均的块）与单进程一致，并记下每段每个微批前向/反向的实测时间线。"""

import pytest
import torch

from tformer_lib.lm import LMConfig, make_lm
from tformer_lib.parallel import launch
from tformer_lib.parallel.pipeline import bubble_fraction, measure_pipeline_timeline, pipeline_worker
from tformer_lib.parallel.schedule import (
    SCHEDULES,
    PipelineEvent,
    busy_time,
    ideal_schedule,
    idle_fraction,
    idle_per_rank,
    makespan,
    peak_in_flight,
    stage_order,
)
from tformer_lib.specials import PAD


@pytest.mark.parametrize("schedule", SCHEDULES)
@pytest.mark.parametrize("backward_time", [1.0, 2.0])
def test_ideal_idle_fraction_is_the_bubble_formula(schedule, backward_time):
    for p in range(1, 9):
        for m in range(1, 17):
            events = ideal_schedule(schedule, p, m, backward_time=backward_time)
            assert len(events) == 2 * p * m
            assert idle_fraction(events) == pytest.approx(bubble_fraction(p, m), abs=1e-12), (p, m)
            assert makespan(events) == pytest.approx((m + p - 1) * (1 + backward_time))
            assert all(b == pytest.approx(m * (1 + backward_time)) for b in busy_time(events).values())


def test_peak_in_flight_gpipe_m_vs_1f1b_p_minus_s():
    for p in range(1, 7):
        for m in range(1, 13):
            assert peak_in_flight(ideal_schedule("gpipe", p, m)) == {s: m for s in range(p)}
            assert peak_in_flight(ideal_schedule("1f1b", p, m)) == {s: min(p - s, m) for s in range(p)}


def test_stage_orders_and_dependencies():
    assert stage_order("gpipe", 2, 3, 0) == [("F", 0), ("F", 1), ("F", 2), ("B", 0), ("B", 1), ("B", 2)]
    assert stage_order("1f1b", 2, 4, 0) == [("F", 0), ("F", 1), ("B", 0), ("F", 2), ("B", 1), ("F", 3), ("B", 2), ("B", 3)]
    assert stage_order("1f1b", 2, 4, 1) == [("F", 0), ("B", 0), ("F", 1), ("B", 1), ("F", 2), ("B", 2), ("F", 3), ("B", 3)]
    for schedule in SCHEDULES:
        events = ideal_schedule(schedule, 3, 4, backward_time=2.0)
        end = {(e.kind, e.rank, e.micro_batch): e.end for e in events}
        for e in events:
            if e.kind == "F" and e.rank > 0:
                assert e.start >= end[("F", e.rank - 1, e.micro_batch)]
            if e.kind == "B":
                dep = ("B", e.rank + 1, e.micro_batch) if e.rank < 2 else ("F", e.rank, e.micro_batch)
                assert e.start >= end[dep]
        for r in range(3):  # 一段同一时刻只做一件事
            mine = sorted((e for e in events if e.rank == r), key=lambda e: e.start)
            assert all(a.end <= b.start for a, b in zip(mine, mine[1:]))
    assert idle_per_rank(ideal_schedule("gpipe", 2, 2)) == {0: pytest.approx(1 / 3), 1: pytest.approx(1 / 3)}


def test_schedule_errors():
    with pytest.raises(ValueError, match="schedule"):
        ideal_schedule("zb", 2, 2)
    with pytest.raises(ValueError, match="micro_batches"):
        ideal_schedule("gpipe", 2, 0)
    with pytest.raises(ValueError, match="backward_time"):
        ideal_schedule("gpipe", 2, 2, backward_time=0)
    with pytest.raises(ValueError, match="stage"):
        stage_order("gpipe", 2, 2, 2)
    with pytest.raises(ValueError, match="events"):
        idle_fraction([])
    with pytest.raises(ValueError, match="kind"):
        makespan([PipelineEvent(0, "X", 0, 0.0, 1.0)])


def test_events_are_read_once_and_bad_ones_are_refused_in_chinese():
    import numpy as np

    events = ideal_schedule("gpipe", 2, 2)
    # 生成器只能读一遍：空闲比例仍然算对，而不是第二遍读到“events 为空”
    assert idle_fraction(e for e in events) == pytest.approx(idle_fraction(events)) == pytest.approx(1 / 3)
    assert idle_per_rank(e for e in events) == idle_per_rank(events)
    with pytest.raises(ValueError, match="stages=1 太少.*2 个段"):
        idle_fraction(events, stages=1)  # 否则是 −0.333
    assert idle_fraction(events, stages=np.int64(4)) == pytest.approx(1 - 8 / (4 * 6))  # 忙 8、跨度 6
    with pytest.raises(ValueError, match="start 应是有限的数"):
        makespan([PipelineEvent(0, "F", 0, float("nan"), 1.0)])
    with pytest.raises(ValueError, match="end 应是有限的数"):
        idle_fraction([PipelineEvent(0, "F", 0, 0.0, float("inf"))])
    with pytest.raises(ValueError, match="rank 应是非负整数"):
        makespan([(-1, "F", 0, 0.0, 1.0)])
    for bad in (None, 5, "FB"):
        with pytest.raises(TypeError, match="events 应是PipelineEvent"):
            makespan(bad)
    with pytest.raises(TypeError, match="其中一项是 1"):
        makespan([1, 2])
    for name in ("forward_time", "backward_time"):
        for value in (float("inf"), float("nan"), -1.0, True):
            with pytest.raises(ValueError, match=f"{name} 应是有限的正数"):
                ideal_schedule("gpipe", 2, 2, **{name: value})
    # NumPy 的整数也是整数（bool 不是）
    assert ideal_schedule("1f1b", np.int64(2), np.int64(3)) == ideal_schedule("1f1b", 2, 3)
    assert stage_order("gpipe", 2, 2, np.int64(1)) == stage_order("gpipe", 2, 2, 1)
    assert bubble_fraction(np.int64(2), np.int32(4)) == pytest.approx(1 / 5)
    with pytest.raises(ValueError, match="stages 应是整数，收到 bool True"):
        ideal_schedule("gpipe", True, 2)
    # 理想调度的列表带着来源标记（画图据此选单位），仍然是普通的 list
    assert getattr(ideal_schedule("gpipe", 2, 2, backward_time=1.5), "ideal", False) and isinstance(events, list)


STEPS, BATCH, MICRO, LR = 2, 6, 3, 0.5


@pytest.fixture(scope="module")
def problem(sgd_reference):
    torch.manual_seed(0)
    model = make_lm(LMConfig(vocab_size=30, d_model=16, n_heads=2, n_layers=3, d_ff=32, max_len=16,
                             tie_embeddings=False, positional="learned"))
    blocks = torch.randint(4, 30, (STEPS * BATCH, 9))
    for row in range(len(blocks)):  # PAD 尾巴长短不一：各微批的非 PAD 目标数不同，整批平均 ≠ 微批平均的平均
        blocks[row, 2 + (row * 5) % 7 :] = PAD
    losses, params = sgd_reference(model, blocks, STEPS, BATCH, LR)
    return model, blocks, losses, params


@pytest.mark.distributed
@pytest.mark.parametrize("mode, stages", [("manual_1f1b", 2), ("manual", 3), ("manual_1f1b", 3)])
def test_manual_schedules_equal_single_process_and_record_a_timeline(problem, mode, stages):
    model, blocks, losses, params = problem
    res = launch(pipeline_worker, stages, (mode, model.config.to_dict(), model.state_dict(), blocks, STEPS, BATCH,
                                           MICRO, LR), timeout=150)
    assert losses == pytest.approx(res[-1]["losses"], rel=1e-6)
    got = {k: v for r in res for k, v in r["params"].items()}
    assert sorted(got) == sorted(params)
    for name, value in params.items():
        assert torch.allclose(got[name], value, atol=1e-6, rtol=0), name
    schedule = "gpipe" if mode == "manual" else "1f1b"
    for rank, r in enumerate(res):
        assert len(r["timeline"]) == STEPS
        for events in r["timeline"]:  # 每段按自己的调度顺序做了每个微批的一次前向与一次反向
            assert [(e.kind, e.micro_batch) for e in events] == stage_order(schedule, stages, MICRO, rank)
            assert all(e.rank == rank and 0 <= e.start <= e.end for e in events)
            assert all(a.end <= b.start for a, b in zip(events, events[1:]))


@pytest.mark.distributed
def test_measured_timeline_has_every_box_and_a_bubble():
    torch.manual_seed(1)
    model = make_lm(LMConfig(vocab_size=30, d_model=16, n_heads=2, n_layers=2, d_ff=32, max_len=16,
                             tie_embeddings=False))
    out = measure_pipeline_timeline(model, torch.randint(4, 30, (16, 9)), micro_batches=4, batch_size=8, steps=2)
    events = out["events"]
    assert len(events) == 2 * 2 * 4 and {e.rank for e in events} == {0, 1}
    assert out["bubble_fraction"] == pytest.approx(1 / 5)
    assert 0 < out["idle_fraction"] < 1
    # 依赖在实测里也成立：第 1 段的前向 i 在第 0 段的前向 i 之后开始
    end = {(e.kind, e.rank, e.micro_batch): e.end for e in events}
    assert all(e.start >= end[("F", 0, e.micro_batch)] for e in events if e.kind == "F" and e.rank == 1)
    with pytest.raises(ValueError, match="整除"):
        measure_pipeline_timeline(model, torch.randint(4, 30, (16, 9)), micro_batches=3, batch_size=8)


@pytest.mark.parametrize("kind", ["gpipe", "1f1b"])
def test_a_slower_last_stage_is_the_bottleneck(kind):
    """stage_cost：最后一段慢 c 倍时，它的 m 个前向与 m 个反向首尾相接，整段时间 = (p−1)(t_f+t_b) + m·c·(t_f+t_b)。"""
    from tformer_lib.parallel.schedule import ideal_schedule

    assert ideal_schedule(kind, 4, 6, backward_time=2.0, stage_cost=[1, 1, 1, 1]) == ideal_schedule(kind, 4, 6,
                                                                                                    backward_time=2.0)
    for p, m, c, t_b in ((4, 6, 3.0, 2.0), (2, 1, 1.5, 1.0), (5, 9, 2.0, 3.0)):
        events = ideal_schedule(kind, p, m, backward_time=t_b, stage_cost=[1.0] * (p - 1) + [c])
        span = max(e.end for e in events) - min(e.start for e in events)
        assert span == pytest.approx((p - 1) * (1 + t_b) + m * c * (1 + t_b))
        last = [e for e in events if e.rank == p - 1]
        assert all(e.end - e.start == pytest.approx(c * (1 if e.kind == "F" else t_b)) for e in last)


def test_stage_cost_is_checked():
    from tformer_lib.parallel.schedule import ideal_schedule

    with pytest.raises(ValueError, match="stage_cost.*3 个"):
        ideal_schedule("gpipe", 3, 4, stage_cost=[1.0, 2.0])
    with pytest.raises(ValueError, match="stage_cost"):
        ideal_schedule("gpipe", 2, 4, stage_cost=[1.0, float("nan")])
    with pytest.raises(ValueError, match="stage_cost"):
        ideal_schedule("gpipe", 2, 4, stage_cost="12")


def test_split_points_and_stages_are_checked():
    from tformer_lib.parallel.pipeline import LMStage, split_points

    for bad in (0, -1):
        with pytest.raises(ValueError, match="stages"):
            split_points(4, bad)
    with pytest.raises(TypeError, match="stages"):
        split_points(4, 2.0)
    model = make_lm(LMConfig(vocab_size=30, d_model=16, n_heads=2, n_layers=4, d_ff=32, max_len=16, tie_embeddings=False))
    with pytest.raises(ValueError, match="stage 应是 0 到 stages-1=2"):
        LMStage(model, 5, 3)
