"""用 Triton 写的 GPU 内核（kernel），在 CPU 上用 Triton 的解释器（``TRITON_INTERPRET=1``）运行与测试（第 15 章）。

五个内核一个接一个地搭起来，每个约 30 行，旁边是它的 PyTorch 参照（reference）：

1. :mod:`.add` 向量加法——程序实例、块、掩码；
2. :mod:`.softmax` 融合的逐行 softmax——一行一个程序实例，减最大值；
3. :mod:`.tiled_matmul` 分块矩阵乘——二维的格、沿 K 的循环、``tl.dot``；
4. :mod:`.flash_forward` FlashAttention 前向——第 8 章的在线 softmax（online softmax）写进一个内核，
   带因果与填充掩码；:mod:`.naive` 用 2、3 拼出把 S、P 写回显存的朴素注意力作对照；
5. :mod:`.decoding` 解码时的分段注意力（split-K，FlashDecoding）。选它而不选反向传播，
   是因为全书的推理主线（第 13 章的 K/V 缓存、第 14 章的解码提速）正缺这一块：解码时每条序列只有一个查询，
   按查询并行的内核只剩 ``B·h`` 个程序实例，沿键切段才能把 GPU 填满；合并各段又恰好是在线 softmax 的修正因子。

IO 的账：:mod:`.io_count` 从内核自己的 ``tl.load``/``tl.store`` 数出显存读写字节，:mod:`.io_bytes`
给出同样的数的闭式公式（纯 Python）。:func:`kernel_error_table`（:mod:`.report`）列出每个内核与 PyTorch 的最大误差。

``import tformer_lib`` 从不导入 triton；本包也只在第一次用到某个内核时才导入它（惰性导入），
所以 :mod:`.io_bytes` 的公式在没装 triton 的机器上也能用。没装 triton 时访问内核会得到 ``ImportError``，
提示安装可选依赖 ``tformer_lib[kernels]``。没有 GPU 且未设 ``TRITON_INTERPRET`` 时，第一次导入内核前
会把它设为 1。
"""

from __future__ import annotations

import importlib

from .io_bytes import (
    attention_io_bytes,
    flash_attention_io_bytes,
    flash_decoding_io_bytes,
    matmul_io_bytes,
    naive_attention_io_bytes,
    softmax_io_bytes,
    vector_add_io_bytes,
)

# 名字 → 定义它的子模块；那些子模块在导入时需要 triton。子模块名故意与函数名不同：
# 子模块导入后会成为本包的同名属性，同名就会把函数遮住。
_LAZY = {
    "vector_add": "add", "vector_add_reference": "add",
    "softmax_rows": "softmax", "softmax_rows_reference": "softmax",
    "matmul": "tiled_matmul", "matmul_reference": "tiled_matmul",
    "flash_attention": "flash_forward", "attention_reference": "flash_forward",
    "naive_attention": "naive",
    "flash_decoding": "decoding", "decoding_reference": "decoding",
    "count_hbm_bytes": "io_count", "HBMTraffic": "io_count",
    "kernel_error_table": "report",
}

__all__ = ["attention_io_bytes", "flash_attention_io_bytes", "flash_decoding_io_bytes", "matmul_io_bytes",
           "naive_attention_io_bytes", "softmax_io_bytes", "vector_add_io_bytes", *_LAZY]


def __getattr__(name: str):
    if name in _LAZY:
        module = importlib.import_module(f".{_LAZY[name]}", __name__)  # 这里才导入 triton
        return getattr(module, name)
    raise AttributeError(f"模块 tformer_lib.kernels 没有属性 {name!r}")


def __dir__():
    return sorted(set(globals()) | set(_LAZY))
