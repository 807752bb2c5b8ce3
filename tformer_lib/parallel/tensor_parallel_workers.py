"""张量并行的训练与核对（test harness）：每个进程把同一个块切开、训练几步，再与不切的块逐步比较。

教学代码（切法本身：f/g 算子、列切与行切、:class:`~tformer_lib.parallel.tensor_parallel.TensorParallelFFN` 与
:class:`~tformer_lib.parallel.tensor_parallel.TensorParallelAttention`、PyTorch 的 ``parallelize_module`` 写法）在
:mod:`tformer_lib.parallel.tensor_parallel`；这里只有跑它们的进程函数与参照：

- :func:`tp_train_worker` / :func:`tp_grad_worker`：交给 :func:`~tformer_lib.parallel.launch.launch` 或
  :class:`~tformer_lib.parallel.launch.WorkerPool` 的每进程函数（``mode`` 见 :data:`TP_MODES`）；
- :func:`train_single_block`：一个进程、不切的参照；:func:`gather_manual_params`：把手写路径各进程的分片拼回完整参数；
- :func:`private_copy`：``spawn`` 传来的张量在进程间共享内存，worker 先复制一份再训练（见 ``tensor_parallel`` 的说明）。
"""

from __future__ import annotations

from contextlib import nullcontext

import torch
import torch.nn.functional as F
from torch import nn

from .._checks import finite_positive, positive_int
from .comm import recording, recording_torch_collectives
from .tensor_parallel import (
    TP_MODES,
    ResidualBlock,
    TensorParallelAttention,
    TensorParallelFFN,
    torch_parallelize_attention,
    torch_parallelize_ffn,
)

__all__ = ["private_copy", "tp_train_worker", "tp_grad_worker", "train_single_block", "gather_manual_params"]


def private_copy(module: nn.Module) -> nn.Module:
    """worker 收到的模块的私有副本：``spawn`` 传来的张量在进程间共享内存，原地训练它会改到别的进程的参数。"""
    import copy

    return copy.deepcopy(module)


def _split_block(block: ResidualBlock, mode: str, rank: int, world_size: int) -> ResidualBlock:
    block = private_copy(block)
    if mode == "manual":
        return ResidualBlock(TensorParallelAttention(block.attn, rank, world_size),
                             TensorParallelFFN(block.ffn, rank, world_size))
    if mode == "torch":
        return ResidualBlock(block.attn, torch_parallelize_ffn(block.ffn, world_size))
    if mode == "torch_block":
        return ResidualBlock(torch_parallelize_attention(block.attn, world_size),
                             torch_parallelize_ffn(block.ffn, world_size))
    raise ValueError(f"mode 应是 {TP_MODES} 之一，收到 {mode!r}")


def _full(param) -> torch.Tensor:
    return (param.full_tensor() if hasattr(param, "full_tensor") else param).detach().clone()


def tp_train_worker(rank: int, world_size: int, mode: str, block: ResidualBlock, x: torch.Tensor,
                    target: torch.Tensor, mask, steps: int, lr: float) -> dict:
    """每个进程里：把 ``block`` 的私有副本切开（``mode`` 见 :data:`TP_MODES`），用同一批数据、均方误差、SGD 训练
    ``steps`` 步。返回损失、本进程持有的参数（PyTorch 路径是拼好的完整参数；手写路径是本进程的分片）与每步交给
    all-reduce 的字节数 ``bytes_per_step``（手写路径由 f/g 算子记下，PyTorch 路径由 :func:`recording_torch_collectives`）。

    用 SGD 而不是 AdamW：W^K 的偏置的真实梯度恒为 0（softmax 对每个键加同一个 q·b_k 不变），两条路径只剩 1e-9
    量级的舍入噪声，AdamW 的归一化会把噪声放大成 ±lr 的更新，比较就失去意义。

    容差（torch 2.13 CPU/gloo，d_model 16、4 头、SGD lr 0.1、6 步）：三种写法与不切的块损失相对差 ≤ 1e-6、
    参数差 ≤ 1e-6，实测约 3e-8（求和顺序不同的 float32 舍入）。"""
    model = _split_block(block, mode, rank, world_size)
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    losses = []
    torch_sent = recording_torch_collectives() if mode != "manual" else nullcontext()
    with recording() as sent, torch_sent:  # 手写路径自己调 record；PyTorch 路径由 dispatch mode 记下
        for _ in range(steps):
            optimizer.zero_grad(set_to_none=True)
            loss = F.mse_loss(model(x, mask), target)
            loss.backward()
            optimizer.step()
            losses.append(float(loss.detach()))
    return {"losses": losses, "params": {k: _full(v) for k, v in model.named_parameters()},
            "bytes_per_step": sum(n for _, n in sent) / steps}


def tp_grad_worker(rank: int, world_size: int, mode: str, block: ResidualBlock, x: torch.Tensor,
                   target: torch.Tensor, mask) -> dict:
    """每个进程里：切开的块做一次前向、反向，返回输出、损失与拼好的完整梯度（``"manual"`` 时是本进程的分片）。"""
    model = _split_block(block, mode, rank, world_size)
    out = model(x, mask)  # (B, T, d_model)
    loss = F.mse_loss(out, target)
    loss.backward()
    weights = getattr(model.attn, "attn_weights", None)  # PyTorch 路径：DTensor，本地只有本进程的 h/p 个头
    return {"out": _full(out), "loss": float(loss.detach()), "grads": {k: _full(v.grad) for k, v in model.named_parameters()},
            "local_weights_shape": tuple(weights.to_local().shape) if hasattr(weights, "to_local") else None}


def train_single_block(block: ResidualBlock, x, target, mask, steps: int, lr: float) -> dict:
    """参照：不切的块、同样的数据与优化器。``block`` 不被修改。"""
    if not isinstance(block, ResidualBlock):
        raise TypeError(f"block 应是 ResidualBlock，收到 {type(block).__name__}")
    positive_int("steps", steps)
    finite_positive("lr", lr)
    model = private_copy(block)
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    losses = []
    for _ in range(steps):
        optimizer.zero_grad(set_to_none=True)
        loss = F.mse_loss(model(x, mask), target)
        loss.backward()
        optimizer.step()
        losses.append(float(loss.detach()))
    return {"losses": losses, "params": {k: v.detach().clone() for k, v in model.named_parameters()}}


def gather_manual_params(per_rank: list[dict]) -> dict:
    """把手写张量并行各进程的参数拼回不切模块的名字与形状（列切按行拼、行切按列拼，偏置取一份）。"""
    p0 = per_rank[0]
    out = {}
    for prefix, column, row, row_bias in (("attn", ("w_q", "w_k", "w_v"), "w_o", "b_o"),
                                          ("ffn", ("w_1", "w_3"), "w_2", "b_2")):
        for name in column:
            if f"{prefix}.{name}.weight" not in p0:
                continue
            for kind in ("weight", "bias"):
                out[f"{prefix}.{name}.{kind}"] = torch.cat([r[f"{prefix}.{name}.{kind}"] for r in per_rank], dim=0)
        out[f"{prefix}.{row}.weight"] = torch.cat([r[f"{prefix}.{row}.weight"] for r in per_rank], dim=1)
        out[f"{prefix}.{row}.bias"] = p0[f"{prefix}.{row_bias}"]
    return out
