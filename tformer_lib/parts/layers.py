"""编码器层（encoder layer）与解码器层（decoder layer），以及把它们串起来的残差 + 层归一化。"""

from collections.abc import Callable

import torch
from torch import nn

from .._checks import dropout_rate, module_dtype
from .attention import MultiHeadAttention
from .feedforward import PositionwiseFeedForward
from .kv_cache import AttentionCache
from .norms import make_norm


class ResidualNorm(nn.Module):
    """残差连接（residual connection）+ 层归一化（layer normalization）。

    - 后置归一化 post-LN（论文做法，默认）：``LayerNorm(x + Dropout(sublayer(x)))``；
    - 前置归一化 pre-LN（``norm_first=True``）：``x + Dropout(sublayer(LayerNorm(x)))``。

    ``norm="rms"`` 把 LayerNorm 换成 :class:`~tformer_lib.parts.norms.RMSNorm`（现代大模型的做法）；
    ``eps`` 是归一化分母里的 ε。
    """

    def __init__(
        self, d_model: int, dropout: float = 0.0, norm_first: bool = False, norm: str = "layer", *, eps: float = 1e-5
    ):
        super().__init__()
        self.norm = make_norm(norm, d_model, eps)
        self.dropout = nn.Dropout(dropout_rate("dropout", dropout))
        self.norm_first = norm_first

    def forward(self, x: torch.Tensor, sublayer: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
        module_dtype("x", x, self.norm)
        if self.norm_first:
            return x + self.dropout(sublayer(self.norm(x)))
        return self.norm(x + self.dropout(sublayer(x)))


class EncoderLayer(nn.Module):
    """编码器层 = 多头自注意力 + 前馈网络，各自包在一个残差 + 层归一化里。"""

    def __init__(self, d_model, n_heads, d_ff, dropout=0.0, activation="relu", norm_first=False, fast=False):
        super().__init__()
        self.self_attn = MultiHeadAttention(d_model, n_heads, dropout, fast=fast)
        self.feed_forward = PositionwiseFeedForward(d_model, d_ff, dropout, activation)
        self.residual_attn = ResidualNorm(d_model, dropout, norm_first)
        self.residual_ffn = ResidualNorm(d_model, dropout, norm_first)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        x = self.residual_attn(x, lambda h: self.self_attn(h, h, h, mask))  # (B, S, d_model)
        return self.residual_ffn(x, self.feed_forward)  # (B, S, d_model)


class DecoderLayer(nn.Module):
    """解码器层 = 带掩码的自注意力 + 交叉注意力（查询来自解码器，键值来自编码器输出）+ 前馈网络。"""

    def __init__(self, d_model, n_heads, d_ff, dropout=0.0, activation="relu", norm_first=False, fast=False):
        super().__init__()
        self.self_attn = MultiHeadAttention(d_model, n_heads, dropout, fast=fast)
        self.cross_attn = MultiHeadAttention(d_model, n_heads, dropout, fast=fast)
        self.feed_forward = PositionwiseFeedForward(d_model, d_ff, dropout, activation)
        self.residual_self = ResidualNorm(d_model, dropout, norm_first)
        self.residual_cross = ResidualNorm(d_model, dropout, norm_first)
        self.residual_ffn = ResidualNorm(d_model, dropout, norm_first)

    def forward(
        self,
        x: torch.Tensor,
        memory: torch.Tensor,
        src_mask: torch.Tensor | None = None,
        tgt_mask: torch.Tensor | None = None,
        self_cache: AttentionCache | None = None,
        cross_cache: AttentionCache | None = None,
    ) -> torch.Tensor:
        x = self.residual_self(x, lambda h: self.self_attn(h, h, h, tgt_mask, self_cache))  # (B, T, d_model)
        x = self.residual_cross(
            x, lambda h: self.cross_attn(h, memory, memory, src_mask, cross_cache)
        )  # (B, T, d_model)
        return self.residual_ffn(x, self.feed_forward)  # (B, T, d_model)
