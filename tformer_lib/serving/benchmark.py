"""推理服务的随包结果文件（第 13 章、``benchmarks/serving.py`` 共用）：把 :mod:`.measure` 的三种测量汇成一个字典。

:func:`serving_results` 把批处理、前缀缓存与推测解码的测量（:func:`~.measure.batching_benchmark`、
:func:`~.measure.prefix_caching_benchmark`、:func:`~.measure.speculative_benchmark`）放进一个字典；
``python -m tformer_lib.serving.benchmark --out …`` 把它写成 JSON（随包的 :data:`RESULTS_PATH` 就是这样写的），
:func:`load_results` 读回，:func:`report` 排成文字。墙钟时间受机器负载影响：比值比秒数可靠，文件里带着机器、
线程数、日期与开始时的平均负载（:func:`tformer_lib.measurement.benchmarking.machine_info`）。
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

import torch

from ..measurement.benchmarking import machine_info, read_results
from ..measurement.benchmarking import save_results as _save
from .measure import batching_benchmark, benchmark_prompts, prefix_caching_benchmark, speculative_benchmark
from .speculative import layer_skip_draft
from .workload import make_workload

__all__ = ["RESULTS_PATH", "serving_results", "save_results", "load_results", "report"]

RESULTS_PATH = Path(__file__).resolve().parent.parent / "results" / "serving.json"
#: 重新生成随包结果文件的命令（写进文件里；scripts/regenerate_results.py 运行的也是它）
COMMAND = "python -m tformer_lib.serving.benchmark --out tformer_lib/results/serving.json --rounds 7"


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
