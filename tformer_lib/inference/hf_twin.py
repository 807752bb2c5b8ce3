"""同一份权重的 ``transformers`` 孪生模型：把 GPT-2 形状的 :class:`~tformer_lib.lm.DecoderOnlyLM` 映射进
``GPT2LMHeadModel``，让基准在**同样的权重**上比较我们的生成与 ``transformers`` 的 ``generate``。

随书唐诗模型就是 GPT-2 的结构：可学习的位置嵌入、pre-LN 的 LayerNorm、GELU、带偏置的线性层、输出层与词嵌入共享。
对应关系（GPT-2 的 ``Conv1D`` 存的是 ``(输入, 输出)``，即我们 ``nn.Linear.weight`` 的转置）：

- ``tok_embed`` → ``wte``，``pos_embed`` → ``wpe``，``norm`` → ``ln_f``；
- 每块：``residual_attn.norm`` → ``ln_1``，``[w_q; w_k; w_v]`` 拼成 ``attn.c_attn``，``w_o`` → ``attn.c_proj``，
  ``residual_ffn.norm`` → ``ln_2``，``w_1`` → ``mlp.c_fc``，``w_2`` → ``mlp.c_proj``。

``transformers`` 只在调用时导入（它是可选依赖）。构建只用配置，不连网。
"""

from __future__ import annotations

import torch

__all__ = ["to_gpt2"]


def _check_gpt2_shaped(config) -> None:
    wanted = {"positional": "learned", "norm": "layer", "norm_first": True, "activation": "gelu",
              "tie_embeddings": True, "n_kv_heads": None}
    wrong = {k: getattr(config, k) for k, v in wanted.items() if getattr(config, k) != v}
    if wrong and not (set(wrong) == {"n_kv_heads"} and config.kv_heads == config.n_heads):
        raise ValueError(f"to_gpt2 只接受 GPT-2 形状的模型（{wanted}），这些字段不同：{wrong}")


@torch.no_grad()
def to_gpt2(model):
    """返回权重与 ``model`` 相同的 ``transformers.GPT2LMHeadModel``（eval 模式、同 dtype；logits 相同，测试核对）。"""
    from transformers import GPT2Config, GPT2LMHeadModel

    c = model.config
    _check_gpt2_shaped(c)
    norm_eps = model.norm.eps
    hf_config = GPT2Config(
        vocab_size=c.vocab_size, n_positions=c.max_len, n_embd=c.d_model, n_layer=c.n_layers, n_head=c.n_heads,
        n_inner=c.d_ff, activation_function="gelu", resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
        layer_norm_epsilon=norm_eps, tie_word_embeddings=True, pad_token_id=c.pad_id, bos_token_id=None, eos_token_id=None,
    )
    hf = GPT2LMHeadModel(hf_config).to(model.lm_head.weight.dtype).eval()
    t = hf.transformer
    t.wte.weight.copy_(model.tok_embed.weight)
    t.wpe.weight.copy_(model.pos_embed.weight)
    t.ln_f.load_state_dict(model.norm.state_dict())
    for block, hf_block in zip(model.blocks, t.h):
        attn, ffn = block.self_attn, block.feed_forward
        hf_block.ln_1.load_state_dict(block.residual_attn.norm.state_dict())
        hf_block.ln_2.load_state_dict(block.residual_ffn.norm.state_dict())
        # Conv1D.weight 是 (d_in, d_out)：我们的 Linear.weight (d_out, d_in) 转置后拼接
        hf_block.attn.c_attn.weight.copy_(torch.cat([attn.w_q.weight, attn.w_k.weight, attn.w_v.weight]).T)
        hf_block.attn.c_attn.bias.copy_(torch.cat([attn.w_q.bias, attn.w_k.bias, attn.w_v.bias]))
        hf_block.attn.c_proj.weight.copy_(attn.w_o.weight.T)
        hf_block.attn.c_proj.bias.copy_(attn.w_o.bias)
        hf_block.mlp.c_fc.weight.copy_(ffn.w_1.weight.T)
        hf_block.mlp.c_fc.bias.copy_(ffn.w_1.bias)
        hf_block.mlp.c_proj.weight.copy_(ffn.w_2.weight.T)
        hf_block.mlp.c_proj.bias.copy_(ffn.w_2.bias)
    hf.tie_weights()
    return hf
