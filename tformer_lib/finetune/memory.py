r"""微调的内存账本：全量微调、LoRA 与 QLoRA 各要多少字节——权重、梯度、Adam 状态与激活。

全量微调（full fine-tuning）与预训练一样，每个参数 16 字节（第 11 章：权重、梯度、Adam 的 m 与 v 各 4 字节）。
LoRA 只有支路的 r·(in + out) 个参数要梯度和优化器状态；冻结的底座只占权重本身（float32 4 字节、bfloat16 2 字节，
QLoRA 的 int4 约 0.5 字节外加比例因子，:func:`~tformer_lib.quant.weight_bytes`）。

激活也变了，而且不止是“多了支路的一点”：autograd 只为**要求梯度**的输入保存反向所需的张量。冻结的线性层
``y = x Wᵀ`` 求 ∂L/∂x 只要 W（本来就在内存里），不必保存 x；冻结的词嵌入不必保存词元 id；第一块的第一个归一化
的输入不要求梯度，什么也不存。:func:`lora_activation_bytes` 沿残差流追踪“从这里往后是否要求梯度”，逐项给出
保存的字节，与 :func:`~tformer_lib.measurement.memory.measure_activation_bytes` 的实测逐字节相等（测试核对几种配置与目标组合）。
"""

from __future__ import annotations

import torch

from .._checks import one_of, positive_int
from ..measurement.memory import concat_copies, sdpa_kv_bytes, lm_activation_bytes, model_state_bytes
from ..quant.sizes import linear_shapes, parameter_count, weight_bytes
from .lora import check_targets

__all__ = ["LORA_TARGETS", "FINETUNE_METHODS", "lora_parameter_count", "lora_activation_bytes", "finetune_memory"]

#: 每块里可以加 LoRA 的线性层
LORA_TARGETS = ("w_q", "w_k", "w_v", "w_o", "w_1", "w_2", "w_3")
#: :func:`finetune_memory` 的三种方法
FINETUNE_METHODS = ("full", "lora", "qlora")

_FP32, _INT64 = 4, 8  # 均值/1/标准差、lse 是 float32；目标是 int64
_ACTIVATIONS = ("relu", "gelu", "gelu_tanh", "swiglu")  # 与 lm_activation_bytes 覆盖的相同


def _check_config(config) -> None:
    from ..lm.config import LMConfig

    if not isinstance(config, LMConfig):
        raise TypeError(f"config 应是 LMConfig（如 PRESETS['llama-2-7b']），收到 {type(config).__name__}")


def _check_targets(config, targets) -> frozenset[str]:
    targets = check_targets(targets)
    allowed = LORA_TARGETS if config.activation == "swiglu" else LORA_TARGETS[:-1]
    bad = sorted(set(targets) - set(allowed))
    if bad:
        raise ValueError(f"targets 里的 {bad} 不是这个模型每块的线性层；可选：{allowed}")
    return frozenset(targets)


def lora_parameter_count(config, rank: int, targets=("w_q", "w_v")) -> int:
    """LoRA 的可训练参数个数：每个目标层 ``r·(in + out)``，乘以层数（与 :func:`~tformer_lib.finetune.trainable_parameters` 相等）。"""
    _check_config(config)
    positive_int("rank", rank)
    chosen = _check_targets(config, targets)
    return sum(rank * (out + inp) for name, out, inp in linear_shapes(config) if name.rsplit(".", 1)[-1] in chosen)


def _norm(kind: str, btd: int, bt: int, e: int, needs_grad: bool) -> int:
    """冻结的归一化为反向保存的字节：输入不要求梯度时为 0；LayerNorm 存 x 与均值、1/标准差；
    RMSNorm 存 x 与 1/均方根（γ 冻结，不再需要 x/rms）。"""
    if not needs_grad:
        return 0
    return btd * e + (2 if kind == "layer" else 1) * bt * _FP32


def lora_activation_bytes(config, batch: int, length: int, targets=("w_q", "w_v"), rank: int = 8,
                          bytes_per_element: int = 4) -> dict[str, int]:
    r"""LoRA 微调（底座与嵌入全部冻结）一次“前向 + 交叉熵”为反向保存的激活字节，按部分列出，另含 ``"total"``。

    与全量微调（:func:`~tformer_lib.measurement.memory.lm_activation_bytes`）相比：

    * ``embedding`` 为 0：冻结的词嵌入与位置嵌入不存 id；
    * ``linear_inputs``：只有**被适配**的层要存输入（给 ∂L/∂A 用）：W^Q/W^K/W^V 共用一份，W_1（与 W_3）共用一份；
      W^O 的输入（拼接后的注意力输出）与 W_2 的输入只在它们被适配时才存；输出层冻结，不存；
    * 第一块里，残差流在遇到第一个被适配的层之前都不要求梯度：那之前的归一化、注意力、前馈都不存东西；
    * ``lora``：每个被适配的层另存支路中间的 ``(B, T, r)``（给 ∂L/∂B 用）。

    量化的底座（QLoRA）与此相同：:class:`~tformer_lib.finetune.LoRALinear` 与量化层在反向时重算反量化的权重。
    只覆盖 pre-LN、快速注意力（``fast_attention=True``）、dropout 为 0 的模型（本书的唐诗模型与各预设都是）。
    """
    _check_config(config)
    for name, value in (("batch", batch), ("length", length), ("bytes_per_element", bytes_per_element)):
        positive_int(name, value)
    if length > config.max_len:
        raise ValueError(f"length 不能超过模型的 max_len={config.max_len}，收到 {length}")
    positive_int("rank", rank)
    chosen = _check_targets(config, targets)
    if not (config.norm_first and config.fast_attention) or config.dropout != 0:
        raise ValueError("公式只覆盖 pre-LN（norm_first=True）、快速注意力（fast_attention=True）且 dropout=0 的模型，"
                         f"收到 norm_first={config.norm_first}、fast_attention={config.fast_attention}、dropout={config.dropout}")
    if config.activation not in _ACTIVATIONS:
        raise ValueError(f"公式覆盖的激活函数是 {_ACTIVATIONS}，收到 activation={config.activation!r}")
    c, e, B, T = config, bytes_per_element, batch, length
    bt, btd, btf = B * T, B * T * c.d_model, B * T * c.d_ff
    rope_tables = 2 * T * (c.d_k // 2) * e  # RoPE 的 cos、sin 表：各层共用，只存一次
    # SDPA：q、输出、k、v（GQA 时只有 h_kv 个头）+ lse（因果掩码交给 is_causal，不存）
    core = 2 * btd * e + 2 * sdpa_kv_bytes(c, bt, e) + B * c.n_heads * T * _FP32
    rope_saved = False
    has = {t: t in chosen for t in LORA_TARGETS}
    ffn_in = has["w_1"] or has["w_3"]
    parts = dict.fromkeys(("norms", "linear_inputs", "attention", "ffn", "lora"), 0)
    stream = False  # 残差流是否要求梯度：第一块的输入（冻结的嵌入）不要求
    for _ in range(c.n_layers):
        parts["norms"] += _norm(c.norm, btd, bt, e, stream)
        q, k, v = stream or has["w_q"], stream or has["w_k"], stream or has["w_v"]
        parts["linear_inputs"] += btd * e * (has["w_q"] or has["w_k"] or has["w_v"])
        # 拼接后的输出只给 W^O 的支路用；没有 RoPE 时它与 SDPA 的输出共用存储（见 lm_activation_bytes），
        # SDPA 自己存了输出（q、k、v 要梯度）就不另占
        saves_output = q or k or v
        concat = has["w_o"] and (concat_copies(c, T) or not saves_output)
        attention = (core if saves_output else 0) + btd * e * concat
        if c.positional == "rope" and (q or k) and not rope_saved:
            attention, rope_saved = attention + rope_tables, True
        parts["attention"] += attention
        stream = stream or q or k or v or has["w_o"]
        parts["norms"] += _norm(c.norm, btd, bt, e, stream)
        parts["linear_inputs"] += btd * e * ffn_in
        a = stream or has["w_1"]  # W_1 x 是否要求梯度
        if c.activation == "swiglu":  # silu 存 a；乘法 silu(a)·b 存 b（silu(a) 要梯度时）与 silu(a)（b 要梯度时）
            b = stream or has["w_3"]
            copies = int(a) + int(a) + int(b) + int(has["w_2"])  # 乘积只给 W_2 的支路
        elif c.activation == "relu":
            copies = int(a or has["w_2"])  # ReLU 的输出：ReLU 的反向与 W_2 的支路共用这一份
        else:  # GELU：输入（GELU 的反向）+ 输出（只给 W_2 的支路）
            copies = int(a) + int(has["w_2"])
        parts["ffn"] += copies * btf * e
        stream = stream or a or (c.activation == "swiglu" and b) or has["w_2"]
        parts["lora"] += bt * rank * e * sum(has[t] for t in chosen)
    parts["norms"] += _norm(c.norm, btd, bt, e, stream)  # 末层归一化
    parts["loss"] = bt * c.vocab_size * _FP32 + bt * _INT64 + _FP32  # log_softmax 的输出、目标与一个标量
    parts["total"] = sum(parts.values())
    return parts


def finetune_memory(config, method: str, *, batch: int, length: int, rank: int = 8, targets=("w_q", "w_v"),
                    base_format: str | None = None, rest_format: str = "fp32",
                    activation_bytes: int = 4) -> dict[str, int]:
    """一个微调步的账本（纯公式，不造模型）：``weights``（全部权重：冻结的底座 + 可训练的参数）、``grads``、
    ``adam``（m 与 v）、``activations`` 与 ``total``，另含 ``trainable``（可训练参数个数）。

    * ``"full"``：全部参数 float32 训练（每个参数 16 字节）+ :func:`~tformer_lib.measurement.memory.lm_activation_bytes`；
    * ``"lora"``：底座按 ``base_format``（默认 ``"fp32"``；真实模型常用 ``"bf16"``）冻结，支路 float32 训练
      （peft 默认也把支路升成 float32；:func:`~tformer_lib.finetune.apply_lora` 的支路跟随底座的 dtype，
      所以在 bf16 的模型上要与这一行相符，需先把支路 ``.float()``）；
    * ``"qlora"``：底座的线性层按 ``base_format``（默认 ``"int4-g64"``），没有量化的参数（嵌入、归一化）按
      ``rest_format``（``"fp32"`` 或 ``"bf16"``），其余同 LoRA。

    ``activation_bytes``：激活每个元素的字节（float32 训练为 4，bf16 autocast 近似为 2）。
    ``"full"`` 不看 ``rank`` 与 ``targets``（全部参数都训练）。
    """
    _check_config(config)
    one_of("method", method, FINETUNE_METHODS)
    for name, value in (("batch", batch), ("length", length), ("activation_bytes", activation_bytes)):
        positive_int(name, value)
    if method == "full":
        if base_format not in (None, "fp32"):
            raise ValueError(f"全量微调的权重是 float32（base_format=None），收到 base_format={base_format!r}")
        n = parameter_count(config)
        states = model_state_bytes(n, "fp32")
        acts = lm_activation_bytes(config, batch, length, activation_bytes)["total"]
        out = {"trainable": n, "weights": states["params"], "grads": states["grads"],
               "adam": states["adam_m"] + states["adam_v"], "activations": acts}
    else:
        fmt = base_format or ("fp32" if method == "lora" else "int4-g64")
        allowed = ("fp32", "bf16") if method == "lora" else ("int8", "int4-g32", "int4-g64", "int4-g128")
        one_of("base_format", fmt, allowed)
        n = lora_parameter_count(config, rank, targets)
        one_of("rest_format", rest_format, ("fp32", "bf16"))
        rest = fmt if method == "lora" else rest_format
        dtype = torch.bfloat16 if rest == "bf16" else torch.float32  # 没量化的参数（嵌入、归一化）的类型
        out = {"trainable": n, "weights": weight_bytes(config, fmt, dtype) + 4 * n, "grads": 4 * n, "adam": 8 * n,
               "activations": lora_activation_bytes(config, batch, length, targets, rank, activation_bytes)["total"]}
    out["total"] = out["weights"] + out["grads"] + out["adam"] + out["activations"]
    return out
