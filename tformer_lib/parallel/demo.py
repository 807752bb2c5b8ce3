"""第 12 章的现场演示：每个函数在 2 个进程（gloo）里跑一种并行方案，返回与单进程训练的比较结果。

笔记本只打印确定的东西（是否在容差之内、字节数、形状），所以这些函数把“差多少”算好交给它，
差值本身（1e-8 到 1e-6 量级，随 BLAS 与求和顺序而变）不进 nbval 比较的文本。

- :class:`WorkerPool`：常驻的一组进程，一章里的演示共用它（每次重新起进程要导入 torch，在 2 核机器上要好几秒）；
- :func:`hello_all_reduce`：最小的集合通信——每个进程拿出 rank + 1，all-reduce 之后都得到总和；
- :func:`demo_data_parallel`：手写梯度 all-reduce、DDP、FSDP2 三种写法（一次启动），对照单进程整批；
- :func:`demo_tensor_parallel`：手写 Megatron（注意力按头 + FFN 列→行）与 PyTorch 的 ``parallelize_module``（Colwise/RowwiseParallel），对照不切的块；
- :func:`demo_pipeline`：手写 GPipe（send/recv）与 ``torch.distributed.pipelining`` 的 GPipe、1F1B，对照单进程。

模型都很小（几十维、两块），数据是随书唐诗打包好的块截短到 32 个字：每个演示几秒钟。
"""

from __future__ import annotations

import copy
import io
from contextlib import contextmanager
import traceback
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.nn.functional as F

from .._checks import finite_positive, positive_int
from ..lm.data import loss_targets
from ..specials import PAD
from .comm import data_parallel_payload, pipeline_payload, tensor_parallel_payload
from .data_parallel import train_lm_worker, train_single_process
from .fsdp import fsdp_train_worker
from .launch import HOST, STARTUP_TIMEOUT, DistributedError, collect_outputs, dump_bytes, backend_for, launch
from .pipeline import pipeline_worker
from .schedule import idle_fraction
from .tensor_parallel import ResidualBlock, gather_manual_params, tp_train_worker, train_single_block
from .zero import zero_bytes_per_rank

__all__ = ["WorkerPool", "recording_fsdp_collectives", "TOLERANCES", "demo_blocks", "demo_lm", "hello_worker", "hello_all_reduce", "max_param_diff",
           "demo_data_parallel", "demo_tensor_parallel", "demo_pipeline", "DEMO_PIPELINE_MODES"]

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
        if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
            raise ValueError(f"world_size 应是正整数，收到 {world_size!r}")
        if not (isinstance(timeout, (int, float)) and timeout > 0):
            raise ValueError(f"timeout 应是正的秒数，收到 {timeout!r}")
        import torch.multiprocessing as mp

        if not isinstance(device, str) or device.split(":")[0] not in ("cpu", "cuda"):
            raise ValueError(f"device={device!r} 不受支持：WorkerPool 只演示 cpu（gloo）")
        backend = backend_for(device)
        if backend == "nccl":
            raise ValueError("WorkerPool 只演示 CPU（gloo）；GPU 上请用 launch(..., device='cuda')")
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


def _run(pool, fn, world_size: int, args: tuple, timeout: float) -> list:
    """有 ``pool`` 时交给它，否则 :func:`launch` 一次。"""
    if pool is None:
        return launch(fn, world_size, args, timeout=timeout)
    if pool.world_size != world_size:
        raise ValueError(f"pool 有 {pool.world_size} 个进程，这个演示需要 {world_size} 个")
    return pool.run(fn, args, timeout=timeout)


def _check_lm_run(model, blocks, steps: int, batch_size: int, lr: float, world_size: int = 2) -> None:
    """在起进程之前查参数：出错的任务会让进程组停在半路，连带关掉整个 :class:`WorkerPool`。"""
    from ..lm import DecoderOnlyLM

    if not isinstance(model, DecoderOnlyLM):
        raise TypeError(f"model 应是 DecoderOnlyLM，收到 {type(model).__name__}")
    positive_int("steps", steps)
    positive_int("batch_size", batch_size)
    finite_positive("lr", lr)
    if not isinstance(blocks, torch.Tensor) or blocks.dim() != 2 or blocks.dtype not in (torch.int64, torch.int32):
        raise ValueError(f"blocks 应是 (块数, T+1) 的整数词元张量，收到 {getattr(blocks, 'shape', type(blocks).__name__)}")
    if blocks.shape[1] - 1 > model.config.max_len or blocks.shape[1] < 2:
        raise ValueError(f"blocks 每块 {blocks.shape[1]} 个词元：应在 2 到 max_len + 1 = {model.config.max_len + 1} 之间")
    if batch_size % world_size != 0:
        raise ValueError(f"batch_size={batch_size} 不能被进程数 world_size={world_size} 整除")
    if blocks.shape[0] < steps * batch_size:
        raise ValueError(f"blocks 只有 {blocks.shape[0]} 块，{steps} 步 × batch_size={batch_size} 需要 {steps * batch_size} 块")


#: 每种方案与单进程比较时用的容差（参数的最大绝对差）；与 tests/test_parallel_*.py 的相同。
#: 数据并行与 FSDP 用 AdamW：求和顺序不同带来的 float32 舍入被 Adam 的归一化放大，所以宽一些。
TOLERANCES = {"data_parallel": 5e-5, "tensor_parallel": 1e-6, "pipeline": 1e-6}


def demo_blocks(n_blocks: int = 32, length: int = 32) -> torch.Tensor:
    """随书唐诗训练集打包好的前 ``n_blocks`` 块，每块截成 ``length + 1`` 个字（输入与目标错开一位）。"""
    from ..lm import poem_data

    positive_int("n_blocks", n_blocks)
    positive_int("length", length)
    blocks = poem_data()["train_blocks"]
    if n_blocks > blocks.shape[0] or length + 1 > blocks.shape[1]:
        raise ValueError(f"n_blocks={n_blocks}、length={length} 超出了随书训练块的 {tuple(blocks.shape)}（每块 length + 1 个字）")
    return blocks[:n_blocks, : length + 1].clone()  # (n_blocks, length + 1)


def demo_lm(vocab_size: int, *, seed: int = 0, **overrides):
    """演示用的小语言模型：d_model 32、4 头、2 块、上下文 32，输出层不与词嵌入共享（流水线要切开首尾）。"""
    from ..lm import LMConfig, make_lm
    from ..seed import set_seed

    settings = dict(d_model=32, n_heads=4, n_layers=2, d_ff=64, max_len=32, tie_embeddings=False)
    settings.update(overrides)
    set_seed(seed)
    return make_lm(LMConfig(vocab_size, **settings))


def max_param_diff(a: dict, b: dict) -> float:
    """两组同名参数的最大绝对差（名字必须一一对应）。"""
    if not a or not b:
        raise ValueError("两组参数都不能为空")
    if sorted(a) != sorted(b):
        raise ValueError(f"两组参数的名字不同：只在一边的有 {sorted(set(a) ^ set(b))[:4]}")
    return max(float((a[k].detach().float() - b[k].detach().float()).abs().max()) for k in a)


def _max_rel(a, b) -> float:
    return max(abs(x - y) / max(abs(y), 1e-12) for x, y in zip(a, b))


# ---- 0. 最小的集合通信 ----
def hello_worker(rank: int, world_size: int) -> dict:
    """每个进程里：拿出 rank + 1，all-reduce（求和）之后每个进程都得到 1 + 2 + … + p。"""
    x = torch.tensor([float(rank + 1)])
    before = float(x)
    dist.all_reduce(x, op=dist.ReduceOp.SUM)  # 每个进程都收到所有进程的和
    return {"rank": rank, "world_size": world_size, "backend": dist.get_backend(), "before": before, "after": float(x)}


def hello_all_reduce(world_size: int = 2, timeout: float = 120.0, *, pool: WorkerPool | None = None) -> list[dict]:
    """在 ``world_size`` 个进程（``pool`` 给定时用它的进程）里跑 :func:`hello_worker`，按 rank 返回每个进程看到的值。"""
    return _run(pool, hello_worker, world_size, (), timeout)


# ---- 1. 数据并行：手写 all-reduce、DDP、FSDP2 ----
@contextmanager
def recording_fsdp_collectives():
    """记下 FSDP2 交给 c10d 的 all-gather 与 reduce-scatter：``[(名字, 字节数), …]``。

    FSDP2 直接调用 ``c10d._allgather_base_`` / ``c10d._reduce_scatter_base_``（每个 ``fully_shard`` 组一次，组内参数拼成
    一个扁平张量）；这里用 ``TorchDispatchMode`` 在它们执行时记下**完整**张量的字节（all-gather 的输出、reduce-scatter
    的输入，即与 all-reduce 的“载荷”同一个口径），并按是否在反向传播里（``torch._C._current_graph_task_id()``）
    分成 ``"all_gather_forward"``、``"all_gather_backward"`` 与 ``"reduce_scatter"``。
    """
    from torch.distributed.tensor import DTensor
    from torch.utils._python_dispatch import TorchDispatchMode

    log: list[tuple[str, int]] = []

    class _Recorder(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if any(issubclass(t, DTensor) for t in types):
                return NotImplemented  # 让 DTensor 先拆成本地运算与通信，再经过这里
            name = str(getattr(func, "_overloadpacket", ""))
            if name == "c10d._allgather_base_":  # (输出, 输入, …)
                phase = "backward" if torch._C._current_graph_task_id() != -1 else "forward"
                log.append((f"all_gather_{phase}", args[0].numel() * args[0].element_size()))
            elif name == "c10d._reduce_scatter_base_":  # (输出, 输入, …)
                log.append(("reduce_scatter", args[1].numel() * args[1].element_size()))
            return func(*args, **(kwargs or {}))

    with _Recorder():
        yield log


def _dp_worker(rank, world_size, config_dict, state, blocks, steps, batch_size, lr):
    out = train_lm_worker(rank, world_size, ("manual", "ddp"), config_dict, state, blocks, steps, batch_size, lr)
    with recording_fsdp_collectives() as log:
        out["fsdp"] = fsdp_train_worker(rank, world_size, config_dict, state, blocks, steps, batch_size, lr)
    comm: dict[str, float] = {"all_gather_forward": 0.0, "all_gather_backward": 0.0, "reduce_scatter": 0.0}
    for name, n in log:
        comm[name] += n / steps
    out["fsdp"]["comm_per_step"] = comm
    return out


def demo_data_parallel(model, blocks: torch.Tensor, *, steps: int = 3, batch_size: int = 8, lr: float = 1e-2,
                       timeout: float = 150.0, pool: WorkerPool | None = None) -> dict:
    """同一初始参数、同一批数据：单进程整批 vs 2 个进程的手写 all-reduce、DDP、FSDP2（AdamW，``steps`` 步）。

    返回 ``{"reference": {"losses"}, "manual"/"ddp"/"fsdp": {"losses", "param_diff", "loss_rel_diff", "within"},
    "bytes_per_step"（手写 all-reduce 实际交出的字节）, "ddp_buckets"（DDP 每个桶的字节）, "payload_formula", "fsdp_bytes"（每个 rank）, "fsdp_comm"（FSDP2 每步 all-gather/reduce-scatter 的字节）,
    "zero3_formula", "n_params"}``。
    """
    _check_lm_run(model, blocks, steps, batch_size, lr)
    ref = train_single_process(model, blocks, steps, batch_size, lr, world_size=2)
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    res = _run(pool, _dp_worker, 2, (model.config.to_dict(), state, blocks, steps, batch_size, lr), timeout)
    tol = TOLERANCES["data_parallel"]
    out = {"reference": {"losses": ref["losses"]}, "tolerance": tol}
    for mode in ("manual", "ddp", "fsdp"):
        r = res[0][mode]
        diff = max_param_diff(r["params"], ref["params"])
        out[mode] = {"losses": r["losses"], "param_diff": diff, "loss_rel_diff": _max_rel(r["losses"], ref["losses"]),
                     "within": diff <= tol and _max_rel(r["losses"], ref["losses"]) <= 1e-5}
    n_params = sum(p.numel() for p in model.parameters())
    out["n_params"] = n_params
    out["bytes_per_step"] = res[0]["manual"]["bytes_per_step"]
    out["ddp_buckets"] = res[0]["ddp"].get("buckets")  # DDP 日志里每个桶的字节数
    out["payload_formula"] = data_parallel_payload(n_params)
    out["fsdp_bytes"] = [r["fsdp"]["bytes"] for r in res]
    out["fsdp_comm"] = res[0]["fsdp"]["comm_per_step"]  # 每步交给 all-gather / reduce-scatter 的完整张量字节
    out["zero3_formula"] = {k: v for k, v in zero_bytes_per_rank(n_params, 2, 3).items() if k != "total"}
    return out


# ---- 2. 张量并行：手写 Megatron 与 PyTorch 的 Colwise/RowwiseParallel ----
def _tp_worker(rank, world_size, block, x, target, mask, steps, lr):
    # tp_train_worker 自己先做私有副本（spawn 传来的张量在进程间共享内存），两种写法互不影响
    return {mode: tp_train_worker(rank, world_size, mode, block, x, target, mask, steps, lr)
            for mode in ("manual", "torch_block")}


def demo_tensor_parallel(block: ResidualBlock, x: torch.Tensor, target: torch.Tensor, mask=None, *, steps: int = 3,
                         lr: float = 0.1, timeout: float = 150.0, pool: WorkerPool | None = None) -> dict:
    """不切的块 vs 2 个进程各持一半，SGD、均方误差训练 ``steps`` 步：手写 Megatron（``"manual"``）与 PyTorch 的
    ``parallelize_module``（注意力与 FFN 都切，``"torch"``）。

    返回 ``{"manual": {"within", "param_diff", "ranks_agree", "shard_shapes", "full_shapes", "bytes_per_step",
    "payload_formula"}, "torch": {"within", "param_diff", "bytes_per_step"（PyTorch 自己发起的 all-reduce）},
    "reference": {"losses"}, "tolerance"}``。
    """
    if not isinstance(block, ResidualBlock):
        raise TypeError(f"block 应是 ResidualBlock，收到 {type(block).__name__}")
    positive_int("steps", steps)
    finite_positive("lr", lr)
    if not (isinstance(x, torch.Tensor) and isinstance(target, torch.Tensor) and x.dim() == 3 and x.shape == target.shape):
        raise ValueError(f"x 与 target 应是同形状的 (B, T, d_model) 张量，收到 {getattr(x, 'shape', None)} 与 {getattr(target, 'shape', None)}")
    for name, size in (("n_heads", block.attn.n_heads), ("d_ff", block.ffn.w_1.out_features)):  # 两个进程要能均分
        if size % 2:
            raise ValueError(f"{name}={size} 不能被进程数 2 整除，无法切到 2 个进程上")
    ref = train_single_block(block, x, target, mask, steps, lr)
    res = _run(pool, _tp_worker, 2, (block, x, target, mask, steps, lr), timeout)
    tol = TOLERANCES["tensor_parallel"]
    manual = gather_manual_params([r["manual"]["params"] for r in res])
    diff = max_param_diff(manual, ref["params"])
    shapes = {name: tuple(res[0]["manual"]["params"][name].shape)
              for name in ("attn.w_q.weight", "attn.w_o.weight", "ffn.w_1.weight", "ffn.w_2.weight")}
    full_shapes = {name: tuple(dict(block.named_parameters())[name].shape) for name in shapes}
    out = {"tolerance": tol, "reference": {"losses": ref["losses"]},
           "manual": {"losses": res[0]["manual"]["losses"], "param_diff": diff,
                      "within": diff <= tol and _max_rel(res[0]["manual"]["losses"], ref["losses"]) <= 1e-6,
                      "ranks_agree": res[0]["manual"]["losses"] == res[1]["manual"]["losses"],
                      "shard_shapes": shapes, "full_shapes": full_shapes,
                      "bytes_per_step": res[0]["manual"]["bytes_per_step"],
                      "payload_formula": tensor_parallel_payload(*x.shape, n_blocks=1,
                                                                 input_requires_grad=x.requires_grad)}}
    torch_diff = max(max_param_diff(r["torch_block"]["params"], ref["params"]) for r in res)
    out["torch"] = {"param_diff": torch_diff, "losses": res[0]["torch_block"]["losses"],
                    "bytes_per_step": res[0]["torch_block"]["bytes_per_step"],
                    "within": torch_diff <= tol and _max_rel(res[0]["torch_block"]["losses"], ref["losses"]) <= 1e-6}
    return out


# ---- 3. 流水线并行：手写 GPipe 与 torch.distributed.pipelining ----
def _pipeline_worker(rank, world_size, modes, config_dict, state, blocks, steps, batch_size, micro_batches, lr):
    return {mode: pipeline_worker(rank, world_size, mode, config_dict, state, blocks, steps, batch_size, micro_batches, lr)
            for mode in modes}


def _single_sgd(model, blocks, steps, batch_size, lr):
    ref = copy.deepcopy(model)
    optimizer = torch.optim.SGD(ref.parameters(), lr=lr)
    losses = []
    for s in range(steps):
        b = blocks[s * batch_size : (s + 1) * batch_size]
        optimizer.zero_grad()
        inputs, targets = loss_targets(b)  # (B, T), (B, T)：PAD 与 BOS 目标不计
        logits = ref(inputs)  # (B, T, V)
        loss = F.cross_entropy(logits.flatten(0, 1), targets.flatten(), ignore_index=PAD)
        loss.backward()
        optimizer.step()
        losses.append(float(loss.detach()))
    return {"losses": losses, "params": {k: v.detach().clone() for k, v in ref.named_parameters()}}


#: 流水线演示的四种调度：手写 GPipe、手写 1F1B、PyTorch 的 ScheduleGPipe 与 Schedule1F1B
DEMO_PIPELINE_MODES = ("manual", "manual_1f1b", "gpipe", "1f1b")


def demo_pipeline(model, blocks: torch.Tensor, *, steps: int = 2, batch_size: int = 8, micro_batches: int = 4,
                  lr: float = 0.5, modes=DEMO_PIPELINE_MODES, timeout: float = 150.0,
                  pool: WorkerPool | None = None) -> dict:
    """单进程整批 SGD vs 2 段流水线（每段一个进程、``micro_batches`` 个微批）的每种调度 ``modes``（一次启动）。

    返回 ``{mode: {"within", "param_diff", "losses", "stage_params"（每段的参数个数）, 手写时还有 "timeline"（最后一步
    两段的实测事件，秒）与 "idle_fraction"}, "bytes_per_step"（手写 GPipe 两段合计 send 的字节）, "payload_formula",
    "reference": {"losses"}}``。实测时间线随负载而变：只画进图里。
    """
    _check_lm_run(model, blocks, steps, batch_size, lr, world_size=1)
    positive_int("micro_batches", micro_batches)
    if batch_size % micro_batches:
        raise ValueError(f"batch_size={batch_size} 不能被 micro_batches={micro_batches} 整除")
    if model.config.tie_embeddings:
        raise ValueError("流水线切分要求 tie_embeddings=False：输出层与词嵌入共享时首尾两段要共用一个矩阵")
    if model.config.n_layers < 2:
        raise ValueError(f"2 段流水线至少要 2 个块，收到 n_layers={model.config.n_layers}")
    bad = [mode for mode in modes if mode not in DEMO_PIPELINE_MODES]
    if isinstance(modes, str) or bad:
        raise ValueError(f"modes 应是 {DEMO_PIPELINE_MODES} 里的若干个，收到 {modes!r}")
    ref = _single_sgd(model, blocks, steps, batch_size, lr)
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    res = _run(pool, _pipeline_worker, 2, (tuple(modes), model.config.to_dict(), state, blocks, steps, batch_size,
                                           micro_batches, lr), timeout)
    tol = TOLERANCES["pipeline"]
    out = {"tolerance": tol, "reference": {"losses": ref["losses"]}}
    for mode in modes:
        params = {**res[0][mode]["params"], **res[1][mode]["params"]}
        diff = max_param_diff(params, ref["params"])
        losses = res[0][mode]["losses"]
        out[mode] = {"losses": losses, "param_diff": diff, "within": diff <= tol and _max_rel(losses, ref["losses"]) <= 1e-6,
                     "stage_params": [sum(v.numel() for v in r[mode]["params"].values()) for r in res]}
        if res[0][mode]["timeline"]:
            events = sorted((e for r in res for e in r[mode]["timeline"][-1]), key=lambda e: (e.start, e.rank))
            out[mode]["timeline"] = events
            out[mode]["idle_fraction"] = idle_fraction(events, 2)
    if "manual" in modes:
        out["bytes_per_step"] = res[0]["manual"]["bytes_per_step"] + res[1]["manual"]["bytes_per_step"]
        out["payload_formula"] = pipeline_payload(batch_size, blocks.shape[1] - 1, model.config.d_model, stages=2)
    return out
