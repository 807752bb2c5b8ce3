"""推理服务的测量（第 13 章与 ``benchmarks/serving.py`` 共用）：同一次运行里交替测量，报告中位数。

- :func:`batching_benchmark`：同一份负载轮流交给静态批处理与连续批处理，逐轮记录吞吐与时延，
  同时核对两者逐词元相同，并记下分页缓存实际占用的内存与“每条序列按上下文长度预留”的连续缓存相比；
- :func:`speculative_benchmark`：对几个 k，推测解码与只用目标模型逐个贪心生成交替计时，记下接受率。

结果是字典（可写成 JSON），带上机器、线程数与日期；墙钟时间受机器负载影响，比值比秒数可靠。
"""

from __future__ import annotations

import datetime
import platform
import statistics
import time
from collections.abc import Sequence

import torch
from torch import nn

from ..lm.generate import generate
from .speculative import expected_speedup, speculative_generate
from .workload import WorkItem, run_continuous, run_static, summarize

__all__ = ["machine_record", "batching_benchmark", "speculative_benchmark"]


def machine_record() -> dict:
    """写进结果文件的运行环境：CPU、torch 版本与线程数、日期（UTC）。"""
    from ..pretrained import cpu_fingerprint

    return {"cpu": cpu_fingerprint(), "torch": torch.__version__, "threads": torch.get_num_threads(),
            "python": platform.python_version(),
            "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")}


def _median(rows: list[dict], key: str) -> float:
    return statistics.median(row[key] for row in rows)


def batching_benchmark(model: nn.Module, items: Sequence[WorkItem], *, rounds: int = 3, max_batch: int = 16,
                       eos_id: int | None = None, min_prefill: int = 4, block_size: int = 16) -> dict:
    """静态 vs 连续批处理，交替 ``rounds`` 轮；返回各自的中位数度量、逐轮吞吐比、内存与一轮的槽位时间线。"""
    static_rows, continuous_rows, ratios = [], [], []
    timeline = None
    memory = None
    for i in range(rounds):
        order = ("static", "continuous") if i % 2 == 0 else ("continuous", "static")
        got = {}
        for kind in order:
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
            got[kind] = (requests, summarize(requests, wall))
        if [r.output for r in got["static"][0]] != [r.output for r in got["continuous"][0]]:
            raise AssertionError("静态与连续批处理生成的词元不同")
        static_rows.append(got["static"][1])
        continuous_rows.append(got["continuous"][1])
        ratios.append(got["continuous"][1]["throughput"] / got["static"][1]["throughput"])
        if timeline is None:
            timeline = {kind: [r.slot_steps for r in got[kind][0]] for kind in got}
    keys = ("throughput", "ttft_p50", "ttft_p95", "tpot_p50", "tpot_p95")
    return {
        "machine": machine_record(),
        "workload": {"requests": len(items), "max_batch": max_batch, "min_prefill": min_prefill,
                     "prompt_tokens": sum(len(it.prompt) for it in items),
                     "new_tokens_requested": sum(it.max_new_tokens for it in items),
                     "tokens_generated": static_rows[0]["tokens"]},
        "static": {k: _median(static_rows, k) for k in keys},
        "continuous": {k: _median(continuous_rows, k) for k in keys},
        "throughput_ratio_median": statistics.median(ratios),
        "throughput_ratios": ratios,
        "memory": memory,
        "timeline": timeline,
    }


@torch.no_grad()
def speculative_benchmark(target: nn.Module, draft: nn.Module, prompts: Sequence[Sequence[int]], max_new_tokens: int,
                          *, ks: Sequence[int] = (1, 2, 4), rounds: int = 3, eos_id: int | None = None) -> dict:
    """每个 k：推测解码与只用目标模型交替计时 ``rounds`` 轮（同一批提示），核对输出相同，报告接受率与加速比。"""
    def timed(fn):
        start = time.perf_counter()
        result = fn()
        return result, time.perf_counter() - start

    def plain():
        return [generate(target, list(p), max_new_tokens, method="greedy", eos_id=eos_id).tolist() for p in prompts]

    # 草稿一步相对目标一步的开销 c：各自对同一个提示做一次前向，取多次的中位数
    probe = torch.tensor([list(prompts[0])])
    costs = {}
    for name, m in (("target", target), ("draft", draft)):
        samples = []
        for _ in range(7):
            _, t = timed(lambda m=m: m(probe))
            samples.append(t)
        costs[name] = statistics.median(samples)
    cost_ratio = costs["draft"] / costs["target"]
    rows = []
    for k in ks:
        speedups, accepted, proposed, passes = [], 0, 0, 0
        for i in range(rounds):
            def spec():
                return [speculative_generate(target, draft, list(p), max_new_tokens, k=k, eos_id=eos_id) for p in prompts]

            if i % 2 == 0:
                (base, t_plain), (spec_out, t_spec) = timed(plain), timed(spec)
            else:
                (spec_out, t_spec), (base, t_plain) = timed(spec), timed(plain)
            if [out for out, _ in spec_out] != base:
                raise AssertionError(f"k={k} 时推测解码的输出与目标模型单独生成不同")
            speedups.append(t_plain / t_spec)
            if i == 0:
                accepted = sum(s.accepted for _, s in spec_out)
                proposed = sum(s.proposed for _, s in spec_out)
                passes = sum(s.target_passes for _, s in spec_out)
                tokens = sum(len(out) for out, _ in spec_out)
        alpha = accepted / proposed if proposed else 0.0
        rows.append({"k": k, "acceptance_rate": alpha, "tokens_per_target_pass": tokens / passes,
                     "speedup_median": statistics.median(speedups), "speedups": speedups,
                     "expected_speedup": expected_speedup(alpha, k, cost_ratio)})
    return {"machine": machine_record(), "cost_ratio": cost_ratio, "prompts": len(prompts),
            "max_new_tokens": max_new_tokens, "rows": rows}
