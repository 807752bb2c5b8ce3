"""模型配置（configuration）：一个数据类写清所有超参数，``make_model(config)`` 据此搭出整个模型。"""

from dataclasses import asdict, dataclass

from .._checks import dropout_rate, flag, one_of, positive_int
from ..specials import PAD

POSITIONAL_KINDS = ("sinusoidal", "learned", "none")
ACTIVATIONS = ("relu", "gelu")


@dataclass
class TransformerConfig:
    """编码器–解码器 Transformer 的超参数；默认值是论文的基础模型（base model）。"""

    src_vocab_size: int  # 源语言词表大小 V_src
    tgt_vocab_size: int  # 目标语言词表大小 V_tgt
    d_model: int = 512  # 模型维度
    n_heads: int = 8  # 头数 h；每头 d_k = d_model / h
    d_ff: int = 2048  # 前馈网络隐藏层维度
    n_encoder_layers: int = 6  # 编码器层数 N
    n_decoder_layers: int = 6  # 解码器层数 N
    dropout: float = 0.1  # 论文的 P_drop
    max_len: int = 512  # 位置编码支持的最大长度
    positional: str = "sinusoidal"  # "sinusoidal" | "learned" | "none"（消融用）
    norm_first: bool = False  # False = post-LN（论文）；True = pre-LN
    activation: str = "relu"  # 前馈网络激活函数："relu" | "gelu"
    tie_embeddings: bool = False  # 输出层与目标端嵌入共享权重
    share_embeddings: bool = False  # 源端与目标端嵌入共享权重（要求两个词表相同大小）
    fast_attention: bool = False  # True 时用 F.scaled_dot_product_attention（不保留注意力权重）
    pad_id: int = PAD  # 填充词元 id，用于默认的填充掩码

    def __post_init__(self):
        for name in ("src_vocab_size", "tgt_vocab_size", "d_model", "n_heads", "d_ff",
                     "n_encoder_layers", "n_decoder_layers", "max_len"):
            positive_int(name, getattr(self, name))
        if self.d_model % self.n_heads != 0:
            raise ValueError(f"d_model={self.d_model} 不能被 n_heads={self.n_heads} 整除")
        dropout_rate("dropout", self.dropout)
        one_of("positional", self.positional, POSITIONAL_KINDS)
        one_of("activation", self.activation, ACTIVATIONS)
        for name in ("norm_first", "tie_embeddings", "share_embeddings", "fast_attention"):
            flag(name, getattr(self, name))  # 字符串 'no' 是“真值”，不检查就会悄悄打开这个开关
        if isinstance(self.pad_id, bool) or not isinstance(self.pad_id, int):
            raise TypeError(f"pad_id 应是整数，收到 {type(self.pad_id).__name__} {self.pad_id!r}")
        if self.share_embeddings and self.src_vocab_size != self.tgt_vocab_size:
            raise ValueError(
                f"share_embeddings=True 要求 src_vocab_size == tgt_vocab_size，"
                f"收到 {self.src_vocab_size} 与 {self.tgt_vocab_size}"
            )
        if not 0 <= self.pad_id < min(self.src_vocab_size, self.tgt_vocab_size):
            raise ValueError(f"pad_id={self.pad_id} 应是两个词表里都合法的 id（0 ≤ pad_id < min(src_vocab_size, tgt_vocab_size)）")

    @property
    def d_k(self) -> int:
        """每个头的维度 d_k = d_model / h。"""
        return self.d_model // self.n_heads

    def to_dict(self) -> dict:
        """转成只含基本类型的字典（写入检查点时用）。"""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "TransformerConfig":
        """从 :meth:`to_dict` 的结果还原；未知字段给出清楚的错误。"""
        unknown = set(data) - set(cls.__dataclass_fields__)
        if unknown:
            raise ValueError(f"data 含有 TransformerConfig 没有的字段：{sorted(unknown)}")
        return cls(**data)
