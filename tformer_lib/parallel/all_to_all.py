"""带梯度的 all-to-all：专家并行（把词元送去专家）与 Ulysses（从按序列切换成按头切）共用。

进程 r 把输入的前 ``send[0]`` 行发给进程 0、接着 ``send[1]`` 行发给进程 1……；收到的按来源进程依次排好，
来自进程 q 的有 ``receive[q]`` 行。all-to-all 的转置还是 all-to-all：反向把梯度按原路送回，两组行数对调。
每次调用都经 :func:`~tformer_lib.parallel.comm.record` 记下交出的字节数。
"""

from __future__ import annotations

import numbers

import torch
import torch.distributed as dist

from .comm import record

__all__ = ["all_to_all", "AllToAll"]


def _row_counts(name: str, counts, world_size: int) -> list[int]:
    if (isinstance(counts, (str, bytes, torch.Tensor)) or not hasattr(counts, "__len__") or len(counts) != world_size
            or any(isinstance(c, bool) or not isinstance(c, numbers.Integral) or c < 0 for c in counts)):
        raise ValueError(f"{name} 应是 world_size={world_size} 个 ≥ 0 的整数（各进程的行数）的列表，收到 {counts!r}")
    return [int(c) for c in counts]


def all_to_all(x: torch.Tensor, send: list[int], receive: list[int]) -> torch.Tensor:
    """不带梯度的 all-to-all（沿第 0 维按行数切）：``x`` ``(Σ send, …)`` → ``(Σ receive, …)``。

    先用一次很小的 all-to-all 核对：每个进程说要收的行数，正是对方要发的行数（否则收到的张量里会有没写过的行）。
    """
    world_size = dist.get_world_size()
    send, receive = _row_counts("send", send, world_size), _row_counts("receive", receive, world_size)
    if not isinstance(x, torch.Tensor) or x.dim() < 1 or sum(send) != x.shape[0]:
        raise ValueError(f"send 的行数之和 {sum(send)} 应等于 x 的第 0 维，收到形状 {tuple(getattr(x, 'shape', ()))}")
    promised = torch.empty(world_size, dtype=torch.int64, device=x.device)
    dist.all_to_all_single(promised, torch.tensor(send, dtype=torch.int64, device=x.device))  # 各进程要发给我的行数
    if promised.tolist() != receive:
        raise ValueError(f"receive={receive} 与各进程实际要发来的行数 {promised.tolist()} 不符（rank {dist.get_rank()}）")
    record("all_to_all_single", x)
    out = x.new_empty((sum(receive), *x.shape[1:]))
    dist.all_to_all_single(out, x.contiguous(), output_split_sizes=receive, input_split_sizes=send)
    return out


class AllToAll(torch.autograd.Function):
    """``AllToAll.apply(x, send, receive)``：:func:`all_to_all`，反向把梯度按原路送回。"""

    @staticmethod
    def forward(ctx, x, send, receive):
        ctx.send, ctx.receive = send, receive
        return all_to_all(x, send, receive)  # (Σ receive, …)

    @staticmethod
    def backward(ctx, grad):
        return all_to_all(grad, ctx.receive, ctx.send), None, None  # (Σ send, …)
