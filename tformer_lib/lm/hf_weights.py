"""Hugging Face 权重名与本书模型权重名的对应（两个方向），读写 HF 模型目录时共用。

- LLaMA/Qwen2/Mistral：``model.layers.{i}.self_attn.q_proj`` → ``blocks.{i}.self_attn.w_q`` 等，
  ``gate_proj`` → ``w_1``、``up_proj`` → ``w_3``、``down_proj`` → ``w_2``（SwiGLU 的 SiLU 一支是 ``w_1``）；
- GPT-2：``Conv1D`` 存 ``(in, out)``（``y = x @ W + b``），与 ``nn.Linear`` 的 ``(out, in)`` 互为转置；
  融合的 ``c_attn`` ``(d_model, 3·d_model)`` 按输出维依次是 q、k、v。
"""

from __future__ import annotations

import torch

__all__ = ["UnsupportedHFConfig", "llama_weight_names", "gpt2_weight_names", "CONV1D_TARGETS", "hf_to_lm_state",
           "lm_to_hf_state"]


class UnsupportedHFConfig(ValueError):
    """Hugging Face 配置里有我们表达不了的设置；消息里写明字段名、取到的值和能接受的值。"""


def llama_weight_names(n_layers: int) -> dict[str, str]:
    """LLaMA/Qwen2/Mistral 的权重名（去掉前缀 ``model.``）→ 我们的名字；``lm_head.weight`` 两边同名。"""
    names = {"embed_tokens.weight": "tok_embed.weight", "norm.weight": "norm.weight"}
    for i in range(n_layers):
        src, dst = f"layers.{i}.", f"blocks.{i}."
        for ours, theirs in (("w_q", "q_proj"), ("w_k", "k_proj"), ("w_v", "v_proj"), ("w_o", "o_proj")):
            for p in ("weight", "bias"):
                names[f"{src}self_attn.{theirs}.{p}"] = f"{dst}self_attn.{ours}.{p}"
        for ours, theirs in (("w_1", "gate_proj"), ("w_3", "up_proj"), ("w_2", "down_proj")):
            for p in ("weight", "bias"):
                names[f"{src}mlp.{theirs}.{p}"] = f"{dst}feed_forward.{ours}.{p}"
        names[f"{src}input_layernorm.weight"] = f"{dst}residual_attn.norm.weight"
        names[f"{src}post_attention_layernorm.weight"] = f"{dst}residual_ffn.norm.weight"
    return names


def gpt2_weight_names(n_layers: int) -> tuple[dict[str, str], dict[str, str]]:
    """GPT-2 的权重名（去掉前缀 ``transformer.``）→ 我们的名字，以及融合的 ``c_attn`` → 我们的注意力模块名。

    ``CONV1D_TARGETS`` 结尾的权重在 HF 里是 ``Conv1D``（存 ``(in, out)``），与我们的 ``nn.Linear`` 互为转置。
    """
    names = {"wte.weight": "tok_embed.weight", "wpe.weight": "pos_embed.weight",
             "ln_f.weight": "norm.weight", "ln_f.bias": "norm.bias"}
    fused = {}
    for i in range(n_layers):
        src, dst = f"h.{i}.", f"blocks.{i}."
        for p in ("weight", "bias"):
            names[f"{src}ln_1.{p}"] = f"{dst}residual_attn.norm.{p}"
            names[f"{src}ln_2.{p}"] = f"{dst}residual_ffn.norm.{p}"
            fused[f"{src}attn.c_attn.{p}"] = f"{dst}self_attn"
            names[f"{src}attn.c_proj.{p}"] = f"{dst}self_attn.w_o.{p}"
            names[f"{src}mlp.c_fc.{p}"] = f"{dst}feed_forward.w_1.{p}"
            names[f"{src}mlp.c_proj.{p}"] = f"{dst}feed_forward.w_2.{p}"
    return names, fused


#: 我们的名字以这些结尾的权重，在 GPT-2 里是转置存放的 Conv1D
CONV1D_TARGETS = ("w_o.weight", "w_1.weight", "w_2.weight")


def _llama_state(hf: dict[str, torch.Tensor], n_layers: int) -> dict[str, torch.Tensor]:
    return _rename(hf, llama_weight_names(n_layers), "model.", ("rotary_emb.inv_freq",))


def _gpt2_state(hf: dict[str, torch.Tensor], n_layers: int) -> dict[str, torch.Tensor]:
    names, fused = gpt2_weight_names(n_layers)
    state = _rename(hf, names, "transformer.", ("attn.bias", "attn.masked_bias"), keep=set(fused))
    for key, prefix in fused.items():
        if key not in state:
            continue  # 缺了的权重由 load_hf 的完整性检查报出
        tensor = state.pop(key)
        if key.endswith("weight"):  # Conv1D：(d_model, 3·d_model)，y = x @ W → 我们的 Linear 要 W^T
            tensor = tensor.t()  # (3·d_model, d_model)
        for part, name in zip(tensor.chunk(3, dim=0), ("w_q", "w_k", "w_v")):
            state[f"{prefix}.{name}.{key.rsplit('.', 1)[1]}"] = part.contiguous()  # (d_model, d_model) 或 (d_model,)
    for key in list(state):  # 其余 Conv1D 的权重也要转置：(in, out) → (out, in)
        if key.endswith(CONV1D_TARGETS):
            state[key] = state[key].t().contiguous()
    return state


def _rename(hf, names: dict, prefix: str, ignored: tuple, keep: set = frozenset()) -> dict[str, torch.Tensor]:
    """按 ``names`` 改名（HF 名字可带或不带 ``prefix``）；``lm_head.weight`` 原样保留；认不出的张量报错。"""
    state, unknown = {}, []
    doubled = sorted(key for key in hf if key.startswith(prefix) and key[len(prefix):] in hf)
    if doubled:  # 同一个张量带前缀、不带前缀各存了一份：不知道该用哪一份，就不猜
        raise UnsupportedHFConfig(f"这些权重带前缀 {prefix!r} 与不带前缀各有一份，不知道该用哪一份：{doubled[:8]}")
    for key, tensor in hf.items():
        short = key[len(prefix):] if key.startswith(prefix) else key
        if key == "lm_head.weight":
            state[key] = tensor
        elif short in names:
            state[names[short]] = tensor
        elif short in keep:
            state[short] = tensor
        elif not short.endswith(ignored):
            unknown.append(key)
    if unknown:
        raise UnsupportedHFConfig(f"这些权重在本书的模型里没有对应的位置：{sorted(unknown)[:8]}")
    return state


def hf_to_lm_state(model_type: str, tensors: dict[str, torch.Tensor], n_layers: int) -> dict[str, torch.Tensor]:
    """HF 的张量字典 → 我们的 ``state_dict`` 名字（``lm_head.weight`` 原样保留，是否共享由调用者处理）。"""
    if model_type == "gpt2":
        return _gpt2_state(tensors, n_layers)
    return _llama_state(tensors, n_layers)


def lm_to_hf_state(model_type: str, state: dict[str, torch.Tensor], n_layers: int, tied: bool) -> dict[str, torch.Tensor]:
    """我们的 ``state_dict`` → HF 的张量字典（连续存放，可直接写 safetensors）；共享词嵌入时不写 ``lm_head.weight``。"""
    out = {}
    if model_type == "gpt2":
        names, fused = gpt2_weight_names(n_layers)
        for theirs, prefix in fused.items():
            p = theirs.rsplit(".", 1)[1]
            joined = torch.cat([state[f"{prefix}.{n}.{p}"] for n in ("w_q", "w_k", "w_v")])  # (3·d_model, d_model) 或 (3·d_model,)
            out[f"transformer.{theirs}"] = joined.t() if p == "weight" else joined  # Conv1D：(d_model, 3·d_model)
        prefix = "transformer."
    else:
        names, prefix = llama_weight_names(n_layers), "model."
    for theirs, ours in names.items():
        if ours in state:
            tensor = state[ours]
            out[prefix + theirs] = tensor.t() if model_type == "gpt2" and ours.endswith(CONV1D_TARGETS) else tensor
    if not tied:
        out["lm_head.weight"] = state["lm_head.weight"]
    return {k: v.detach().contiguous() for k, v in out.items()}
