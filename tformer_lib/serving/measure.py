"""推理服务的三种测量（第 13 章；:mod:`.benchmark` 把它们汇成随包的结果文件）：同一次运行里交替测量，报告中位数与范围。

- :func:`batching_benchmark`：同一份负载轮流交给静态批处理与连续批处理（static, continuous, continuous, static, …），
  逐轮记录吞吐、时延、步数与进程 CPU 时间，核对两者逐词元相同，记下一轮的槽位时间线，以及分页缓存实际占用的
  内存与“每个槽位按上下文长度预留”的连续缓存相比；
- :func:`prefix_caching_benchmark`：共用一段提示前缀的请求，开/关前缀缓存各跑一遍（只数词元与块，不计时）；
- :func:`speculative_benchmark`：对几个 k，推测解码与只用目标模型逐个贪心生成交替计时，记下接受率与公式。

墙钟时间受机器负载影响：比值比秒数可靠。
"""

from __future__ import annotations

import random
import statistics
import time
from collections.abc import Sequence

import torch
from torch import nn

from .._checks import language_model, positive_int
from ..lm.generate import generate
from ..measurement.benchmarking import machine_info
from .engine import Engine
from .speculative import expected_speedup, speculative_generate
from .workload import WorkItem, run_continuous, run_static, summarize

__all__ = ["benchmark_prompts", "batching_benchmark", "prefix_caching_benchmark", "speculative_benchmark"]


def benchmark_prompts(tokenizer, n: int = 200, seed: int = 0) -> list[list[int]]:
    """基准用的提示（valid 划分，种子固定）：体裁 + 题目，一部分再带上诗的前一两句，所以长短不一。"""
    from ..data.poems import load_poems
    from ..lm.data import poem_prompt

    rng = random.Random(seed)
    texts = []
    for poem in rng.sample(load_poems("valid"), n):
        head = "".join(line for line in poem.lines[: rng.choice([0, 0, 1, 2])])
        texts.append(poem_prompt(poem.form, poem.title) + head)
    return [tokenizer.encode(t, add_bos=True) for t in texts]


def _median(rows: list[dict], key: str) -> float:
    return statistics.median(row[key] for row in rows)


def _occupancy(slot_steps: list[list[tuple[int, int]]], max_batch: int) -> dict:
    """步数与槽位占用率：被请求占着的（步, 槽位）格数 ÷（步数 × max_batch）。"""
    cells = {cell for steps in slot_steps for cell in steps}
    n_steps = 1 + max(step for step, _ in cells)
    return {"steps": n_steps, "slot_occupancy": len(cells) / (n_steps * max_batch)}


def batching_benchmark(model: nn.Module, items: Sequence[WorkItem], *, rounds: int = 3, max_batch: int = 16,
                       eos_id: int | None = None, min_prefill: int = 1, block_size: int = 16) -> dict:
    """静态 vs 连续批处理，交替 ``rounds`` 轮；返回中位数度量、逐轮记录与吞吐比、内存与第一轮的槽位时间线。

    静态批处理（:func:`~.workload.run_static`）用 :func:`~.ragged.greedy_batch`：左侧填充、连续的 K/V 缓存，
    一批跑到其中最长的一条结束——这是它本来的样子，不是被故意放慢的版本（同一个模型、同一次前向的写法）。
    ``timeline[kind]`` 是每个请求的 ``[(步, 槽位), …]``；静态批处理里一批的所有槽位要等最长的一条结束才能换人，
    这就是连续批处理步数少得多的原因（``steps``、``slot_occupancy`` 给出数字）。
    """
    language_model("model", model)
    if isinstance(items, (str, bytes)) or not isinstance(items, Sequence) or not items:
        raise ValueError(f"items 应是非空的 WorkItem 列表（make_workload 的结果），收到 {items!r:.40}")
    positive_int("rounds", rounds)
    keys = ("throughput", "ttft_p50", "ttft_p95", "tpot_p50", "tpot_p95")
    per_round, timeline, memory, prefix = [], None, None, None
    for i in range(rounds):
        order = ("static", "continuous") if i % 2 == 0 else ("continuous", "static")
        got = {}
        for kind in order:
            cpu = time.process_time()
            if kind == "static":
                requests, wall = run_static(model, items, max_batch=max_batch, eos_id=eos_id)
            else:
                requests, wall, engine = run_continuous(model, items, max_batch=max_batch, eos_id=eos_id,
                                                        min_prefill=min_prefill, block_size=block_size)
                c = model.config
                per_token = 2 * c.n_layers * c.kv_heads * c.d_k * next(model.parameters()).element_size()
                memory = {"paged_peak_bytes": engine.peak_held_bytes,
                          "contiguous_bytes": max_batch * c.max_len * per_token,
                          "block_size": block_size, "bytes_per_token": per_token}
                prefix = {"prefill_tokens_saved": engine.prefill_tokens_saved}
            cpu = time.process_time() - cpu
            row = summarize(requests, wall)
            row.update(_occupancy([r.slot_steps for r in requests], max_batch), cpu_seconds=cpu)
            got[kind] = (requests, row)
        if [r.output for r in got["static"][0]] != [r.output for r in got["continuous"][0]]:
            raise AssertionError("静态与连续批处理生成的词元不同")
        ratio = got["continuous"][1]["throughput"] / got["static"][1]["throughput"]
        per_round.append({"order": list(order), "static": got["static"][1], "continuous": got["continuous"][1],
                          "throughput_ratio": ratio,
                          "cpu_ratio": got["static"][1]["cpu_seconds"] / got["continuous"][1]["cpu_seconds"]})
        if timeline is None:
            timeline = {kind: [r.slot_steps for r in got[kind][0]] for kind in ("static", "continuous")}
    ratios = [r["throughput_ratio"] for r in per_round]
    static_rows = [r["static"] for r in per_round]
    continuous_rows = [r["continuous"] for r in per_round]
    return {
        "machine": machine_info(),
        "workload": {"requests": len(items), "max_batch": max_batch, "min_prefill": min_prefill,
                     "block_size": block_size,
                     "prompt_tokens": sum(len(it.prompt) for it in items),
                     "new_tokens_requested": sum(it.max_new_tokens for it in items),
                     "tokens_generated": static_rows[0]["tokens"]},
        "static": {k: _median(static_rows, k) for k in keys} | {"steps": static_rows[0]["steps"]},
        "continuous": {k: _median(continuous_rows, k) for k in keys} | {"steps": continuous_rows[0]["steps"]},
        "throughput_ratio_median": statistics.median(ratios),
        "throughput_ratios": ratios,
        "throughput_ratio_range": [min(ratios), max(ratios)],
        "rounds_at_least_2x": sum(r >= 2 for r in ratios),
        "cpu_ratio_median": statistics.median(r["cpu_ratio"] for r in per_round),
        "cpu_ratios": [r["cpu_ratio"] for r in per_round],
        "rounds_at_least_2x_cpu": sum(r["cpu_ratio"] >= 2 for r in per_round),
        "rounds": per_round,
        "memory": memory,
        "prefix_caching": prefix,
        "timeline": timeline,
    }


@torch.no_grad()
def prefix_caching_benchmark(model: nn.Module, shared: Sequence[int], tails: Sequence[Sequence[int]],
                             max_new_tokens: int, *, block_size: int = 16, eos_id: int | None = None) -> dict:
    """``len(tails)`` 个请求共用提示前缀 ``shared``（例如同一段系统提示）：第一个先预填充，其余随后到达。

    开、关前缀缓存各跑一遍，核对输出相同，数出实际预填充的词元数与 K/V 块的峰值（确定的计数，不计时）。
    """
    language_model("model", model)
    if isinstance(shared, (str, bytes)) or not isinstance(shared, Sequence):
        raise TypeError(f"shared 应是共用前缀的词元 id 列表，收到 {type(shared).__name__}")
    if isinstance(tails, (str, bytes)) or not isinstance(tails, Sequence) or not tails:
        raise ValueError(f"tails 应是非空的列表（每个请求一段接在前缀后的词元 id），收到 {tails!r:.40}")
    for i, t in enumerate(tails):
        if isinstance(t, (str, bytes)) or not isinstance(t, Sequence):
            raise TypeError(f"tails[{i}] 应是词元 id 列表，收到 {type(t).__name__} {t!r:.40}")
        if not shared and not t:
            raise ValueError(f"shared 与 tails[{i}] 都是空的：每个请求的提示至少要有 1 个词元")
    prompts = [list(shared) + list(t) for t in tails]
    out = {"requests": len(prompts), "shared_prefix_tokens": len(shared), "block_size": block_size,
           "prompt_tokens": sum(map(len, prompts))}
    outputs = {}
    for caching in (True, False):
        engine = Engine(model, max_batch=len(prompts), block_size=block_size, prefix_caching=caching, eos_id=eos_id)
        requests = [engine.add_request(prompts[0], max_new_tokens)]
        engine.step()  # 第一条先到、先预填充（它的满块在接纳时就登记了，同一步接纳的请求也能共用）
        requests += [engine.add_request(p, max_new_tokens) for p in prompts[1:]]
        engine.run()
        outputs[caching] = [r.output for r in requests]
        name = "with_prefix_caching" if caching else "without_prefix_caching"
        out[name] = {"prefill_tokens": out["prompt_tokens"] - engine.prefill_tokens_saved,
                     "prefill_tokens_saved": engine.prefill_tokens_saved,
                     "peak_blocks": engine.peak_held_bytes // engine.cache.bytes_per_block,
                     "peak_bytes": engine.peak_held_bytes}
    if outputs[True] != outputs[False]:
        raise AssertionError("开、关前缀缓存生成的词元不同")
    return out


def _decode_step_seconds(model: nn.Module, prompt: Sequence[int], repeats: int = 15) -> tuple[list[float], list[float]]:
    """带缓存、批大小 1 时解码一个词元的耗时（推测解码里草稿与目标做的正是这种前向）：墙钟与进程 CPU 时间各一份。"""
    cache = model.new_cache()
    model(torch.tensor([list(prompt)]), cache=cache)
    token = torch.tensor([[int(prompt[-1])]])
    wall, cpu = [], []
    for _ in range(repeats):
        start, start_cpu = time.perf_counter(), time.process_time()
        model(token, cache=cache)
        wall.append(time.perf_counter() - start)
        cpu.append(time.process_time() - start_cpu)
        cache.crop(len(prompt))
    return wall, cpu


@torch.no_grad()
def speculative_benchmark(target: nn.Module, draft: nn.Module, prompts: Sequence[Sequence[int]], max_new_tokens: int,
                          *, ks: Sequence[int] = (1, 2, 4), rounds: int = 3, eos_id: int | None = None) -> dict:
    """每个 k：推测解码与只用目标模型交替计时 ``rounds`` 轮（同一批提示），核对输出相同，报告接受率与加速比。

    - 接受率 ``acceptance_rate`` 是每个草稿词元被接受的概率 α 的估计（:attr:`~.speculative.SpeculativeStats.alpha`：
      被检验过的草稿词元里接受的比例）；``accepted_fraction`` = 接受数 ÷ 提出数（k > 1 时偏低，因为第一个被拒的
      词元之后的草稿没被检验）。
    - 开销比 c = 草稿解码一步 ÷ 目标解码一步（带缓存、批大小 1，交替各测若干次取中位数），用进程 CPU 时间量：
      机器繁忙时墙钟里混着等 CPU 的时间，CPU 时间只数真正做的工作。``cost_ratio_wall`` 是墙钟量的。
    - ``expected_speedup`` = (1−α^{k+1}) / ((1−α)(kc+1))；``speedups`` 是墙钟加速比，``cpu_speedups`` 是 CPU 时间之比。
    """
    language_model("target", target)
    language_model("draft", draft)
    if isinstance(prompts, (str, bytes)) or not isinstance(prompts, Sequence) or not prompts:
        raise ValueError(f"prompts 应是非空的提示列表（每条是 id 列表），收到 {prompts!r:.40}")
    positive_int("max_new_tokens", max_new_tokens)
    positive_int("rounds", rounds)
    if isinstance(ks, (str, bytes)) or not isinstance(ks, Sequence) or not ks:
        raise ValueError(f"ks 应是非空的正整数序列（要比较的草稿长度 k），收到 {ks!r}")
    for k in ks:
        positive_int("ks 里的 k", k)

    def timed(fn):
        start, start_cpu = time.perf_counter(), time.process_time()
        result = fn()
        return result, time.perf_counter() - start, time.process_time() - start_cpu

    def plain():
        return [generate(target, list(p), max_new_tokens, method="greedy", eos_id=eos_id).tolist() for p in prompts]

    for m in (target, draft):
        m.eval()
    costs = {"target": ([], []), "draft": ([], [])}
    for _ in range(3):  # 交替测，别让机器负载的起伏只落在一方
        for name, m in (("target", target), ("draft", draft)):
            wall, cpu = _decode_step_seconds(m, prompts[0])
            costs[name][0].extend(wall)
            costs[name][1].extend(cpu)
    step_ms = {name: statistics.median(cpu) * 1e3 for name, (_, cpu) in costs.items()}
    cost_ratio = step_ms["draft"] / step_ms["target"]
    cost_ratio_wall = statistics.median(costs["draft"][0]) / statistics.median(costs["target"][0])
    rows = []
    for k in ks:
        speedups, cpu_speedups, first = [], [], None
        for i in range(rounds):
            def spec():
                return [speculative_generate(target, draft, list(p), max_new_tokens, k=k, eos_id=eos_id) for p in prompts]

            if i % 2 == 0:
                (base, t_plain, c_plain), (spec_out, t_spec, c_spec) = timed(plain), timed(spec)
            else:
                (spec_out, t_spec, c_spec), (base, t_plain, c_plain) = timed(spec), timed(plain)
            if [out for out, _ in spec_out] != base:
                raise AssertionError(f"k={k} 时推测解码的输出与目标模型单独生成不同")
            speedups.append(t_plain / t_spec)
            cpu_speedups.append(c_plain / c_spec)
            if first is None:
                first = spec_out
        total = {field: sum(getattr(s, field) for _, s in first)
                 for field in ("accepted", "proposed", "rejected", "target_passes")}
        tested = total["accepted"] + total["rejected"]
        alpha = total["accepted"] / tested if tested else 0.0
        rows.append({"k": k, "acceptance_rate": alpha,
                     "accepted_fraction": total["accepted"] / total["proposed"] if total["proposed"] else 0.0,
                     "tokens_per_target_pass": sum(len(out) for out, _ in first) / total["target_passes"],
                     "speedup_median": statistics.median(speedups), "speedups": speedups,
                     "cpu_speedup_median": statistics.median(cpu_speedups), "cpu_speedups": cpu_speedups,
                     "expected_speedup": expected_speedup(alpha, k, cost_ratio)})
    return {"machine": machine_info(), "cost_ratio": cost_ratio, "cost_ratio_wall": cost_ratio_wall,
            "step_ms": step_ms,
            "draft_parameters": sum(p.numel() for p in draft.parameters()),
            "target_parameters": sum(p.numel() for p in target.parameters()),
            "prompts": len(prompts), "max_new_tokens": max_new_tokens, "rows": rows,
            "formula": "expected_speedup = (1 - α^(k+1)) / ((1 - α)(k·c + 1))"}
