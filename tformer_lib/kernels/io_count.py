"""数内核自己读写了多少字节：给 Triton 解释器的 ``tl.load``/``tl.store`` 装上计数器。

在解释器里，内核里的每个 ``tl.load(ptrs, mask=…)`` 最后都落到解释器的
``create_masked_load(ptrs, mask, …)``，``tl.store`` 落到 ``create_masked_store``（不带掩码的读写也先
补一个全真的掩码再走这两条路）。:func:`count_hbm_bytes` 在 ``with`` 块内临时包住这两个函数：每次调用
把“掩码为真的元素个数 × 元素字节数”记进读或写的总数——被掩码挡住的元素不访问内存，不算。
这样数出来的就是内核真实发出的显存（HBM）流量，可与 :mod:`.io_bytes` 的闭式公式逐字节对照。

只在解释器里可用（GPU 上要用 Nsight Compute 之类的硬件计数器）；依赖 Triton 解释器的内部函数名，
在 triton 3.x 上验证过。
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field

import numpy as np

from ._runtime import INTERPRET_HINT, load_triton

__all__ = ["HBMTraffic", "count_hbm_bytes"]


@dataclass
class HBMTraffic:
    """``with`` 块内所有内核读（``read``）与写（``write``）的字节数，以及读写指令各执行了几次。"""

    read: int = 0
    write: int = 0
    loads: int = 0
    stores: int = 0
    by_dtype: dict = field(default_factory=dict)  # 元素类型名 → 读写字节合计

    @property
    def total(self) -> int:
        return self.read + self.write

    def _add(self, kind: str, n_bytes: int, dtype_name: str) -> None:
        if kind == "read":
            self.read += n_bytes
            self.loads += 1
        else:
            self.write += n_bytes
            self.stores += 1
        self.by_dtype[dtype_name] = self.by_dtype.get(dtype_name, 0) + n_bytes


def _element_bytes(handle) -> tuple[int, str]:
    """指针张量 ``handle`` 指向的元素类型的字节数与名字。"""
    element = handle.get_element_ty()
    return element.primitive_bitwidth // 8, str(element)


@contextlib.contextmanager
def count_hbm_bytes():
    """``with count_hbm_bytes() as traffic:`` 块内启动的内核的显存读写字节数记在 ``traffic`` 里。

    要求解释器（``TRITON_INTERPRET=1``）：否则内核编译到 GPU 上运行，这里看不见它的访存。
    """
    load_triton()
    from triton import knobs
    from triton.runtime import interpreter

    if not knobs.runtime.interpret:
        raise RuntimeError(f"count_hbm_bytes 只能数解释器里的读写。{INTERPRET_HINT}")
    builder = interpreter.interpreter_builder
    original_load, original_store = builder.create_masked_load, builder.create_masked_store
    traffic = HBMTraffic()

    def counted_load(ptrs, mask, other, cache_policy, is_volatile):
        n_bytes, name = _element_bytes(ptrs)
        traffic._add("read", int(np.count_nonzero(mask.data)) * n_bytes, name)  # 只数掩码为真的元素
        return original_load(ptrs, mask, other, cache_policy, is_volatile)

    def counted_store(ptrs, value, mask, cache_policy):
        n_bytes, name = _element_bytes(ptrs)
        traffic._add("write", int(np.count_nonzero(mask.data)) * n_bytes, name)
        return original_store(ptrs, value, mask, cache_policy)

    builder.create_masked_load, builder.create_masked_store = counted_load, counted_store  # 实例属性盖住类方法
    try:
        yield traffic
    finally:
        del builder.create_masked_load, builder.create_masked_store  # 恢复成类上的原方法
