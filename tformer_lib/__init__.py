"""tformer_lib：《Transformer 原理深讲》的随书库。

书中每一章都从这里导入模型部件，不在笔记本里另写一份。
"""

#: 包的版本号（pyproject.toml 从这里读取，只写一处）
__version__ = "0.1.0"

# --- core model ---
from .parts.attention import MultiHeadAttention, fast_scaled_dot_product_attention, scaled_dot_product_attention
from .parts.embedding import TokenEmbedding
from .parts.feedforward import PositionwiseFeedForward
from .parts.kv_cache import AttentionCache, KVCache
from .parts.layers import DecoderLayer, EncoderLayer, ResidualNorm
from .parts.masks import causal_mask, combine_masks, padding_mask, target_mask
from .parts.norms import RMSNorm, make_norm
from .translation.config import TransformerConfig
from .translation.model import Decoder, Encoder, Generator, Transformer, count_parameters, make_model
from .parts.positional import (
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

# --- plotting/widgets/exercises ---
# 绘图与控件依赖 matplotlib/ipywidgets，按需（lazy）导入，``import tformer_lib`` 不因此变慢。
_VIZ_LAZY = {
    "FONT_FAMILY": "tformer_lib.plotting",
    "register_cjk_font": "tformer_lib.plotting",
    "missing_glyphs": "tformer_lib.plotting",
    "plot_heatmap": "tformer_lib.plotting",
    "plot_attention": "tformer_lib.plotting",
    "plot_attention_grid": "tformer_lib.plotting",
    "plot_model_attention": "tformer_lib.plotting",
    "plot_mask": "tformer_lib.plotting",
    "plot_masks": "tformer_lib.plotting",
    "plot_positional_encoding": "tformer_lib.plotting",
    "plot_positional_curves": "tformer_lib.plotting",
    "plot_positional_similarity": "tformer_lib.plotting",
    "plot_positional_slice": "tformer_lib.plotting",
    "plot_softmax_temperature": "tformer_lib.plotting",
    "plot_dot_product_variance": "tformer_lib.plotting",
    "plot_scaled_attention": "tformer_lib.plotting",
    "plot_lr_schedule": "tformer_lib.plotting",
    "plot_label_smoothing": "tformer_lib.plotting",
    "plot_history": "tformer_lib.plotting",
    "make_explorer": "tformer_lib.widgets",
    "positional_encoding_explorer": "tformer_lib.widgets",
    "softmax_scaling_explorer": "tformer_lib.widgets",
    "softmax_temperature_explorer": "tformer_lib.widgets",
    "attention_explorer": "tformer_lib.widgets",
    "model_attention_explorer": "tformer_lib.widgets",
    "mask_explorer": "tformer_lib.widgets",
    "lr_schedule_explorer": "tformer_lib.widgets",
    "check_softmax": "tformer_lib.exercises",
    "check_positional_encoding": "tformer_lib.exercises",
    "show_source": "tformer_lib.notebook.source",
}


def __getattr__(name, _previous=globals().get("__getattr__")):
    if name in _VIZ_LAZY:
        import importlib

        return getattr(importlib.import_module(_VIZ_LAZY[name]), name)
    if _previous is not None:
        return _previous(name)
    raise AttributeError(f"模块 'tformer_lib' 没有属性 {name!r}")

# --- efficiency ---
from .measurement.costs import (
    attention_flops,
    attention_memory,
    decoder_layer_flops,
    encoder_layer_flops,
    encoder_layer_memory,
    feedforward_flops,
    kv_cache_bytes,
    kv_cache_bytes_per_token,
    largest_tensor_bytes,
    measure_flops,
    median_time,
    model_forward_flops,
    saved_tensor_bytes,
)
from .parts.flash import online_softmax, tiled_attention

# --- data/training/decoding ---
from .data import (
    Batch,
    ToyCorpus,
    Vocab,
    batch_iterator,
    encode_pairs,
    make_batch,
    make_copy_task,
    make_reverse_task,
    make_synthetic_splits,
    make_toy_corpus,
    mirror_sentence,
    synthetic_vocab,
    tokenize_en,
    tokenize_zh,
)
from .translation.decoding import beam_search, greedy_decode, ids_to_lists, sample_decode, sequence_log_probs, translate
from .translation.pretrained import cache_dir, load_or_train_toy_model, load_toy_data, toy_model_config

# --- Part 3: decoder-only language model ---
from .lm import DecoderOnlyLM, LMCache, LMConfig, generate, make_lm
from .training import (
    CheckpointError,
    History,
    LabelSmoothingLoss,
    Trainer,
    TrainingDivergedError,
    evaluate,
    label_smoothing_loss,
    load_checkpoint,
    load_model,
    make_optimizer,
    make_scheduler,
    noam_rate,
    save_checkpoint,
)
