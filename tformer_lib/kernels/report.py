"""误差表（kernel error table）：每个内核在固定种子、尺寸不是块大小倍数的随机输入上，与 PyTorch 的最大绝对误差。

第 15 章与全书的结尾用它列出“内核 / 形状 / 块大小 / 与 PyTorch 的最大绝对误差”。在 CPU 的解释器里误差在
float32 的舍入量级（1e-7 ~ 1e-6），具体数值随累加顺序与 CPU 指令集略有不同，显示时宜按数量级取整。
在 GPU 上，float32 的 ``tl.dot`` 默认走 TF32 张量核（尾数只有 10 位），用到它的内核（分块矩阵乘、两种注意力）
误差约为结果大小的 1e-3。
"""

from __future__ import annotations

import os

import torch
import torch.nn.functional as F

from .add import vector_add
from .decoding import decoding_reference, flash_decoding
from .flash_forward import attention_reference, flash_attention
from .naive import naive_attention
from .softmax import softmax_rows
from .tiled_matmul import matmul

__all__ = ["kernel_error_table"]


def _row(kernel: str, shape: str, blocks: str, reference: str, out: torch.Tensor, expected: torch.Tensor) -> dict:
    return {"kernel": kernel, "shape": shape, "blocks": blocks, "reference": reference,
            "max_abs_error": float((out - expected).abs().max()), "max_abs_reference": float(expected.abs().max())}


def kernel_error_table(seed: int = 0, device: str | torch.device | None = None) -> list[dict]:
    """按书中的顺序跑一遍五个内核（外加朴素注意力），返回每行
    ``{"kernel", "shape", "blocks", "reference", "max_abs_error", "max_abs_reference"}`` 的列表
    （后者是参照结果的最大绝对值，用来判断误差相对于数值本身有多大）。

    ``device``：输入放在哪里，``"cpu"`` 或 ``"cuda"``（CPU 张量要求解释器，CUDA 张量要求编译的内核）；
    ``None`` 时内核在解释器里跑（``TRITON_INTERPRET=1``，没有 GPU 时的默认）就用 CPU，否则用 ``"cuda"``。随机输入总在 CPU 上按 ``seed`` 生成再搬过去，所以两种设备上的输入逐位相同。
    """
    if device is None:
        interpreted = os.environ.get("TRITON_INTERPRET") == "1" or not torch.cuda.is_available()
        device = "cpu" if interpreted else "cuda"
    if not isinstance(device, (str, torch.device)):
        raise TypeError(f"device 应是 'cpu'、'cuda' 这样的字符串或 torch.device，收到 {type(device).__name__} {device!r}")
    try:
        device = torch.device(device)
    except RuntimeError:
        raise ValueError(f"device 应是 'cpu' 或 'cuda'（可带编号），收到 {device!r}") from None
    if device.type not in ("cpu", "cuda") or (device.type == "cpu" and device.index not in (None, 0)):
        raise ValueError(f"device 应是 'cpu' 或 'cuda'（Triton 的内核只在这两处运行），收到 {str(device)!r}")
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device={str(device)!r}，但这台机器没有可用的 GPU：不给 device（或给 'cpu'）就在解释器里跑")
    gen = torch.Generator().manual_seed(seed)

    def randn(*shape):
        return torch.randn(*shape, generator=gen).to(device)

    rows = []
    x, y = randn(1000), randn(1000)
    rows.append(_row("vector_add", "n=1000", "BLOCK=128", "x + y", vector_add(x, y), x + y))
    s = randn(6, 37) * 10
    rows.append(_row("softmax_rows", "(6, 37)", "BLOCK_N=64", "torch.softmax", softmax_rows(s), s.softmax(-1)))
    a, b = randn(37, 21), randn(21, 50)
    rows.append(_row("matmul", "(37, 21) @ (21, 50)", "BLOCK_M=16, BLOCK_N=32, BLOCK_K=16", "a @ b",
                     matmul(a, b, block_m=16, block_n=32, block_k=16), a @ b))
    q, k, v = randn(2, 1, 37, 20), randn(2, 1, 37, 20), randn(2, 1, 37, 20)
    sdpa = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    rows.append(_row("naive_attention", "B=2, h=1, T=37, d=20, 因果", "BLOCK_M=BLOCK_N=BLOCK_K=16",
                     "F.scaled_dot_product_attention",
                     naive_attention(q, k, v, causal=True, block_m=16, block_n=16, block_k=16), sdpa))
    rows.append(_row("flash_attention", "B=2, h=1, T=37, d=20, 因果", "BLOCK_M=BLOCK_N=16",
                     "F.scaled_dot_product_attention", flash_attention(q, k, v, causal=True, block_m=16, block_n=16),
                     sdpa))
    lengths = torch.tensor([37, 11], device=device)
    rows.append(_row("flash_attention", "B=2, h=1, T=37, d=20, 因果 + 键长 [37, 11]", "BLOCK_M=BLOCK_N=16",
                     "F.scaled_dot_product_attention + 布尔掩码",
                     flash_attention(q, k, v, causal=True, key_lengths=lengths, block_m=16, block_n=16),
                     attention_reference(q, k, v, causal=True, key_lengths=lengths)))
    q1, kc, vc = randn(3, 1, 20), randn(3, 1, 45, 20), randn(3, 1, 45, 20)
    cache = torch.tensor([45, 17, 1], device=device)
    rows.append(_row("flash_decoding", "B=3, h=1, T_max=45, d=20, 缓存长 [45, 17, 1]", "split=16, BLOCK_N=8",
                     "F.scaled_dot_product_attention + 布尔掩码",
                     flash_decoding(q1, kc, vc, cache, split_size=16, block_n=8), decoding_reference(q1, kc, vc, cache)))
    return rows
