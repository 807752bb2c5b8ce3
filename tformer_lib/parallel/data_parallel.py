"""数据并行（data parallelism）：每个进程一份完整的模型，各算一部分批次，反向后把梯度取平均。

三种写法，测试证明它们 k 步后的损失与参数一致：

1. 单进程、整批（参照）；
2. 手写：``loss.backward()`` 之后对每个梯度 ``dist.all_reduce(SUM)`` 再除以进程数 p（:func:`allreduce_gradients`）；
3. PyTorch 的 ``DistributedDataParallel``（DDP）：同样的平均，但把梯度分桶（bucket），在反向传播进行中就开始通信。

为什么平均梯度就等于整批：整批的损失是所有 N 个非 PAD 目标的平均 L = (1/N)Σ_i ℓ_i。rank r 持有其中 N_r 个。
若每个进程各自求平均（除以 N_r）再平均梯度，得到的是“平均的平均”(1/p)Σ_r (1/N_r)Σ_{i∈r} ℓ_i——PAD 不均匀
（N_r 不同）时它 ≠ L。所以每个进程先 all-reduce 出全局目标数 N（两个数：损失总和与目标数，16 字节），
反向用 ℓ^(r) = (p/N)Σ_{i∈r} ℓ_i（:func:`global_mean_lm_loss`）；梯度平均之后
(1/p)Σ_r ∇ℓ^(r) = (1/N)Σ_i ∇ℓ_i = ∇L，与单进程整批是同一个量，任何 PAD 分布下都成立（测试用不均匀的 PAD）。
手写 all-reduce 与 DDP 都用它（DDP 也是求平均）；与 :class:`~tformer_lib.parallel.DistributedLMTrainer` 同一个做法。

容差（torch 2.13、CPU/gloo、2 个进程，小 LM、AdamW lr 1e-2、4 步、PAD 不均匀）：与单进程整批的损失相对差
≤ 1e-5（实测 6e-8），参数 ≤ 5e-5（实测 1.7e-5，全在 W^K 的偏置上——真实梯度恒为 0，舍入噪声被 Adam 的归一化
放大；其余参数 ≤ 1.3e-6）。

每个进程取哪些样本由 ``DistributedSampler`` 决定（:func:`rank_batches`）：每个 epoch 按种子打乱一次，
rank r 拿走第 r, r+p, r+2p, … 个；只有 rank 0 打印与保存检查点（:func:`~tformer_lib.parallel.launch.is_rank0`）。
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data.distributed import DistributedSampler

from .._checks import finite_positive, non_negative_int, positive_int, tensor_with_dim
from ..lm.data import loss_targets
from ..specials import PAD
from .comm import record
from .launch import launch

__all__ = ["allreduce_gradients", "rank_batches", "global_batches", "global_mean_lm_loss", "train_lm_worker",
           "train_data_parallel", "train_single_process", "DP_MODES"]

#: 数据并行的写法："manual" = 手写梯度 all-reduce，"ddp" = DistributedDataParallel
DP_MODES = ("manual", "ddp")


def allreduce_gradients(model: nn.Module) -> int:
    """把每个参数的梯度在所有进程间求平均（手写的数据并行），返回本进程交给 all-reduce 的字节数。"""
    world_size = dist.get_world_size()
    sent = 0
    for p in model.parameters():
        if p.grad is None:
            continue
        record("all_reduce", p.grad)
        dist.all_reduce(p.grad, op=dist.ReduceOp.SUM)  # 每个进程都得到 Σ_r grad_r
        p.grad /= world_size  # 求和 → 平均
        sent += p.grad.numel() * p.grad.element_size()
    return sent


def rank_batches(n_samples: int, batch_size: int, rank: int, world_size: int, seed: int = 0, epoch: int = 0) -> list[torch.Tensor]:
    """``DistributedSampler`` 给 rank 的每一步样本下标：全局批 ``batch_size``，每个进程 ``batch_size // world_size`` 个。"""
    positive_int("n_samples", n_samples)
    positive_int("batch_size", batch_size)
    positive_int("world_size", world_size)
    rank = non_negative_int("rank", rank)
    if rank >= world_size:
        raise ValueError(f"rank 应是 0 到 world_size-1={world_size - 1} 之间的整数，收到 {rank!r}")
    if batch_size % world_size != 0:
        raise ValueError(f"batch_size={batch_size} 不能被进程数 world_size={world_size} 整除")
    sampler = DistributedSampler(range(n_samples), num_replicas=world_size, rank=rank, shuffle=True, seed=seed,
                                 drop_last=True)
    sampler.set_epoch(epoch)
    indices = torch.tensor(list(iter(sampler)))
    per_rank = batch_size // world_size
    return list(indices[: len(indices) // per_rank * per_rank].split(per_rank))


def global_batches(n_samples: int, batch_size: int, world_size: int, seed: int = 0, epoch: int = 0) -> list[torch.Tensor]:
    """与 :func:`rank_batches` 同一批数据的单进程版本：第 s 步 = 各 rank 第 s 步下标拼起来。"""
    per_rank = [rank_batches(n_samples, batch_size, r, world_size, seed, epoch) for r in range(world_size)]
    return [torch.cat(parts) for parts in zip(*per_rank)]


def lm_loss(model, block: torch.Tensor) -> torch.Tensor:
    """本进程自己的平均损失（只对本进程的目标求平均；PAD 不均匀时不是整批的平均，见 :func:`global_mean_lm_loss`）。
    目标与第 9 章相同（:func:`~tformer_lib.lm.data.loss_targets`）：PAD 与 BOS 不计。"""
    _token_blocks("block", block, "(b, L+1)")
    inputs, targets = loss_targets(block.long())  # (b, L), (b, L)：BOS 目标已记作 PAD
    logits = model(inputs)  # (b, L, V)
    total = F.cross_entropy(logits.flatten(0, 1), targets.flatten(), ignore_index=PAD, reduction="sum")  # (b·L, V)
    return total / max(1, int((targets != PAD).sum()))  # 全是 PAD 的块：0（与 global_mean_lm_loss 相同），不是 0/0


def global_mean_lm_loss(model, block: torch.Tensor) -> tuple[torch.Tensor, float]:
    """数据并行里整批意义下的损失：返回 ``(loss, value)``。

    ``loss`` 交给 ``backward``：本进程的损失总和 × p / 全局非 PAD 目标数 N（各进程梯度再求平均，就是
    Σ_r 总和_r / N 的梯度——与一个进程算整批相同，PAD 不均匀也一样）。``value`` 是整批的平均损失
    Σ_r 总和_r / N（各进程相同，用于日志）。为此每步多一次只有两个数的 all-reduce（float64：目标数精确）。
    没有进程组时 p = 1，就是普通的“总和 / 目标数”。``block`` 是 ``(b, L+1)`` 的词元块（输入与目标错开一位）；
    目标与第 9 章的训练相同（:func:`~tformer_lib.lm.data.loss_targets`）：PAD 与 BOS 都不计，N 也不数它们。
    """
    _token_blocks("block", block, "(b, L+1)")
    if block.shape[1] < 2:
        raise ValueError(f"block 每行至少要 2 个词元（输入与目标错开一位），收到形状 {tuple(block.shape)}")
    inputs, targets = loss_targets(block.long())  # (b, L), (b, L)：BOS 目标已记作 PAD；int32 的块也行
    logits = model(inputs)  # (b, L, V)
    total = F.cross_entropy(logits.flatten(0, 1), targets.flatten(), ignore_index=PAD, reduction="sum")  # 展平为 (b·L, V)
    stats = torch.tensor([float(total.detach()), float((targets != PAD).sum())], dtype=torch.float64,
                         device=targets.device)
    world_size = 1
    if dist.is_initialized() and dist.get_world_size() > 1:
        world_size = dist.get_world_size()
        dist.all_reduce(stats)  # [Σ_r 总和_r, N]
    n_targets = max(1.0, float(stats[1]))
    return total * (world_size / n_targets), float(stats[0]) / n_targets


def new_model(config_dict: dict, state: dict):
    from ..lm import LMConfig, make_lm

    model = make_lm(LMConfig.from_dict(config_dict))
    model.load_state_dict(state)
    return model


def _token_blocks(name: str, blocks, layout: str) -> None:
    tensor_with_dim(name, blocks, 2, layout)
    if blocks.dtype.is_floating_point or blocks.dtype == torch.bool or blocks.is_complex():
        raise TypeError(f"{name} 应是整数类型的词元 id {layout}，收到 dtype {blocks.dtype}")


def check_run(blocks, steps: int, batch_size: int, lr: float, world_size: int) -> None:
    """各种并行训练入口共用的参数检查：词元块、步数、能被进程数整除的全局批、学习率，步数不超过一个 epoch。"""
    _token_blocks("blocks", blocks, "(n_blocks, L+1)")
    positive_int("steps", steps)
    positive_int("batch_size", batch_size)
    finite_positive("lr", lr)
    positive_int("world_size", world_size)
    if batch_size % world_size != 0:
        raise ValueError(f"batch_size={batch_size} 不能被进程数 world_size={world_size} 整除")
    available = len(blocks) // batch_size
    if steps > available:
        raise ValueError(f"steps={steps} 超过了一个 epoch 的步数 {available}（blocks 有 {len(blocks)} 块、"
                         f"batch_size={batch_size}）：减少 steps 或多给一些块")


def _train(model, optimizer, batches, blocks, steps, sync=None) -> list[float]:
    losses = []
    for step in range(steps):
        optimizer.zero_grad(set_to_none=True)
        loss, value = global_mean_lm_loss(model, blocks[batches[step]])  # value：整批的损失，各进程相同
        loss.backward()
        if sync is not None:
            sync()
        optimizer.step()
        losses.append(value)
    return losses


def train_lm_worker(rank: int, world_size: int, modes, config_dict: dict, state: dict, blocks: torch.Tensor,
                    steps: int, batch_size: int, lr: float, seed: int = 0) -> dict:
    """每个进程里跑的函数：对 ``modes`` 中每种写法，从同一初始参数训 ``steps`` 步。

    返回 ``{mode: {"losses": [...], "params": {name: tensor}, "bytes_per_step": int, "buckets": ...}}``（每个 rank
    一份）。``bytes_per_step`` 是每步交给梯度 all-reduce 的字节：手写路径是实际交出的张量之和；DDP 是它每个桶的字节数
    之和（``buckets``，读自 DDP 的日志；手写路径为 ``None``）。另有一次 16 字节的 all-reduce 统计全局目标数，不计在内。
    """
    out = {}
    batches = rank_batches(len(blocks), batch_size, rank, world_size, seed)
    for mode in modes:
        model = new_model(config_dict, state)
        sent = {"bytes": 0}
        if mode == "manual":
            optimizer = torch.optim.AdamW(model.parameters(), lr=lr)

            def sync():
                sent["bytes"] = allreduce_gradients(model)

            losses = _train(model, optimizer, batches, blocks, steps, sync)
        elif mode == "ddp":
            ddp = DistributedDataParallel(model)  # CPU：不给 device_ids
            optimizer = torch.optim.AdamW(ddp.parameters(), lr=lr)
            losses = _train(ddp, optimizer, batches, blocks, steps)
            # DDP 在 C++ 里按桶（bucket）all-reduce，Python 看不到那些张量；它的日志记着每个桶的字节数
            info = ddp._get_ddp_logging_data()
            sent["buckets"] = [int(b) for b in str(info.get("bucket_sizes", "")).split(",") if b.strip()]
            sent["bytes"] = sum(sent["buckets"])
        else:
            raise ValueError(f"mode 应是 {DP_MODES} 之一，收到 {mode!r}")
        out[mode] = {"losses": losses, "params": {k: v.detach().clone() for k, v in model.named_parameters()},
                     "bytes_per_step": sent["bytes"], "buckets": sent.get("buckets")}
    return out


def train_single_process(model, blocks: torch.Tensor, steps: int, batch_size: int, lr: float, world_size: int = 2,
                         seed: int = 0) -> dict:
    """参照：一个进程、整批，数据与 ``world_size`` 个进程的数据并行逐步相同。``model`` 不被修改。"""
    check_run(blocks, steps, batch_size, lr, world_size)
    model = new_model(model.config.to_dict(), model.state_dict())
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    losses = _train(model, optimizer, global_batches(len(blocks), batch_size, world_size, seed), blocks, steps)
    return {"losses": losses, "params": {k: v.detach().clone() for k, v in model.named_parameters()}}


def train_data_parallel(model, blocks: torch.Tensor, steps: int, batch_size: int, lr: float, *, world_size: int = 2,
                        modes=DP_MODES, seed: int = 0, timeout: float = 120.0) -> dict:
    """起 ``world_size`` 个进程做数据并行训练（每种 ``modes`` 各一遍），返回 rank 0 的结果（见 :func:`train_lm_worker`）。"""
    if isinstance(modes, str):
        raise TypeError(f"modes 应是写法名的序列，如 ('manual',)，收到字符串 {modes!r}")
    for mode in modes:
        if mode not in DP_MODES:
            raise ValueError(f"modes 里的 {mode!r} 不是 {DP_MODES} 之一")
    check_run(blocks, steps, batch_size, lr, world_size)
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    results = launch(train_lm_worker, world_size,
                     (tuple(modes), model.config.to_dict(), state, blocks, steps, batch_size, lr, seed), timeout=timeout)
    return results[0]
