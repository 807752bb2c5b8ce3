"""多进程启动器（launcher）：在一台机器上起 ``world_size`` 个进程，组成一个 ``torch.distributed`` 进程组。

- 后端（backend）按设备选：CPU 用 gloo，CUDA 用 nccl（:func:`backend_for`）；
- 端口不靠猜：父进程先开一个 ``TCPStore``，让操作系统分配空闲端口（port 0），子进程连上它——
  没有“先查空闲端口、再被别人抢走”的竞争；
- 永不挂起：进程组与 store 都带超时；父进程按截止时间收结果，超时或任一进程出错就结束所有子进程并报错；
- 每个进程默认单线程（2 核机器上两个进程各用 2 线程会互相等待，每步可慢十几倍）。

worker 函数写在库里（顶层函数，``spawn`` 要能按名字导入它），签名 ``fn(rank, world_size, *args)``，
返回值经 ``torch.save`` 序列化后传回父进程，所以可以含张量。

在 ``torchrun`` 下（环境变量里已有 ``RANK``/``WORLD_SIZE``）用 :func:`init_from_env`，不用 :func:`launch`。
"""

from __future__ import annotations

import io
import os
import queue as queue_module
import time
import traceback
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

__all__ = ["backend_for", "launch", "init_from_env", "is_rank0", "rank_print", "DistributedError"]

_HOST = "127.0.0.1"


class DistributedError(RuntimeError):
    """某个进程出错或超时：消息里带着出错进程的 rank 与它的回溯（traceback）。"""


def backend_for(device: str | torch.device = "cpu") -> str:
    """CPU → ``"gloo"``，CUDA → ``"nccl"``。"""
    kind = torch.device(device).type
    if kind == "cpu":
        return "gloo"
    if kind == "cuda":
        return "nccl"
    raise ValueError(f"device={device!r} 不受支持：分布式训练只支持 cpu（gloo）或 cuda（nccl）")


def _dumps(obj) -> bytes:
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    return buffer.getvalue()


def _worker(rank, world_size, port, backend, timeout, threads, fn, packed_args, results):
    torch.set_num_threads(threads)
    try:
        args = torch.load(io.BytesIO(packed_args), weights_only=False)  # 每个进程一份私有的拷贝
        if backend == "nccl":
            torch.cuda.set_device(rank % torch.cuda.device_count())
        store = dist.TCPStore(_HOST, port, world_size, is_master=False, timeout=timedelta(seconds=timeout))
        dist.init_process_group(backend, store=store, rank=rank, world_size=world_size,
                                timeout=timedelta(seconds=timeout))
        out = fn(rank, world_size, *args)
        results.put((rank, "ok", _dumps(out)))
    except BaseException:  # noqa: BLE001 — 任何异常都要报回父进程，否则父进程只能等到超时
        results.put((rank, "error", traceback.format_exc()))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def launch(fn, world_size: int = 2, args: tuple = (), *, device: str = "cpu", timeout: float = 120.0,
           threads: int = 1) -> list:
    """起 ``world_size`` 个进程各跑 ``fn(rank, world_size, *args)``，返回按 rank 排好的返回值列表。

    ``args`` 按 ``torch.save`` 的字节传给每个进程：每个进程拿到自己的一份拷贝，原地修改（如训练传入的模型）
    不会影响父进程，也不会影响别的进程（``multiprocessing`` 默认会把张量放进共享内存，几个进程改的是同一块）。
    timeout：整个运行的秒数上限（进程组的集合通信也用它）；超时、任一进程出错或意外退出都抛
    :class:`DistributedError`，并结束其余进程——测试与笔记本永远不会挂住。
    """
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"world_size 应是正整数，收到 {world_size!r}")
    if not callable(fn):
        raise TypeError(f"fn 应是可调用的顶层函数，收到 {type(fn).__name__}")
    if not (isinstance(timeout, (int, float)) and timeout > 0):
        raise ValueError(f"timeout 应是正的秒数，收到 {timeout!r}")
    backend = backend_for(device)
    if backend == "nccl" and torch.cuda.device_count() < 1:
        raise ValueError("device='cuda' 但这台机器没有可用的 GPU")
    # 父进程持有 store 的服务端：port=0 由操作系统分配空闲端口
    store = dist.TCPStore(_HOST, 0, None, is_master=True, timeout=timedelta(seconds=timeout), wait_for_workers=False)
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    # 参数按字节传（torch.save），不走 multiprocessing 的张量共享内存：否则各进程原地更新的是父进程的同一块存储
    packed = _dumps(tuple(args))
    procs = [ctx.Process(target=_worker, args=(r, world_size, store.port, backend, timeout, threads, fn, packed, results),
                         daemon=True) for r in range(world_size)]
    for p in procs:
        p.start()
    outputs: dict[int, bytes] = {}
    deadline = time.monotonic() + timeout
    try:
        while len(outputs) < world_size:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise DistributedError(f"{world_size} 个进程在 timeout={timeout} 秒内没有全部完成"
                                       f"（已完成的 rank：{sorted(outputs)}）")
            try:
                rank, status, payload = results.get(timeout=min(remaining, 1.0))
            except queue_module.Empty:
                dead = [r for r, p in enumerate(procs) if p.exitcode not in (None, 0) and r not in outputs]
                if dead:
                    raise DistributedError(f"rank {dead[0]} 意外退出（exitcode={procs[dead[0]].exitcode}），没有返回结果")
                continue
            if status == "error":
                raise DistributedError(f"rank {rank} 出错：\n{payload}")
            outputs[rank] = payload
    finally:
        finished = len(outputs) == world_size
        for p in procs:
            p.join(timeout=5 if finished else 0.1)  # 失败时不再等：其余进程可能正卡在集合通信里
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join(timeout=5)
        results.close()
        del store
    return [torch.load(io.BytesIO(outputs[r]), weights_only=False) for r in range(world_size)]


def init_from_env(device: str = "cpu", timeout: float = 300.0) -> tuple[int, int]:
    """在 ``torchrun`` 起的进程里初始化进程组（``env://``：读 ``RANK``、``WORLD_SIZE``、``MASTER_ADDR/PORT``）。

    环境里没有 ``WORLD_SIZE`` 或它为 1 时什么也不做，返回 ``(0, 1)``——同一段代码单进程也能跑。
    """
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    if world_size <= 1:
        return 0, 1
    if not dist.is_initialized():
        dist.init_process_group(backend_for(device), timeout=timedelta(seconds=timeout))
    return dist.get_rank(), dist.get_world_size()


def is_rank0() -> bool:
    """没有进程组（单进程）或本进程是 rank 0 时为 True：只有它打印日志、保存检查点。"""
    return not dist.is_initialized() or dist.get_rank() == 0


def rank_print(*args, **kwargs) -> None:
    """只在 rank 0 上 ``print``。"""
    if is_rank0():
        print(*args, **kwargs)
