r"""int8 的 K/V 缓存：每个词元、每个头一个比例因子（per-token, per-head）。

K（或 V）的一个位置、一个头是 d_k 个数；把它们对称量化成 int8（:func:`~tformer_lib.quant.affine.quantize_symmetric`，
s = max|k| / 127.5），再把 float32 的比例因子的 4 个字节直接接在这 d_k 个 int8 后面，存成**一行 d_k + 4 个字节**
（与 llama.cpp 的 Q8_0 块把比例因子和它的 32 个值放在一起是同一个思路）::

    k (B, h_kv, T, d_k) 浮点  →  行 (B, h_kv, T, d_k + 4) int8 = [q_0 … q_{d_k−1} | s 的 4 个字节]

比例因子与它的值同行，缓存的所有操作（拼接、按批重排、截短、数字节）都不必知道里面装的是什么，
:class:`~tformer_lib.lm.LMCache` 与 :class:`~tformer_lib.serving.PagedKVCache` 的代码一行不改。
每步注意力读到的是反量化后的 K/V；它与“缓存里直接存反量化值”的生成逐位相同（测试核对）。

- :class:`Int8AttentionCache` / :class:`Int8LMCache`：连续缓存，:func:`use_int8_kv_cache` 让 ``generate`` 用它；
- :class:`Int8KVStore` / :class:`Int8PagedKVCache`：分页缓存的一层存储，对分页缓存来说它像一个
  ``(槽位, h_kv, d_k)`` 的浮点张量（``index_copy_`` 写入时量化，``index_select`` 读出时反量化）。
"""

from __future__ import annotations

import functools

import torch
from torch import nn

from ..lm.cache import LMCache
from ..parts.kv_cache import AttentionCache
from ..serving.paged_cache import PagedKVCache
from .affine import SCALE_DTYPE, dequantize_symmetric, quantize_symmetric

__all__ = ["SCALE_BYTES", "quantize_kv_rows", "dequantize_kv_rows", "Int8AttentionCache", "Int8LMCache",
           "use_int8_kv_cache", "Int8KVStore", "Int8PagedKVCache"]

SCALE_BYTES = torch.finfo(SCALE_DTYPE).bits // 8  # 每行末尾比例因子的字节数（float32：4）


def quantize_kv_rows(x: torch.Tensor) -> torch.Tensor:
    """``x`` ``(..., d_k)`` 浮点 → int8 行 ``(..., d_k + 4)``：d_k 个量化值，后接 float32 比例因子的 4 个字节。"""
    q, scale = quantize_symmetric(x, bits=8, check_finite=False)  # (..., d_k), (..., 1)：每步都量化，不扫描 NaN
    return torch.cat([q, scale.contiguous().view(torch.int8)], dim=-1)  # (..., d_k + 4)


def dequantize_kv_rows(rows: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """:func:`quantize_kv_rows` 的逆：int8 行 ``(..., d_k + 4)`` → 浮点 ``(..., d_k)``。"""
    if rows.dtype != torch.int8 or rows.shape[-1] <= SCALE_BYTES:
        raise ValueError(f"rows 应是最后一维大于 {SCALE_BYTES} 的 int8 张量，收到 {rows.dtype} {tuple(rows.shape)}")
    q = rows[..., :-SCALE_BYTES]  # (..., d_k)
    scale = rows[..., -SCALE_BYTES:].contiguous().view(SCALE_DTYPE)  # (..., 1)：4 个字节重新解释成 float32
    return dequantize_symmetric(q, scale, dtype)  # (..., d_k)


class Int8AttentionCache(AttentionCache):
    """自注意力的 int8 缓存：``k``、``v`` 是 int8 行 ``(B, h_kv, T, d_k + 4)``；``update`` 返回反量化的完整 K/V。"""

    def __init__(self):
        super().__init__(static=False)

    def update(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        rows_k, rows_v = quantize_kv_rows(k), quantize_kv_rows(v)  # (B, h_kv, T_new, d_k + 4)
        if self.k is not None:
            rows_k = torch.cat([self.k, rows_k], dim=2)  # (B, h_kv, T_cached + T_new, d_k + 4)
            rows_v = torch.cat([self.v, rows_v], dim=2)  # (B, h_kv, T_cached + T_new, d_k + 4)
        self.k, self.v = rows_k, rows_v
        return dequantize_kv_rows(rows_k, k.dtype), dequantize_kv_rows(rows_v, v.dtype)  # (B, h_kv, T_k, d_k)


class Int8LMCache(LMCache):
    """整个语言模型的 int8 缓存：与 :class:`~tformer_lib.lm.LMCache` 相同，只是每层换成 :class:`Int8AttentionCache`。"""

    def __init__(self, n_layers: int):
        super().__init__(n_layers)
        self.layers = [Int8AttentionCache() for _ in range(n_layers)]


def use_int8_kv_cache(model: nn.Module, enabled: bool = True) -> nn.Module:
    """让这个模型实例的 ``new_cache()`` 返回 :class:`Int8LMCache`（``generate`` 就用上 int8 缓存）；
    ``enabled=False`` 还原成普通缓存。只改这一个实例，返回它。"""
    if not hasattr(model, "blocks") or not callable(getattr(type(model), "new_cache", None)):
        raise TypeError(f"model 应是 DecoderOnlyLM（有 blocks 与 new_cache），收到 {type(model).__name__}")
    if not isinstance(enabled, bool):
        raise TypeError(f"enabled 应是 bool，收到 {enabled!r}")
    if enabled:
        model.new_cache = functools.partial(Int8LMCache, len(model.blocks))
    else:
        model.__dict__.pop("new_cache", None)
    return model


class Int8KVStore:
    """分页缓存一层的 K（或 V）存储：``rows`` int8 ``(槽位, h_kv, d_k + 4)``。

    它只实现 :class:`~tformer_lib.serving.PagedKVCache` 用到的那几样：``dtype``/``device``（读写的浮点类型与设备）、
    ``nbytes``、``index_copy_(0, 槽位, 值)``（写入时量化）与 ``index_select(0, 槽位)``（读出时反量化）。
    """

    def __init__(self, shape: tuple[int, int, int], dtype: torch.dtype, device):
        slots, heads, d_k = shape
        self.rows = torch.zeros((slots, heads, d_k + SCALE_BYTES), dtype=torch.int8, device=device)
        self.dtype, self.device, self.shape = dtype, self.rows.device, torch.Size(shape)

    @property
    def nbytes(self) -> int:
        return self.rows.nbytes

    def index_copy_(self, dim: int, index: torch.Tensor, source: torch.Tensor) -> "Int8KVStore":
        if dim != 0:
            raise ValueError(f"Int8KVStore 只按槽位（第 0 维）写入，收到 dim={dim}")
        self.rows.index_copy_(0, index, quantize_kv_rows(source))  # (N, h_kv, d_k + 4)
        return self

    def index_select(self, dim: int, index: torch.Tensor) -> torch.Tensor:
        if dim != 0:
            raise ValueError(f"Int8KVStore 只按槽位（第 0 维）读取，收到 dim={dim}")
        return dequantize_kv_rows(self.rows.index_select(0, index), self.dtype)  # (N, h_kv, d_k)


class Int8PagedKVCache(PagedKVCache):
    """每层 K/V 都存成 :class:`Int8KVStore` 的分页缓存；块表、前缀缓存与视图全部沿用 :class:`PagedKVCache`。"""

    def _new_store(self, shape, dtype, device) -> Int8KVStore:
        return Int8KVStore(shape, dtype, device)
