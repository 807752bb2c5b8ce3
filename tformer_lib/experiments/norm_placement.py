"""第 7 章的 Post-LN 与 Pre-LN 对比实验（norm placement study）：多个种子、训练到预热结束之后。

两组实验，都用玩具中→英语料与书中的训练配方（:data:`~tformer_lib.translation.pretrained.TOY_TRAINING`），只改下面几项：

- ``"no_warmup"``：2+2 层的玩具模型，**不预热**（``warmup=1``、``lr_factor=0.25``：第 1 步就是约 3.5 倍于
  配方峰值的学习率），训练 2 个 epoch；
- ``"deep"``：编码器、解码器各 6 层，**原配方**（预热 200 步），训练 5 个 epoch（470 步，远过预热）。

每组分别训练 Post-LN（``norm_first=False``）与 Pre-LN（``norm_first=True``），每种 3 个种子。
整套实验在单线程 CPU 上要好几分钟，第 7 章在 2 分钟的时限内跑不完，所以结果由本模块的脚本生成、
写成随包附带的 JSON（:data:`RESULTS_PATH`），章节只读取它；文件里记着机器、线程数、torch 版本和日期。
重新生成::

    python -m tformer_lib.experiments.norm_placement            # 写 tformer_lib/results/norm_placement.json
    python -m tformer_lib.experiments.norm_placement --out x.json --seeds 0 1 2 3
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

import torch

from ..measurement.benchmarking import machine_info, read_results, save_results

__all__ = ["EXPERIMENTS", "NORMS", "RESULTS_PATH", "run_study", "load_study", "main"]

#: 随包附带的结果文件
RESULTS_PATH = Path(__file__).resolve().parent.parent / "results" / "norm_placement.json"

#: 两种层归一化位置：名字 → ``norm_first``
NORMS = {"post_ln": False, "pre_ln": True}

#: 每组实验相对书中配方的改动（模型配置覆盖 + 训练设置覆盖 + epoch 数）
EXPERIMENTS: dict[str, dict[str, Any]] = {
    "no_warmup": {
        "description": "2+2 层，不预热（warmup=1, lr_factor=0.25），2 个 epoch",
        "config": {},
        "training": {"warmup": 1, "lr_factor": 0.25, "eval_decode": False},
        "epochs": 2,
    },
    "deep": {
        "description": "6+6 层，原配方（warmup=200, lr_factor=1.0），5 个 epoch",
        "config": {"n_encoder_layers": 6, "n_decoder_layers": 6},
        "training": {"eval_decode": False},
        "epochs": 5,
    },
}

_EPOCH_KEYS = ("epoch", "step", "lr", "train_loss", "valid_loss", "valid_token_accuracy")


def _one_run(experiment: str, norm: str, seed: int) -> dict[str, Any]:
    from tformer_lib.translation.pretrained import load_or_train_toy_model  # 避免导入 tformer_lib 时就拉起训练模块

    spec = EXPERIMENTS[experiment]
    _, _, _, history = load_or_train_toy_model(
        epochs=spec["epochs"], seed=seed, cache=False, norm_first=NORMS[norm],
        **spec["training"], **spec["config"],
    )
    return {
        "experiment": experiment,
        "norm": norm,
        "seed": seed,
        "step_loss": [round(float(x), 4) for x in history.step_loss],  # 学习率由调度公式决定，不必存
        "epochs": [{k: e[k] for k in _EPOCH_KEYS if k in e} for e in history.epochs],
    }


def run_study(seeds=(0, 1, 2), experiments=tuple(EXPERIMENTS), *, threads: int = 1, log=print) -> dict[str, Any]:
    """训练全部 ``experiments × NORMS × seeds``，返回可写成 JSON 的结果字典（不读写任何缓存）。"""
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        machine = machine_info()  # 设好线程数之后、训练之前
        runs = []
        for exp in experiments:
            for norm in NORMS:
                for seed in seeds:
                    runs.append(_one_run(exp, norm, seed))
                    last = runs[-1]["epochs"][-1]
                    if log is not None:
                        log(f"{exp:<9} {norm:<7} seed {seed}: 验证损失 {last['valid_loss']:.3f}，"
                            f"词元准确率 {last['valid_token_accuracy']:.3f}")
        return {
            "experiments": {k: EXPERIMENTS[k] for k in experiments},
            "seeds": list(seeds),
            "machine": machine,
            "date": machine["date"],
            "command": "python -m tformer_lib.experiments.norm_placement",
            "runs": runs,
        }
    finally:
        torch.set_num_threads(previous)


def load_study(path: str | os.PathLike | None = None) -> dict[str, Any]:
    """读取结果文件（默认随包附带的 :data:`RESULTS_PATH`）。

    返回的字典多一个键 ``"by"``：``by[experiment][norm]`` 是按种子排好的运行列表。
    """
    data = read_results(path if path is not None else RESULTS_PATH, "python -m tformer_lib.experiments.norm_placement")
    by: dict[str, dict[str, list]] = {}
    for run in sorted(data["runs"], key=lambda r: r["seed"]):
        by.setdefault(run["experiment"], {}).setdefault(run["norm"], []).append(run)
    data["by"] = by
    return data


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description="第 7 章 Post-LN 与 Pre-LN 对比实验（多种子）")
    parser.add_argument("--out", type=Path, default=RESULTS_PATH, help="结果 JSON 的路径")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    result = run_study(tuple(args.seeds), threads=args.threads)
    save_results(result, args.out)
    print(f"写入 {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
