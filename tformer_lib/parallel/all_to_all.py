"""带梯度的 all-to-all：专家并行（把词元送去专家）与 Ulysses（从按序列切换成按头切）共用。

进程 r 把输入的前 ``send[0]`` 行发给进程 0、接着 ``send[1]`` 行发给进程 1……；收到的按来源进程依次排好，
来自进程 q 的有 ``receive[q]`` 行。all-to-all 的转置还是 all-to-all：反向把梯度按原路送回，两组行数对调。
每次调用都经 :func:`~tformer_lib.parallel.comm.record` 记下交出的字节数。
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from .comm import record

__all__ = ["all_to_all", "AllToAll"]


def all_to_all(x: torch.Tensor, send: list[int], receive: list[int]) -> torch.Tensor:
    """不带梯度的 all-to-all（沿第 0 维按行数切）：``x`` ``(Σ send, …)`` → ``(Σ receive, …)``。"""
    if len(send) != dist.get_world_size() or len(receive) != dist.get_world_size():
        raise ValueError(f"send 与 receive 应各有 world_size={dist.get_world_size()} 个行数，收到 {len(send)} 与 {len(receive)}")
    if sum(send) != x.shape[0]:
        raise ValueError(f"send 的行数之和 {sum(send)} 应等于 x 的第 0 维 {x.shape[0]}")
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
