"""第 12 章（分布式训练）练习的检查器，和“找错”题里那段有错的代码。

- :func:`check_ring_allreduce_bytes`（推导并核对）：环形 all-reduce 里每个进程发出多少字节——与检查器里一个真的
  逐轮模拟的环（reduce-scatter + all-gather，数出每个进程发出的字节，并核对求和结果）比较；
- :func:`buggy_allreduce_gradients` + :func:`check_allreduce_gradients`（找错）：手写的梯度同步只求和、没有取平均——
  检查器真的起进程（gloo，2 个与 3 个各一次），在小模型上用读者改好的函数同步梯度，与单进程整批的梯度比较；
- :func:`check_bubble_fraction`（预测再验证）：p 段、m 个微批时流水线的空闲比例——与理想调度的时间线
  （GPipe 与 1F1B、随机的反向耗时）量出来的空闲比例比较；
- :func:`check_peak_in_flight`（扩展）：GPipe 与 1F1B 里第 s 段最多同时存几个微批的激活——与理想时间线数出来的比较。

每个检查器都在多组随机情形上调用读者的函数（写死的答案过不了）；库里直接给出答案的函数（例如
:func:`~tformer_lib.parallel.comm.ring_all_reduce_bytes`、:func:`~tformer_lib.parallel.pipeline.bubble_fraction`）
是禁用的（``run_checks(..., forbidden=…, trace_forbidden=True)``，子进程里也记）：读者的函数用到它们得到
“❌ library_call”。桩（stub）→ “⏳ 尚未完成”，不抛异常。
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from tformer_lib.exercises._core import (
    CheckResult,
    Mistake,
    Variant,
    as_int,
    compare_number,
    draw_choice,
    draw_int,
    random_cases,
    run_checks,
    run_in_workers,
)

__all__ = [
    "check_ring_allreduce_bytes",
    "buggy_allreduce_gradients",
    "check_allreduce_gradients",
    "check_bubble_fraction",
    "check_peak_in_flight",
]


# ---- 推导并核对：环形 all-reduce 每个进程发出的字节 ------------------------------------------------------


def _simulate_ring(tensors: list[torch.Tensor]) -> list[int]:
    """逐轮模拟环形 all-reduce：返回每个进程发出的字节数，并核对每个进程最后都得到总和。

    第一趟 reduce-scatter：p−1 轮，每轮 rank r 把第 (r−k) mod p 块发给 r+1，对方加到自己那块上；之后 rank r 手里的
    第 (r+1) mod p 块是全体之和。第二趟 all-gather：p−1 轮，把求好和的块沿环传下去（对方直接覆盖）。
    """
    p = len(tensors)
    chunks = [list(t.clone().chunk(p)) for t in tensors]
    sent = [0] * p
    for shift in (0, 1):  # 0：reduce-scatter（相加），1：all-gather（覆盖）
        for k in range(p - 1):
            messages = [(r, (r + shift - k) % p, chunks[r][(r + shift - k) % p].clone()) for r in range(p)]
            for r, c, data in messages:
                sent[r] += data.numel() * data.element_size()
                if shift == 0:
                    chunks[(r + 1) % p][c] += data
                else:
                    chunks[(r + 1) % p][c] = data
    total = torch.stack(tensors).sum(0)
    for ch in chunks:  # 检查器自己的核对：模拟的环确实算出了总和
        if not torch.allclose(torch.cat(ch).double(), total.double(), atol=1e-3):
            raise RuntimeError("环形 all-reduce 的模拟没有得到总和")
    return sent


def check_ring_allreduce_bytes(fn: Callable[..., Any], *, verbose: bool = True) -> CheckResult:
    """检查 ``fn(n_elements, world_size, element_bytes) -> 数``：对一个 ``n_elements`` 个元素（每个
    ``element_bytes`` 字节）的张量做环形 all-reduce，每个进程一共**发出**多少字节。

    与逐轮模拟的环（:func:`_simulate_ring`，真的切块、传递、求和）数出来的字节比较；n_elements 取 p 的倍数。
    库里的 ``ring_all_reduce_bytes`` 禁用。
    """
    from tformer_lib.parallel.comm import ring_all_reduce_bytes

    dtypes = {2: torch.float16, 4: torch.float32, 8: torch.float64}

    def cases(f):
        for i, g in enumerate(random_cases(10, seed=121)):
            # 第一组 p=4、4 字节：各种错误写法的值互不相同；第 4 组 p=1（环里没有别人：0 字节），之后也可能抽到 1
            p = (4, 8, 2, 1)[i] if i < 4 else draw_int(g, 1, 12)
            b = 4 if i == 0 else draw_choice(g, (2, 4, 8))
            small = p * draw_int(g, 1, 12)
            sent = _simulate_ring([torch.randint(-4, 5, (small,), generator=g).to(dtypes[b]) for _ in range(p)])
            n = small if i % 2 == 0 else p * draw_int(g, 10_000, 2_000_000)  # 大的 n：按每个元素的字节数放大
            want = sent[0] / small * n
            call = f"ring_allreduce_bytes(n_elements={n}, world_size={p}, element_bytes={b})"
            compare_number(f(n, p, b), want, what=f"{call} 的返回值", variants=[
                Variant("one_pass", "只算了一趟：环形 all-reduce 先 reduce-scatter、再 all-gather，两趟各 p−1 轮",
                        (p - 1) / p * n * b),
                Variant("whole_tensor", "每一轮只发 1/p 块，而不是整个张量", 2 * (p - 1) * n * b),
                Variant("naive", "那是每个进程把整个张量直接发给其余 p−1 个进程；环形每轮只发 1/p", (p - 1) * n * b),
                Variant("elements", "算出的是元素个数，还要乘每个元素的字节数 element_bytes", 2 * (p - 1) / p * n),
                Variant("limit", "2N 是 p→∞ 时的极限；p 有限时是 2(p−1)/p·N", 2 * n * b),
            ], default_hint=f"{call}：逐轮模拟的环里每个进程发出 {want:.6g} 字节"
                            + ("（只有 1 个进程时环里没有别人，不发任何字节）" if p == 1 else ""))

    return run_checks("环形 all-reduce 每个进程发出的字节", fn,
                      [("10 组随机的 n、p（含 p=1）与元素字节数，对照逐轮模拟", cases)], verbose=verbose,
                      forbidden=(ring_all_reduce_bytes,), trace_forbidden=True)


# ---- 找错：梯度同步只求和、没有平均 ----------------------------------------------------------------------


def buggy_allreduce_gradients(model: nn.Module) -> nn.Module:
    """一个有错的手写梯度同步（第 12 章“找错”练习用，不要在别处使用）：应让每个进程得到所有进程梯度的**平均**。"""
    for p in model.parameters():
        if p.grad is None:
            continue
        dist.all_reduce(p.grad, op=dist.ReduceOp.SUM)  # 每个进程都得到 Σ_r grad_r
    return model


_WORLDS = (2, 3)  # 两种进程数各起一次：写死“除以 2”或“除以 3”的答案总有一种不对


def _tiny_model(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(5, 7), nn.Tanh(), nn.Linear(7, 3))
    model.append(nn.Linear(3, 3)).requires_grad_(True)
    model[3].bias.requires_grad_(False)  # 一个不训练的参数：它的 grad 是 None
    return model


def _grad_case(seed: int, per_rank: int, rank: int, world_size: int):
    """第 ``seed`` 组：模型、整批 ``per_rank × world_size`` 行数据；rank 的那一份是第 rank 个连续的 ``per_rank`` 行，
    ``rank = -1`` 表示一个进程用整批。返回反向之后的模型（梯度在 ``p.grad`` 里）。"""
    model = _tiny_model(seed)
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(per_rank * world_size, 5, generator=g)
    y = torch.randn(per_rank * world_size, 3, generator=g)
    rows = slice(rank * per_rank, (rank + 1) * per_rank) if rank >= 0 else slice(None)
    loss = ((model(x[rows]) - y[rows]) ** 2).mean()  # 批内平均
    loss.backward()
    return model


def _grads(model: nn.Module) -> dict[str, torch.Tensor | None]:
    return {k: (None if p.grad is None else p.grad.detach().clone()) for k, p in model.named_parameters()}


def _allreduce_worker(rank: int, world_size: int, call: Callable[..., Any], cases: list[tuple[int, int]]) -> list[dict]:
    """子进程里（:func:`~tformer_lib.exercises._core.run_in_workers` 的 ``body``）：对每组情形算出本进程那一份数据的
    梯度，用 ``call`` 调用读者的函数，交回同步后的梯度（和同步前的，用来认错）。"""
    out = []
    for seed, per_rank in cases:
        model = _grad_case(seed, per_rank, rank, world_size)
        local = _grads(model)
        call(model)
        out.append({"local": local, "synced": _grads(model)})
    return out


def check_allreduce_gradients(fn: Callable[..., Any], *, verbose: bool = True, timeout: float = 90.0) -> CheckResult:
    """检查改好的 ``fn(model) -> model``：在每个进程里把 ``model`` 每个参数的梯度换成**所有进程梯度的平均**。

    真的起进程（gloo，:func:`~tformer_lib.parallel.launch.launch`），2 个与 3 个各一次：每个进程用同一个小模型、
    整批数据里自己的那一份算出梯度，调用 ``fn(model)``，再与一个进程用整批算出的梯度比较（每次 4 组随机的模型与
    批大小）；进程数写死在代码里的答案过不了。读者的函数先在本进程里试调一次：还是桩时立刻 ⏳，不起进程。
    库里的 ``allreduce_gradients`` 禁用（子进程里也记下执行到的禁用代码）。
    """
    from tformer_lib.parallel.data_parallel import allreduce_gradients

    cases_ = [(1201 + k, 1 + k % 3) for k in range(4)]

    def check_world(f, world: int):
        # results[rank][k]：第 k 组情形在 rank 上同步前后的梯度；桩、异常、集合通信不齐等由 run_in_workers 报告
        results = run_in_workers(f, _allreduce_worker, world, (cases_,), probe=(_grad_case(0, 2, -1, 1),), timeout=timeout)
        for k, (seed, per_rank) in enumerate(cases_):
            want = _grads(_grad_case(seed, per_rank, -1, world))  # 一个进程、整批
            for name, ref in want.items():
                got = [res[k]["synced"][name] for res in results]
                local = [res[k]["local"][name] for res in results]
                if ref is None:
                    continue
                where = f"{world} 个进程、第 {k + 1} 组（每个进程 {per_rank} 个样本）参数 {name} 的梯度"
                if any(g is None for g in got):
                    raise Mistake(f"{where}变成了 None：不要把梯度置空，就地改写 p.grad", key="values")
                if all(torch.allclose(g, ref, atol=1e-6, rtol=1e-5) for g in got):
                    continue
                if all(torch.allclose(g, world * ref, atol=1e-6, rtol=1e-5) for g in got):
                    raise Mistake(f"{where}是整批梯度的 {world} 倍：all_reduce(SUM) 得到的是各进程梯度之和，"
                                  "还要除以进程数才是平均", key="sum_not_mean")
                for d in (2, 3, 4, 8):
                    if d != world and all(torch.allclose(g, world * ref / d, atol=1e-6, rtol=1e-5) for g in got):
                        raise Mistake(f"{where}是总和除以 {d}：进程数不要写死，用 dist.get_world_size()"
                                      f"（这里有 {world} 个进程）", key="hard_coded_world_size")
                if all(torch.allclose(g, l, atol=1e-7) or torch.allclose(g, l / world, atol=1e-7)
                       for g, l in zip(got, local)):
                    raise Mistake(f"{where}只用了本进程自己的数据：要先用 dist.all_reduce 把各进程的梯度加起来",
                                  key="no_all_reduce")
                if not all(torch.equal(g, got[0]) for g in got):
                    raise Mistake(f"{where}在各进程上不一样：同步之后每个进程的梯度应完全相同", key="values")
                raise Mistake(f"{where}与一个进程用整批算出的不一致", key="values")

    def synced(f):
        for world in _WORLDS:
            check_world(f, world)

    return run_checks("手写梯度同步（取平均）", fn,
                      [(f"{' 与 '.join(map(str, _WORLDS))} 个进程各一次、每次 4 组随机的模型与批大小，对照单进程整批", synced)],
                      verbose=verbose, forbidden=(allreduce_gradients,), trace_forbidden=True)


# ---- 预测再验证：流水线的气泡 ---------------------------------------------------------------------------


def check_bubble_fraction(fn: Callable[..., Any], *, verbose: bool = True) -> CheckResult:
    """检查 ``fn(stages, micro_batches, last_stage_cost) -> 数``：p 段、m 个微批、最后一段的前向与反向都比其余各段
    慢 c = ``last_stage_cost`` 倍（c ≥ 1，如放了输出层的那一段）时，各段合起来空闲的比例。

    与理想调度的时间线（:func:`~tformer_lib.parallel.schedule.ideal_schedule` 的 ``stage_cost``：GPipe 与 1F1B、
    随机的反向耗时）量出来的空闲比例比较（含 p=1、m=1、c=1 的边界）。c = 1 时就是 5.2 节的 (p−1)/(m+p−1)；
    c > 1 时还用它，检查器会指出。库里的 ``bubble_fraction``、``idle_fraction``、``idle_per_rank``、``busy_time``、
    ``makespan`` 与 ``ideal_schedule`` 都禁用（静态地看代码，也在读者的函数运行时记下执行到的库代码）：这是推导题，
    不是把库里的时间线再量一遍。
    """
    from tformer_lib.parallel import schedule as sch
    from tformer_lib.parallel.pipeline import bubble_fraction

    banned = (bubble_fraction, sch.idle_fraction, sch.idle_per_rank, sch.busy_time, sch.makespan, sch.ideal_schedule)
    ideal = sch.ideal_schedule  # 检查器自己用（禁用只针对读者的函数）

    def cases(f):
        for i, g in enumerate(random_cases(16, seed=124)):
            # 边界：第 2、3 组 p=1（没有流水线，不空闲），第 4、5 组 m=1，第 6、7 组 c=1（各段一样快），第 8 组 m<p；其余随机
            p = 1 if i in (1, 2) else draw_int(g, 2, 8) if i < 12 else draw_int(g, 1, 8)
            m = draw_int(g, 1, p - 1) if i == 7 and p > 1 else 1 if i in (3, 4) else draw_int(g, 3, 32)
            c = 1.0 if i in (5, 6) else draw_choice(g, (1.5, 2.0, 3.0, 4.0)) if i < 12 else draw_choice(g, (1.0, 2.0, 2.5))
            kind = ("gpipe", "1f1b")[i % 2]
            t_b = draw_choice(g, (1.0, 2.0, 3.0))
            events = ideal(kind, p, m, backward_time=t_b, stage_cost=[1.0] * (p - 1) + [c])
            busy = sum(e.end - e.start for e in events)
            span = max(e.end for e in events) - min(e.start for e in events)
            want = 1 - busy / (p * span)
            call = f"bubble(stages={p}, micro_batches={m}, last_stage_cost={c:g})"
            variants = [
                Variant("over_useful", "(p−1)/m 是气泡时间与有用计算时间之比（Narayanan 等人 2021 年给出的 (p−1)/m）；"
                        "这里问的是占整段时间的比例", (p - 1) / m),
                Variant("denominator", "各段一样快时整段时间是 m+p−1 个“格”（每段忙 m 格、等 p−1 格），分母不是 m+p",
                        (p - 1) / (m + p)),
                Variant("one_over_m", "气泡随段数 p 变大：每段开头等 p−1 格、末尾也等 p−1 格", 1 / m),
                Variant("busy", "这是忙碌的比例；问的是空闲的比例", 1 - want),
                Variant("percent", "应返回 0 到 1 之间的比例，不是百分数", 100 * want),
            ]
            if c != 1:
                variants.insert(0, Variant(
                    "balanced", f"(p−1)/(m+p−1) 只在各段一样快时成立。最后一段慢 c={c:g} 倍时它是瓶颈：前向与反向各有 m 件事"
                    "在它那里首尾相接，整段时间变长了，而其余各段的忙碌时间不变", (p - 1) / (m + p - 1)))
                variants += [
                    Variant("slow_fill", "只有最后一段慢：第一个微批走过前面 p−1 段、最后一个梯度走回前面 p−1 段，用的是快的段的时间，"
                            "不是 c 倍", 1 - m * (p - 1 + c) / (p * c * (m + p - 1))),
                    Variant("one_stage", "这是一个快的段自己空闲的比例；最后一段一直在忙，要把所有段合起来算",
                            1 - m / (p - 1 + m * c)),
                    Variant("limit", "这是 m 很大时的极限；m 有限时开头和末尾还要各等一段", (p - 1) * (c - 1) / (p * c)),
                ]
            compare_number(f(p, m, c), want, what=f"{call} 的返回值", rtol=1e-6, atol=1e-9,
                           variants=variants,
                           default_hint=f"{call}：{kind} 理想时间线（反向耗时 {t_b:g}×前向）上量出的空闲比例是 {want:.4f}")

    return run_checks("流水线的气泡比例", fn, [("16 组随机的 p、m 与最后一段的倍数 c（含 p=1、m=1、c=1），GPipe 与 1F1B，"
                                          "对照理想时间线", cases)], verbose=verbose, forbidden=banned,
                      trace_forbidden=True)


# ---- 扩展：1F1B 与 GPipe 各要存几份激活 ------------------------------------------------------------------


def check_peak_in_flight(fn: Callable[..., Any], *, verbose: bool = True) -> CheckResult:
    """检查 ``fn(schedule, stages, micro_batches, stage) -> int``：调度 ``schedule``（``"gpipe"`` 或 ``"1f1b"``）下，
    第 ``stage`` 段同时“在飞”（前向做了、反向还没做完，激活得存着）的微批最多几个。

    与理想时间线（:func:`~tformer_lib.parallel.schedule.ideal_schedule`）上数出来的比较；库里的
    ``peak_in_flight`` 禁用。
    """
    from tformer_lib.parallel import schedule as sch

    def cases(f):
        for i, g in enumerate(random_cases(20, seed=125)):
            kind = ("gpipe", "1f1b")[i % 2]
            p = draw_int(g, 3, 8)
            s = draw_int(g, 0, p - 1) if i >= 6 else (0, 0, 0, draw_int(g, 1, p - 1), 0, draw_int(g, 0, p - 2))[i]
            if i in (1, 3):  # 微批比段多：在飞的个数由段号决定
                m = p + draw_int(g, 1, 8)
            elif i == 5:  # 微批比 p−s 少：在飞的不会超过 m
                m = draw_int(g, 1, p - s - 1)
            else:
                m = draw_int(g, 1, 24)
            if i >= 14:  # 边界：p=1（两种调度）、p=2，以及 p>3 时的最后一段与 m=1
                kind, p = ("gpipe", "1f1b", "1f1b", "1f1b", "gpipe", "1f1b")[i - 14], (1, 1, 2, 0, 0, 0)[i - 14]
                p = p or draw_int(g, 4, 8)
                s = p - 1 if i in (14, 15, 17, 18) else draw_int(g, 0, p - 1)
                m = 1 if i == 19 else draw_int(g, 3, 24)
            want = sch.peak_in_flight(sch.ideal_schedule(kind, p, m))[s]
            call = f"peak_in_flight(schedule={kind!r}, stages={p}, micro_batches={m}, stage={s})"
            got = as_int(f(kind, p, m, s), f"{call} 的返回值")
            if got == want:
                continue
            if kind == "gpipe":
                hint, key = ("GPipe 先把 m 个前向全做完才开始反向：每段都要同时存 m 份激活", "gpipe")
            elif got == p - s and m < p - s:
                hint, key = ("微批只有 m 个时，在飞的也不可能超过 m 个", "no_min")
            elif got == m:
                hint, key = ("1F1B 不是先做完全部前向：第 s 段预热 p−1−s 个前向后就一前一后交替，反向做完一个就释放一份", "1f1b_as_gpipe")
            elif got == p:
                hint, key = ("越靠后的段预热越短：第 s 段只预热 p−1−s 个前向，再加上稳态里正在做的那一个", "ignores_stage")
            else:
                hint, key = (f"在理想时间线上数一数：第 {s} 段最多同时有 {want} 个微批的前向做了、反向还没做完", "values")
            raise Mistake(f"{call} 返回 {got}，应为 {want}。{hint}", key=key)

    return run_checks("流水线每段最多存几份激活", fn,
                      [("20 组随机的调度、p、m 与段号（含 p=1、p=2、最后一段、m=1），对照理想时间线", cases)],
                      verbose=verbose, forbidden=(sch.peak_in_flight,), trace_forbidden=True)
