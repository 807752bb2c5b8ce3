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

from .._checks import flag, one_of, positive_int

__all__ = ["recording", "record", "RECORD_OPS", "ring_all_reduce_bytes", "data_parallel_payload", "tensor_parallel_payload",
           "pipeline_payload", "recording_torch_collectives", "recording_fsdp_collectives"]

_active: list | None = None
#: :func:`record` 认得的通信原语：手写方案的 all-reduce / send，以及 PyTorch 张量并行（DTensor）自己发起的几种集合通信
RECORD_OPS = ("all_reduce", "send", "all_gather_into_tensor", "reduce_scatter_tensor", "all_to_all_single", "broadcast")


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
    world_size = positive_int("world_size", world_size)
    if (isinstance(payload_bytes, bool) or not isinstance(payload_bytes, numbers.Real)
            or not math.isfinite(payload_bytes) or payload_bytes < 0):
        raise ValueError(f"payload_bytes 应是 ≥ 0 的有限字节数，收到 {payload_bytes!r}")
    return 2 * (world_size - 1) / world_size * payload_bytes


def data_parallel_payload(n_params: int, element_bytes: int = 4) -> int:
    """数据并行每步 all-reduce 的载荷：全部梯度。"""
    return positive_int("n_params", n_params) * positive_int("element_bytes", element_bytes)


def tensor_parallel_payload(batch: int, length: int, d_model: int, n_blocks: int = 1, element_bytes: int = 4,
                            input_requires_grad: bool = True) -> int:
    """Megatron 张量并行每个训练步的 all-reduce 载荷：每块前向 2 次 + 反向 2 次，每次 (B, T, d_model)。

    第一块的输入不需要梯度时（直接喂数据、前面没有嵌入层），它入口 f 算子的反向 all-reduce 不会发生：少一次。
    """
    batch, length, d_model = positive_int("batch", batch), positive_int("length", length), positive_int("d_model", d_model)
    n_blocks, element_bytes = positive_int("n_blocks", n_blocks), positive_int("element_bytes", element_bytes)
    count = 4 * n_blocks - (0 if flag("input_requires_grad", input_requires_grad) else 1)
    return count * batch * length * d_model * element_bytes


def pipeline_payload(batch: int, length: int, d_model: int, stages: int = 2, element_bytes: int = 4) -> int:
    """流水线每个训练步经 send 搬运的字节：每个段边界激活一次、梯度一次（所有微批合计 = 整批）。"""
    batch, length, d_model = positive_int("batch", batch), positive_int("length", length), positive_int("d_model", d_model)
    stages, element_bytes = positive_int("stages", stages), positive_int("element_bytes", element_bytes)
    return 2 * (stages - 1) * batch * length * d_model * element_bytes


# ---- PyTorch 自己发起的通信：在分发层（TorchDispatchMode）记下 ----
_COLLECTIVES = ("all_reduce", "all_gather_into_tensor", "reduce_scatter_tensor", "all_to_all_single", "broadcast")


@contextmanager
def recording_torch_collectives():
    """把 PyTorch 自己（DTensor 重分布时）发起的集合通信也记进 :func:`~tformer_lib.parallel.comm.recording`。

    DTensor 把 ``Partial → Replicate`` 之类的重分布翻译成 ``torch.ops._c10d_functional.all_reduce`` 等函数式
    集合通信；这里用一个 ``TorchDispatchMode`` 在它们执行时记下交出的本地张量（与手写方案调 ``record`` 的
    位置相同：交给通信原语的有效载荷）。反向传播也在同一线程里执行，一并记下。测试证明：注意力与 FFN 都交给
    PyTorch 时，每步恰好 4 次 ``(B, T, d_model)`` 的 all-reduce（输入不需要梯度时 3 次）——与手写 Megatron 的
    公式相同，SwiGLU 也一样。
    """
    from torch.distributed.tensor import DTensor
    from torch.utils._python_dispatch import TorchDispatchMode

    class _Recorder(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if any(issubclass(t, DTensor) for t in types):
                return NotImplemented  # 先让 DTensor 拆成本地运算与集合通信，再经过这里
            packet = str(getattr(func, "_overloadpacket", ""))
            if packet.startswith("_c10d_functional.") and packet.split(".")[-1] in _COLLECTIVES:
                record(packet.split(".")[-1], args[0])
            return func(*args, **(kwargs or {}))

    with _Recorder():
        yield


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
