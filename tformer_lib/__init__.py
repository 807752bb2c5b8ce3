"""tformer_lib：《Transformer 原理深讲》的随书库。

书中每一章都从这里导入模型部件，不在笔记本里另写一份。
"""

# --- core model ---
from .attention import MultiHeadAttention, fast_scaled_dot_product_attention, scaled_dot_product_attention
from .config import TransformerConfig
from .embedding import TokenEmbedding
from .feedforward import PositionwiseFeedForward
from .kv_cache import AttentionCache, KVCache
from .layers import DecoderLayer, EncoderLayer, ResidualNorm
from .masks import causal_mask, combine_masks, padding_mask, target_mask
from .model import Decoder, Encoder, Generator, Transformer, count_parameters, make_model
from .positional import (
    LearnedPositionalEmbedding,
    NoPositionalEncoding,
    SinusoidalPositionalEncoding,
    alibi_bias,
    alibi_slopes,
    apply_rope,
    sinusoidal_positional_encoding,
)
from .seed import set_seed
from .specials import BOS, EOS, PAD, SPECIAL_TOKENS, UNK
