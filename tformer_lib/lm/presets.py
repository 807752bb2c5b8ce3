"""真实模型的超参数预设（presets）：把公开发布的大模型写成本书的 :class:`~tformer_lib.lm.LMConfig`。

``make_lm(PRESETS[name])`` 搭出的结构与原模型逐层相同（参数个数与 ``transformers`` 按同一配置在 meta 设备上
搭出的模型完全相等，测试保证）；在 ``with torch.device("meta"):`` 里搭建时只有形状、没有数值，不占内存，
所以 70B 的模型也能在笔记本电脑上“搭出来”数参数、算账本（:mod:`tformer_lib.scale`）。

每个预设的数字都抄自它在 Hugging Face Hub 上的 ``config.json``（网址见 :data:`PRESET_SOURCES`），字段对应：

===================================  =====================================================
``config.json``                       ``LMConfig``
===================================  =====================================================
vocab_size                           vocab_size
hidden_size / n_embd                 d_model
num_attention_heads / n_head         n_heads
num_key_value_heads                  n_kv_heads（与 n_heads 相同时记 None = 普通 MHA）
num_hidden_layers / n_layer          n_layers
intermediate_size / n_inner          d_ff（GPT-2 的 n_inner 为 null，即 4 × n_embd）
max_position_embeddings / n_positions  max_len（Mistral 见下）
rope_theta                           rope_base
rms_norm_eps / layer_norm_epsilon    norm_eps
tie_word_embeddings                  tie_embeddings
===================================  =====================================================

各家的结构差别：

* GPT-2（``gpt2``、``gpt2-xl``）：可学习的位置嵌入、LayerNorm（ε = 1e-5）、tanh 近似的 GELU（``gelu_new``）、
  四个注意力投影与 FFN 全带偏置、输出层与词嵌入共享。
* LLaMA-2 / LLaMA-3 / Mistral：RoPE、RMSNorm、SwiGLU，没有任何偏置，输出层不共享；LLaMA-2-70B、LLaMA-3、
  Mistral 用分组查询注意力（GQA，8 个 K/V 头）。LLaMA-3 的 rope_theta 是 500000。
* Qwen2.5：同上，但 **只有 W^Q、W^K、W^V 带偏置**（``out_bias=False``、``ffn_bias=False``），rope_theta = 1e6；
  0.5B 共享输出层，7B 与 72B 不共享；0.5B、7B 的 ε = 1e-6，72B 的 ε = 1e-5。
* Mistral-7B 的 ``config.json`` 写的是 max_position_embeddings 32768、**滑动窗口（sliding window）4096**：
  每个词元只看前 4096 个位置。本书的注意力没有滑动窗口，所以预设把上下文长度定为 4096——在这个长度以内
  两者逐元素相同；更长的输入会被 :class:`~tformer_lib.lm.DecoderOnlyLM` 拒绝，而不是悄悄算成另一个模型。

所有预设 ``dropout=0``（这些模型推理与微调时的设置；GPT-2 的 ``config.json`` 里训练用的 dropout 是 0.1，
不影响结构与参数量），``fast_attention=True``（大模型训练与推理都走融合的注意力内核，不保存 ``(B, h, T, T)``）。

``PRESETS`` 里的配置是共用的：要改某一项，用 :func:`preset` 取一份副本（``preset("llama-2-7b", max_len=512)``），
不要直接改字典里的对象（模型的 ``set_fast_attention`` 也会改它的配置）。
"""

from __future__ import annotations

import dataclasses

from .config import LMConfig

__all__ = ["PRESETS", "PRESET_SOURCES", "PUBLISHED_TRAINING_TOKENS", "preset"]


def _gpt2(d_model: int, n_heads: int, n_layers: int) -> LMConfig:
    return LMConfig(50257, d_model=d_model, n_heads=n_heads, n_layers=n_layers, d_ff=4 * d_model, max_len=1024,
                    positional="learned", norm="layer", activation="gelu_tanh", tie_embeddings=True,
                    norm_eps=1e-5, fast_attention=True)


def _llama(vocab: int, d_model: int, n_heads: int, n_kv_heads: int | None, n_layers: int, d_ff: int, max_len: int,
           rope_base: float, norm_eps: float, *, qkv_bias: bool = False, tie: bool = False) -> LMConfig:
    """LLaMA 式的块（Mistral、Qwen2 同构）：RoPE + RMSNorm + SwiGLU，只有 Qwen2 的 q/k/v 带偏置。"""
    return LMConfig(vocab, d_model=d_model, n_heads=n_heads, n_kv_heads=n_kv_heads, n_layers=n_layers, d_ff=d_ff,
                    max_len=max_len, positional="rope", norm="rms", activation="swiglu", tie_embeddings=tie,
                    rope_base=rope_base, norm_eps=norm_eps, qkv_bias=qkv_bias, out_bias=False, ffn_bias=False,
                    fast_attention=True)


#: 名字 → 公开模型的超参数（数字的出处见 :data:`PRESET_SOURCES`）
PRESETS: dict[str, LMConfig] = {
    "gpt2": _gpt2(768, 12, 12),
    "gpt2-xl": _gpt2(1600, 25, 48),
    "llama-2-7b": _llama(32000, 4096, 32, None, 32, 11008, 4096, 10000.0, 1e-5),
    "llama-2-13b": _llama(32000, 5120, 40, None, 40, 13824, 4096, 10000.0, 1e-5),
    "llama-2-70b": _llama(32000, 8192, 64, 8, 80, 28672, 4096, 10000.0, 1e-5),
    "llama-3-8b": _llama(128256, 4096, 32, 8, 32, 14336, 8192, 500000.0, 1e-5),
    "llama-3-70b": _llama(128256, 8192, 64, 8, 80, 28672, 8192, 500000.0, 1e-5),
    "mistral-7b": _llama(32000, 4096, 32, 8, 32, 14336, 4096, 10000.0, 1e-5),  # 上下文 = 滑动窗口 4096（见模块说明）
    "qwen2.5-0.5b": _llama(151936, 896, 14, 2, 24, 4864, 32768, 1e6, 1e-6, qkv_bias=True, tie=True),
    "qwen2.5-7b": _llama(152064, 3584, 28, 4, 28, 18944, 131072, 1e6, 1e-6, qkv_bias=True),
    "qwen2.5-72b": _llama(152064, 8192, 64, 8, 80, 29568, 131072, 1e6, 1e-5, qkv_bias=True),
}

_HUB = "https://huggingface.co/{}/blob/main/config.json"

#: 名字 → 超参数的出处（Hugging Face Hub 上的 ``config.json``）
PRESET_SOURCES: dict[str, str] = {
    "gpt2": _HUB.format("openai-community/gpt2"),
    "gpt2-xl": _HUB.format("openai-community/gpt2-xl"),
    "llama-2-7b": _HUB.format("meta-llama/Llama-2-7b-hf"),
    "llama-2-13b": _HUB.format("meta-llama/Llama-2-13b-hf"),
    "llama-2-70b": _HUB.format("meta-llama/Llama-2-70b-hf"),
    "llama-3-8b": _HUB.format("meta-llama/Meta-Llama-3-8B"),
    "llama-3-70b": _HUB.format("meta-llama/Meta-Llama-3-70B"),
    "mistral-7b": _HUB.format("mistralai/Mistral-7B-v0.1"),
    "qwen2.5-0.5b": _HUB.format("Qwen/Qwen2.5-0.5B"),
    "qwen2.5-7b": _HUB.format("Qwen/Qwen2.5-7B"),
    "qwen2.5-72b": _HUB.format("Qwen/Qwen2.5-72B"),
}

#: 论文/技术报告公布的预训练词元数（只收有明确公布数字的）：LLaMA-2 论文（Touvron et al., 2023）“2 trillion
#: tokens”；LLaMA-3 发布说明（Meta, 2024）“over 15T tokens”（取 15T，是下界）；Qwen2.5 技术报告（Qwen Team, 2024）
#: “18 trillion tokens”。GPT-2 与 Mistral-7B 没有公布，不列。
PUBLISHED_TRAINING_TOKENS: dict[str, int] = {
    **{name: 2 * 10**12 for name in ("llama-2-7b", "llama-2-13b", "llama-2-70b")},
    **{name: 15 * 10**12 for name in ("llama-3-8b", "llama-3-70b")},
    **{name: 18 * 10**12 for name in ("qwen2.5-0.5b", "qwen2.5-7b", "qwen2.5-72b")},
}


def preset(name: str, **overrides) -> LMConfig:
    """取预设 ``name`` 的一份副本；``overrides`` 替换其中任一字段（例如 ``max_len=512``）。"""
    if name not in PRESETS:
        raise ValueError(f"没有名为 {name!r} 的预设；可选：{sorted(PRESETS)}")
    unknown = set(overrides) - {f.name for f in dataclasses.fields(LMConfig)}
    if unknown:
        raise ValueError(f"LMConfig 没有这些字段：{sorted(unknown)}")
    return dataclasses.replace(PRESETS[name], **overrides)
