"""语言模型的配置（configuration）：一个数据类写清仅解码器（decoder-only）模型的全部超参数。"""

import math
from dataclasses import asdict, dataclass

from .._checks import finite_positive, non_negative_int, positive_int
from ..parts.norms import NORM_KINDS
from ..parts.rope_scaling import RopeScaling, rope_frequencies
from ..specials import PAD

POSITIONAL_KINDS = ("learned", "sinusoidal", "rope", "alibi", "none")
ACTIVATIONS = ("relu", "gelu", "gelu_tanh", "swiglu")


@dataclass
class LMConfig:
    """GPT 式语言模型的超参数；默认值是一个能在 CPU 上几分钟训完的小模型。

    与编码器–解码器的 :class:`~tformer_lib.TransformerConfig` 不同，这里默认前置归一化（pre-LN）、
    GELU 与权重共享（weight tying）——GPT-2 以来语言模型的常见做法；第 10 章逐项比较这些选择。
    """

    vocab_size: int  # 词表大小 V
    d_model: int = 128  # 模型维度
    n_heads: int = 4  # 查询头数 h；每头 d_k = d_model / h
    n_kv_heads: int | None = None  # K/V 头数（GQA）；None = n_heads（普通 MHA），1 = 多查询注意力 MQA
    n_layers: int = 4  # 块数 N
    d_ff: int = 512  # 前馈网络隐藏层维度（SwiGLU 时是每个分支的维度）
    max_len: int = 128  # 上下文长度（context length）：一次最多看多少个词元
    positional: str = "learned"  # "learned" | "sinusoidal" | "rope" | "alibi"（第 16 章）| "none"
    norm: str = "layer"  # "layer" = LayerNorm | "rms" = RMSNorm
    norm_first: bool = True  # True = pre-LN（默认）；False = post-LN（论文）
    activation: str = "gelu"  # "relu" | "gelu"（精确）| "gelu_tanh"（tanh 近似，GPT-2）| "swiglu"
    tie_embeddings: bool = True  # 输出层与词嵌入共享同一个矩阵
    dropout: float = 0.0  # 残差、注意力与嵌入上的 dropout
    rope_base: float = 10000.0  # RoPE 的 θ_i = base^{-2i/d_k}
    rope_scaling: RopeScaling | None = None  # RoPE 缩放（第 16 章：PI / NTK / YaRN）；也可给它的字典；None = 不缩放
    fast_attention: bool = False  # True 时用 F.scaled_dot_product_attention（不保留注意力权重）
    pad_id: int = PAD  # 填充词元 id；训练时不计入损失
    qkv_bias: bool = True  # W^Q、W^K、W^V 带偏置（GPT-2、Qwen2 有；LLaMA、Mistral 没有）
    out_bias: bool = True  # W^O 带偏置（GPT-2 有；LLaMA、Qwen2、Mistral 没有）
    ffn_bias: bool = True  # 前馈网络的线性层带偏置（GPT-2 有；LLaMA、Qwen2、Mistral 没有）
    norm_eps: float = 1e-5  # 归一化分母里的 ε（LayerNorm/RMSNorm；各家模型取值不同，如 1e-5、1e-6）
    # 混合专家（第 16 章，tformer_lib.moe）：moe_experts = 0 时每块是普通的稠密 FFN，以下各项不起作用
    moe_experts: int = 0  # 每块的专家数 E；> 0 时 FFN 换成 MoEFeedForward，每个专家宽 d_ff
    moe_top_k: int = 2  # 每个词元走几个专家 k
    moe_capacity_factor: float | None = None  # 容量因子 c（训练时每专家最多 ⌈c·N·k/E⌉ 份任务）；None = 不丢词元
    moe_renormalize: bool = True  # top-k 的权重重新归一到和为 1（Mixtral）；False = 保留 softmax 原值（Switch）
    moe_shared_experts: int = 0  # 共享专家个数（DeepSeek-MoE）；人人都走
    moe_aux_weight: float = 0.01  # 负载均衡损失的权重 α（Switch Transformer 的取值）
    moe_z_weight: float = 0.0  # 路由器 z 损失的权重（ST-MoE 取 0.001）

    def __post_init__(self):
        for name in ("vocab_size", "d_model", "n_heads", "n_layers", "d_ff", "max_len"):
            positive_int(name, getattr(self, name))
        if self.d_model % self.n_heads != 0:
            raise ValueError(f"d_model={self.d_model} 不能被 n_heads={self.n_heads} 整除")
        if self.n_kv_heads is not None:
            positive_int("n_kv_heads", self.n_kv_heads)
            if self.n_heads % self.n_kv_heads != 0:
                raise ValueError(f"n_heads={self.n_heads} 不能被 n_kv_heads={self.n_kv_heads} 整除")
        for name, kinds in (("positional", POSITIONAL_KINDS), ("norm", NORM_KINDS), ("activation", ACTIVATIONS)):
            if getattr(self, name) not in kinds:
                raise ValueError(f"{name} 应是 {kinds} 之一，收到 {getattr(self, name)!r}")
        if self.positional == "rope" and self.d_k % 2 != 0:
            raise ValueError(f"positional='rope' 要求每头维度 d_k 为偶数，收到 d_k={self.d_k}")
        if isinstance(self.dropout, bool) or not isinstance(self.dropout, (int, float)) or not 0 <= self.dropout < 1:
            raise ValueError(f"dropout 应是 [0, 1) 内的数，收到 {self.dropout!r}")
        finite_positive("norm_eps", self.norm_eps)
        finite_positive("rope_base", self.rope_base)
        if self.rope_scaling is not None:
            self.rope_scaling = RopeScaling.from_dict(self.rope_scaling)  # 检查点里存的是字典
            if self.positional != "rope":
                raise ValueError(f"rope_scaling 只用于 positional='rope'，收到 positional={self.positional!r}")
            rope_frequencies(self.d_k, self.rope_base, self.rope_scaling)  # 现在就检查（如 base ≤ 1、ntk 要 d_k ≥ 4）
        for name in ("norm_first", "tie_embeddings", "fast_attention", "qkv_bias", "out_bias", "ffn_bias"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"{name} 应是 bool，收到 {getattr(self, name)!r}")
        self._check_moe()
        if non_negative_int("pad_id", self.pad_id) >= self.vocab_size:
            raise ValueError(f"pad_id={self.pad_id!r} 应是词表 [0, {self.vocab_size}) 内的整数 id")

    def _check_moe(self) -> None:
        non_negative_int("moe_experts", self.moe_experts)
        non_negative_int("moe_shared_experts", self.moe_shared_experts)
        positive_int("moe_top_k", self.moe_top_k)
        if self.moe_experts and self.moe_top_k > self.moe_experts:
            raise ValueError(f"moe_top_k={self.moe_top_k} 不能大于专家数 moe_experts={self.moe_experts}")
        if self.moe_capacity_factor is not None:
            finite_positive("moe_capacity_factor", self.moe_capacity_factor)
        if not isinstance(self.moe_renormalize, bool):
            raise TypeError(f"moe_renormalize 应是 bool，收到 {self.moe_renormalize!r}")
        for name in ("moe_aux_weight", "moe_z_weight"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
                raise ValueError(f"{name} 应是 ≥ 0 的有限数，收到 {value!r}")

    @property
    def d_k(self) -> int:
        """每个头的维度 d_k = d_model / h。"""
        return self.d_model // self.n_heads

    @property
    def kv_heads(self) -> int:
        """实际的 K/V 头数（``n_kv_heads`` 为 None 时等于 ``n_heads``）。"""
        return self.n_heads if self.n_kv_heads is None else self.n_kv_heads

    def to_dict(self) -> dict:
        """转成只含基本类型的字典（写入检查点时用）。"""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "LMConfig":
        """从 :meth:`to_dict` 的结果还原；未知字段给出清楚的错误。

        旧检查点的字典里没有后来加的字段（``qkv_bias``、``out_bias``、``ffn_bias``、``norm_eps``），
        这些取默认值——正是加字段之前模型的样子（``moe_*`` 的默认值就是稠密 FFN）。
        """
        unknown = set(data) - set(cls.__dataclass_fields__)
        if unknown:
            raise ValueError(f"LMConfig 没有这些字段：{sorted(unknown)}")
        return cls(**data)
