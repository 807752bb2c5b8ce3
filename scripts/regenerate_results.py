#!/usr/bin/env python
"""维护者用：一条命令重新生成随包的全部结果文件（``tformer_lib/results/*.json``）。

书里引用的每个实测数字都来自这些文件；每个文件里记着生成它的命令（``command``，或 ``produced_by``/``machine`` 里的 ``command``），
它与下面 ``RESULTS`` 表里的命令相同（``tests/test_results_files.py`` 检查：包里的每个结果文件都在表里，
文件里记的命令就是表里的命令）。

用法::

    python scripts/regenerate_results.py --list               # 列出每个结果文件和生成它的命令
    python scripts/regenerate_results.py serving decode       # 只重新生成这几个
    python scripts/regenerate_results.py --all                # 全部（单线程、依次运行；要几个小时，请在空闲的机器上跑）

这些命令都是测量：请在没有别的任务的机器上运行，结果文件会记下机器、线程数、日期与负载。
"""

from __future__ import annotations

import argparse
import shlex
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS_DIR = ROOT / "tformer_lib" / "results"

#: 结果文件名（不含 .json）→ 生成它的命令（在仓库根目录运行）
RESULTS = {
    "train_step": "python benchmarks/train_step.py --threads 1 --out tformer_lib/results/train_step.json",
    "length_generalization": "python -m tformer_lib.experiments.length_generalization",
    "ffn_ablation": "python -m tformer_lib.experiments.ablations",
    "norm_placement": "python -m tformer_lib.experiments.norm_placement",
    "lm_variants": "python -m tformer_lib.experiments.modern_variants",
    "throughput": "python -m tformer_lib.parallel.throughput --out tformer_lib/results/throughput.json --rounds 7",
    "serving": "python -m tformer_lib.serving.benchmark --out tformer_lib/results/serving.json --rounds 7",
    "decode": "python benchmarks/decode.py --rounds 5 --out tformer_lib/results/decode.json",
    "quantization": "python -m tformer_lib.quant.measure --out tformer_lib/results/quantization.json",
    "quant_gemv": "python benchmarks/quant_gemv.py --n 8192 --rounds 15 --out tformer_lib/results/quant_gemv.json",
    "quant_real_models": "python -m tformer_lib.quant.real_models --out tformer_lib/results/quant_real_models.json",
    "vs_transformers": "python benchmarks/vs_transformers.py --rounds 5 --out tformer_lib/results/vs_transformers.json",
    "finetune": "python -m tformer_lib.finetune.measure --out tformer_lib/results/finetune.json",
    "scaling": "python -m tformer_lib.scale.scaling --out tformer_lib/results/scaling.json",
    "moe": "python -m tformer_lib.experiments.moe --out tformer_lib/results/moe.json",
    "long_context": "python -m tformer_lib.experiments.long_context --out tformer_lib/results/long_context.json",
    "gqa_decode": "python -m tformer_lib.serving.gqa_decode --out tformer_lib/results/gqa_decode.json",
    "bf16_serving": "python -m tformer_lib.serving.bf16 --out tformer_lib/results/bf16_serving.json",
    "document_masking": "python -m tformer_lib.experiments.document_masking --out tformer_lib/results/document_masking.json",
}


def recorded_command(data: dict) -> str | None:
    """结果文件里记下的生成命令：顶层的 ``command``，或 ``produced_by``/``machine`` 记录里的 ``command``。"""
    if isinstance(data.get("command"), str):
        return data["command"]
    for record in ("produced_by", "machine"):
        if isinstance(data.get(record), dict) and isinstance(data[record].get("command"), str):
            return data[record]["command"]
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="重新生成随包的结果文件（tformer_lib/results/*.json）")
    parser.add_argument("names", nargs="*", help=f"要重新生成的结果文件：{', '.join(RESULTS)}")
    parser.add_argument("--all", action="store_true", help="全部重新生成")
    parser.add_argument("--list", action="store_true", help="只列出结果文件与命令")
    args = parser.parse_args(argv)
    if args.list or not (args.names or args.all):
        for name, command in RESULTS.items():
            print(f"{name:22s} {command}")
        return 0
    unknown = [n for n in args.names if n not in RESULTS]
    if unknown:
        parser.error(f"不认识的结果文件：{unknown}；可选：{', '.join(RESULTS)}")
    for name in RESULTS if args.all else args.names:
        command = shlex.split(RESULTS[name])
        command[0] = sys.executable
        print(f"== {name}：{RESULTS[name]}", flush=True)
        start = time.monotonic()
        subprocess.run(command, cwd=ROOT, check=True)
        print(f"   （用时 {time.monotonic() - start:.0f} 秒）", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
