"""把本书的 :class:`~tformer_lib.lm.DecoderOnlyLM` 写成 Hugging Face 模型目录（``config.json`` + ``model.safetensors``）。

``transformers.AutoModelForCausalLM.from_pretrained(path)`` 读回的模型与我们的 logits 相同（测试核对）。
按配置挑一个能**精确**表达它的家族：

- 可学习位置 + LayerNorm + GELU + 全部偏置 → ``gpt2``（随书的唐诗模型就是这种；精确 GELU 写成
  ``activation_function="gelu"``，tanh 近似写成 ``"gelu_pytorch_tanh"``）；
- RoPE + RMSNorm + SwiGLU：q/k/v 与 W^O 的偏置同有同无 → ``llama``（``attention_bias``、``mlp_bias``）；
  只有 q/k/v 有偏置 → ``qwen2``。

别的组合没有哪个家族能精确表达，报错并指出字段。导出的是推理用的模型：dropout 不写出（各家的 dropout 字段为 0）。
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

import torch

from ..specials import BOS, EOS, PAD, SPECIAL_TOKENS
from ..text import CharTokenizer
from .config import LMConfig
from .hf_tokenizer import tokenizer_json_text
from .hf_weights import UnsupportedHFConfig, lm_to_hf_state
from .model import DecoderOnlyLM

__all__ = ["hf_family", "lm_to_hf_config", "save_hf"]

_ARCHITECTURES = {"gpt2": "GPT2LMHeadModel", "llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM"}
_DTYPE_NAMES = {torch.float32: "float32", torch.float16: "float16", torch.bfloat16: "bfloat16"}


def _refuse(field: str, value, why: str) -> UnsupportedHFConfig:
    return UnsupportedHFConfig(f"{field}={value!r}：{why}，没有 Hugging Face 家族能精确表达这个模型")


def hf_family(config: LMConfig) -> str:
    """能精确表达 ``config`` 的 HF 家族（``"gpt2"``、``"llama"`` 或 ``"qwen2"``）；没有时抛 :class:`UnsupportedHFConfig`。"""
    c = config
    if c.moe_experts:
        raise UnsupportedHFConfig(f"moe_experts={c.moe_experts!r}：这里只映射稠密的 gpt2/llama/qwen2 家族，"
                                  "混合专家（Mixtral 等）的权重格式不在其中")
    if c.rope_scaling is not None and c.rope_scaling.kind == "ntk":
        raise UnsupportedHFConfig("rope_scaling.kind='ntk'：HF 没有静态的 NTK-aware 缩放（它的 'dynamic' 随序列长度改 base，"
                                  "不是同一个式子）")
    if not c.norm_first:
        raise _refuse("norm_first", c.norm_first, "HF 的这些家族都是前置归一化（pre-LN）")
    if c.positional == "learned":
        if c.norm != "layer":
            raise _refuse("norm", c.norm, "可学习位置编码的 gpt2 只有 LayerNorm")
        if c.activation not in ("gelu", "gelu_tanh"):
            raise _refuse("activation", c.activation, "gpt2 的前馈网络只有 GELU（'gelu' 或 'gelu_tanh'）")
        for field in ("qkv_bias", "out_bias", "ffn_bias"):
            if not getattr(c, field):
                raise _refuse(field, False, "gpt2 的每个线性层都带偏置")
        if c.kv_heads != c.n_heads:
            raise _refuse("n_kv_heads", c.n_kv_heads, "gpt2 没有分组查询注意力（GQA）")
        return "gpt2"
    if c.positional != "rope":
        raise _refuse("positional", c.positional, "gpt2 用可学习位置（'learned'），llama/qwen2 用 'rope'")
    if c.norm != "rms":
        raise _refuse("norm", c.norm, "RoPE 的 llama/qwen2 只有 RMSNorm")
    if c.activation != "swiglu":
        raise _refuse("activation", c.activation, "llama/qwen2 的前馈网络是 SwiGLU")
    if c.qkv_bias == c.out_bias:
        return "llama"  # attention_bias 同管 q/k/v 与 W^O，mlp_bias 管前馈网络
    if not c.qkv_bias:
        raise _refuse("out_bias", c.out_bias, "W^O 有偏置而 q/k/v 没有")
    if c.ffn_bias:
        raise _refuse("ffn_bias", c.ffn_bias, "q/k/v 有偏置而 W^O 没有时只有 qwen2 能表达，它的前馈网络没有偏置")
    return "qwen2"


def _hf_rope_scaling(scaling) -> dict | None:
    """本库的 RoPE 缩放 → HF 的 ``rope_scaling``（``linear`` 与 ``yarn`` 逐项相同；``ntk`` 在 :func:`hf_family` 里已被拒绝）。"""
    if scaling is None:
        return None
    if scaling.kind == "linear":
        return {"rope_type": "linear", "factor": scaling.factor}
    return {"rope_type": "yarn", "factor": scaling.factor, "original_max_position_embeddings": scaling.original_max_len,
            "beta_fast": scaling.beta_fast, "beta_slow": scaling.beta_slow}


def lm_to_hf_config(config: LMConfig, dtype: torch.dtype = torch.float32, special_ids: dict | None = None) -> dict:
    """:class:`LMConfig` → ``config.json`` 的字典（``special_ids`` 给出 ``bos/eos/pad_token_id``，默认本库的 BOS/EOS/PAD）。"""
    c, family = config, hf_family(config)
    ids = {"bos_token_id": BOS, "eos_token_id": EOS, "pad_token_id": c.pad_id}
    ids.update(special_ids or {})
    ids = {k: v if v is None or v < c.vocab_size else None for k, v in ids.items()}  # 词表外的 id 不写（如 vocab_size=2 时的 EOS）
    common = {"architectures": [_ARCHITECTURES[family]], "model_type": family, "vocab_size": c.vocab_size,
              "tie_word_embeddings": c.tie_embeddings, "torch_dtype": _DTYPE_NAMES[dtype], **ids}
    if family == "gpt2":
        act = "gelu" if c.activation == "gelu" else "gelu_pytorch_tanh"  # 两者与我们的 nn.GELU 逐位相同
        return {**common, "n_embd": c.d_model, "n_layer": c.n_layers, "n_head": c.n_heads, "n_inner": c.d_ff,
                "n_positions": c.max_len, "activation_function": act, "layer_norm_epsilon": c.norm_eps,
                "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0, "scale_attn_weights": True,
                "scale_attn_by_inverse_layer_idx": False, "reorder_and_upcast_attn": False}
    out = {**common, "hidden_size": c.d_model, "intermediate_size": c.d_ff, "num_hidden_layers": c.n_layers,
           "num_attention_heads": c.n_heads, "num_key_value_heads": c.kv_heads, "head_dim": c.d_k,
           "hidden_act": "silu", "max_position_embeddings": c.max_len, "rms_norm_eps": c.norm_eps,
           "rope_theta": c.rope_base, "rope_scaling": _hf_rope_scaling(c.rope_scaling), "attention_dropout": 0.0}
    if family == "llama":
        return {**out, "attention_bias": c.qkv_bias, "mlp_bias": c.ffn_bias}
    return {**out, "use_sliding_window": False, "sliding_window": None, "max_window_layers": c.n_layers}


def _tokenizer_files(tokenizer, model_vocab: int, max_len: int) -> tuple[dict[str, str], dict]:
    """分词器 → 要写的文件 ``{名字: 文本}`` 与 config 里的特殊 id。"""
    text = tokenizer_json_text(tokenizer)  # 不是可导出的分词器时，这里报出清楚的 TypeError
    if tokenizer.vocab_size > model_vocab:
        raise ValueError(f"tokenizer 的词表有 {tokenizer.vocab_size} 个词元，比模型的 vocab_size={model_vocab} 多")
    files = {"tokenizer.json": text}
    if isinstance(tokenizer, CharTokenizer):  # 特殊词元用本库的名字；AutoTokenizer 由 tokenizer_config.json 认出它
        pad, bos, eos, unk = SPECIAL_TOKENS
        files["tokenizer_config.json"] = json.dumps(
            {"tokenizer_class": "PreTrainedTokenizerFast", "pad_token": pad, "bos_token": bos, "eos_token": eos,
             "unk_token": unk, "model_max_length": max_len}, ensure_ascii=False, indent=1) + "\n"
        return files, {"bos_token_id": BOS, "eos_token_id": EOS, "pad_token_id": PAD}
    ids = {f"{n}_token_id": getattr(tokenizer, f"{n}_id", None) for n in ("bos", "eos", "pad")}
    return files, {k: v for k, v in ids.items() if v is not None}


def _replace_dir(tmp: Path, path: Path) -> None:
    """把写好的临时目录换到 ``path``：旧目录先改名让开，新目录就位后再删旧的。"""
    if not path.exists():
        os.replace(tmp, path)
        return
    old = Path(tempfile.mkdtemp(dir=path.parent, prefix=f".{path.name}.old"))
    os.replace(path, old / path.name)
    os.replace(tmp, path)
    shutil.rmtree(old)


def save_hf(model: DecoderOnlyLM, path: str | os.PathLike, tokenizer=None) -> Path:
    """把 ``model`` 写成 Hugging Face 模型目录 ``path``（原子地：先写临时目录再改名），返回路径。

    写出 ``config.json``、``model.safetensors``（共享词嵌入时不存 ``lm_head.weight``），给了 ``tokenizer`` 时再写
    ``tokenizer.json``（本书的字符分词器写成词级模型，``tokenizers`` 与 ``PreTrainedTokenizerFast`` 都能读）。
    ``path`` 已存在时只替换空目录或以前写的模型目录（有 ``config.json``），别的目录与文件拒绝覆盖。

    ``config.json`` 里的 ``bos/eos/pad_token_id``：给了 ``tokenizer`` 时取它的（:class:`~.hf_tokenizer.HFTokenizer`
    的 ``bos_id``/``eos_id``/``pad_id``）；没给时是本库的特殊词元 BOS=1、EOS=2 与 ``config.pad_id``——所以把一个由
    :func:`~tformer_lib.lm.load_hf` 读进来、结束词元不是 2 的模型再写出去时，要把读到的分词器一起传进来，
    否则 transformers 的 ``generate`` 会停在 2 上。
    """
    from safetensors.torch import save_file

    if not isinstance(model, DecoderOnlyLM):
        raise TypeError(f"model 应是 DecoderOnlyLM，收到 {type(model).__name__}")
    path = Path(path)
    if path.exists() and not (path.is_dir() and (not any(path.iterdir()) or (path / "config.json").is_file())):
        raise FileExistsError(f"{path} 已存在且不是模型目录（没有 config.json）：不覆盖它")
    c = model.config
    state = model.state_dict()
    dtypes = {t.dtype for t in state.values() if t.is_floating_point()}
    if len(dtypes) != 1 or next(iter(dtypes)) not in _DTYPE_NAMES:
        raise ValueError(f"model 的参数应是同一种 float32/float16/bfloat16，收到 {sorted(map(str, dtypes))}")
    files, special_ids = _tokenizer_files(tokenizer, c.vocab_size, c.max_len) if tokenizer is not None else ({}, {})
    hf_config = lm_to_hf_config(c, next(iter(dtypes)), special_ids)
    tensors = lm_to_hf_state(hf_config["model_type"], state, c.n_layers, c.tie_embeddings)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=path.parent, prefix=f".{path.name}.tmp"))
    try:
        save_file({k: v.cpu() for k, v in tensors.items()}, tmp / "model.safetensors", metadata={"format": "pt"})
        files["config.json"] = json.dumps(hf_config, ensure_ascii=False, indent=2) + "\n"
        for name, text in files.items():
            (tmp / name).write_text(text, encoding="utf-8")
        os.chmod(tmp, 0o755)
        _replace_dir(tmp, path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return path
