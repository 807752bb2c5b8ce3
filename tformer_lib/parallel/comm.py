"""通信量（communication volume）：每种并行方案每步要搬多少字节——由手写方案实际交给通信原语的张量记下来
（:func:`recording`），与公式并排比较。

记录的是“交给 all-reduce / send 的有效载荷”；环形 all-reduce（ring all-reduce）里每个进程实际发出
2(p−1)/p 倍的载荷（先 reduce-scatter 再 all-gather，各 p−1 轮、每轮 1/p）：:func:`ring_all_reduce_bytes`。

- 数据并行：每步 all-reduce 全部梯度，载荷 = 4N 字节（float32）；
- 张量并行（Megatron）：每块前向 2 次 all-reduce（注意力、FFN 的输出各一次）、反向 2 次（入口 f 算子），
  每次载荷 B·T·d_model·4 字节，与参数量无关、与批大小成正比；
- 流水线并行：每个段边界前向发一次激活、反向发回一次梯度，整批合计各 B·T·d_model·4 字节。
"""

from __future__ import annotations

import math
import numbers
from contextlib import contextmanager

import torch

from .._checks import flag, one_of

__all__ = ["recording", "record", "RECORD_OPS", "ring_all_reduce_bytes", "data_parallel_payload", "tensor_parallel_payload",
           "pipeline_payload"]

_active: list | None = None
#: :func:`record` 认得的通信原语：手写方案的 all-reduce / send，以及 PyTorch 张量并行（DTensor）自己发起的几种集合通信
RECORD_OPS = ("all_reduce", "send", "all_gather_into_tensor", "reduce_scatter_tensor", "all_to_all_single", "broadcast")


def _count(name: str, value, minimum: int = 1) -> int:
    """整数（含 NumPy 整数，不含 bool）且 ≥ ``minimum``：字符串 "10" 乘 4 会得到 "10101010"，负数会得到负字节。"""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} 应是整数，收到 {type(value).__name__} {value!r}")
    if value < minimum:
        raise ValueError(f"{name} 应是 ≥ {minimum} 的整数，收到 {value!r}")
    return int(value)


@contextmanager
def recording():
    """在这段代码里记录手写方案交给通信原语的每个张量：得到 ``[(op, 字节数), …]``。"""
    global _active
    previous, _active = _active, []
    try:
        yield _active
    finally:
        _active = previous


def record(op: str, tensor: torch.Tensor) -> None:
    """手写方案在每次 all-reduce / send 前调用（``op`` 是 :data:`RECORD_OPS` 之一）；不在 :func:`recording` 里时
    只检查参数、不记。"""
    one_of("op", op, RECORD_OPS)
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"tensor 应是交给 {op} 的 torch.Tensor，收到 {type(tensor).__name__}")
    if _active is not None:
        _active.append((op, tensor.numel() * tensor.element_size()))


def ring_all_reduce_bytes(payload_bytes: float, world_size: int) -> float:
    """环形 all-reduce 里每个进程发出的字节数：2(p−1)/p · 载荷。"""
    if isinstance(world_size, bool) or not isinstance(world_size, numbers.Integral) or world_size < 1:
        raise ValueError(f"world_size 应是正整数，收到 {world_size!r}")
    if (isinstance(payload_bytes, bool) or not isinstance(payload_bytes, numbers.Real)
            or not math.isfinite(payload_bytes) or payload_bytes < 0):
        raise ValueError(f"payload_bytes 应是 ≥ 0 的有限字节数，收到 {payload_bytes!r}")
    return 2 * (int(world_size) - 1) / int(world_size) * payload_bytes


def data_parallel_payload(n_params: int, element_bytes: int = 4) -> int:
    """数据并行每步 all-reduce 的载荷：全部梯度。"""
    return _count("n_params", n_params) * _count("element_bytes", element_bytes)


def tensor_parallel_payload(batch: int, length: int, d_model: int, n_blocks: int = 1, element_bytes: int = 4,
                            input_requires_grad: bool = True) -> int:
    """Megatron 张量并行每个训练步的 all-reduce 载荷：每块前向 2 次 + 反向 2 次，每次 (B, T, d_model)。

    第一块的输入不需要梯度时（直接喂数据、前面没有嵌入层），它入口 f 算子的反向 all-reduce 不会发生：少一次。
    """
    batch, length, d_model = _count("batch", batch), _count("length", length), _count("d_model", d_model)
    n_blocks, element_bytes = _count("n_blocks", n_blocks), _count("element_bytes", element_bytes)
    count = 4 * n_blocks - (0 if flag("input_requires_grad", input_requires_grad) else 1)
    return count * batch * length * d_model * element_bytes


def pipeline_payload(batch: int, length: int, d_model: int, stages: int = 2, element_bytes: int = 4) -> int:
    """流水线每个训练步经 send 搬运的字节：每个段边界激活一次、梯度一次（所有微批合计 = 整批）。"""
    batch, length, d_model = _count("batch", batch), _count("length", length), _count("d_model", d_model)
    stages, element_bytes = _count("stages", stages), _count("element_bytes", element_bytes)
    return 2 * (stages - 1) * batch * length * d_model * element_bytes
