r"""一个训练步的内存账本（memory account）：参数、梯度、优化器状态、激活，以及“每个参数占几个字节”。

训练时内存分两大块：

* **模型状态**（model states），与批大小无关：参数 Ψ 个，梯度 Ψ 个，Adam 的一阶矩 m 与二阶矩 v 各 Ψ 个。
  全 float32 训练每个参数 4 + 4 + 4 + 4 = **16 字节**。ZeRO 论文（Rajbhandari et al., 2020）式的混合精度
  （mixed precision）把参数与梯度存成 16 位（2 + 2 字节），但另要一份 float32 的主权重（master weights, 4 字节）
  和 float32 的 m、v（4 + 4）——合计还是 **16 字节**：混合精度省下的不是模型状态，而是激活与算力。
  PyTorch 的 ``torch.autocast`` 更简单：参数、梯度、m、v 都仍是 float32（16 字节），只在算子里临时转成 16 位。
* **激活**（activations）：前向传播为反向传播保存下来的张量，随批大小 B 与长度 T 增长；
  :func:`lm_activation_bytes` 逐项列出仅解码器模型保存的每一个张量（公式与 :func:`measure_activation_bytes`
  的实测逐字节相等，测试保证）。

记号同 :mod:`tformer_lib.measurement.costs`：B 批大小，T 长度，d = d_model，h 头数，d_k = d/h，d_ff，V 词表大小，N 层数。
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .._checks import positive_int
from .costs import attention_memory, saved_tensor_bytes

__all__ = [
    "BYTES_PER_PARAMETER",
    "parameter_count",
    "model_state_bytes",
    "measured_model_state_bytes",
    "lm_activation_bytes",
    "measure_activation_bytes",
    "training_memory",
    "training_step_memory",
    "KORTHIKANTI_RECOMPUTE",
    "korthikanti_activation_bytes",
]

#: 每个参数占的字节：全 float32、torch.autocast（权重仍是 float32）、ZeRO 式混合精度（16 位权重 + float32 主权重）。
BYTES_PER_PARAMETER = {
    "fp32": {"params": 4, "grads": 4, "master": 0, "adam_m": 4, "adam_v": 4},
    "autocast": {"params": 4, "grads": 4, "master": 0, "adam_m": 4, "adam_v": 4},
    "mixed": {"params": 2, "grads": 2, "master": 4, "adam_m": 4, "adam_v": 4},
}

_INT64, _BOOL, _FP32 = 8, 1, 4
#: 前馈网络为反向保存几份 (B, T, d_ff)：ReLU 只存输出；GELU（精确或 tanh 近似）存输入与输出；SwiGLU 存四份
_FFN_SAVED_COPIES = {"relu": 1, "gelu": 2, "gelu_tanh": 2, "swiglu": 4}


def parameter_count(model: nn.Module) -> int:
    """参数个数 Ψ；共享的张量（如权重共享的词嵌入与输出层）只算一次。"""
    if not isinstance(model, nn.Module):
        raise TypeError(f"model 应是 nn.Module，收到 {type(model).__name__}")
    return sum(p.numel() for p in model.parameters())  # model.parameters() 已对同一个 Parameter 去重


def model_state_bytes(n_params: int, precision: str = "fp32") -> dict[str, int]:
    """Ψ 个参数的模型状态字节数，按部分列出（``params``、``grads``、``master``、``adam_m``、``adam_v``），
    另含 ``"total"`` 与 ``"bytes_per_parameter"``。``precision`` 是 :data:`BYTES_PER_PARAMETER` 的键之一。"""
    positive_int("n_params", n_params)
    if precision not in BYTES_PER_PARAMETER:
        raise ValueError(f"precision 应是 {tuple(BYTES_PER_PARAMETER)} 之一，收到 {precision!r}")
    per = BYTES_PER_PARAMETER[precision]
    parts = {name: n_params * b for name, b in per.items()}
    parts["total"] = sum(parts.values())
    parts["bytes_per_parameter"] = sum(per.values())
    return parts


def measured_model_state_bytes(model: nn.Module, optimizer: torch.optim.Optimizer | None = None) -> dict[str, int]:
    """PyTorch 实际持有的模型状态字节数：参数、``.grad``、优化器状态里的每个张量（Adam 的 ``exp_avg``、
    ``exp_avg_sq``，以及每个参数张量一个 0 维的 ``step`` 计数）。同一块存储只算一次。"""
    if not isinstance(model, nn.Module):
        raise TypeError(f"model 应是 nn.Module，收到 {type(model).__name__}")
    params = list(model.parameters())
    out = {
        "params": sum(p.untyped_storage().nbytes() for p in params),
        "grads": sum(p.grad.untyped_storage().nbytes() for p in params if p.grad is not None),
        "adam_m": 0,
        "adam_v": 0,
        "step": 0,
        "other": 0,
    }
    if optimizer is not None:
        names = {"exp_avg": "adam_m", "exp_avg_sq": "adam_v", "step": "step"}
        for state in optimizer.state.values():
            for key, value in state.items():
                if isinstance(value, torch.Tensor):
                    out[names.get(key, "other")] += value.untyped_storage().nbytes()
    out["total"] = sum(out.values())
    return out


def _norm_bytes(kind: str, btd: int, bt: int, e: int) -> int:
    """一个归一化层为反向保存的字节：LayerNorm 存输入与每位置的均值、1/标准差（float32）；
    RMSNorm 存输入、1/均方根与归一化后的 x（乘 γ 要用）。"""
    if kind == "layer":
        return btd * e + 2 * bt * _FP32  # x (B, T, d) + 均值、1/标准差 各 (B, T, 1)
    return 2 * btd * e + bt * _FP32  # x、x/rms 各 (B, T, d) + 1/rms (B, T, 1)


def sdpa_kv_bytes(config, bt: int, e: int) -> int:
    """快速路径为反向保存的 k（或 v）一份的字节：SDPA 按组读时只有 ``(B, h_kv, T, d_k)``，否则是复制后的 ``(B, h, T, d_k)``。"""
    from ..parts.attention import SDPA_HAS_GQA

    heads = config.kv_heads if SDPA_HAS_GQA else config.n_heads
    return bt * heads * config.d_k * e


def concat_copies(config, length: int) -> bool:
    """快速路径拼接各头时是否复制：RoPE 旋转出的 q 是连续的 ``(B, h, T, d_k)``，SDPA 的输出随它，换回 ``(B, T, d)``
    要复制——除非 T = 1 或 h = 1（那时转置不改变内存布局）。没有 RoPE 时 q 是转置视图，拼接与输出共用存储。"""
    return config.positional == "rope" and length > 1 and config.n_heads > 1


def lm_activation_bytes(
    config, batch: int, length: int, bytes_per_element: int = 4, checkpointing: bool = False
) -> dict[str, int]:
    r"""仅解码器语言模型（:class:`~tformer_lib.lm.LMConfig`）一次“前向 + 交叉熵”为反向保存的激活字节数。

    返回的字典按部分列出（每块的项已乘以 N 层），另含 ``"per_block"`` 与 ``"total"``：

    * ``embedding``：词元 id ``(B, T)`` int64（查表的反向要用），可学习位置编码另存位置 ``(T,)``；
    * ``norms``：每块两个归一化（见 :func:`_norm_bytes`），pre-LN 另加末层归一化；
    * ``linear_inputs``：每块送进 W^Q/W^K/W^V（共用一份）与 W_1 的输入、再加输出层的输入，各 ``(B, T, d)``；
    * ``attention``：显式路径即 :func:`~tformer_lib.measurement.costs.attention_memory` 的六项——q、k、v、softmax 输出
      ``(B, h, T, T)``、掩码置零后的权重（与分数同形）、拼接后的输出——再加两个 ``(T, T)`` 布尔掩码；
      快速路径（SDPA）不存 ``(B, h, T, T)``，只存 q、k、v、输出、拼接结果、每行的 logsumexp ``(B, h, T)``
      （因果掩码交给 SDPA 的 ``is_causal``，不造掩码张量）。SDPA 的输出沿用 q 的内存布局：没有 RoPE 时 q 是
      ``(B, T, h, d_k)`` 的转置视图，输出换回 ``(B, T, d)`` 不必复制，拼接结果与输出共用一份存储；RoPE 旋转出的
      q 是连续的 ``(B, h, T, d_k)``，拼接要复制一份（T = 1 或 h = 1 时转置不改变布局，不必复制；测试实测）；
    * ``rope``：RoPE 的 cos、sin 表 ``(T, d_k/2)`` 各一份——各层的 q、k 共用同一张表，只存一次
      （激活重算时为 0：表是块内的旋转为反向保存的，随块内的激活一起不存）；
    * ``ffn``：ReLU 存 1 份 ``(B, T, d_ff)``，GELU 2 份（输入与输出），SwiGLU 4 份；
    * ``loss``：log_softmax 的输出 ``(B·T, V)`` float32、目标 ``(B·T,)`` int64 与一个标量。

    ``checkpointing=True``（激活重算，:meth:`~tformer_lib.lm.DecoderOnlyLM.set_activation_checkpointing`）时，
    块内的四项都不再保存，每块只存它的输入 ``(B, T, d)``（``block_inputs``）；反向时一次重算一块，
    所以峰值再加一块的量 ``"recompute_peak"``（= ``"per_block"``，RoPE 时再加那张 cos/sin 表；不计入 ``"total"``）。

    前提：dropout 为 0（否则还要存随机掩码）、输入是连续张量。分组查询注意力（GQA，``n_kv_heads`` < h）：
    快速路径把分组交给 SDPA 的 ``enable_gqa``（torch ≥ 2.5），保存的 k、v 只有 ``(B, h_kv, T, d_k)``；显式路径在打分前
    把每个 K/V 头复制给同组的查询头（``repeat_interleave``），保存的是复制后的 ``(B, h, T, d_k)``，与普通多头注意力
    相同（两者都由测试实测核对）。
    参数不计（它们本来就在内存里）。注意：显式路径的 ``MultiHeadAttention`` 还把最近一次的注意力权重
    ``(B, h, T, T)`` 留在 ``attn_weights`` 里供画图——它与 softmax 的输出共用存储，不重算时不另占内存，
    但打开激活重算后每层仍留着一份，这里不计；要省这部分，训练时用快速路径（``fast_attention=True``）。
    """
    from ..lm.config import LMConfig

    if not isinstance(config, LMConfig):
        raise TypeError(f"config 应是 LMConfig，收到 {type(config).__name__}")
    for name, value in (("batch", batch), ("length", length), ("bytes_per_element", bytes_per_element)):
        positive_int(name, value)
    if config.dropout != 0:
        raise ValueError(f"公式只覆盖 dropout=0（dropout 还会保存随机掩码），收到 dropout={config.dropout}")
    if config.activation not in _FFN_SAVED_COPIES:
        raise ValueError(f"公式覆盖的激活函数是 {tuple(_FFN_SAVED_COPIES)}，收到 activation={config.activation!r}")
    c, e, B, T = config, bytes_per_element, batch, length
    bt, btd = B * T, B * T * c.d_model
    embedding = bt * _INT64 + (T * _INT64 if c.positional == "learned" else 0)
    block_norms = 2 * _norm_bytes(c.norm, btd, bt, e)
    block_inputs = 2 * btd * e  # 归一化后送进 W^Q/W^K/W^V 与 W_1 的输入
    if c.fast_attention:
        # q、k、v、输出、拼接 + lse；没有 RoPE 时输出与拼接共用一份存储（见文档字符串）；GQA 的 k、v 只有 h_kv 个头
        attn = (3 if concat_copies(c, T) else 2) * btd * e + 2 * sdpa_kv_bytes(c, bt, e) + B * c.n_heads * T * _FP32
    else:
        parts = attention_memory(B, T, T, c.d_model, c.n_heads, e)
        attn = sum(parts.values()) + 2 * T * T * _BOOL  # 两处 ~mask
    ffn = _FFN_SAVED_COPIES[c.activation] * bt * c.d_ff * e
    per_block = {"norms": block_norms, "linear_inputs": block_inputs, "attention": attn, "ffn": ffn}
    final_norm = _norm_bytes(c.norm, btd, bt, e) if c.norm_first else 0
    kept = 0 if checkpointing else c.n_layers  # 激活重算时块内一项都不保存
    # RoPE 的 cos、sin 各 (T, d_k/2)，各层共用；重算时它们由块内的旋转保存，随块一起不存
    rope_tables = 2 * T * (c.d_k // 2) * e if c.positional == "rope" else 0
    out = {
        "embedding": embedding,
        "norms": kept * block_norms + final_norm,
        "linear_inputs": kept * block_inputs + btd * e,  # + 输出层的输入
        "attention": kept * attn,
        "ffn": kept * ffn,
        "loss": bt * c.vocab_size * _FP32 + bt * _INT64 + _FP32,
        "rope": 0 if checkpointing else rope_tables,
    }
    if checkpointing:
        out["block_inputs"] = c.n_layers * btd * e
    out["total"] = sum(out.values())
    out["per_block"] = sum(per_block.values())
    if checkpointing:
        out["recompute_peak"] = out["per_block"] + rope_tables  # 重算的那一块又存下 cos、sin 表
    return out


def lm_loss(model, tokens: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    logits = model(tokens)  # (B, T, V)
    return F.cross_entropy(logits.flatten(0, 1), targets.flatten(), ignore_index=model.config.pad_id)


def measure_activation_bytes(model: nn.Module, tokens: torch.Tensor, targets: torch.Tensor) -> int:
    """实测：运行一次 ``model(tokens)`` + 交叉熵，返回 autograd 保存的张量字节数（参数除外，同一存储只算一次）。

    用 ``torch.autograd.graph.saved_tensors_hooks`` 截获每个被保存的张量（见
    :func:`~tformer_lib.measurement.costs.saved_tensor_bytes`）。在当前的 autocast 与激活重算设置下测量。
    """
    params = tuple(model.parameters())
    return saved_tensor_bytes(lambda: lm_loss(model, tokens, targets), exclude=params)


def training_memory(
    n_params: int, config, batch: int, length: int, precision: str = "fp32", checkpointing: bool = False,
    bytes_per_element: int = 4,
) -> dict[str, int]:
    """一个训练步的完整账本（只看参数个数与配置，不必建模型）：模型状态（:func:`model_state_bytes`，按
    ``precision``）+ 激活（:func:`lm_activation_bytes`，每个元素 ``bytes_per_element`` 字节）。

    返回 ``params``、``grads``、``master``、``adam_m``、``adam_v``、``activations`` 与 ``total``；
    打开 ``checkpointing`` 时另含 ``recompute_peak``（反向时重算一块的量，不计入 ``total``）。
    """
    states = model_state_bytes(n_params, precision)
    acts = lm_activation_bytes(config, batch, length, bytes_per_element, checkpointing=checkpointing)
    out = {k: v for k, v in states.items() if k not in ("total", "bytes_per_parameter")}
    out["activations"] = acts["total"]
    out["total"] = states["total"] + acts["total"]
    if checkpointing:
        out["recompute_peak"] = acts["recompute_peak"]
    return out


def training_step_memory(
    model: nn.Module, batch: int, length: int, precision: str = "fp32", checkpointing: bool = False
) -> dict[str, int]:
    """一个训练步的完整账本（公式）：模型状态（按 ``precision``）+ 激活（fp32 模型，:func:`lm_activation_bytes`）。"""
    return training_memory(parameter_count(model), model.config, batch, length, precision, checkpointing)


#: :func:`korthikanti_activation_bytes` 认得的三种重算方式
KORTHIKANTI_RECOMPUTE = ("none", "selective", "full")


def korthikanti_activation_bytes(config, batch: int, length: int, recompute: str = "none") -> dict[str, int]:
    r"""Korthikanti et al. (2022, *Reducing Activation Recomputation in Large Transformer Models*, 第 4 节与表 2)
    的每层激活公式（不做张量/序列并行，t = 1），记号 s = 长度、b = 微批大小、h = d_model、a = 头数、L = 层数：

    * ``"none"``：每层 :math:`sbh\,(34 + 5as/h)` 字节；
    * ``"selective"``（只重算注意力里 softmax、dropout 与 QKᵀ/AV 那些随 s² 增长的部分）：:math:`34\,sbh`；
    * ``"full"``（整层重算，只存每层的输入）：:math:`2\,sbh`。

    论文的前提：16 位激活（2 字节）、dropout 掩码 1 字节、GPT 式的块（LayerNorm、GELU、d_ff = 4h、普通多头注意力、
    保存 softmax 输出的注意力）；LayerNorm 的均值/方差这类小缓冲不计，词嵌入、末层归一化、输出层与损失也不计
    （``total`` = L × 每层）。其他结构（SwiGLU、RMSNorm、GQA、FlashAttention）套用它只是近似；本书自己的实现
    以 :func:`lm_activation_bytes` 为准（两者在随书模型上的逐项对照见测试）。
    """
    from ..lm.config import LMConfig

    if not isinstance(config, LMConfig):
        raise TypeError(f"config 应是 LMConfig，收到 {type(config).__name__}")
    positive_int("batch", batch)
    positive_int("length", length)
    if recompute not in KORTHIKANTI_RECOMPUTE:
        raise ValueError(f"recompute 应是 {KORTHIKANTI_RECOMPUTE} 之一，收到 {recompute!r}")
    s, b, h, a = length, batch, config.d_model, config.n_heads
    sbh = s * b * h
    per_layer = {"none": 34 * sbh + 5 * a * s * s * b, "selective": 34 * sbh, "full": 2 * sbh}[recompute]
    return {"per_layer": per_layer, "total": config.n_layers * per_layer}
