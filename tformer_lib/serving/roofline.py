r"""预填充（prefill）与解码（decode）的成本：一次前向的 FLOPs、搬动的字节数，与算术强度（arithmetic intensity）。

生成分两段：**预填充**把整段提示（T 个词元）一次送进模型；**解码**每步只送 1 个新词元，却要把全部权重和
整个 K/V 缓存从内存里读一遍。两者做的是同一种矩阵乘法，差别在“每读一个字节做多少次运算”：

.. math::

    \text{算术强度} = \frac{\text{FLOPs}}{\text{搬动的字节数}}\quad(\text{FLOP/字节})

机器也有一个这样的比值——机器平衡点（machine balance）= 峰值 FLOP/s ÷ 内存带宽（字节/秒）。强度低于它，
算力等着数据，是**访存受限**（memory-bound）；高于它才是**算力受限**（compute-bound）。这就是屋顶线模型
（roofline model，Williams et al., 2009）：可达的 FLOP/s = min(峰值, 强度 × 带宽)。

口径（与 :mod:`tformer_lib.measurement.costs`、:func:`tformer_lib.measurement.profiling.lm_training_flops` 相同）：

* FLOPs 只数矩阵乘法，一次乘加算 2；显式注意力路径对新词元的每一行都与全部 ``context`` 个键相乘；
  输出层对每个新词元都算（模型返回 ``(B, T_new, V)``）。
* 字节只数三样，每样读或写一次：矩阵乘法的**权重**（整批共用，一次前向读一遍；共享的输出层只算一次）、
  **K/V 缓存**（每条序列读出 ``context`` 个位置，其中新的 ``new_tokens`` 个是刚写进去的）、
  **激活**（投影、W^O 与前馈各矩阵乘法的输入与输出，注意力分数表 ``(B, h, T_new, T_k)`` 写一次读一次，
  输出层读隐藏状态、写 logits）。
  归一化、softmax、残差这些逐元素运算另有少量访存，这里不计。

本模块除 :func:`measure_memory_bandwidth` 外都是纯函数（不计时）；画图的函数把测得的峰值与带宽当作参数接收。
"""

from __future__ import annotations

import statistics
import time

import torch

from .._checks import positive_int
from ..lm.cache import lm_kv_cache_bytes_per_token
from ..lm.config import LMConfig

__all__ = [
    "lm_weight_elements",
    "lm_forward_flops",
    "lm_forward_bytes",
    "arithmetic_intensity",
    "prefill_cost",
    "decode_cost",
    "machine_balance",
    "attainable_flops",
    "measure_memory_bandwidth",
]


def check_config(config) -> LMConfig:
    """``config`` 必须是 :class:`~tformer_lib.lm.LMConfig`（算术强度与屋顶线的公式只认它）。"""
    if not isinstance(config, LMConfig):
        raise TypeError(f"config 应是 LMConfig，收到 {type(config).__name__}")
    return config


def _ffn_matrices(c: LMConfig) -> int:
    return 3 if c.activation == "swiglu" else 2  # SwiGLU：W_1、W_3、W_2；否则 W_1、W_2


def lm_weight_elements(config: LMConfig) -> dict[str, int]:
    """矩阵乘法用到的权重元素个数：每块的 W^Q、W^K、W^V、W^O 与前馈矩阵，加上输出层（共享嵌入时也只一份）。

    词嵌入与位置嵌入是查表，每个词元只读一行，不计；偏置与归一化的参数很少，也不计。
    """
    c = check_config(config)
    kv_dim = c.kv_heads * c.d_k  # GQA：W^K、W^V 只投影到 n_kv_heads·d_k 维
    attention = 2 * c.d_model * c.d_model + 2 * c.d_model * kv_dim  # W^Q、W^O + W^K、W^V
    ffn = _ffn_matrices(c) * c.d_model * c.d_ff
    blocks = c.n_layers * (attention + ffn)
    head = c.d_model * c.vocab_size
    return {"blocks": blocks, "head": head, "total": blocks + head}


def _check_step(batch: int, new_tokens: int, context: int, config: LMConfig) -> None:
    positive_int("batch", batch)
    positive_int("new_tokens", new_tokens)
    positive_int("context", context)
    if context < new_tokens:
        raise ValueError(f"context={context} 不能小于 new_tokens={new_tokens}：context 是缓存里原有的位置加上新词元")
    if context > config.max_len:
        raise ValueError(f"context={context} 超过了上下文长度 max_len={config.max_len}")


def lm_forward_flops(config: LMConfig, batch: int, new_tokens: int, context: int) -> dict[str, int]:
    """带缓存的一次前向：``batch`` 条序列各送入 ``new_tokens`` 个新词元、各看 ``context`` 个键（缓存 + 新词元）。

    预填充 T 个词元：``new_tokens = context = T``；解码第 L 个位置：``new_tokens = 1, context = L``。
    返回 ``{"projections", "attention", "ffn", "head", "total"}``（矩阵乘法 FLOPs）。
    """
    c = check_config(config)
    _check_step(batch, new_tokens, context, c)
    rows = batch * new_tokens  # 送进每个矩阵乘法的行数 B·T_new
    w = lm_weight_elements(c)
    kv_dim = c.kv_heads * c.d_k
    projections = c.n_layers * 2 * rows * (2 * c.d_model * c.d_model + 2 * c.d_model * kv_dim)
    attention = c.n_layers * 2 * 2 * batch * c.n_heads * new_tokens * context * c.d_k  # QKᵀ 与 AV
    ffn = c.n_layers * 2 * rows * _ffn_matrices(c) * c.d_model * c.d_ff
    head = 2 * rows * w["head"]  # (B·T_new, d) @ (d, V)
    return {"projections": projections, "attention": attention, "ffn": ffn, "head": head,
            "total": projections + attention + ffn + head}


def lm_forward_bytes(config: LMConfig, batch: int, new_tokens: int, context: int,
                     bytes_per_element: int = 4) -> dict[str, int]:
    """同一次前向搬动的字节数：``{"weights", "kv_cache", "activations", "total"}``（口径见模块说明）。"""
    c = check_config(config)
    _check_step(batch, new_tokens, context, c)
    positive_int("bytes_per_element", bytes_per_element)
    e = bytes_per_element
    weights = lm_weight_elements(c)["total"] * e
    kv_dim = c.kv_heads * c.d_k
    kv_cache = batch * context * lm_kv_cache_bytes_per_token(c, e)  # 每层读出 context 个位置的 K 与 V
    rows = batch * new_tokens
    hidden = _ffn_matrices(c) - 1  # 前馈隐藏层的份数：W_1（SwiGLU 再加 W_3）的输出
    per_row = (
        c.d_model + (c.d_model + 2 * kv_dim)  # Q/K/V 投影：读 x，写 q、k、v
        + 2 * c.d_model  # W^O：读注意力输出，写结果
        + c.d_model + hidden * c.d_ff  # 前馈第一层：读 x，写隐藏层
        + c.d_ff + c.d_model  # 前馈第二层：读隐藏层，写结果
    )
    scores = 2 * batch * c.n_heads * new_tokens * context  # 分数表 (B, h, T_new, T_k)：写一次、读一次
    activations = (c.n_layers * (rows * per_row + scores) + rows * (c.d_model + c.vocab_size)) * e  # 加输出层的读写
    return {"weights": weights, "kv_cache": kv_cache, "activations": activations,
            "total": weights + kv_cache + activations}


def arithmetic_intensity(flops: float, n_bytes: float) -> float:
    """算术强度 = FLOPs ÷ 字节（FLOP/字节）。"""
    for name, value in (("flops", flops), ("n_bytes", n_bytes)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
            raise ValueError(f"{name} 应为正数，收到 {value!r}")
    return flops / n_bytes


def _cost(config, batch, new_tokens, context, bytes_per_element) -> dict:
    flops = lm_forward_flops(config, batch, new_tokens, context)
    moved = lm_forward_bytes(config, batch, new_tokens, context, bytes_per_element)
    return {"batch": batch, "new_tokens": new_tokens, "context": context, "flops": flops["total"],
            "bytes": moved["total"], "bytes_parts": moved, "flops_parts": flops,
            "intensity": arithmetic_intensity(flops["total"], moved["total"])}


def prefill_cost(config: LMConfig, prompt_len: int, batch: int = 1, bytes_per_element: int = 4) -> dict:
    """一次预填充（``batch`` 条各 ``prompt_len`` 个词元）：FLOPs、字节（及各部分）与算术强度。"""
    positive_int("prompt_len", prompt_len)
    return _cost(config, batch, prompt_len, prompt_len, bytes_per_element)


def decode_cost(config: LMConfig, batch: int, context: int, bytes_per_element: int = 4) -> dict:
    """一步解码（``batch`` 条序列各 1 个新词元、各看 ``context`` 个位置）：FLOPs、字节与算术强度。"""
    return _cost(config, batch, 1, context, bytes_per_element)


def machine_balance(peak_flops: float, bandwidth: float) -> float:
    """机器平衡点 = 峰值 FLOP/s ÷ 内存带宽（字节/秒）：强度高于它才可能算力受限。"""
    for name, value in (("peak_flops", peak_flops), ("bandwidth", bandwidth)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
            raise ValueError(f"{name} 应为正数，收到 {value!r}")
    return peak_flops / bandwidth


def attainable_flops(intensity: float, peak_flops: float, bandwidth: float) -> float:
    """屋顶线：强度为 ``intensity`` 的运算最多能跑到的 FLOP/s = min(峰值, 强度 × 带宽)。"""
    machine_balance(peak_flops, bandwidth)  # 检查参数
    if isinstance(intensity, bool) or not isinstance(intensity, (int, float)) or not intensity > 0:
        raise ValueError(f"intensity 应为正数，收到 {intensity!r}")
    return min(peak_flops, intensity * bandwidth)


def measure_memory_bandwidth(n_mib: int = 256, repeats: int = 5) -> float:
    """实测内存带宽（字节/秒）：复制一个 ``n_mib`` MiB 的 float32 张量（读一遍 + 写一遍），取中位数。

    张量要远大于 CPU 缓存，测到的才是主内存的带宽；结果随机器负载与线程数变化，只在同一次运行里与
    :func:`~tformer_lib.measurement.profiling.matmul_peak_flops` 相比。
    """
    positive_int("n_mib", n_mib)
    positive_int("repeats", repeats)
    src = torch.ones(n_mib * 2**20 // 4)
    dst = torch.empty_like(src)
    dst.copy_(src)  # 热身（也让两块内存真正分配出来）
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        dst.copy_(src)
        samples.append(time.perf_counter() - start)
    return 2 * src.nbytes / statistics.median(samples)
