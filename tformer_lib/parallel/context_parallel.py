"""上下文并行（context parallelism，第 16 章）的运行器：在 p 个进程上跑一次环形注意力或 Ulysses，把结果收回来。

:func:`run_context_parallel` 把整条序列的 ``q, k, v`` 与输出的梯度 ``d_out`` 按切法分给各进程，每个进程只算自己那片的
前向与反向，并记下它交给通信原语的每个张量；返回拼回整条序列的输出与梯度、每个进程发出的字节和为反向存下的字节——
笔记本拿它与单进程的注意力、与 :func:`~tformer_lib.parallel.ring_attention.ring_attention_payload` 的公式对照。
"""

from __future__ import annotations

import torch

from .._checks import one_of, positive_int
from .comm import recording
from .launch import launch
from .ring_attention import LAYOUTS, gather_sequence, ring_attention, sequence_positions, split_sequence
from .ulysses import ulysses_attention

__all__ = ["CONTEXT_SCHEMES", "run_context_parallel"]

#: 两种上下文并行
CONTEXT_SCHEMES = ("ring", "ulysses")


def _worker(rank: int, world_size: int, tensors, scheme: str, layout: str, causal: bool) -> dict:
    q, k, v, d_out = tensors
    positions = sequence_positions(q.shape[-2], world_size, layout)
    local = [split_sequence(x, positions)[rank].clone().requires_grad_(True) for x in (q, k, v)]  # 各 (B, h, T/p, d)
    attend = ring_attention if scheme == "ring" else ulysses_attention
    options = {"layout": layout} if scheme == "ring" else {}
    with recording() as forward_log:
        out = attend(*local, causal=causal, **options)  # (B, h, T/p, d)
    saved = sum(t.numel() * t.element_size() for t in out.grad_fn.saved_tensors) if scheme == "ring" else None
    with recording() as backward_log:
        out.backward(split_sequence(d_out, positions)[rank])
    return {"out": out.detach(), "grads": [x.grad for x in local], "saved_bytes": saved,
            "forward_bytes": sum(b for _, b in forward_log), "backward_bytes": sum(b for _, b in backward_log)}


def run_context_parallel(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, d_out: torch.Tensor, *,
                         scheme: str = "ring", layout: str = "zigzag", causal: bool = True, world_size: int = 2,
                         timeout: float = 120.0) -> dict:
    """在 ``world_size`` 个进程上算整条序列 ``q, k, v`` ``(B, h, T, d)`` 的注意力及其对 ``d_out`` 的反向。

    ``scheme``：``"ring"``（环形注意力，按 ``layout`` 切序列）或 ``"ulysses"``（按顺序切；头数须能被进程数整除）。
    返回 ``{"out": (B, h, T, d), "grads": [dq, dk, dv], "forward_bytes": [每进程], "backward_bytes": [每进程],
    "saved_bytes": [每进程]（Ulysses 为 None）}``：输出与梯度按位置拼回整条序列，可以直接与单进程的结果比较。
    """
    one_of("scheme", scheme, CONTEXT_SCHEMES)
    one_of("layout", layout, LAYOUTS)
    positive_int("world_size", world_size)
    if scheme == "ulysses" and layout != "contiguous":
        raise ValueError(f"Ulysses 按顺序切序列：layout 应是 'contiguous'，收到 {layout!r}")
    if not isinstance(causal, bool):
        raise TypeError(f"causal 应是 bool，收到 {causal!r}")
    tensors = (q, k, v, d_out)
    for name, x in zip(("q", "k", "v", "d_out"), tensors):
        if not isinstance(x, torch.Tensor) or x.dim() != 4 or not x.is_floating_point() or x.numel() == 0:
            raise ValueError(f"{name} 应是非空的 4 维浮点张量 (B, h, T, d)，收到 {getattr(x, 'shape', type(x).__name__)}")
    if len({tuple(x.shape) for x in tensors}) != 1:
        raise ValueError(f"q、k、v、d_out 的形状应相同，收到 {[tuple(x.shape) for x in tensors]}")
    if len({x.dtype for x in tensors}) != 1:
        raise ValueError(f"q、k、v、d_out 的 dtype 应相同，收到 {[str(x.dtype) for x in tensors]}")
    if scheme == "ulysses" and q.shape[1] % world_size:
        raise ValueError(f"Ulysses 把 h={q.shape[1]} 个头分给 world_size={world_size} 个进程：h 应能被整除")
    tensors = tuple(x.detach() for x in tensors)  # 只送数值：各进程自己建叶子张量求梯度
    sequence_positions(q.shape[-2], world_size, layout)  # 现在就检查 T 能否按这种切法分给 world_size 个进程
    outs = launch(_worker, world_size, (tensors, scheme, layout, causal), timeout=timeout)
    positions = sequence_positions(q.shape[-2], world_size, layout)
    return {"out": gather_sequence([o["out"] for o in outs], positions),
            "grads": [gather_sequence([o["grads"][i] for o in outs], positions) for i in range(3)],
            "forward_bytes": [o["forward_bytes"] for o in outs], "backward_bytes": [o["backward_bytes"] for o in outs],
            "saved_bytes": [o["saved_bytes"] for o in outs]}
