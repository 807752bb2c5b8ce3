"""完整的编码器–解码器 Transformer：编码器栈、解码器栈、输出层与工厂函数 ``make_model``。"""

import torch
from torch import nn

from .._checks import bool_mask, flag, last_dim, non_empty_sequence, same_batch, tensor_with_dim
from ..parts.attention import MultiHeadAttention
from ..parts.embedding import TokenEmbedding
from ..parts.kv_cache import KVCache
from ..parts.layers import DecoderLayer, EncoderLayer
from ..parts.masks import causal_mask, combine_masks, padding_mask
from ..parts.positional import LearnedPositionalEmbedding, NoPositionalEncoding, SinusoidalPositionalEncoding
from .config import TransformerConfig


class Encoder(nn.Module):
    """编码器栈：N 个编码器层；pre-LN 时末尾再加一个 LayerNorm（post-LN 每层已归一化，不需要）。"""

    def __init__(self, layers: list[EncoderLayer], d_model: int, norm_first: bool):
        super().__init__()
        self.layers = nn.ModuleList(layers)
        self.norm = nn.LayerNorm(d_model) if norm_first else nn.Identity()

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x, mask)  # (B, S, d_model)
        return self.norm(x)


class Decoder(nn.Module):
    """解码器栈：N 个解码器层；pre-LN 时末尾再加一个 LayerNorm。"""

    def __init__(self, layers: list[DecoderLayer], d_model: int, norm_first: bool):
        super().__init__()
        self.layers = nn.ModuleList(layers)
        self.norm = nn.LayerNorm(d_model) if norm_first else nn.Identity()

    def forward(self, x, memory, src_mask=None, tgt_mask=None, cache: KVCache | None = None) -> torch.Tensor:
        for i, layer in enumerate(self.layers):
            self_cache = cache.self_attn[i] if cache is not None else None
            cross_cache = cache.cross_attn[i] if cache is not None else None
            x = layer(x, memory, src_mask, tgt_mask, self_cache, cross_cache)  # (B, T, d_model)
        return self.norm(x)


class Generator(nn.Module):
    """输出层：线性层把 d_model 维隐藏状态映射成词表上的分数（logits）；softmax 留给损失或解码。"""

    def __init__(self, d_model: int, vocab_size: int):
        super().__init__()
        self.proj = nn.Linear(d_model, vocab_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(x)  # (B, T, V)


def _positional(config: TransformerConfig) -> nn.Module:
    if config.positional == "sinusoidal":
        return SinusoidalPositionalEncoding(config.d_model, config.max_len, config.dropout)
    if config.positional == "learned":
        return LearnedPositionalEmbedding(config.d_model, config.max_len, config.dropout)
    return NoPositionalEncoding(config.dropout)


class Transformer(nn.Module):
    """编码器–解码器 Transformer（论文图 1），batch-first。

    - ``encode(src)``：编码器只跑一次，得到 memory ``(B, S, d_model)``；
    - ``decode(memory, tgt_in)``：解码器读入已生成的目标前缀，得到隐藏状态 ``(B, T, d_model)``；
    - ``forward(src, tgt_in)``：两者串起来再接输出层，返回 logits ``(B, T, V_tgt)``。
    """

    def __init__(self, config: TransformerConfig):
        super().__init__()
        c = self.config = config
        layer_args = (c.d_model, c.n_heads, c.d_ff, c.dropout, c.activation, c.norm_first, c.fast_attention)
        self.src_embed = TokenEmbedding(c.src_vocab_size, c.d_model)
        self.tgt_embed = TokenEmbedding(c.tgt_vocab_size, c.d_model)
        self.src_pos = _positional(c)
        self.tgt_pos = _positional(c)
        self.encoder = Encoder([EncoderLayer(*layer_args) for _ in range(c.n_encoder_layers)], c.d_model, c.norm_first)
        self.decoder = Decoder([DecoderLayer(*layer_args) for _ in range(c.n_decoder_layers)], c.d_model, c.norm_first)
        self.generator = Generator(c.d_model, c.tgt_vocab_size)
        self._init_parameters()
        if c.share_embeddings:
            self.tgt_embed.lut.weight = self.src_embed.lut.weight
        if c.tie_embeddings:
            self.generator.proj.weight = self.tgt_embed.lut.weight

    def _init_parameters(self) -> None:
        """矩阵参数用 Xavier 均匀初始化（与 torch.nn.Transformer 相同），偏置与 LayerNorm 保持默认。"""
        for p in self.parameters():
            if p.dim() > 1:
                nn.init.xavier_uniform_(p)

    @staticmethod
    def _check_tokens(name: str, tokens: torch.Tensor) -> None:
        tensor_with_dim(name, tokens, 2, "(B, T) of token ids")
        non_empty_sequence(name, tokens, seq_dim=1)

    def _check_cache(self, cache) -> None:
        if not isinstance(cache, KVCache):
            raise TypeError(f"cache 应是 model.new_cache() 创建的 KVCache，收到 {type(cache).__name__}")
        n_layers = len(self.decoder.layers)
        if len(cache.self_attn) != n_layers or len(cache.cross_attn) != n_layers:
            raise ValueError(
                f"cache 有 {len(cache.self_attn)} 层，但解码器有 {n_layers} 层：请用 model.new_cache() 新建缓存"
            )

    def encode(self, src: torch.Tensor, src_mask: torch.Tensor | None = None) -> torch.Tensor:
        """源序列 ``(B, S)`` → memory ``(B, S, d_model)``；默认掩码为源端的填充掩码。"""
        self._check_tokens("src", src)
        if src_mask is None:
            src_mask = padding_mask(src, self.config.pad_id)  # (B, 1, 1, S)
        else:
            B, S = src.shape
            bool_mask("src_mask", src_mask, (B, self.config.n_heads, S, S))
        return self.encoder(self.src_pos(self.src_embed(src, name="src")), src_mask)

    def decode(
        self,
        memory: torch.Tensor,
        tgt_in: torch.Tensor,
        src_mask: torch.Tensor | None = None,
        tgt_mask: torch.Tensor | None = None,
        cache: KVCache | None = None,
    ) -> torch.Tensor:
        """目标前缀 ``(B, T)`` 与 memory → 隐藏状态 ``(B, T, d_model)``。

        ``src_mask`` 应与 :meth:`encode` 用的一致（交叉注意力据此忽略源端填充）；
        ``tgt_mask`` 默认为填充掩码与因果掩码的合并。
        给出 ``cache``（由 :meth:`new_cache` 创建）时，``tgt_in`` 只放新的词元，位置从 ``cache.length`` 接着数；
        此时默认掩码只含因果部分（缓存里的前缀被视为真实词元）。
        """
        self._check_tokens("tgt_in", tgt_in)
        tensor_with_dim("memory", memory, 3, "(B, S, d_model)")
        last_dim("memory", memory, self.config.d_model, "模型的 d_model")
        if cache is not None:
            self._check_cache(cache)
        cross_k = cache.cross_attn[0].k if cache is not None else None
        if cross_k is None:  # 有缓存且交叉注意力的 K/V 已算好时，memory 不再被读取（束搜索时批大小可以不同）
            same_batch(("tgt_in", tgt_in), ("memory", memory))
        else:
            same_batch(("tgt_in", tgt_in), ("cache", cross_k))
        if src_mask is not None:
            bool_mask("src_mask", src_mask, (tgt_in.shape[0], self.config.n_heads, tgt_in.shape[1], memory.shape[1]))
        start = cache.length if cache is not None else 0
        if tgt_mask is None:
            length = tgt_in.shape[1]
            causal = causal_mask(start + length, device=tgt_in.device)[start:]  # (T_new, start + T_new)
            tgt_mask = causal if cache is not None else combine_masks(padding_mask(tgt_in, self.config.pad_id), causal)
        x = self.tgt_pos(self.tgt_embed(tgt_in, name="tgt_in"), start=start)  # (B, T, d_model)
        hidden = self.decoder(x, memory, src_mask, tgt_mask, cache)
        if cache is not None:
            cache.length += tgt_in.shape[1]
        return hidden

    def forward(
        self,
        src: torch.Tensor,
        tgt_in: torch.Tensor,
        src_mask: torch.Tensor | None = None,
        tgt_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """``src`` ``(B, S)``、``tgt_in`` ``(B, T)`` → logits ``(B, T, V_tgt)``（未经 softmax）。"""
        self._check_tokens("src", src)
        self._check_tokens("tgt_in", tgt_in)
        same_batch(("src", src), ("tgt_in", tgt_in))
        if src_mask is None:
            src_mask = padding_mask(src, self.config.pad_id)  # (B, 1, 1, S)
        memory = self.encode(src, src_mask)
        return self.generator(self.decode(memory, tgt_in, src_mask, tgt_mask))

    def new_cache(self) -> KVCache:
        """为增量解码新建一个空的 K/V 缓存。"""
        return KVCache(len(self.decoder.layers))

    def set_fast_attention(self, fast: bool) -> None:
        """在显式路径（返回权重）与快速路径之间切换所有注意力模块。"""
        flag("fast", fast)
        self.config.fast_attention = bool(fast)
        for module in self.modules():
            if isinstance(module, MultiHeadAttention):
                module.fast = bool(fast)

    def attention_weights(self) -> dict[str, list[torch.Tensor | None]]:
        """最近一次前向的注意力权重，按层列出，每个 ``(B, h, T_q, T_k)``（快速路径下为 None）。"""
        return {
            "encoder_self": [layer.self_attn.attn_weights for layer in self.encoder.layers],
            "decoder_self": [layer.self_attn.attn_weights for layer in self.decoder.layers],
            "decoder_cross": [layer.cross_attn.attn_weights for layer in self.decoder.layers],
        }


def make_model(config: TransformerConfig) -> Transformer:
    """按配置搭出一个初始化好的 Transformer。"""
    if not isinstance(config, TransformerConfig):
        raise TypeError(f"config 应是 TransformerConfig，收到 {type(config).__name__}")
    return Transformer(config)


def count_parameters(module: nn.Module, trainable_only: bool = True) -> int:
    """参数总数；共享的权重只算一次。"""
    return sum(p.numel() for p in module.parameters() if p.requires_grad or not trainable_only)
