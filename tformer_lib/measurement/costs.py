r"""算力与内存的账本：每一层的浮点运算量（FLOPs）与激活内存（activation memory）的闭式公式。

约定
----
* **FLOPs 只数矩阵乘法**，一次乘加算 2 次浮点运算：``(m×k) @ (k×n)`` 记 ``2·m·k·n``。
  这与 ``torch.utils.flop_counter.FlopCounterMode`` 的口径相同（它也只数 mm/addmm/bmm 等，
  线性层的偏置、softmax、LayerNorm、ReLU 这些逐元素运算都不计——它们只占很小一部分）。
* 记号：B 批大小，T（或 T_q、T_k）序列长度，d = d_model，h 头数，d_k = d/h，d_ff 前馈隐藏维度，V 词表大小。
* 内存以字节（bytes）计，``bytes_per_element`` 默认 4（float32）。

一层多头注意力（查询长度 T_q，键/值长度 T_k）：

==================  =========================  ==========================
部分                 FLOPs                       说明
==================  =========================  ==========================
Q 投影 X W^Q         2·B·T_q·d·d
K、V 投影            2 · 2·B·T_k·d·d
QKᵀ 分数             2·B·h·T_q·T_k·d_k           = 2·B·T_q·T_k·d，随长度平方增长
AV 加权求和          2·B·h·T_q·T_k·d_k           同上
输出投影 W^O         2·B·T_q·d·d
==================  =========================  ==========================

前馈网络：``2 · 2·B·T·d·d_ff``（两个线性层）。
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import torch

from .._checks import positive_int
from ..translation.config import TransformerConfig

__all__ = [
    "attention_flops",
    "feedforward_flops",
    "encoder_layer_flops",
    "decoder_layer_flops",
    "model_forward_flops",
    "attention_memory",
    "encoder_layer_memory",
    "kv_cache_bytes_per_token",
    "kv_cache_bytes",
    "measure_flops",
    "saved_tensor_bytes",
    "largest_tensor_bytes",
    "median_time",
]


def _check_config(config) -> TransformerConfig:
    if not isinstance(config, TransformerConfig):
        raise TypeError(f"config 应是 TransformerConfig，收到 {type(config).__name__}")
    return config


def attention_flops(batch: int, t_q: int, t_k: int, d_model: int, n_heads: int) -> dict[str, int]:
    """一次多头注意力（含四个投影）的矩阵乘法 FLOPs，按部分列出，另含 ``"total"``。

    自注意力时 ``t_q == t_k == T``；交叉注意力时 ``t_q`` 是目标长度，``t_k`` 是源长度 S。
    """
    for name, value in (("batch", batch), ("t_q", t_q), ("t_k", t_k), ("d_model", d_model), ("n_heads", n_heads)):
        positive_int(name, value)
    if d_model % n_heads != 0:
        raise ValueError(f"d_model={d_model} 不能被 n_heads={n_heads} 整除")
    d_k = d_model // n_heads
    parts = {
        "q_proj": 2 * batch * t_q * d_model * d_model,  # (B·T_q, d) @ (d, d)
        "kv_proj": 2 * 2 * batch * t_k * d_model * d_model,  # K 与 V 各一次 (B·T_k, d) @ (d, d)
        "scores": 2 * batch * n_heads * t_q * t_k * d_k,  # Q K^T：(B·h, T_q, d_k) @ (B·h, d_k, T_k)
        "weighted_sum": 2 * batch * n_heads * t_q * t_k * d_k,  # A V：(B·h, T_q, T_k) @ (B·h, T_k, d_k)
        "out_proj": 2 * batch * t_q * d_model * d_model,  # (B·T_q, d) @ (d, d)
    }
    parts["total"] = sum(parts.values())
    return parts


def feedforward_flops(batch: int, length: int, d_model: int, d_ff: int) -> int:
    """逐位置前馈网络的 FLOPs：两个线性层 ``d → d_ff → d``。"""
    for name, value in (("batch", batch), ("length", length), ("d_model", d_model), ("d_ff", d_ff)):
        positive_int(name, value)
    return 2 * 2 * batch * length * d_model * d_ff


def encoder_layer_flops(config: TransformerConfig, batch: int, length: int) -> dict[str, int]:
    """一个编码器层（自注意力 + 前馈）的 FLOPs，按部分列出，另含 ``"total"``。"""
    c = _check_config(config)
    positive_int("batch", batch)
    positive_int("length", length)
    attn = attention_flops(batch, length, length, c.d_model, c.n_heads)
    parts = {f"self_attn.{k}": v for k, v in attn.items() if k != "total"}
    parts["ffn"] = feedforward_flops(batch, length, c.d_model, c.d_ff)
    parts["total"] = sum(parts.values())
    return parts


def decoder_layer_flops(config: TransformerConfig, batch: int, tgt_len: int, src_len: int) -> dict[str, int]:
    """一个解码器层（带掩码的自注意力 + 交叉注意力 + 前馈）的 FLOPs，不使用缓存时。

    注意：显式路径对被因果掩码屏蔽的位置也照样做乘法，所以自注意力仍按 ``T × T`` 计。
    """
    c = _check_config(config)
    for name, value in (("batch", batch), ("tgt_len", tgt_len), ("src_len", src_len)):
        positive_int(name, value)
    self_attn = attention_flops(batch, tgt_len, tgt_len, c.d_model, c.n_heads)
    cross = attention_flops(batch, tgt_len, src_len, c.d_model, c.n_heads)
    parts = {f"self_attn.{k}": v for k, v in self_attn.items() if k != "total"}
    parts.update({f"cross_attn.{k}": v for k, v in cross.items() if k != "total"})
    parts["ffn"] = feedforward_flops(batch, tgt_len, c.d_model, c.d_ff)
    parts["total"] = sum(parts.values())
    return parts


def model_forward_flops(config: TransformerConfig, batch: int, src_len: int, tgt_len: int) -> dict[str, int]:
    """整个模型一次前向 ``model(src, tgt_in)`` 的 FLOPs：编码器栈、解码器栈、输出层。

    词嵌入是查表（不是矩阵乘法），位置编码是加法，都记 0。
    """
    c = _check_config(config)
    encoder = c.n_encoder_layers * encoder_layer_flops(c, batch, src_len)["total"]
    decoder = c.n_decoder_layers * decoder_layer_flops(c, batch, tgt_len, src_len)["total"]
    generator = 2 * batch * tgt_len * c.d_model * c.tgt_vocab_size  # (B·T, d) @ (d, V)
    return {"encoder": encoder, "decoder": decoder, "generator": generator, "total": encoder + decoder + generator}


def attention_memory(
    batch: int, t_q: int, t_k: int, d_model: int, n_heads: int, bytes_per_element: int = 4
) -> dict[str, int]:
    """显式路径一次多头注意力产生的主要张量的字节数。

    ``q`` ``(B, h, T_q, d_k)``；``k``、``v`` ``(B, h, T_k, d_k)``；
    ``scores`` 与 ``weights`` 都是 ``(B, h, T_q, T_k)``——这就是随长度平方增长的那一块；
    ``output`` ``(B, T_q, d)``。
    """
    for name, value in (("batch", batch), ("t_q", t_q), ("t_k", t_k), ("d_model", d_model),
                        ("n_heads", n_heads), ("bytes_per_element", bytes_per_element)):
        positive_int(name, value)
    if d_model % n_heads != 0:
        raise ValueError(f"d_model={d_model} 不能被 n_heads={n_heads} 整除")
    e = bytes_per_element
    return {
        "q": batch * t_q * d_model * e,  # (B, h, T_q, d_k)
        "k": batch * t_k * d_model * e,  # (B, h, T_k, d_k)
        "v": batch * t_k * d_model * e,  # (B, h, T_k, d_k)
        "scores": batch * n_heads * t_q * t_k * e,  # (B, h, T_q, T_k)，softmax 之前
        "weights": batch * n_heads * t_q * t_k * e,  # (B, h, T_q, T_k)，softmax 之后
        "output": batch * t_q * d_model * e,  # (B, T_q, d)
    }


def encoder_layer_memory(
    config: TransformerConfig, batch: int, length: int, bytes_per_element: int = 4
) -> dict[str, int]:
    """训练时一个编码器层（显式注意力路径）为反向传播保存的激活张量字节数，按部分列出，另含 ``"total"``。

    这正是 :func:`saved_tensor_bytes` 实测到的量（dropout 关闭时逐字节相等，post-LN 与 pre-LN 都一样）：

    * ``layer_input``：W^Q、W^K、W^V 共用的输入 ``(B, T, d)``；
    * ``q``、``k``、``v``：各 ``(B, h, T, d_k)``（QKᵀ 与 AV 的反向要用）；
    * ``attn_weights``：softmax 输出 ``(B, h, T, T)``——唯一随 T 平方增长的一项；
    * ``attn_concat``：拼接各头后送进 W^O 的 ``(B, T, d)``；
    * ``layer_norm``：两个 LayerNorm 的输入 ``(B, T, d)`` 各一份，外加每个位置的均值与 1/标准差 ``(B, T, 1)``；
    * ``ffn_input``：送进 W_1 的 ``(B, T, d)``；``ffn_hidden``：ReLU 输出 ``(B, T, d_ff)``。

    参数本身不计。dropout 打开时还会多存每处的随机掩码，这里不计。
    """
    c = _check_config(config)
    for name, value in (("batch", batch), ("length", length), ("bytes_per_element", bytes_per_element)):
        positive_int(name, value)
    e, btd = bytes_per_element, batch * length * c.d_model
    parts = {
        "layer_input": btd * e,  # (B, T, d)
        "q": btd * e,  # (B, h, T, d_k)
        "k": btd * e,  # (B, h, T, d_k)
        "v": btd * e,  # (B, h, T, d_k)
        "attn_weights": batch * c.n_heads * length * length * e,  # (B, h, T, T)
        "attn_concat": btd * e,  # (B, T, d)
        "layer_norm": (2 * btd + 2 * 2 * batch * length) * e,  # 2 × (B, T, d) + 2 × 均值/标准差 (B, T, 1)
        "ffn_input": btd * e,  # (B, T, d)
        "ffn_hidden": batch * length * c.d_ff * e,  # (B, T, d_ff)
    }
    parts["total"] = sum(parts.values())
    return parts


def kv_cache_bytes_per_token(config: TransformerConfig, bytes_per_element: int = 4) -> int:
    """解码器每多生成一个词元，自注意力缓存增加的字节数（一条序列）。

    每个解码器层存一份 K 和一份 V，各 ``d_model`` 个数：``2 · N_dec · d_model · bytes``。
    """
    c = _check_config(config)
    positive_int("bytes_per_element", bytes_per_element)
    return 2 * c.n_decoder_layers * c.d_model * bytes_per_element


def kv_cache_bytes(
    config: TransformerConfig, batch: int, tgt_len: int, src_len: int, bytes_per_element: int = 4
) -> dict[str, int]:
    """已解码 ``tgt_len`` 个词元时整个 :class:`~tformer_lib.KVCache` 的字节数。

    ``self_attn``：随生成长度增长，``B · tgt_len · kv_cache_bytes_per_token``；
    ``cross_attn``：编码器输出的 K、V，只算一次，``2 · N_dec · B · S · d_model · bytes``。
    """
    c = _check_config(config)
    for name, value in (("batch", batch), ("tgt_len", tgt_len), ("src_len", src_len)):
        positive_int(name, value)
    self_attn = batch * tgt_len * kv_cache_bytes_per_token(c, bytes_per_element)
    cross_attn = 2 * c.n_decoder_layers * batch * src_len * c.d_model * bytes_per_element
    return {"self_attn": self_attn, "cross_attn": cross_attn, "total": self_attn + cross_attn}


# ---------------------------------------------------------------- 测量（与闭式公式对照）


def measure_flops(fn: Callable[[], object]) -> dict[str, int]:
    """运行 ``fn()`` 并用 ``FlopCounterMode`` 数它的矩阵乘法 FLOPs，返回 ``{算子名: FLOPs, "total": …}``。

    注意：CPU 上 ``F.scaled_dot_product_attention`` 的融合内核不在 PyTorch 的计数表里，
    快速路径的 QKᵀ 与 AV 会漏数；要对照公式，请用显式路径（``fast_attention=False``）。
    """
    from torch.utils.flop_counter import FlopCounterMode

    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        fn()
    counts = {str(op).removeprefix("aten."): int(n) for op, n in counter.get_flop_counts()["Global"].items()}
    counts["total"] = int(counter.get_total_flops())
    return counts


def saved_tensor_bytes(fn: Callable[[], object], exclude: tuple[torch.Tensor, ...] = ()) -> int:
    """运行 ``fn()``，返回 autograd 为反向传播保存下来的张量一共占多少字节（同一块存储只算一次）。

    这就是训练时“激活内存”的实测值。``exclude`` 里的张量（通常是模型参数）不计入。
    """
    excluded = {t.untyped_storage().data_ptr() for t in exclude}
    storages: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        ptr = storage.data_ptr()
        if ptr not in excluded:
            storages[ptr] = storage.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn()
    return sum(storages.values())


def largest_tensor_bytes(fn: Callable[[], object]) -> int:
    """运行 ``fn()``，返回其间任何一个 PyTorch 算子输出的最大一块存储的字节数。

    用来实测“中间结果最大有多大”：显式注意力里它就是 ``(B, h, T_q, T_k)`` 的分数表；
    逐块注意力（:func:`tformer_lib.parts.flash.tiled_attention`）里只是 ``(B, h, T_q, block_size)`` 的一块。
    （借助 PyTorch 的 ``TorchDispatchMode`` 拦截每个算子，与 ``FlopCounterMode`` 同一机制。）
    """
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_flatten

    largest = 0

    class _Largest(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            nonlocal largest
            out = func(*args, **(kwargs or {}))
            for t in tree_flatten(out)[0]:
                if isinstance(t, torch.Tensor):
                    largest = max(largest, t.untyped_storage().nbytes())
            return out

    with torch.no_grad(), _Largest():
        fn()
    return largest


def median_time(fn: Callable[[], object], repeats: int = 5, warmup: int = 1) -> float:
    """``fn()`` 的耗时中位数（秒）：先热身 ``warmup`` 次，再测 ``repeats`` 次。

    计时随机器负载而变，只适合比较同一次运行里的相对快慢（比值），不要把秒数写进结论。
    """
    positive_int("repeats", repeats)
    for _ in range(warmup):
        fn()
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)
