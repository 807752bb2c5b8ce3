"""缩放点积注意力（scaled dot-product attention）与多头注意力（multi-head attention）。

两条路径，结果一致（测试保证）：
- 显式路径：matmul → softmax → matmul，逐步可见，并返回注意力权重，供教学与画图；
- 快速路径：``torch.nn.functional.scaled_dot_product_attention``，用于训练，不返回权重。
"""

import math

import torch
import torch.nn.functional as F
from torch import nn

from ._checks import attention_inputs, bool_mask, non_empty_sequence, positive_int, tensor_with_dim
from .kv_cache import AttentionCache


def scaled_dot_product_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor | None = None,
    dropout: nn.Module | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    r"""显式路径的注意力 :math:`\mathrm{softmax}(QK^\top/\sqrt{d_k})V`，返回 ``(output, weights)``。

    形状：``q`` 为 ``(..., T_q, d_k)``，``k`` 为 ``(..., T_k, d_k)``，``v`` 为 ``(..., T_k, d_v)``；
    ``mask`` 为布尔张量（True = 可以关注），能广播到分数形状 ``(..., T_q, T_k)``。
    被屏蔽的分数填 ``torch.finfo(dtype).min``；softmax 之后再把被屏蔽的权重置为 0，
    因此被屏蔽处的权重恰好为 0，整行都被屏蔽时输出全 0 而不是 NaN。
    返回的 ``weights`` 是 dropout 之前的权重。
    """
    attention_inputs(q, k, v)
    d_k = q.shape[-1]
    # 计算 Q K^T / sqrt(d_k)
    scores = q @ k.transpose(-2, -1) / math.sqrt(d_k)  # (..., T_q, T_k)
    if mask is not None:
        bool_mask("mask", mask, scores.shape)
        scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
    weights = scores.softmax(dim=-1)  # (..., T_q, T_k)，每行和为 1
    if mask is not None:
        weights = weights.masked_fill(~mask, 0.0)  # 整行被屏蔽时为全 0
    attended = dropout(weights) if dropout is not None else weights
    return attended @ v, weights  # (..., T_q, d_v), (..., T_q, T_k)


def fast_scaled_dot_product_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor | None = None,
    dropout_p: float = 0.0,
) -> torch.Tensor:
    """快速路径：调用 ``F.scaled_dot_product_attention``，掩码约定与显式路径相同，只返回输出。

    PyTorch 的布尔 ``attn_mask`` 也是 True = 参与注意力；但整行被屏蔽时，较早的版本与部分内核给出 NaN
    （torch 2.13 的 CPU 实现给 0）。为了在我们支持的所有版本上行为一致，这里把掩码换成加性浮点掩码
    （被屏蔽处为 ``finfo.min``），再把整行被屏蔽的输出置 0。
    """
    attention_inputs(q, k, v)
    if mask is None:
        return F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p)
    score_shape = (*torch.broadcast_shapes(q.shape[:-2], k.shape[:-2]), q.shape[-2], k.shape[-2])
    bool_mask("mask", mask, score_shape)
    additive = torch.zeros(mask.shape, dtype=q.dtype, device=q.device)
    additive = additive.masked_fill(~mask, torch.finfo(q.dtype).min)
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=additive, dropout_p=dropout_p)
    any_key = mask.any(dim=-1, keepdim=True)  # (..., T_q, 1)：这一行是否至少能看见一个键
    return out.masked_fill(~any_key, 0.0)  # (..., T_q, d_v)


class MultiHeadAttention(nn.Module):
    """多头注意力：把 d_model 维切成 h 个头，各自做一次注意力，再拼接并用 W^O 混合。

    属性 ``w_q, w_k, w_v, w_o`` 就是论文中的 W^Q、W^K、W^V、W^O（各一个 ``nn.Linear(d_model, d_model)``）。
    显式路径下，``attn_weights`` 保存最近一次的注意力权重 ``(B, h, T_q, T_k)``；快速路径下为 ``None``。
    """

    def __init__(self, d_model: int, n_heads: int, dropout: float = 0.0, fast: bool = False):
        super().__init__()
        positive_int("d_model", d_model)
        positive_int("n_heads", n_heads)
        if d_model % n_heads != 0:
            raise ValueError(f"d_model={d_model} is not divisible by n_heads={n_heads}")
        self.d_model, self.n_heads, self.d_k = d_model, n_heads, d_model // n_heads
        self.w_q = nn.Linear(d_model, d_model)
        self.w_k = nn.Linear(d_model, d_model)
        self.w_v = nn.Linear(d_model, d_model)
        self.w_o = nn.Linear(d_model, d_model)
        self.dropout = nn.Dropout(dropout)
        self.fast = fast
        self.attn_weights: torch.Tensor | None = None

    def split_heads(self, x: torch.Tensor) -> torch.Tensor:
        """``(B, T, d_model)`` → ``(B, h, T, d_k)``：先把最后一维拆成 (h, d_k)，再把 h 换到前面。"""
        batch, length, _ = x.shape
        return x.view(batch, length, self.n_heads, self.d_k).transpose(1, 2)  # (B, h, T, d_k)

    def merge_heads(self, x: torch.Tensor) -> torch.Tensor:
        """``(B, h, T, d_k)`` → ``(B, T, d_model)``：split_heads 的逆操作（即“拼接各头”）。"""
        batch, _, length, _ = x.shape
        return x.transpose(1, 2).reshape(batch, length, self.d_model)  # (B, T, h·d_k)

    def _check_inputs(self, query, key, value) -> None:
        for name, x in (("query", query), ("key", key), ("value", value)):
            tensor_with_dim(name, x, 3, "(B, T, d_model)")
            non_empty_sequence(name, x)
        if query.shape[-1] != self.d_model:
            raise ValueError(f"query has d_model={query.shape[-1]}, but this layer expects d_model={self.d_model}")
        if key.shape[-1] != query.shape[-1] or value.shape[-1] != query.shape[-1]:
            raise ValueError(
                f"query, key and value must share d_model, got query {tuple(query.shape)}, "
                f"key {tuple(key.shape)}, value {tuple(value.shape)}"
            )
        if key.shape[:2] != value.shape[:2]:
            raise ValueError(f"key and value must have the same (B, T_k), got {tuple(key.shape)} and {tuple(value.shape)}")

    def forward(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        mask: torch.Tensor | None = None,
        cache: AttentionCache | None = None,
    ) -> torch.Tensor:
        """``query`` ``(B, T_q, d_model)``，``key``/``value`` ``(B, T_k, d_model)`` → ``(B, T_q, d_model)``。

        ``mask``：布尔，True = 可以关注，能广播到 ``(B, h, T_q, T_k)``。
        ``cache``：增量解码用的 K/V 缓存（见 :mod:`tformer_lib.kv_cache`）。
        """
        self._check_inputs(query, key, value)
        # 1) 线性投影 Q = X W^Q 等，并拆成多个头
        q = self.split_heads(self.w_q(query))  # (B, h, T_q, d_k)
        if cache is not None and cache.static and cache.k is not None:
            k, v = cache.k, cache.v  # 交叉注意力：编码器输出的 K、V 只算一次
        else:
            k = self.split_heads(self.w_k(key))  # (B, h, T_k, d_k)
            v = self.split_heads(self.w_v(value))  # (B, h, T_k, d_k)
            if cache is not None:
                k, v = cache.update(k, v)  # 自注意力：把新位置的 K、V 接在已缓存的后面
        # 2) 每个头各自做一次缩放点积注意力
        if self.fast:
            out = fast_scaled_dot_product_attention(
                q, k, v, mask, dropout_p=self.dropout.p if self.training else 0.0
            )  # (B, h, T_q, d_k)
            self.attn_weights = None
        else:
            out, weights = scaled_dot_product_attention(q, k, v, mask, self.dropout)  # (B, h, T_q, d_k)
            self.attn_weights = weights.detach()  # (B, h, T_q, T_k)
        # 3) 拼接各头，再用 W^O 做一次线性变换
        return self.w_o(self.merge_heads(out))  # (B, T_q, d_model)
