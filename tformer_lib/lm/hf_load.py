"""读 Hugging Face 的模型目录（``config.json`` + safetensors）成本书的 :class:`~tformer_lib.lm.DecoderOnlyLM`。

支持四个家族（``model_type``），各自与本书配置的对应：

- ``gpt2``：可学习位置、LayerNorm、GELU（``gelu`` 精确；``gelu_new``/``gelu_pytorch_tanh`` 是 tanh 近似）、
  全部线性层带偏置、通常共享词嵌入；
- ``llama``：RoPE、RMSNorm、SwiGLU，偏置由 ``attention_bias``（q/k/v 与 W^O）和 ``mlp_bias`` 决定（常为无）；
- ``mistral``：同 llama、没有偏置，另有滑动窗口 ``sliding_window``；
- ``qwen2``：同 llama，只有 q/k/v 带偏置。

HF 的 RoPE 是“前后两半”（rotate-half）的约定，与 :func:`~tformer_lib.parts.positional.apply_rope` 相同，权重无需重排。
权重按名字对应：``q_proj/k_proj/v_proj/o_proj`` → ``w_q/w_k/w_v/w_o``，``gate_proj`` → ``w_1``、
``up_proj`` → ``w_3``、``down_proj`` → ``w_2``；GPT-2 的 ``Conv1D`` 存的是转置的矩阵（``x @ W``），
融合的 ``c_attn`` 按输出维切成 q、k、v 三份。RoPE 缩放只收 ``linear``（位置插值）与 ``yarn``（第 16 章，
:mod:`tformer_lib.parts.rope_scaling`，与 transformers 逐项相同）。

我们表达不了的设置（别的 RoPE 缩放、比上下文短的滑动窗口、别的激活函数……）一律报错并指出字段名，
绝不悄悄给出一个不同的模型。
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import NamedTuple

import torch

from .._checks import positive_int
from ..parts.rope_scaling import RopeScaling, yarn_attention_factor
from .config import LMConfig
from .hf_tokenizer import read_tokenizer_dir
from .hf_weights import UnsupportedHFConfig, hf_to_lm_state
from .model import DecoderOnlyLM

__all__ = ["HF_MODEL_TYPES", "HFModel", "UnsupportedHFConfig", "hf_to_lm_config", "load_hf"]

HF_MODEL_TYPES = ("llama", "qwen2", "mistral", "gpt2")
_LLAMA_LIKE = ("llama", "qwen2", "mistral")
#: GPT-2 的 ``activation_function`` → 我们的 ``activation``（gelu_new 与 gelu_pytorch_tanh 都是 tanh 近似）
_GPT2_ACTIVATIONS = {"gelu": "gelu", "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh"}
_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16, "float64": torch.float64}


class HFModel(NamedTuple):
    """:func:`load_hf` 的结果，可以直接解包：``model, tokenizer = load_hf(path)``。"""

    model: DecoderOnlyLM
    tokenizer: object  # CharTokenizer | HFTokenizer | None（目录里没有 tokenizer.json 时）


def _refuse(field: str, value, expected: str) -> UnsupportedHFConfig:
    return UnsupportedHFConfig(f"Hugging Face 配置的字段 {field}={value!r} 不受支持：{expected}")


def _int(hf: dict, field: str, default=None) -> int:
    """``config.json`` 里应为正整数的字段；缺了（又没有缺省值）或不是正整数时报错并写明字段。"""
    if field not in hf and default is None:
        raise UnsupportedHFConfig(f"config.json 缺少字段 {field}（transformers 会悄悄取它的缺省值；这里不猜）")
    value = hf.get(field, default)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise _refuse(field, value, "应是正整数")
    return value


#: ``config.json`` 没写上下文长度时，transformers 各家族配置类的缺省值
HF_DEFAULT_CONTEXT = {"llama": 2048, "qwen2": 32768, "mistral": 4096 * 32}


def _rope_scaling(hf: dict, fields: dict, where: str, context: int) -> RopeScaling | None:
    """HF 的 RoPE 缩放设置 → :class:`~tformer_lib.parts.rope_scaling.RopeScaling`：只收与本库逐项相同的 ``linear`` 与 ``yarn``。

    YaRN 的训练长度与 transformers 取法相同：顶层的 ``original_max_position_embeddings``（Phi-3 的写法）优先，
    其次缩放设置里的同名字段，都没有时是 ``max_position_embeddings``（``context``）。
    """
    kind = fields.get("rope_type", fields.get("type", "default"))
    if kind == "default":
        return None
    if kind not in ("linear", "yarn"):
        raise _refuse(f"{where}.rope_type", kind, "只支持 'default'、'linear'（位置插值）与 'yarn'；"
                      "'dynamic'、'llama3'、'longrope' 等与本库的缩放不是同一个式子")
    factor = fields.get("factor")
    if isinstance(factor, bool) or not isinstance(factor, (int, float)) or not factor >= 1:
        raise _refuse(f"{where}.factor", factor, f"rope_type={kind!r} 需要缩放倍数 factor ≥ 1")
    if kind == "linear":
        return RopeScaling("linear", float(factor))
    for field in ("mscale", "mscale_all_dim"):
        if fields.get(field):
            raise _refuse(f"{where}.{field}", fields[field], "只支持 YaRN 的默认注意力系数 0.1·ln s + 1")
    if not fields.get("truncate", True):
        raise _refuse(f"{where}.truncate", fields["truncate"], "只支持 truncate=True（过渡区的端点取整）")
    original = hf.get("original_max_position_embeddings", fields.get("original_max_position_embeddings", context))
    try:
        scaling = RopeScaling("yarn", float(factor), original, fields.get("beta_fast") or 32.0,
                              fields.get("beta_slow") or 1.0)
    except ValueError as exc:
        raise _refuse(where, fields, str(exc)) from None
    wanted = fields.get("attention_factor")
    if wanted is not None and abs(wanted - yarn_attention_factor(scaling.factor)) > 1e-9:
        raise _refuse(f"{where}.attention_factor", wanted, "只支持 YaRN 的默认注意力系数 0.1·ln s + 1")
    return scaling


def _rope(hf: dict, context: int) -> tuple[float, RopeScaling | None]:
    """RoPE 的 base（θ）与缩放：新版写在 ``rope_parameters``，旧版是顶层的 ``rope_theta`` 与 ``rope_scaling``。"""
    legacy = hf.get("rope_scaling") or {}
    params = hf.get("rope_parameters") or {}
    for field in ("partial_rotary_factor",):
        for source, name in ((params, f"rope_parameters.{field}"), (hf, field)):
            if source.get(field, 1.0) != 1.0:
                raise _refuse(name, source[field], "只支持整个头都旋转（1.0）")
    scaling = _rope_scaling(hf, params, "rope_parameters", context) or _rope_scaling(hf, legacy, "rope_scaling", context)
    return float(params.get("rope_theta", hf.get("rope_theta", 10000.0))), scaling


#: ``config.json`` 里没写 ``sliding_window`` 时，transformers 的 Mistral 与 Qwen2 配置取的默认窗口
HF_DEFAULT_SLIDING_WINDOW = 4096


def _sliding_window(hf: dict) -> int | None:
    """transformers 实际用的滑动窗口（没有时 None），与它的配置类读同一份 ``config.json`` 的结果一致：

    - ``llama`` 没有滑动窗口，这个字段即使写了也不起作用；
    - ``mistral``：``sliding_window``，缺省为 :data:`HF_DEFAULT_SLIDING_WINDOW`，``None`` 表示不用；
    - ``qwen2``：只在 ``use_sliding_window``（缺省 False）时有窗口，而且只用在 ``layer_types`` 标成
      ``"sliding_attention"`` 的层——没写 ``layer_types`` 时是第 ``max_window_layers``（缺省 28）层及以后。
    """
    kind = hf["model_type"]
    if kind == "llama":
        return None
    window = hf.get("sliding_window", HF_DEFAULT_SLIDING_WINDOW)
    if kind == "mistral" or window is None:
        return window
    if not hf.get("use_sliding_window", False):
        return None
    layer_types = hf.get("layer_types") or [
        "sliding_attention" if i >= hf.get("max_window_layers", 28) else "full_attention"
        for i in range(hf["num_hidden_layers"])
    ]
    return window if "sliding_attention" in layer_types else None


def _check_window(hf: dict, context: int) -> None:
    """滑动窗口（sliding window）只在窗口 ≥ 我们运行的上下文时等同于普通因果注意力。"""
    window = _sliding_window(hf)
    if window is not None and window < context:
        shown = hf.get("sliding_window", f"缺省的 {HF_DEFAULT_SLIDING_WINDOW}")
        raise _refuse(
            "sliding_window", shown,
            f"滑动窗口注意力尚未实现；窗口不比上下文 {context} 短时才与因果注意力相同"
            f"（可用 load_hf(..., max_len={window}) 只在窗口以内运行）",
        )


def hf_to_lm_config(hf: dict, max_len: int | None = None) -> LMConfig:
    """把 ``config.json`` 的字典翻译成 :class:`LMConfig`；表达不了的设置抛 :class:`UnsupportedHFConfig`。

    ``max_len`` 默认取 ``max_position_embeddings``（GPT-2 是 ``n_positions``）；可以给得更小（只在更短的上下文里运行）。
    """
    kind = hf.get("model_type")
    if kind not in HF_MODEL_TYPES:
        raise _refuse("model_type", kind, f"只支持 {HF_MODEL_TYPES}")
    if kind == "gpt2":
        return _gpt2_config(hf, max_len)
    if hf.get("hidden_act", "silu") != "silu":
        raise _refuse("hidden_act", hf["hidden_act"], f"{kind} 的门控前馈网络只支持 'silu'（SwiGLU）")
    d_model, heads = _int(hf, "hidden_size"), _int(hf, "num_attention_heads")
    if d_model % heads:
        raise _refuse("num_attention_heads", heads, f"hidden_size={d_model} 应能被它整除")
    kv_heads = heads if hf.get("num_key_value_heads") is None else _int(hf, "num_key_value_heads")
    if heads % kv_heads:
        raise _refuse("num_key_value_heads", kv_heads, f"num_attention_heads={heads} 应能被它整除")
    head_dim = hf.get("head_dim")
    if head_dim is not None and head_dim * heads != d_model:
        raise _refuse("head_dim", head_dim, f"只支持 head_dim = hidden_size / num_attention_heads = {d_model / heads:g}")
    if kind == "llama":
        qkv_bias = out_bias = hf.get("attention_bias", False)
        ffn_bias = hf.get("mlp_bias", False)
    else:  # Qwen2 的 q/k/v 有偏置、W^O 与 FFN 没有；Mistral 全无（两者都写死在 transformers 的代码里）
        qkv_bias, out_bias, ffn_bias = kind == "qwen2", False, False
    limit = _int(hf, "max_position_embeddings", HF_DEFAULT_CONTEXT[kind])
    context = _context(max_len, limit, "max_position_embeddings")
    _check_window(hf, context)
    base, scaling = _rope(hf, limit)
    return LMConfig(
        vocab_size=_int(hf, "vocab_size"), d_model=d_model, n_heads=heads,
        n_kv_heads=kv_heads, n_layers=_int(hf, "num_hidden_layers"),
        d_ff=_int(hf, "intermediate_size"), max_len=context, positional="rope", norm="rms", norm_first=True,
        activation="swiglu", tie_embeddings=bool(hf.get("tie_word_embeddings", False)), dropout=0.0, fast_attention=True,
        rope_base=base, rope_scaling=scaling, qkv_bias=qkv_bias, out_bias=out_bias, ffn_bias=ffn_bias,
        norm_eps=float(hf.get("rms_norm_eps", 1e-6)), pad_id=_pad_id(hf),
    )


def _gpt2_config(hf: dict, max_len: int | None) -> LMConfig:
    act = hf.get("activation_function", "gelu_new")
    if act not in _GPT2_ACTIVATIONS:
        raise _refuse("activation_function", act, f"只支持 {sorted(_GPT2_ACTIVATIONS)}")
    for field, wanted in (("scale_attn_weights", True), ("scale_attn_by_inverse_layer_idx", False),
                          ("add_cross_attention", False)):
        if hf.get(field, wanted) != wanted:
            raise _refuse(field, hf[field], f"只支持 {wanted}（标准 GPT-2 的缩放点积自注意力）")
    d_model, heads = _int(hf, "n_embd"), _int(hf, "n_head")
    if d_model % heads:
        raise _refuse("n_head", heads, f"n_embd={d_model} 应能被它整除")
    d_ff = 4 * d_model if hf.get("n_inner") is None else _int(hf, "n_inner")
    return LMConfig(
        vocab_size=_int(hf, "vocab_size"), d_model=d_model, n_heads=heads, n_layers=_int(hf, "n_layer"),
        d_ff=d_ff, max_len=_context(max_len, _int(hf, "n_positions"), "n_positions"),
        positional="learned", norm="layer", norm_first=True, activation=_GPT2_ACTIVATIONS[act],
        tie_embeddings=bool(hf.get("tie_word_embeddings", True)), dropout=0.0, fast_attention=True,
        norm_eps=float(hf.get("layer_norm_epsilon", 1e-5)), pad_id=_pad_id(hf),
    )


def _context(max_len: int | None, limit: int, field: str) -> int:
    if max_len is None:
        return int(limit)
    max_len = positive_int("max_len", max_len)
    if max_len > limit:
        raise ValueError(f"max_len 应是 (0, {field}={limit}] 内的整数或 None，收到 {max_len!r}")
    return max_len


def _pad_id(hf: dict) -> int:
    """填充 id 只影响训练时哪些目标不计损失；HF 配置没有（或越界）时用本库的 PAD=0。"""
    pad = hf.get("pad_token_id")
    return pad if isinstance(pad, int) and not isinstance(pad, bool) and 0 <= pad < hf["vocab_size"] else 0


def _read_safetensors(path: Path) -> dict[str, torch.Tensor]:
    """读 ``model.safetensors``，或分片的 ``model.safetensors.index.json`` 列出的全部分片。"""
    from safetensors.torch import load_file

    single, index = path / "model.safetensors", path / "model.safetensors.index.json"
    if single.is_file():
        return load_file(single)
    if index.is_file():
        weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
        tensors = {}
        for shard in sorted(set(weight_map.values())):
            tensors.update(load_file(path / shard))
        missing = sorted(set(weight_map) - set(tensors))
        if missing:
            raise ValueError(f"{index} 列出的张量在分片里找不到：{missing[:5]}")
        return tensors
    present = sorted(p.name for p in path.iterdir())
    raise FileNotFoundError(f"{path} 里没有 model.safetensors 或 model.safetensors.index.json（只读 safetensors），目录里有 {present}")


def _resolve_dtype(dtype, hf: dict):
    if dtype is None:
        field = "dtype" if "dtype" in hf else "torch_dtype"
        name = hf.get(field)
        if name is None:
            return torch.float32
        if name not in _DTYPES:
            raise _refuse(field, name, f"只认 {sorted(_DTYPES)}（或不写，按 float32 读）；也可以给 load_hf 的 dtype 参数")
        return _DTYPES[name]
    if isinstance(dtype, str):
        if dtype not in _DTYPES:
            raise ValueError(f"dtype 应是 torch.dtype 或 {sorted(_DTYPES)} 之一，收到 {dtype!r}")
        return _DTYPES[dtype]
    if not isinstance(dtype, torch.dtype) or dtype not in _DTYPES.values():
        raise TypeError(f"dtype 应是 {sorted(_DTYPES)} 之一的 torch.dtype、它的名字或 None，收到 {dtype!r}")
    return dtype


def load_hf(path: str | os.PathLike, dtype=None, *, max_len: int | None = None) -> HFModel:
    """读 Hugging Face 模型目录，返回 :class:`HFModel` ``(model, tokenizer)``（eval 模式，在 CPU 上）。

    - 目录里要有 ``config.json``，以及 ``model.safetensors`` 或分片的 ``model.safetensors.index.json``；
      ``model_type`` 是 ``llama``、``qwen2``、``mistral``、``gpt2`` 之一；
    - ``tokenizer`` 总是返回：目录里有 ``tokenizer.json`` 时是分词器（本书 :func:`save_hf` 写的字符词表还原成
      :class:`~tformer_lib.text.CharTokenizer`，别的包成 :class:`~tformer_lib.lm.hf_tokenizer.HFTokenizer`），没有时是 None；
    - ``dtype=None`` 保持检查点的精度（``config.json`` 的 ``dtype``/``torch_dtype``，没写时 float32）；
      也可给 ``torch.float32`` 之类或它的名字 ``"float32"``；
    - ``max_len`` 默认是配置的 ``max_position_embeddings``（GPT-2 为 ``n_positions``）；给得更小时只在这个上下文里运行
      （例如窗口 4096 的 Mistral-7B-v0.1 用 ``max_len=4096``，这时滑动窗口不起作用，模型是精确的）。

    注意力走快速路径（``fast_attention=True``）；要看注意力权重时 ``model.set_fast_attention(False)``。
    配置里有表达不了的设置时抛 :class:`UnsupportedHFConfig`（``ValueError`` 的子类），消息里写明字段。
    """
    path = Path(path)
    config_file = path / "config.json"
    if path.is_file():
        raise FileNotFoundError(f"{path} 是一个文件：load_hf 要的是 Hugging Face 模型的目录（里面有 config.json）")
    if not config_file.is_file():
        raise FileNotFoundError(f"{path} 不是 Hugging Face 模型目录：缺少 config.json")
    try:
        hf = json.loads(config_file.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"{config_file} 不是合法的 JSON：{exc}") from exc
    if not isinstance(hf, dict):
        raise ValueError(f"{config_file} 应是一个 JSON 对象，收到 {type(hf).__name__}")
    if hf.get("quantization_config") is not None:
        raise _refuse("quantization_config", hf["quantization_config"], "量化过的检查点（GPTQ、AWQ、bitsandbytes……）读不了")
    config = hf_to_lm_config(hf, max_len)
    dtype = _resolve_dtype(dtype, hf)
    tensors = _read_safetensors(path)
    not_float = sorted(k for k, t in tensors.items() if not t.is_floating_point())
    if not_float:
        raise UnsupportedHFConfig(f"这些权重不是浮点数（{tensors[not_float[0]].dtype}）：{not_float[:8]}")
    state = hf_to_lm_state(hf["model_type"], tensors, config.n_layers)
    if config.tie_embeddings:
        head = state.pop("lm_head.weight", None)  # 共享时 HF 通常不存它；存了就必须与词嵌入相同
        if head is not None and not torch.equal(head, state["tok_embed.weight"]):
            raise UnsupportedHFConfig("tie_word_embeddings=True，但权重里的 lm_head.weight 与词嵌入不同：不能共享")
    elif "lm_head.weight" not in state:
        raise UnsupportedHFConfig("tie_word_embeddings=False，但权重里没有 lm_head.weight")
    with torch.device("meta"):  # 先在 meta 设备上搭架子：不分配、不初始化，权重直接换成读到的张量
        model = DecoderOnlyLM(config)
    state = {k: v.to(dtype) if v.is_floating_point() else v for k, v in state.items()}
    try:
        missing, unexpected = model.load_state_dict(state, strict=False, assign=True)
    except RuntimeError as exc:  # 形状不符
        raise UnsupportedHFConfig(f"权重的形状与 config.json 不符：{exc}") from exc
    if config.tie_embeddings:
        model.lm_head.weight = model.tok_embed.weight
        missing = [k for k in missing if k != "lm_head.weight"]
    if missing or unexpected:
        raise UnsupportedHFConfig(
            f"权重与配置不一致：缺少 {sorted(missing)[:8]}，多出 {sorted(unexpected)[:8]}（检查偏置字段与 tie_word_embeddings）"
        )
    left = [n for n, t in [*model.named_parameters(), *model.named_buffers()] if t.is_meta]
    if left:
        raise RuntimeError(f"这些张量没有从检查点读到：{left[:8]}")
    tokenizer = read_tokenizer_dir(path, hf)
    if tokenizer is not None and tokenizer.vocab_size > config.vocab_size:
        raise ValueError(f"{path / 'tokenizer.json'} 的词表有 {tokenizer.vocab_size} 个词元，比模型的 vocab_size={config.vocab_size} 多")
    return HFModel(model.eval(), tokenizer)

