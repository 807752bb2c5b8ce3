"""吞吐量对比：1 个进程 × 2 线程 与 2 个进程 × 1 线程（数据并行，手写 all-reduce 以便计时通信）。

2 个 CPU 核不是 2 块 GPU：两个进程抢同一块内存带宽，all-reduce 走本机 TCP（gloo），两线程的矩阵乘法也已经
用上了两个核——所以结果要在同一次运行里量，不能预设数据并行一定更快。结果（墙钟时间）只进图表，不进 nbval 比较的文本。
"""

from __future__ import annotations

import time

import torch
import torch.distributed as dist

from .data_parallel import _lm_loss, _new_model, allreduce_gradients
from .launch import launch

__all__ = ["throughput_worker", "measure_throughput"]


def throughput_worker(rank: int, world_size: int, config_dict: dict, state: dict, blocks: torch.Tensor, steps: int,
                      batch_size: int, warmup: int = 1) -> dict:
    """全局批 ``batch_size``，每个进程 ``batch_size / world_size`` 块；返回本进程的计时。"""
    model = _new_model(config_dict, state)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    per_rank = batch_size // world_size
    comm = total = 0.0
    for step in range(warmup + steps):
        start = time.perf_counter()
        rows = torch.arange(per_rank) + (step * batch_size + rank * per_rank) % max(1, len(blocks) - per_rank)
        optimizer.zero_grad(set_to_none=True)
        _lm_loss(model, blocks[rows]).backward()
        if world_size > 1:
            t = time.perf_counter()
            allreduce_gradients(model)
            if step >= warmup:
                comm += time.perf_counter() - t
        optimizer.step()
        if step >= warmup:
            total += time.perf_counter() - start
    tokens = steps * batch_size * (blocks.shape[1] - 1)  # 全局的目标词元数
    return {"seconds": total, "comm_seconds": comm, "tokens_per_s": tokens / total, "threads": torch.get_num_threads()}


def measure_throughput(model, blocks: torch.Tensor, steps: int = 5, batch_size: int = 16, timeout: float = 600.0) -> dict:
    """同一次运行里量 ``"1x2"``（1 进程 2 线程）与 ``"2x1"``（2 进程各 1 线程，数据并行）的全局词元/秒与通信占比。"""
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    args = (model.config.to_dict(), state, blocks, steps, batch_size)
    one = launch(throughput_worker, 1, args, threads=2, timeout=timeout)[0]
    two = launch(throughput_worker, 2, args, threads=1, timeout=timeout)
    slowest = max(two, key=lambda r: r["seconds"])
    return {"1x2": {"tokens_per_s": one["tokens_per_s"]},
            "2x1": {"tokens_per_s": slowest["tokens_per_s"], "comm_share": slowest["comm_seconds"] / slowest["seconds"]}}
