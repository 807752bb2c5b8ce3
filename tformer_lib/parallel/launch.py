"""多进程启动器（launcher）：在一台机器上起 ``world_size`` 个进程，组成一个 ``torch.distributed`` 进程组。

- 后端（backend）按设备选：CPU 用 gloo，CUDA 用 nccl（:func:`backend_for`）；
- 端口不靠猜：父进程先开一个 ``TCPStore``，让操作系统分配空闲端口（port 0），子进程连上它——
  没有“先查空闲端口、再被别人抢走”的竞争；
- 永不挂起：进程组与 store 都带超时；父进程按截止时间收结果，超时或任一进程出错就结束所有子进程并报错；
- 启动不算在 ``timeout`` 里：spawn 出的进程要先导入 torch、连上 store（安静时约 3 秒，2 核机器负载 ≈ 14 时实测
  20–60 秒），它们都报“就绪”之后 ``timeout`` 才开始计时；启动本身最多等 :data:`STARTUP_TIMEOUT` 秒；
- 报错先说真正的原因：一个进程出错退出后，别的进程的集合通信会随之报“Connection closed/reset”——那是结果不是原因。
  父进程先收到的若只是这种通信错误，会再等一会儿（:data:`_SETTLE` 秒）看真正出错的进程报来什么，消息第一行点名它
  （与第 12 章检查器的做法相同）；
- 每个进程默认单线程（2 核机器上两个进程各用 2 线程会互相等待，每步可慢十几倍）。

worker 函数写在库里（顶层函数，``spawn`` 要能按名字导入它），签名 ``fn(rank, world_size, *args)``，
返回值经 ``torch.save`` 序列化后传回父进程，所以可以含张量。

在 ``torchrun`` 下（环境变量里已有 ``RANK``/``WORLD_SIZE``）用 :func:`init_from_env`，不用 :func:`launch`。
"""

from __future__ import annotations

import io
import os
import queue as queue_module
import signal
import time
import traceback
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from .._checks import positive_int

__all__ = ["backend_for", "launch", "WorkerPool", "init_from_env", "is_rank0", "rank_print", "DistributedError", "STARTUP_TIMEOUT"]

HOST = "127.0.0.1"
#: 进程启动（spawn、导入 torch、连上 store、组成进程组）最多等多少秒；不算在 ``timeout`` 里（见模块说明）
STARTUP_TIMEOUT = 300.0
#: 先收到的只是通信错误时，再等真正出错的进程报来原因的秒数
_SETTLE = 10.0
#: 对方进程已经退出时集合通信报的错（gloo 的措辞）：它们是别的进程出错的结果
_COMM_FAILURE_MARKS = ("Connection closed", "Connection reset", "Broken pipe", "Connection refused")


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


def dump_bytes(obj) -> bytes:
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    return buffer.getvalue()


def _is_comm_failure(text: str) -> bool:
    """``text``（一个进程的回溯）是不是“对方已经断开”一类的通信错误。"""
    return any(mark in text for mark in _COMM_FAILURE_MARKS)


def _last_line(text: str) -> str:
    """回溯的最后一行非空文字：异常的类型与消息，如 ``ValueError: …``。"""
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1].strip() if lines else "（没有消息）"


def _exit_reason(exitcode: int) -> str:
    """``exitcode`` 的说明；负数是结束它的信号。"""
    if exitcode >= 0:
        return f"exitcode={exitcode}"
    try:
        name = signal.Signals(-exitcode).name
    except ValueError:
        name = f"信号 {-exitcode}"
    text = f"exitcode={exitcode}，被 {name} 结束"
    if -exitcode == signal.SIGKILL:  # 本库只在出错或超时之后才 kill 子进程，那时已经另有报错
        text += "：不是本库发出的，常见的来源是内存不足时操作系统的 OOM killer"
    return text


def _failure_message(errors: dict[int, str], dead: dict[int, int]) -> str:
    """几个进程出错（``errors``：rank → 回溯）或意外退出（``dead``：rank → exitcode）时的报错：第一行点名真正的原因。

    顺序：不是通信错误的异常 → 意外退出的进程 → 通信错误（对方断开，是别的进程出错的结果）。
    """
    real = [r for r in sorted(errors) if not _is_comm_failure(errors[r])]
    comm = [r for r in sorted(errors) if _is_comm_failure(errors[r])]
    if real:
        first, rest = real[0], real[1:] + comm
        head = f"rank {first} 出错：{_last_line(errors[first])}\n{errors[first].rstrip()}"
    elif dead:
        first, rest = min(dead), comm
        head = f"rank {first} 意外退出（{_exit_reason(dead[first])}），没有返回结果"
    else:
        first, rest = comm[0], comm[1:]
        head = (f"rank {first} 出错：{_last_line(errors[first])}\n（这是通信错误：另一个进程可能已经没报原因就退出了）\n"
                f"{errors[first].rstrip()}")
    others = [f"rank {r}：{_last_line(errors[r])}" for r in rest]
    others += [f"rank {r}：意外退出（{_exit_reason(code)}）" for r, code in sorted(dead.items()) if r != first]
    if others:
        head += "\n其余进程随之失败（别的进程退出后，集合通信连接被关闭）：\n" + "\n".join(others)
    return head


def collect_outputs(receive, procs, world_size: int, timeout: float, ready: set, what: str) -> dict[int, bytes]:
    """父进程收结果：``receive(秒)`` 返回一条 ``(rank, status, payload)``（status 为 "ready"/"ok"/"error"），
    超时抛 ``queue.Empty``。``ready`` 是已就绪的 rank（常驻的进程池跨任务保留它）。

    全部就绪之前最多等 :data:`STARTUP_TIMEOUT` 秒，之后 ``timeout`` 秒；出错时按 :func:`_failure_message` 报错。
    """
    outputs: dict[int, bytes] = {}
    errors: dict[int, str] = {}
    start = time.monotonic()
    deadline = start + (timeout if len(ready) == world_size else STARTUP_TIMEOUT)
    settle_until = None
    while len(outputs) < world_size:
        now = time.monotonic()
        dead = {r: p.exitcode for r, p in enumerate(procs)
                if p.exitcode not in (None, 0) and r not in outputs and r not in errors}
        if errors or dead:
            settle_until = now + _SETTLE if settle_until is None else settle_until
            accounted = len(outputs) + len(errors) + len(dead) == world_size
            real = dead or any(not _is_comm_failure(t) for t in errors.values())
            if real or accounted or now >= settle_until:
                if dead:  # 它退出之前放进队列的消息可能还没读：先读完再下结论
                    try:
                        while True:
                            rank, status, payload = receive(0.05)
                            if status == "error":
                                errors[rank] = payload
                            elif status == "ok":
                                outputs[rank] = payload
                    except queue_module.Empty:
                        pass
                    dead = {r: c for r, c in dead.items() if r not in outputs and r not in errors}
                    if not dead and not errors:
                        continue
                raise DistributedError(_failure_message(errors, dead))
        if now >= deadline:
            if len(ready) < world_size:
                raise DistributedError(f"{what}：{world_size} 个进程没有在 {STARTUP_TIMEOUT:g} 秒内全部启动"
                                       f"（已就绪的 rank：{sorted(ready)}）：机器太忙，或有进程卡在导入 torch / 连接 store")
            raise DistributedError(f"{what}：{world_size} 个进程在 timeout={timeout} 秒内没有全部完成（从全部就绪算起；"
                                   f"已完成的 rank：{sorted(outputs)}）")
        try:
            rank, status, payload = receive(max(0.0, min(deadline - now, 0.5)))
        except queue_module.Empty:
            continue
        if status == "ready":
            ready.add(rank)
            if len(ready) == world_size:  # 启动完毕：从现在起算 timeout
                deadline = time.monotonic() + timeout
        elif status == "error":
            errors[rank] = payload
        else:
            outputs[rank] = payload
    return outputs


def _worker(rank, world_size, port, backend, timeout, threads, fn, packed_args, results):
    torch.set_num_threads(threads)
    try:
        args = torch.load(io.BytesIO(packed_args), weights_only=False)  # 每个进程一份私有的拷贝
        if backend == "nccl":
            torch.cuda.set_device(rank % torch.cuda.device_count())
        # 组成进程组时要等最慢的进程启动完：store 与进程组的超时含启动的时间
        limit = timedelta(seconds=timeout + STARTUP_TIMEOUT)
        store = dist.TCPStore(HOST, port, world_size, is_master=False, timeout=limit)
        dist.init_process_group(backend, store=store, rank=rank, world_size=world_size, timeout=limit)
        results.put((rank, "ready", None))
        out = fn(rank, world_size, *args)
        results.put((rank, "ok", dump_bytes(out)))
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
    timeout：所有进程就绪（导入 torch、组成进程组）之后，运行的秒数上限；启动本身另有 :data:`STARTUP_TIMEOUT`。
    超时、任一进程出错或意外退出都抛 :class:`DistributedError`（第一行点名真正出错的 rank 与它的异常），
    并结束其余进程——测试与笔记本永远不会挂住。
    """
    world_size = positive_int("world_size", world_size)
    if not callable(fn):
        raise TypeError(f"fn 应是可调用的顶层函数，收到 {type(fn).__name__}")
    if not (isinstance(timeout, (int, float)) and timeout > 0):
        raise ValueError(f"timeout 应是正的秒数，收到 {timeout!r}")
    backend = backend_for(device)
    if backend == "nccl" and torch.cuda.device_count() < 1:
        raise ValueError("device='cuda' 但这台机器没有可用的 GPU")
    # 父进程持有 store 的服务端：port=0 由操作系统分配空闲端口
    store = dist.TCPStore(HOST, 0, None, is_master=True, timeout=timedelta(seconds=timeout + STARTUP_TIMEOUT),
                          wait_for_workers=False)
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    # 参数按字节传（torch.save），不走 multiprocessing 的张量共享内存：否则各进程原地更新的是父进程的同一块存储
    packed = dump_bytes(tuple(args))
    procs = [ctx.Process(target=_worker, args=(r, world_size, store.port, backend, timeout, threads, fn, packed, results),
                         daemon=True) for r in range(world_size)]
    for p in procs:
        p.start()
    outputs: dict[int, bytes] = {}
    try:
        outputs = collect_outputs(lambda seconds: results.get(timeout=seconds), procs, world_size, timeout, set(),
                           getattr(fn, "__name__", "launch"))
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


# ---- 常驻的进程组：一次启动，多次交任务 ----
def _loads(payload: bytes):
    return torch.load(io.BytesIO(payload), weights_only=False)


def _pool_worker(rank, world_size, port, backend, timeout, threads, tasks, results):
    torch.set_num_threads(threads)
    try:
        limit = timedelta(seconds=timeout + STARTUP_TIMEOUT)  # 组成进程组要等最慢的进程启动完
        store = dist.TCPStore(HOST, port, world_size, is_master=False, timeout=limit)
        dist.init_process_group(backend, store=store, rank=rank, world_size=world_size, timeout=limit)
    except BaseException:  # noqa: BLE001 — 报回父进程，它才不会等到超时
        results.put((rank, -1, "error", traceback.format_exc()))
        return
    results.put((rank, -1, "ready", None))
    try:
        while True:
            item = tasks.get()
            if item is None:  # 父进程要求退出
                break
            task_id, payload = item
            try:
                fn, args = _loads(payload)
                results.put((rank, task_id, "ok", dump_bytes(fn(rank, world_size, *args))))
            except BaseException:  # noqa: BLE001
                results.put((rank, task_id, "error", traceback.format_exc()))
                break  # 集合通信可能停在半路：这个进程组不能再用
    finally:
        dist.destroy_process_group()


class WorkerPool:
    """一组常驻的进程（一个进程组），可以一次次地交给它任务——省掉每次 :func:`launch` 重新起进程、导入 torch 的几秒钟。

    ``pool.run(fn, args)`` 与 ``launch(fn, world_size, args)`` 一样：每个进程调用 ``fn(rank, world_size, *args)``，
    按 rank 返回结果；任务与结果经 ``torch.save`` 序列化。``timeout`` 从进程全部就绪算起（启动另有
    :data:`~tformer_lib.parallel.launch.STARTUP_TIMEOUT`），报错的第一行点名真正出错的 rank。任一进程出错或超时就结束所有进程、抛
    :class:`~tformer_lib.parallel.launch.DistributedError`，这个池也就不能再用了。用完调用 :meth:`close`
    （或用 ``with WorkerPool(2) as pool:``）；进程是守护进程，父进程退出时也会被结束。
    """

    def __init__(self, world_size: int = 2, *, device: str = "cpu", timeout: float = 120.0, threads: int = 1):
        world_size = positive_int("world_size", world_size)
        if not (isinstance(timeout, (int, float)) and timeout > 0):
            raise ValueError(f"timeout 应是正的秒数，收到 {timeout!r}")
        import torch.multiprocessing as mp

        if device != "cpu":
            raise ValueError(f"device={device!r} 不受支持：WorkerPool 只演示 CPU（gloo）；GPU 上请用 launch(..., device='cuda')")
        backend = backend_for(device)
        self.world_size, self.timeout = world_size, timeout
        self._store = dist.TCPStore(HOST, 0, None, is_master=True, timeout=timedelta(seconds=timeout + STARTUP_TIMEOUT),
                                    wait_for_workers=False)
        ctx = mp.get_context("spawn")
        self._results = ctx.Queue()
        self._tasks = [ctx.Queue() for _ in range(world_size)]
        self._procs = [ctx.Process(target=_pool_worker, daemon=True,
                                   args=(r, world_size, self._store.port, backend, timeout, threads, self._tasks[r],
                                         self._results)) for r in range(world_size)]
        for p in self._procs:
            p.start()
        self._next = 0
        self._ready: set[int] = set()  # 已经组成进程组的 rank：第一个任务先等它们启动（不算在 timeout 里）
        self.closed = False

    def run(self, fn, args: tuple = (), timeout: float | None = None) -> list:
        """每个进程跑 ``fn(rank, world_size, *args)``，返回按 rank 排好的结果列表。"""
        if self.closed:
            raise DistributedError("这个 WorkerPool 已经关闭（出过错、超时或调用过 close()）；请新建一个")
        if not callable(fn):
            raise TypeError(f"fn 应是可调用的顶层函数，收到 {type(fn).__name__}")
        timeout = self.timeout if timeout is None else timeout
        task_id, self._next = self._next, self._next + 1
        payload = dump_bytes((fn, tuple(args)))
        for q in self._tasks:
            q.put((task_id, payload))

        def receive(seconds: float):
            while True:  # 别的任务的结果（只会来自出过错、已关闭的池）不要
                rank, got_id, status, body = self._results.get(timeout=seconds)
                if status != "ok" or got_id == task_id:
                    return rank, status, body

        try:
            outputs = collect_outputs(receive, self._procs, self.world_size, timeout, self._ready,
                               f"任务 {getattr(fn, '__name__', fn)}")
        except BaseException:
            self.close(force=True)
            raise
        return [_loads(outputs[r]) for r in range(self.world_size)]

    def close(self, force: bool = False) -> None:
        """让各进程退出（``force`` 时直接结束它们）；可以重复调用。"""
        if self.closed:
            return
        self.closed = True
        if not force:
            for q in self._tasks:
                q.put(None)
        for p in self._procs:
            p.join(timeout=0.1 if force else 2)  # 退出时 destroy_process_group 偶尔要等一会儿：不必等它
        for p in self._procs:
            if p.is_alive():
                p.kill()
                p.join(timeout=5)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close(force=exc[0] is not None)

    def __del__(self):  # pragma: no cover - 解释器退出时的兜底
        try:
            self.close(force=True)
        except Exception:  # noqa: BLE001
            pass
