"""第 12 章检查器的用例：参考答案（与 notebooks/solutions/12_solutions.ipynb 一致）和已知错误答案。"""

import torch
import torch.distributed as dist

from checkers import Case, Wrong
from tformer_lib.exercises.ch12 import (
    buggy_allreduce_gradients,
    check_allreduce_gradients,
    check_bubble_fraction,
    check_peak_in_flight,
    check_ring_allreduce_bytes,
)
from tformer_lib.parallel import allreduce_gradients, bubble_fraction
from tformer_lib.parallel.comm import ring_all_reduce_bytes
from tformer_lib.parallel.schedule import busy_time, ideal_schedule, makespan, peak_in_flight


# ---- 练习 1（推导并核对）：reduce-scatter 与 all-gather 各 p−1 轮，每轮 N/p 个元素 ----
def ref_ring_allreduce_bytes(n_elements, world_size, element_bytes):
    return 2 * (world_size - 1) / world_size * n_elements * element_bytes


RING = Case(check_ring_allreduce_bytes, ref_ring_allreduce_bytes, returns="number",
            also_correct=[lambda n, p, b: 2 * (p - 1) * (n // p) * b], wrong=[
    Wrong("hard_coded", lambda n, p, b: 4_000_000),
    Wrong("one_pass", lambda n, p, b: (p - 1) / p * n * b, key="one_pass"),
    Wrong("whole_tensor", lambda n, p, b: 2 * (p - 1) * n * b, key="whole_tensor"),
    Wrong("elements", lambda n, p, b: 2 * (p - 1) / p * n, key="elements"),
    Wrong("limit", lambda n, p, b: 2 * n * b, key="limit"),
    Wrong("limit_at_p1", lambda n, p, b: 2 * n * b if p == 1 else ref_ring_allreduce_bytes(n, p, b), key="limit"),
    Wrong("library_call", lambda n, p, b: ring_all_reduce_bytes(n * b, p), key="library_call"),
])


# ---- 练习 2（找错）：求和之后还要除以进程数 ----
def ref_allreduce_gradients(model):
    world_size = dist.get_world_size()
    for p in model.parameters():
        if p.grad is None:
            continue
        dist.all_reduce(p.grad, op=dist.ReduceOp.SUM)  # Σ_r grad_r
        p.grad /= world_size  # 平均
    return model


def _divide_first(model):
    for p in model.parameters():
        if p.grad is not None:
            p.grad /= dist.get_world_size()  # 先除再加，也对
            dist.all_reduce(p.grad)
    return model


def _divide_by_two(model):
    for p in model.parameters():
        if p.grad is not None:
            dist.all_reduce(p.grad)
            p.grad /= 2  # 写死了本章例子的 2 个进程
    return model


def _divide_by_three(model):
    for p in model.parameters():
        if p.grad is not None:
            dist.all_reduce(p.grad)
            p.grad /= 3  # 写死了检查器以前唯一的 3 个进程：2 个进程时错
    return model


def _local_only(model):
    for p in model.parameters():
        if p.grad is not None:
            p.grad /= dist.get_world_size()  # 忘了 all_reduce
    return model


ALLREDUCE = Case(check_allreduce_gradients, ref_allreduce_gradients, also_correct=[_divide_first], wrong=[
    Wrong("hard_coded", _divide_by_two, key="hard_coded_world_size"),
    Wrong("hard_coded_three", _divide_by_three, key="hard_coded_world_size"),
    Wrong("the_bug", buggy_allreduce_gradients, key="sum_not_mean"),
    Wrong("local_only", _local_only, key="no_all_reduce"),
    Wrong("library_call", lambda model: allreduce_gradients(model) and model, key="library_call"),
])


# ---- 练习 3（预测再验证）：最后一段慢 c 倍时，它成了瓶颈 ----
def ref_bubble(stages, micro_batches, last_stage_cost):
    # 以“一次前向 + 一次反向”为一格：整段 (p−1) + m·c 格；忙碌 (p−1)·m + m·c 格（其余各段 m 格，最后一段 m·c 格）
    p, m, c = stages, micro_batches, last_stage_cost
    return 1 - m * (p - 1 + c) / (p * (p - 1 + m * c))


def _factored_bubble(stages, micro_batches, last_stage_cost):  # 同一个式子的另一种写法：(p−1)(p + m(c−1)) / (p(p−1+mc))
    p, m, c = stages, micro_batches, last_stage_cost
    return (p - 1) * (p + m * (c - 1)) / (p * (p - 1 + m * c))


def _measured_bubble(stages, micro_batches, last_stage_cost):  # 在库的理想时间线上量：不是推导，ideal_schedule 也禁用
    events = ideal_schedule("gpipe", stages, micro_batches, stage_cost=[1.0] * (stages - 1) + [last_stage_cost])
    span = max(e.end for e in events) - min(e.start for e in events)
    return 1 - sum(e.end - e.start for e in events) / (stages * span)


def _bubble_from_library_helpers(stages, micro_batches, last_stage_cost):  # 库的 busy_time、makespan 就是答案
    events = ideal_schedule("gpipe", stages, micro_batches, stage_cost=[1.0] * (stages - 1) + [last_stage_cost])
    return 1 - sum(busy_time(events).values()) / (stages * makespan(events))


BUBBLE = Case(check_bubble_fraction, ref_bubble, returns="number", also_correct=[_factored_bubble], wrong=[
    Wrong("measures_the_library_timeline", _measured_bubble, key="library_call"),
    Wrong("hard_coded", lambda p, m, c: 0.2),
    Wrong("balanced_formula", lambda p, m, c: (p - 1) / (m + p - 1), key="balanced"),
    Wrong("over_useful", lambda p, m, c: (p - 1) / m, key="over_useful"),
    Wrong("busy", lambda p, m, c: 1 - ref_bubble(p, m, c), key="busy"),
    Wrong("half_at_p1", lambda p, m, c: ref_bubble(p, m, c) if p > 1 else 0.5, key="values"),
    Wrong("wrong_at_m1", lambda p, m, c: ref_bubble(p, m, c) if m > 1 else 0.3, key="values"),  # m=1 时答案是 1−1/p
    Wrong("slow_fill_and_drain", lambda p, m, c: 1 - m * (p - 1 + c) / (p * c * (m + p - 1)), key="slow_fill"),
    Wrong("one_fast_stage", lambda p, m, c: 1 - m / (p - 1 + m * c), key="one_stage"),
    Wrong("percent", lambda p, m, c: 100 * ref_bubble(p, m, c), key="percent"),
    Wrong("scaled_numerator", lambda p, m, c: (p - 1) * c / (m * c + p - 1), key="values"),
    # 库里的 bubble_fraction 是各段一样快时的式子：c ≠ 1 时数不对，按写错报告（用到库函数只在全部通过时才点名）
    Wrong("library_balanced_formula", lambda p, m, c: bubble_fraction(p, m), key="balanced"),
    Wrong("busy_time_and_makespan", _bubble_from_library_helpers, key="library_call"),
])


# ---- 练习 4（推导并核对）：GPipe 存 m 份，1F1B 的第 s 段存 min(p−s, m) 份 ----
def ref_peak_in_flight(schedule, stages, micro_batches, stage):
    return micro_batches if schedule == "gpipe" else min(stages - stage, micro_batches)


def _count_in_flight(schedule, stages, micro_batches, stage):  # 另一种对的做法：在理想时间线上自己数
    mine = [e for e in ideal_schedule(schedule, stages, micro_batches) if e.rank == stage]
    points = sorted([(e.start, 1) for e in mine if e.kind == "F"] + [(e.end, -1) for e in mine if e.kind == "B"])
    live = peak = 0
    for _, delta in points:
        live += delta
        peak = max(peak, live)
    return peak


PEAK = Case(check_peak_in_flight, ref_peak_in_flight, returns="int", also_correct=[_count_in_flight], wrong=[
    Wrong("hard_coded", lambda k, p, m, s: 2),
    Wrong("1f1b_as_gpipe", lambda k, p, m, s: m, key="1f1b_as_gpipe"),
    Wrong("ignores_stage", lambda k, p, m, s: m if k == "gpipe" else min(p, m), key="ignores_stage"),
    Wrong("no_min", lambda k, p, m, s: m if k == "gpipe" else p - s, key="no_min"),
    Wrong("last_stage_plus_one", lambda k, p, m, s: ref_peak_in_flight(k, p, m, s) + (k == "1f1b" and s == p - 1 and p > 3),
          key="values"),
    Wrong("library_call", lambda k, p, m, s: peak_in_flight(ideal_schedule(k, p, m))[s], key="library_call"),
])

CASES = [RING, ALLREDUCE, BUBBLE, PEAK]
