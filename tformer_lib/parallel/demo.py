"""第 12 章的现场演示：每个函数在 2 个进程（gloo）里跑一种并行方案，返回与单进程训练的比较结果。

笔记本只打印确定的东西（是否在容差之内、字节数、形状），所以这些函数把“差多少”算好交给它，
差值本身（1e-8 到 1e-6 量级，随 BLAS 与求和顺序而变）不进 nbval 比较的文本。

- 每个演示都可以交给一个 :class:`~tformer_lib.parallel.launch.WorkerPool`（常驻的一组进程，一章里的演示共用它：每次重新起进程
  要导入 torch，在 2 核机器上要好几秒）；
- :func:`hello_all_reduce`：最小的集合通信——每个进程拿出 rank + 1，all-reduce 之后都得到总和；
- :func:`demo_data_parallel`：手写梯度 all-reduce、DDP、FSDP2 三种写法（一次启动），对照单进程整批；
- :func:`demo_tensor_parallel`：手写 Megatron（注意力按头 + FFN 列→行）与 PyTorch 的 ``parallelize_module``（Colwise/RowwiseParallel），对照不切的块；
- :func:`demo_pipeline`：手写 GPipe（send/recv）与 ``torch.distributed.pipelining`` 的 GPipe、1F1B，对照单进程。

模型都很小（几十维、两块），数据是随书唐诗打包好的块截短到 32 个字：每个演示几秒钟。
"""

from __future__ import annotations

import copy

import torch
import torch.distributed as dist
import torch.nn.functional as F

from .._checks import finite_positive, positive_int
from ..lm.data import loss_targets
from ..specials import PAD
from .comm import data_parallel_payload, pipeline_payload, recording_fsdp_collectives, tensor_parallel_payload
from .data_parallel import train_lm_worker, train_single_process
from .fsdp import fsdp_train_worker
from .launch import WorkerPool, launch
from .pipeline import pipeline_worker
from .schedule import idle_fraction
from .tensor_parallel import ResidualBlock
from .tensor_parallel_workers import gather_manual_params, tp_train_worker, train_single_block
from .zero import zero_bytes_per_rank

__all__ = ["TOLERANCES", "demo_blocks", "demo_lm", "hello_worker", "hello_all_reduce", "max_param_diff",
           "demo_data_parallel", "demo_tensor_parallel", "demo_pipeline", "DEMO_PIPELINE_MODES"]

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
