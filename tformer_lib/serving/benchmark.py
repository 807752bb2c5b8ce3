"""推理服务的测量（第 13 章、``benchmarks/serving.py`` 与随包结果文件共用）：同一次运行里交替测量，报告中位数与范围。

- :func:`batching_benchmark`：同一份负载轮流交给静态批处理与连续批处理（static, continuous, continuous, static, …），
  逐轮记录吞吐、时延、步数与进程 CPU 时间，核对两者逐词元相同，记下一轮的槽位时间线，以及分页缓存实际占用的
  内存与“每个槽位按上下文长度预留”的连续缓存相比；
- :func:`prefix_caching_benchmark`：共用一段提示前缀的请求，开/关前缀缓存各跑一遍（只数词元与块，不计时）；
- :func:`speculative_benchmark`：对几个 k，推测解码与只用目标模型逐个贪心生成交替计时，记下接受率与公式。

:func:`serving_results` 把三者放进一个字典；``python -m tformer_lib.serving.benchmark --out …`` 把它写成 JSON
（随包的 :data:`RESULTS_PATH` 就是这样写的）。墙钟时间受机器负载影响：比值比秒数可靠，文件里带着机器、线程数、
日期与开始时的平均负载（:func:`tformer_lib.measurement.benchmarking.machine_info`）。
"""

from __future__ import annotations

import argparse
import random
import re
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import torch
from torch import nn

from .._checks import language_model, positive_int
from ..lm.generate import generate
from ..measurement.benchmarking import machine_info, read_results
from ..measurement.benchmarking import save_results as _save
from .engine import Engine
from .speculative import expected_speedup, layer_skip_draft, speculative_generate
from .workload import WorkItem, make_workload, run_continuous, run_static, summarize

__all__ = ["RESULTS_PATH", "benchmark_prompts", "batching_benchmark", "prefix_caching_benchmark",
           "speculative_benchmark", "serving_results", "save_results", "load_results", "report"]

RESULTS_PATH = Path(__file__).resolve().parent.parent / "results" / "serving.json"
#: 重新生成随包结果文件的命令（写进文件里；scripts/regenerate_results.py 运行的也是它）
COMMAND = "python -m tformer_lib.serving.benchmark --out tformer_lib/results/serving.json --rounds 7"


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


def serving_results(*, quick: bool = False, requests: int = 96, rounds: int = 3, max_batch: int = 16,
                    draft_layers: int = 2, spec_prompts: int = 12, spec_tokens: int = 40) -> dict:
    """随书唐诗模型上的全部测量（结果文件的内容）。``quick=True`` 是 CI 用的小规模版本：只证明流程跑通、输出相同。"""
    from ..lm.pretrained import load_poem_model
    from ..specials import EOS
    from .draft import SHIPPED_DRAFT, load_draft_model

    if quick:
        requests, rounds, spec_prompts, spec_tokens = 12, 1, 3, 16
    model, tokenizer, _ = load_poem_model()
    prompts = benchmark_prompts(tokenizer)
    mean_new, rate = 20, 1000
    items = make_workload(prompts, requests, max_len=model.config.max_len, seed=0, mean_new_tokens=mean_new, rate=rate)
    result = {"machine": machine_info(), "quick": quick, "command": COMMAND}
    result["batching"] = batching_benchmark(model, items, rounds=rounds, max_batch=max_batch, eos_id=EOS)
    result["batching"]["workload"].update(seed=0, mean_new_tokens=mean_new, arrival_rate_per_s=rate)
    # 前缀缓存：8 个请求共用“体裁 + 题目 + 前四句”这段前缀（两个满块以上），各自再接一个不同的字
    from ..data.poems import load_poems
    from ..lm.data import poem_prompt

    poem = next(p for p in load_poems("valid") if p.form == "七言律诗")
    shared = tokenizer.encode(poem_prompt(poem.form, poem.title) + "".join(poem.lines[:4]), add_bos=True)
    tails = [[t] for t in tokenizer.encode("山水风月花雪云江")]
    result["prefix_caching"] = prefix_caching_benchmark(model, shared, tails, 8, eos_id=EOS)
    spec_set = prompts[:spec_prompts]
    draft, _, draft_ckpt = load_draft_model()
    result["speculative"] = speculative_benchmark(model, draft, spec_set, spec_tokens, rounds=rounds, eos_id=EOS)
    result["speculative"]["draft"] = {"checkpoint": SHIPPED_DRAFT.name, "config": draft.config.to_dict(),
                                      "parameters": sum(p.numel() for p in draft.parameters()),
                                      "train_cpu_seconds": draft_ckpt.get("extra", {}).get("cpu_seconds"),
                                      "last_eval": (draft_ckpt.get("extra", {}).get("history", {}).get("evals") or [None])[-1]}
    skip = layer_skip_draft(model, draft_layers)
    result["speculative_layer_skip"] = speculative_benchmark(model, skip, spec_set, spec_tokens, rounds=rounds, eos_id=EOS)
    result["speculative_layer_skip"]["draft"] = {"layer_skip": draft_layers}
    return result


_NUMBERS = re.compile(r"\[\s*(-?[\d.eE+-]+(?:,\s*-?[\d.eE+-]+)*)\s*\]")
_PAIRS = re.compile(r"\[\s*(\[[^\[\]]*\](?:,\s*\[[^\[\]]*\])*)\s*\]")


def _one_line_lists(text: str) -> str:
    """数字列表与（步, 槽位）列表各排成一行，文件才不至于很长。"""
    text = _NUMBERS.sub(lambda m: "[" + ", ".join(x.strip() for x in m.group(1).split(",")) + "]", text)
    return _PAIRS.sub(lambda m: "[" + ", ".join(re.findall(r"\[[^\[\]]*\]", m.group(1))) + "]", text)


def save_results(result: dict, path: str | Path = RESULTS_PATH) -> Path:
    """原子地写成 JSON（:func:`~tformer_lib.measurement.benchmarking.save_results`），列表各占一行。"""
    return _save(result, path, layout=_one_line_lists)


def load_results(path: str | Path | None = None) -> dict:
    """读结果文件，默认随包的 :data:`RESULTS_PATH`。"""
    p = Path(path) if path is not None else RESULTS_PATH
    return read_results(p, f"python -m tformer_lib.serving.benchmark --out {p}")


_REPORT_KEYS = {
    "machine": (),
    "batching": ("workload", "static", "continuous", "throughput_ratio_median", "throughput_ratios",
                 "rounds_at_least_2x", "cpu_ratio_median", "memory"),
    "prefix_caching": ("requests", "shared_prefix_tokens", "with_prefix_caching", "without_prefix_caching"),
    "speculative": ("cost_ratio", "cost_ratio_wall", "rows"),
    "speculative_layer_skip": ("cost_ratio", "cost_ratio_wall", "rows"),
}


def _check_report_input(result) -> None:
    """``report`` 要的是 :func:`serving_results` 的整个字典（或 :func:`load_results` 读出的结果文件）。"""
    hint = "report 要的是 serving_results() 的整个字典（或 load_results() 读出的结果文件）"
    if not isinstance(result, dict):
        raise TypeError(f"{hint}，收到 {type(result).__name__}")
    missing = [k for k in _REPORT_KEYS if k not in result]
    if missing:
        raise ValueError(f"{hint}：缺少键 {'、'.join(missing)}（收到的键：{'、'.join(map(str, result)) or '无'}）")
    for key, inner in _REPORT_KEYS.items():
        lacking = [k for k in inner if not isinstance(result[key], dict) or k not in result[key]]
        if lacking:
            raise ValueError(f"{hint}：result[{key!r}] 缺少键 {'、'.join(lacking)}")


def report(result: dict) -> str:
    """结果的中文摘要（几行文字）。``result``：:func:`serving_results` 的整个字典（或 :func:`load_results` 的结果）。"""
    _check_report_input(result)
    b = result["batching"]
    s, c = b["static"], b["continuous"]
    lines = [f"机器：{result['machine']}", f"负载：{b['workload']}",
             f"吞吐（词元/秒）静态 {s['throughput']:.0f}，连续 {c['throughput']:.0f}；逐轮比值中位数 "
             f"{b['throughput_ratio_median']:.2f}×（{', '.join(f'{r:.2f}' for r in b['throughput_ratios'])}），"
             f"≥ 2× 的轮数 {b['rounds_at_least_2x']}/{len(b['throughput_ratios'])}；CPU 时间比中位数 {b['cpu_ratio_median']:.2f}×"
             + (f"（{', '.join(f'{r:.2f}' for r in b['cpu_ratios'])}）" if "cpu_ratios" in b else ""),
             f"步数：静态 {s['steps']}，连续 {c['steps']}"]
    for name, row in (("静态", s), ("连续", c)):
        lines.append(f"{name}：TTFT p50 {row['ttft_p50'] * 1e3:.0f} ms / p95 {row['ttft_p95'] * 1e3:.0f} ms；"
                     f"TPOT p50 {row['tpot_p50'] * 1e3:.1f} ms / p95 {row['tpot_p95'] * 1e3:.1f} ms")
    mem = b["memory"]
    lines.append(f"K/V 缓存：分页峰值 {mem['paged_peak_bytes'] / 2**20:.2f} MiB，按上下文预留 "
                 f"{mem['contiguous_bytes'] / 2**20:.2f} MiB")
    pc = result["prefix_caching"]
    lines.append(f"前缀缓存：{pc['requests']} 个请求共用 {pc['shared_prefix_tokens']} 个词元的前缀；预填充词元 "
                 f"{pc['without_prefix_caching']['prefill_tokens']} → {pc['with_prefix_caching']['prefill_tokens']}，"
                 f"峰值块数 {pc['without_prefix_caching']['peak_blocks']} → {pc['with_prefix_caching']['peak_blocks']}")
    for key, label in (("speculative", "另训的草稿"), ("speculative_layer_skip", "前几块当草稿")):
        spec = result[key]
        lines.append(f"推测解码（{label}，开销比 c = {spec['cost_ratio']:.2f}，按墙钟 {spec['cost_ratio_wall']:.2f}）：")
        for row in spec["rows"]:
            lines.append(f"  k={row['k']}：α {row['acceptance_rate']:.2f}（接受/提出 {row['accepted_fraction']:.2f}），"
                         f"每次验证 {row['tokens_per_target_pass']:.2f} 词元，加速比 {row['speedup_median']:.2f}×"
                         f"（各轮 {', '.join(f'{x:.2f}' for x in row['speedups'])}；CPU 时间 {row['cpu_speedup_median']:.2f}×；"
                         f"公式 {row['expected_speedup']:.2f}×）")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description="推理服务基准：静态 vs 连续批处理、分页缓存、前缀缓存、推测解码")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--requests", type=int, default=96)
    p.add_argument("--max-batch", type=int, default=16)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--draft-layers", type=int, default=2, help="对照用的“前几块当草稿”取几块")
    p.add_argument("--out", default=None, help="把结果写成 JSON（随包的结果文件：tformer_lib/results/serving.json）")
    p.add_argument("--quick", action="store_true", help="CI 用的小规模版本（几秒；数字不作结论）")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    result = serving_results(quick=args.quick, requests=args.requests, rounds=args.rounds, max_batch=args.max_batch,
                             draft_layers=args.draft_layers)
    print(report(result))
    if args.out:
        print(f"已写入 {save_results(result, args.out)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
