"""内核模块的运行环境：惰性导入 triton、决定是否用解释器（interpreter）、检查张量与块大小。

Triton 在 ``@triton.jit`` 装饰函数的那一刻读环境变量 ``TRITON_INTERPRET``：为 1 时得到一个
“解释执行”的函数（用 NumPy 在 CPU 上逐个程序实例地跑内核），否则得到要编译到 GPU 的函数。
所以这个变量必须在内核模块第一次导入**之前**设好。:func:`load_triton` 在没有 GPU、且用户没设
这个变量时替用户设成 1；设成了别的值又把 CPU 张量交给内核时，:func:`check_tensors` 给出清楚的错误。
"""

from __future__ import annotations

import os

import torch

from .._checks import positive_int

INSTALL_HINT = "pip install 'tformer_lib[kernels]'（或 pip install triton）"
INTERPRET_HINT = (
    "CPU 张量只能在 Triton 的解释器里运行：请在导入 triton 与 tformer_lib.kernels 的内核之前"
    "设置环境变量 TRITON_INTERPRET=1（例如在笔记本第一格写 os.environ['TRITON_INTERPRET'] = '1'）"
)


def load_triton():
    """导入并返回 ``(triton, triton.language)``；没有 GPU 且未设 ``TRITON_INTERPRET`` 时先把它设为 1。

    没装 triton 时抛出 ``ImportError``，告诉用户装哪个可选依赖（extra）。
    """
    if "TRITON_INTERPRET" not in os.environ and not torch.cuda.is_available():
        os.environ["TRITON_INTERPRET"] = "1"  # 没有 GPU：解释器是唯一能跑内核的方式
    try:
        import triton
        import triton.language as tl
    except ImportError as exc:
        raise ImportError(
            f"tformer_lib.kernels 需要 triton，但没有找到它：{INSTALL_HINT}。"
            "库的其余部分不需要 triton。"
        ) from exc
    return triton, tl


def is_interpreted(kernel) -> bool:
    """``kernel`` 是否由解释器执行（装饰时 ``TRITON_INTERPRET=1``）。"""
    from triton.runtime.interpreter import InterpretedFunction

    return isinstance(kernel, InterpretedFunction)


def check_tensors(kernel, *named: tuple[str, torch.Tensor], dtypes=(torch.float32, torch.float16, torch.bfloat16),
                  uses_dot: bool = False):
    """要求几个张量类型正确、dtype 相同且在 ``dtypes`` 之内、在同一设备上；CPU 张量要求解释器。

    ``uses_dot=True``（内核里有 ``tl.dot``）时，解释器里不接受 bfloat16：triton 3.9 的解释器用 NumPy 做
    ``tl.dot``，而 NumPy 没有 bfloat16，乘出来的数是错的（实测误差 1e8 量级）；GPU 上没有这个问题。
    """
    (first, x), *_ = named
    for name, y in named:
        if not isinstance(y, torch.Tensor):
            raise TypeError(f"{name} 应是 torch.Tensor，收到 {type(y).__name__}")
        if y.dtype not in dtypes:
            shown = "、".join(str(d) for d in dtypes)
            raise TypeError(f"{name} 的 dtype 应是 {shown} 之一，收到 {y.dtype}")
        if y.dtype != x.dtype:
            raise TypeError(f"{first} 的 dtype 是 {x.dtype}，{name} 的 dtype 是 {y.dtype}：两者必须相同")
        if y.device != x.device:
            raise ValueError(f"{first} 在 {x.device} 上，{name} 在 {y.device} 上：内核的输入必须在同一设备上")
    if x.device.type == "cpu" and not is_interpreted(kernel):
        raise RuntimeError(f"{INTERPRET_HINT}；当前 TRITON_INTERPRET={os.environ.get('TRITON_INTERPRET')!r}")
    if uses_dot and x.dtype == torch.bfloat16 and is_interpreted(kernel):
        raise TypeError(f"{first} 是 bfloat16：Triton 解释器里的 tl.dot 算不对 bfloat16（NumPy 没有这个类型）；"
                        "在 CPU 上请用 float32 或 float16，bfloat16 请在 GPU 上运行")


def block_size(name: str, value, minimum: int = 1) -> int:
    """块大小（block size）必须是 2 的幂（``tl.arange`` 的要求），且不小于 ``minimum``。

    用到 ``tl.dot`` 的内核要求 ``minimum=16``：GPU 上的矩阵乘单元按 16×16 的小块工作；
    解释器不在乎，但我们让同一份代码在 GPU 上也能编译。
    """
    positive_int(name, value)
    if value & (value - 1):
        raise ValueError(f"{name} 应是 2 的幂（如 16、32、64），收到 {value}")
    if value < minimum:
        raise ValueError(f"{name} 至少为 {minimum}（tl.dot 的最小块），收到 {value}")
    return value


def next_power_of_2(n: int, minimum: int = 1) -> int:
    """不小于 ``n`` 的最小的 2 的幂（至少为 ``minimum``），用作覆盖整行/整个 d 的块宽。"""
    return max(minimum, 1 << (int(n) - 1).bit_length())
