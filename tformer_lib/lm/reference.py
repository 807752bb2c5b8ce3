"""PyTorch 自带的孪生模型（twin）：用 ``nn.TransformerEncoder`` 加因果掩码搭出的同配置语言模型。

用途：测试证明 :class:`~tformer_lib.lm.DecoderOnlyLM` 复制权重后与它逐元素相等；
``benchmarks/lm_step.py`` 拿它比较训练速度。``nn.TransformerEncoderLayer`` 只支持 LayerNorm、
ReLU/GELU 与普通多头注意力，所以孪生只覆盖这些选项（RMSNorm、SwiGLU、RoPE、GQA 另有各自的孪生测试）。
"""

import torch
from torch import nn

from ..parts.masks import causal_mask
from ..parts.positional import sinusoidal_positional_encoding
from .config import LMConfig
from .model import DecoderOnlyLM


class TorchEncoderLM(nn.Module):
    """词嵌入 + 位置 + ``nn.TransformerEncoder``（因果掩码）+ 末层 LayerNorm + 共享权重的输出层。"""

    def __init__(self, config: LMConfig):
        super().__init__()
        c = self.config = config
        all_biases = c.qkv_bias and c.out_bias and c.ffn_bias
        if (c.norm != "layer" or c.activation not in ("relu", "gelu") or c.positional in ("rope", "alibi")
                or c.kv_heads != c.n_heads or not all_biases):
            raise ValueError(
                "nn.TransformerEncoder 只能做 LayerNorm、ReLU/GELU、非 RoPE 非 ALiBi、n_kv_heads=n_heads、全部带偏置的配置，"
                f"收到 norm={c.norm!r}, activation={c.activation!r}, positional={c.positional!r}, n_kv_heads={c.n_kv_heads}, "
                f"qkv_bias={c.qkv_bias}, out_bias={c.out_bias}, ffn_bias={c.ffn_bias}"
            )
        self.tok_embed = nn.Embedding(c.vocab_size, c.d_model)
        if c.positional == "learned":
            self.pos_embed = nn.Embedding(c.max_len, c.d_model)
        elif c.positional == "sinusoidal":
            self.register_buffer("pos_table", sinusoidal_positional_encoding(c.max_len, c.d_model), persistent=False)
        self.dropout = nn.Dropout(c.dropout)
        layer = nn.TransformerEncoderLayer(
            c.d_model, c.n_heads, c.d_ff, c.dropout, activation=c.activation,
            layer_norm_eps=c.norm_eps, batch_first=True, norm_first=c.norm_first,
        )
        final_norm = nn.LayerNorm(c.d_model, eps=c.norm_eps) if c.norm_first else None
        self.encoder = nn.TransformerEncoder(layer, c.n_layers, norm=final_norm, enable_nested_tensor=False)
        self.lm_head = nn.Linear(c.d_model, c.vocab_size, bias=False)
        if c.tie_embeddings:
            self.lm_head.weight = self.tok_embed.weight

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        length = tokens.shape[1]
        x = self.tok_embed(tokens)  # (B, T, d_model)
        positions = torch.arange(length, device=tokens.device)
        if self.config.positional == "learned":
            x = x + self.pos_embed(positions)
        elif self.config.positional == "sinusoidal":
            x = x + self.pos_table[positions]
        # PyTorch 的布尔 mask 约定相反（True = 不许看），浮点掩码则是加到分数上的
        future = ~causal_mask(length, device=tokens.device)  # (T, T)，True = 未来位置
        x = self.encoder(self.dropout(x), mask=future, is_causal=True)  # (B, T, d_model)
        return self.lm_head(x)  # (B, T, V)

    @torch.no_grad()
    def copy_from(self, model: DecoderOnlyLM) -> "TorchEncoderLM":
        """把我们模型的权重复制过来（W^Q、W^K、W^V 拼成 ``in_proj_weight``），返回 self。"""
        self.tok_embed.weight.copy_(model.tok_embed.weight)
        if self.config.positional == "learned":
            self.pos_embed.weight.copy_(model.pos_embed.weight)
        if not self.config.tie_embeddings:
            self.lm_head.weight.copy_(model.lm_head.weight)
        for ours, theirs in zip(model.blocks, self.encoder.layers):
            a = ours.self_attn
            theirs.self_attn.in_proj_weight.copy_(torch.cat([a.w_q.weight, a.w_k.weight, a.w_v.weight]))
            theirs.self_attn.in_proj_bias.copy_(torch.cat([a.w_q.bias, a.w_k.bias, a.w_v.bias]))
            theirs.self_attn.out_proj.weight.copy_(a.w_o.weight)
            theirs.self_attn.out_proj.bias.copy_(a.w_o.bias)
            ff = ours.feed_forward
            theirs.linear1.weight.copy_(ff.w_1.weight)
            theirs.linear1.bias.copy_(ff.w_1.bias)
            theirs.linear2.weight.copy_(ff.w_2.weight)
            theirs.linear2.bias.copy_(ff.w_2.bias)
            for src, dst in ((ours.residual_attn.norm, theirs.norm1), (ours.residual_ffn.norm, theirs.norm2)):
                dst.weight.copy_(src.weight)
                dst.bias.copy_(src.bias)
        if self.config.norm_first:
            self.encoder.norm.weight.copy_(model.norm.weight)
            self.encoder.norm.bias.copy_(model.norm.bias)
        return self


def torch_twin(model: DecoderOnlyLM) -> TorchEncoderLM:
    """为 ``model`` 建一个同配置的 ``nn.TransformerEncoder`` 孪生并复制权重（eval/train 模式与 model 相同）。"""
    twin = TorchEncoderLM(model.config).copy_from(model)
    return twin.train(model.training)
