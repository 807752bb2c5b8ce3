"""FSDP2（``torch.distributed.fsdp.fully_shard``）= ZeRO 阶段 3：参数、梯度、优化器状态都按进程切开。

每个块各包一层 ``fully_shard``（前向到这一块时 all-gather 收齐它的参数，用完释放；反向后梯度 reduce-scatter
回各自的分片），最后整个模型再包一层（嵌入、末层归一化、输出层）。数据与 DDP 相同（``DistributedSampler`` 的分片），
所以损失与 DDP、与单进程整批相同；每个进程实际存下的字节与 :func:`~tformer_lib.parallel.zero.zero_bytes_per_rank`
（阶段 3）比较（测试）。
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from .data_parallel import new_model, global_mean_lm_loss, rank_batches

__all__ = ["fsdp_train_worker", "local_bytes"]


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if hasattr(t, "to_local") else t


def local_bytes(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, int]:
    """本进程实际持有的参数、梯度、优化器状态字节数（DTensor 只算本地分片）。"""
    params = list(model.parameters())
    nbytes = lambda t: _local(t).numel() * _local(t).element_size()  # noqa: E731
    optim = sum(nbytes(v) for state in optimizer.state.values() for v in state.values()
                if isinstance(v, torch.Tensor) and v.dim() > 0)  # 不算 0 维的 step 计数
    return {"parameters": sum(nbytes(p) for p in params),
            "gradients": sum(nbytes(p.grad) for p in params if p.grad is not None), "optimizer": optim}


def fsdp_train_worker(rank: int, world_size: int, config_dict: dict, state: dict, blocks: torch.Tensor, steps: int,
                      batch_size: int, lr: float, seed: int = 0) -> dict:
    """每个进程里：``fully_shard`` 每块与整个模型，AdamW 训练 ``steps`` 步。

    损失与数据并行一样取整批意义下的平均（:func:`~tformer_lib.parallel.data_parallel.global_mean_lm_loss`）。
    返回每步损失（整批的平均损失）、拼好的完整参数、本进程的字节数（第一步之后量）与参数个数 N。
    """
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    model = new_model(config_dict, state)
    n_params = sum(p.numel() for p in model.parameters())  # 共享的权重只算一次
    mesh = init_device_mesh("cpu", (world_size,))
    for block in model.blocks:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    batches = rank_batches(len(blocks), batch_size, rank, world_size, seed)
    losses, measured = [], None
    for step in range(steps):
        optimizer.zero_grad(set_to_none=False)
        loss, value = global_mean_lm_loss(model, blocks[batches[step]])  # 按全局目标数加权：PAD 不均也等于整批
        loss.backward()  # FSDP 的 reduce-scatter 对梯度求平均，与 DDP 相同
        optimizer.step()
        if measured is None:
            measured = local_bytes(model, optimizer)
        losses.append(value)
    params = {k: (v.full_tensor() if hasattr(v, "full_tensor") else v).detach().clone() for k, v in model.named_parameters()}
    return {"losses": losses, "params": params, "bytes": measured, "n_params": n_params}
