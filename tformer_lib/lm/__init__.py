"""仅解码器语言模型（第 9–10 章）：配置、模型、K/V 缓存、生成、训练与随书检查点。"""

from .cache import LMCache
from .config import LMConfig
from .model import DecoderOnlyBlock, DecoderOnlyLM, make_lm
from .generate import filter_top_k, filter_top_p, generate, next_token_distribution
from .reference import TorchEncoderLM, torch_twin
