"""吞吐量对比：1 个进程 × 2 线程 与 2 个进程 × 1 线程（数据并行：手写 all-reduce 以便计时通信，以及 DDP）。

2 个 CPU 核不是 2 块 GPU：两个进程抢同一块内存带宽，all-reduce 走本机 TCP（gloo），两线程的矩阵乘法也已经
用上了两个核——所以结果要在同一次运行里量，不能预设数据并行一定更快。结果（墙钟时间）只进图表，不进 nbval 比较的文本。
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

from .data_parallel import lm_loss, new_model, allreduce_gradients
from .launch import launch

__all__ = ["throughput_worker", "measure_throughput", "run_throughput_rounds", "write_throughput_results",
           "load_throughput_results", "THROUGHPUT_RESULTS"]


def throughput_worker(rank: int, world_size: int, config_dict: dict, state: dict, blocks: torch.Tensor, steps: int,
                      batch_size: int, warmup: int = 1, ddp: bool = False) -> dict:
    """全局批 ``batch_size``，每个进程 ``batch_size / world_size`` 块；返回本进程的计时。

    ``ddp=False``：反向之后用手写的 :func:`allreduce_gradients`，单独计时通信（``comm_seconds``）；
    ``ddp=True``：经 ``DistributedDataParallel``，它把分桶的 all-reduce 与反向重叠，通信时间分不出来（``comm_seconds`` 为 None）。
    """
    from torch.nn.parallel import DistributedDataParallel

    model = new_model(config_dict, state)
    net = DistributedDataParallel(model) if ddp and world_size > 1 else model
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    per_rank = batch_size // world_size
    comm = total = 0.0
    for step in range(warmup + steps):
        start = time.perf_counter()
        rows = torch.arange(per_rank) + (step * batch_size + rank * per_rank) % max(1, len(blocks) - per_rank)
        optimizer.zero_grad(set_to_none=True)
        lm_loss(net, blocks[rows]).backward()  # DDP 时 all-reduce 在这里面，与反向重叠
        if world_size > 1 and not ddp:
            t = time.perf_counter()
            allreduce_gradients(model)
            if step >= warmup:
                comm += time.perf_counter() - t
        optimizer.step()
        if step >= warmup:
            total += time.perf_counter() - start
    tokens = steps * batch_size * (blocks.shape[1] - 1)  # 全局的目标词元数
    return {"seconds": total, "comm_seconds": None if ddp else comm, "tokens_per_s": tokens / total,
            "threads": torch.get_num_threads()}


def measure_throughput(model, blocks: torch.Tensor, steps: int = 5, batch_size: int = 16, timeout: float = 600.0) -> dict:
    """同一次运行里量三种布局的全局词元/秒：``"1x2"``（1 进程 2 线程）、``"2x1"``（2 进程各 1 线程，手写 all-reduce，
    附通信占比）与 ``"2x1_ddp"``（2 进程各 1 线程，``DistributedDataParallel``）。"""
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    args = (model.config.to_dict(), state, blocks, steps, batch_size)
    one = launch(throughput_worker, 1, args, threads=2, timeout=timeout)[0]
    two = launch(throughput_worker, 2, args, threads=1, timeout=timeout)
    ddp = launch(throughput_worker, 2, args + (1, True), threads=1, timeout=timeout)
    slowest = max(two, key=lambda r: r["seconds"])
    return {"1x2": {"tokens_per_s": one["tokens_per_s"]},
            "2x1": {"tokens_per_s": slowest["tokens_per_s"], "comm_share": slowest["comm_seconds"] / slowest["seconds"]},
            "2x1_ddp": {"tokens_per_s": max(ddp, key=lambda r: r["seconds"])["tokens_per_s"]}}


#: 随包附带的结果文件（``python -m tformer_lib.parallel.throughput --out`` 写的）。
THROUGHPUT_RESULTS = Path(__file__).resolve().parent.parent / "results" / "throughput.json"


def run_throughput_rounds(rounds: int = 5, steps: int = 5, batch_size: int = 16, timeout: float = 600.0) -> dict:
    """随书唐诗模型（第 9 章的配方）上交替量 ``rounds`` 轮 :func:`measure_throughput`：每轮依次 1×2、2×1（手写）、2×1（DDP）。

    一轮一对，比值逐轮算：机器上别的任务让某一轮整体变慢时，同一轮的两种布局一起受影响。每轮记下开始时的
    1 分钟平均负载（``load_average``），看得出负载与两种布局之比的关系。
    """
    from ..lm import poem_data
    from ..lm.model import make_lm
    from ..lm.pretrained import POEM_RECIPE, poem_model_config
    from ..seed import set_seed

    data = poem_data()
    set_seed(POEM_RECIPE["seed"])
    model = make_lm(poem_model_config(data["tokenizer"].vocab_size))
    blocks = data["train_blocks"][: (steps + 1) * batch_size + 1]
    out = []
    for _ in range(rounds):
        load = round(os.getloadavg()[0], 2) if hasattr(os, "getloadavg") else None  # 这一轮开始时的 1 分钟平均负载
        out.append({**measure_throughput(model, blocks, steps=steps, batch_size=batch_size, timeout=timeout),
                    "load_average": load})
    n_params = sum(p.numel() for p in model.parameters())
    return {"rounds": out, "settings": {"rounds": rounds, "steps": steps, "batch_size": batch_size,
                                        "context": int(blocks.shape[1] - 1), "n_params": n_params,
                                        "model": dict(POEM_RECIPE["model"])}}


def write_throughput_results(path=THROUGHPUT_RESULTS, **kwargs):
    """（维护者用）跑 :func:`run_throughput_rounds`，连同命令、机器、日期写成 JSON（临时文件 + 改名）。"""
    from ..measurement.benchmarking import machine_info, save_results

    info = machine_info()  # 开始时的平均负载
    start = time.perf_counter()
    result = run_throughput_rounds(**kwargs)
    info["load_average_after"] = round(os.getloadavg()[0], 2) if hasattr(os, "getloadavg") else None
    info["seconds"] = round(time.perf_counter() - start, 1)
    info["threads"] = "1×2 与 2×1（见各轮）"
    result["produced_by"] = {"command": "python -m tformer_lib.parallel.throughput " + " ".join(sys.argv[1:]), **info}
    return save_results(result, path)


def load_throughput_results(path=THROUGHPUT_RESULTS) -> dict:
    """读回 :func:`write_throughput_results` 写的 JSON（第 12 章用它画图）。"""
    from ..measurement.benchmarking import read_results

    return read_results(path, f"python -m tformer_lib.parallel.throughput --out {path}")


def main(argv=None) -> int:  # pragma: no cover - 维护者脚本
    import argparse

    parser = argparse.ArgumentParser(description="1 进程 × 2 线程 vs 2 进程 × 1 线程（数据并行）的吞吐，写成 JSON")
    parser.add_argument("--out", default=str(THROUGHPUT_RESULTS))
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--batch-size", type=int, default=16)
    args = parser.parse_args(argv)
    print(write_throughput_results(args.out, rounds=args.rounds, steps=args.steps, batch_size=args.batch_size))
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
