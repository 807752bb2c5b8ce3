"""量化（quantization）：权重只量化的 int8 / int4 线性层、int8 K/V 缓存，以及每种格式的字节公式（第 14 章）。

层次（只向下依赖）：affine（对称量化的公式）→ int4_packing（两个 4 位数一字节）→ linear（Int8Linear、Int4Linear）
→ quantize（``quantize_model``）→ kv_cache（int8 K/V 缓存，接进 LMCache 与 PagedKVCache）→ sizes（字节公式）→ real_models（LLaMA-2 的账）
→ measure（在随书模型上量质量，``python -m tformer_lib.quant.measure``）。
"""

from .affine import (
    dequantize_groupwise,
    dequantize_symmetric,
    int_range,
    quantize_groupwise,
    quantize_symmetric,
    symmetric_scale,
)
from .int4_packing import pack_int4, packed_length, unpack_int4
from .linear import INT4_GROUP_SIZES, Int4Linear, Int8Linear
from .quantize import WEIGHT_FORMATS, dequantize_model, quantize_model
from .kv_cache import (
    Int8AttentionCache,
    Int8KVStore,
    Int8LMCache,
    Int8PagedKVCache,
    dequantize_kv_rows,
    quantize_kv_rows,
    use_int8_kv_cache,
)
from .sizes import (
    KV_FORMATS,
    kv_bytes_per_token,
    linear_shapes,
    linear_weight_bytes,
    parameter_count,
    sessions_per_memory,
    tensor_bytes,
    weight_bytes,
)

__all__ = [
    "int_range", "symmetric_scale", "quantize_symmetric", "dequantize_symmetric", "quantize_groupwise",
    "dequantize_groupwise", "pack_int4", "unpack_int4", "packed_length", "Int8Linear", "Int4Linear",
    "INT4_GROUP_SIZES", "WEIGHT_FORMATS", "quantize_model", "dequantize_model", "quantize_kv_rows", "dequantize_kv_rows",
    "Int8AttentionCache", "Int8LMCache", "use_int8_kv_cache", "Int8KVStore", "Int8PagedKVCache", "KV_FORMATS",
    "linear_shapes", "parameter_count", "linear_weight_bytes", "weight_bytes", "kv_bytes_per_token", "tensor_bytes",
    "sessions_per_memory",
]
