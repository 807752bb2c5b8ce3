r"""每种格式占多少字节：权重（:func:`weight_bytes`）与每个词元的 K/V 缓存（:func:`kv_bytes_per_token`）。

闭式公式只用 :class:`~tformer_lib.lm.LMConfig`，所以对 70B 的模型也能算，不必造出它；测试核对公式与真实张量的
``nbytes`` 逐字节相等（:func:`tensor_bytes`）。一个 ``(out, in)`` 的线性层权重：

=============  ===============================================================
格式            字节数
=============  ===============================================================
fp32 / bf16     4·out·in / 2·out·in
int8            out·in（每个权重 1 字节）+ 4·out（每个输出通道一个 float32 比例因子）
int4-g{g}       out·⌈in/2⌉（两个权重一字节）+ 4·out·in/g（每组一个 float32 比例因子）
=============  ===============================================================

整数格式只量化矩阵乘法的权重（见 :mod:`~tformer_lib.quant.quantize`）；嵌入、归一化与偏置按 ``dtype`` 计
（随书模型是 float32，真实模型通常是 bfloat16）。K/V 缓存每个词元、每层、K 与 V 各 ``h_kv`` 行：浮点每行
``d_k·字节``，int8 每行 ``d_k + 4`` 字节（d_k 个 int8 加一个 float32 比例因子，见 :mod:`~tformer_lib.quant.kv_cache`）。
"""

from __future__ import annotations

import torch
from torch import nn

from .._checks import one_of, positive_int
from ..lm.config import LMConfig
from .int4_packing import packed_length
from .kv_cache import SCALE_BYTES
from .quantize import FLOAT_FORMATS, WEIGHT_FORMATS, int4_group_size

__all__ = ["KV_FORMATS", "linear_shapes", "parameter_count", "linear_weight_bytes", "weight_bytes",
           "kv_bytes_per_token", "tensor_bytes", "sessions_per_memory"]

KV_FORMATS = ("fp32", "bf16", "int8")


def _config(config_or_model) -> LMConfig:
    config = getattr(config_or_model, "config", config_or_model)
    if not isinstance(config, LMConfig):
        raise TypeError(f"config_or_model 应是 LMConfig 或带 .config 的语言模型，收到 {type(config_or_model).__name__}")
    return config


def _element_bytes(dtype: torch.dtype) -> int:
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise TypeError(f"dtype 应是浮点 torch.dtype，收到 {dtype!r}")
    return torch.finfo(dtype).bits // 8


def linear_shapes(config_or_model) -> list[tuple[str, int, int]]:
    """整数格式会量化的每个线性层 ``(名字, out, in)``：每块的 W^Q、W^K、W^V、W^O 与前馈矩阵，以及不共享时的输出层。"""
    c = _config(config_or_model)
    kv_dim = c.kv_heads * c.d_k  # GQA：W^K、W^V 只投影到 n_kv_heads·d_k 维
    ffn = ["w_1", "w_3", "w_2"] if c.activation == "swiglu" else ["w_1", "w_2"]
    shapes = []
    for i in range(c.n_layers):
        attn = f"blocks.{i}.self_attn"
        shapes += [(f"{attn}.w_q", c.d_model, c.d_model), (f"{attn}.w_k", kv_dim, c.d_model),
                   (f"{attn}.w_v", kv_dim, c.d_model), (f"{attn}.w_o", c.d_model, c.d_model)]
        shapes += [(f"blocks.{i}.feed_forward.{n}", c.d_model, c.d_ff) if n == "w_2" else
                   (f"blocks.{i}.feed_forward.{n}", c.d_ff, c.d_model) for n in ffn]
    if not c.tie_embeddings:
        shapes.append(("lm_head", c.vocab_size, c.d_model))
    return shapes


def parameter_count(config_or_model) -> int:
    """模型的参数个数（共享的矩阵只算一次）：嵌入、每块的投影（及配置里打开的偏置）与归一化、末层归一化、不共享时的输出层。"""
    c = _config(config_or_model)
    norm = 2 * c.d_model if c.norm == "layer" else c.d_model  # LayerNorm 有 γ 与 β，RMSNorm 只有 γ
    kv_dim = c.kv_heads * c.d_k
    attention = 2 * c.d_model * c.d_model + 2 * c.d_model * kv_dim  # W^Q、W^O、W^K、W^V
    attention += (c.d_model + 2 * kv_dim) * c.qkv_bias + c.d_model * c.out_bias  # 它们的偏置（有的模型没有）
    n_ffn_in = 2 if c.activation == "swiglu" else 1  # W_1（和 SwiGLU 的 W_3）：d_model → d_ff
    ffn = n_ffn_in * c.d_model * c.d_ff + c.d_ff * c.d_model + (n_ffn_in * c.d_ff + c.d_model) * c.ffn_bias
    total = c.vocab_size * c.d_model + c.n_layers * (attention + ffn + 2 * norm)
    total += c.max_len * c.d_model if c.positional == "learned" else 0
    total += norm if c.norm_first else 0  # pre-LN 末层的归一化
    total += 0 if c.tie_embeddings else c.vocab_size * c.d_model  # 输出层（没有偏置）
    return total


def linear_weight_bytes(out_features: int, in_features: int, fmt: str) -> int:
    """一个 ``(out, in)`` 线性层的权重在 ``fmt`` 格式下的字节数（不含偏置），公式见模块说明。"""
    positive_int("out_features", out_features)
    positive_int("in_features", in_features)
    one_of("fmt", fmt, WEIGHT_FORMATS)
    if fmt in FLOAT_FORMATS:
        return out_features * in_features * _element_bytes(FLOAT_FORMATS[fmt])
    group = int4_group_size(fmt)
    if group is None:  # int8：每个权重 1 字节 + 每个输出通道一个比例因子
        return out_features * in_features + SCALE_BYTES * out_features
    if in_features % group:
        raise ValueError(f"in_features={in_features} 不是 {fmt} 的组大小 {group} 的整数倍")
    return out_features * packed_length(in_features) + SCALE_BYTES * out_features * (in_features // group)


def weight_bytes(config_or_model, fmt: str, dtype: torch.dtype = torch.float32) -> int:
    """整个模型在 ``fmt`` 格式下的权重字节数。浮点格式全部按该格式计；整数格式下，没有量化的参数按 ``dtype`` 计。"""
    c = _config(config_or_model)
    one_of("fmt", fmt, WEIGHT_FORMATS)
    if fmt in FLOAT_FORMATS:
        return parameter_count(c) * _element_bytes(FLOAT_FORMATS[fmt])
    shapes = linear_shapes(c)
    quantized = sum(linear_weight_bytes(out, inp, fmt) for _, out, inp in shapes)
    rest = parameter_count(c) - sum(out * inp for _, out, inp in shapes)
    return quantized + rest * _element_bytes(dtype)


def kv_bytes_per_token(config_or_model, fmt: str) -> int:
    """每个词元的 K/V 缓存字节数（所有层、K 与 V）：``2·N·h_kv·d_k·字节``，int8 为 ``2·N·h_kv·(d_k + 4)``。"""
    c = _config(config_or_model)
    one_of("fmt", fmt, KV_FORMATS)
    row = c.d_k + SCALE_BYTES if fmt == "int8" else c.d_k * _element_bytes(FLOAT_FORMATS[fmt])
    return 2 * c.n_layers * c.kv_heads * row


def tensor_bytes(model: nn.Module) -> int:
    """模型状态字典（state_dict）里的张量真正占的字节（共用存储的张量只算一次；``_extra_state`` 之类的非张量项不计）。"""
    if not isinstance(model, nn.Module):
        raise TypeError(f"model 应是 nn.Module，收到 {type(model).__name__}")
    seen, total = set(), 0
    for t in model.state_dict().values():
        if not isinstance(t, torch.Tensor):  # 如 LoRALinear 记下的 {"merged": …}
            continue
        key = (t.untyped_storage().data_ptr(), t.storage_offset(), t.dtype, tuple(t.shape))
        if key not in seen:
            seen.add(key)
            total += t.nbytes
    return total


def sessions_per_memory(config_or_model, weight_fmt: str, kv_fmt: str, context: int,
                        memory_bytes: int = 80 * 10**9, dtype: torch.dtype = torch.bfloat16) -> int:
    """一块 ``memory_bytes`` 字节（默认 80 GB = 80·10⁹）的显存，放下权重之后还能同时容纳几条长 ``context`` 的会话：
    ⌊(显存 − 权重字节) / (每词元 K/V 字节 × context)⌋；权重都放不下时为 0。激活与框架开销不计。"""
    one_of("weight_fmt", weight_fmt, WEIGHT_FORMATS)
    one_of("kv_fmt", kv_fmt, KV_FORMATS)
    positive_int("context", context)
    positive_int("memory_bytes", memory_bytes)
    free = memory_bytes - weight_bytes(config_or_model, weight_fmt, dtype)
    return max(0, free // (kv_bytes_per_token(config_or_model, kv_fmt) * context))

