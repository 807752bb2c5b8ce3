"""仅解码器语言模型（第 9–10 章）：配置、模型、K/V 缓存、生成、训练、质量度量与随书检查点。

层次（只向下依赖）：config → cache → model（由 MultiHeadAttention、FFN、ResidualNorm 搭成）→ presets / meta
（真实模型的超参数、meta 设备上搭模型与按部件数参数）→ generate →
data / quality → fused_loss → training → pretrained → cli；Hugging Face 互通（hf_weights、hf_tokenizer → hf_load、hf_save）
只依赖 config 与 model，``safetensors`` 在读写时才导入。
"""

from .cache import LMCache, lm_kv_cache_bytes_per_token
from .config import LMConfig
from .model import DecoderOnlyBlock, DecoderOnlyLM, make_lm
from .generate import filter_top_k, filter_top_p, generate, greedy_tokens, next_token_distribution
from .reference import TorchEncoderLM, torch_twin
from .data import FORM_CODES, loss_targets, pack_documents, pad_documents, poem_document, poem_prompt, stream_blocks
from .quality import (
    BigramLM,
    evaluate_poem_model,
    form_accuracy,
    lm_perplexity,
    poem_form,
    sample_poems,
    verbatim_line_rate,
)
from .fused_loss import linear_cross_entropy
from .training import LMTrainer, WarmupCosine, load_lm, make_adamw, save_lm_checkpoint
from .pretrained import POEM_RECIPE, load_poem_model, poem_data, train_poem_model
from .presets import PRESETS, PRESET_SOURCES, PUBLISHED_TRAINING_TOKENS, preset
from .meta import meta_lm, parameter_breakdown
from .hf_load import HFModel, UnsupportedHFConfig, load_hf
from .hf_save import save_hf
