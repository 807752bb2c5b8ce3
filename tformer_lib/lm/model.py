"""仅解码器（decoder-only）语言模型：GPT 的结构，全部由本书已有的部件搭成。

与第 5 章的编码器–解码器相比，去掉了编码器和交叉注意力，只剩“带因果掩码的自注意力 + 前馈网络”的块；
结构上它就是一个处处加了因果掩码的编码器栈（测试证明它与 ``nn.TransformerEncoder`` 加因果掩码逐元素相等）。

    tokens (B, T) → 词嵌入 + 位置 → N × [自注意力(因果) → FFN] → 末层归一化 → 输出层(与词嵌入共享) → logits (B, T, V)
"""

import math

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from .._checks import INDEX_DTYPES, bool_mask, check_values, non_empty_sequence, tensor_with_dim, token_ids
from ..moe import MoEFeedForward
from ..parts.attention import MultiHeadAttention
from ..parts.feedforward import PositionwiseFeedForward
from ..parts.layers import ResidualNorm
from ..parts.masks import combine_masks
from ..parts.norms import make_norm
from ..parts.positional import RopeTables, sinusoidal_positional_encoding
from .cache import LMCache
from .config import LMConfig


def feed_forward_for(config: LMConfig) -> nn.Module:
    """块里的前馈网络：稠密的 :class:`~tformer_lib.PositionwiseFeedForward`；``config.moe_experts`` > 0 时是
    :class:`~tformer_lib.moe.MoEFeedForward`（E 个这样的 FFN，每个词元走 ``moe_top_k`` 个）。"""
    c = config
    if not c.moe_experts:
        return PositionwiseFeedForward(c.d_model, c.d_ff, c.dropout, c.activation, bias=c.ffn_bias)
    return MoEFeedForward(c.d_model, c.d_ff, c.moe_experts, c.moe_top_k, dropout=c.dropout, activation=c.activation,
                          bias=c.ffn_bias, capacity_factor=c.moe_capacity_factor, renormalize=c.moe_renormalize,
                          n_shared_experts=c.moe_shared_experts)


class DecoderOnlyBlock(nn.Module):
    """一个块 = 因果自注意力 + 前馈网络，各包在一个残差 + 归一化（:class:`~tformer_lib.ResidualNorm`）里。"""

    def __init__(self, config: LMConfig):
        super().__init__()
        c = config
        self.self_attn = MultiHeadAttention(
            c.d_model, c.n_heads, c.dropout, fast=c.fast_attention, n_kv_heads=c.n_kv_heads,
            rope=c.positional == "rope", rope_base=c.rope_base, qkv_bias=c.qkv_bias, out_bias=c.out_bias,
            rope_scaling=c.rope_scaling, alibi=c.positional == "alibi",
        )
        self.feed_forward = feed_forward_for(c)  # 稠密 FFN；moe_experts > 0 时是混合专家（第 16 章）
        self.residual_attn = ResidualNorm(c.d_model, c.dropout, c.norm_first, c.norm, eps=c.norm_eps)
        self.residual_ffn = ResidualNorm(c.d_model, c.dropout, c.norm_first, c.norm, eps=c.norm_eps)

    def forward(self, x, mask, cache=None, positions=None, causal=False) -> torch.Tensor:
        attend = lambda h: self.self_attn(h, h, h, mask, cache, positions, causal=causal)  # noqa: E731
        x = self.residual_attn(x, attend)  # (B, T, d_model)
        return self.residual_ffn(x, self.feed_forward)  # (B, T, d_model)


class DecoderOnlyLM(nn.Module):
    """GPT 式语言模型，batch-first。

    ``model(tokens, *, cache=None, positions=None, attn_mask=None)`` → logits ``(B, T, V)``（未经 softmax）：

    - ``tokens``：``(B, T)`` 词元 id；给出 ``cache``（由 :meth:`new_cache` 创建）时只放新的词元，
      位置从 ``cache.length`` 接着数；
    - ``positions``：可选的位置编号 ``(T,)`` 或 ``(B, T)``（例如左侧填充的批次里每行起点不同）；
      默认 ``cache.length, …, cache.length + T - 1``；
    - ``attn_mask``：可选的布尔掩码（True = 可以关注），能广播到 ``(B, h, T, T_k)``，``T_k`` 是缓存长度加 T；
      它与因果掩码取“与”，所以总是因果的。
    - 超出上下文长度 ``config.max_len`` 的输入会被拒绝（给出清楚的错误），不会悄悄截断。
    """

    def __init__(self, config: LMConfig):
        super().__init__()
        c = self.config = config
        self.tok_embed = nn.Embedding(c.vocab_size, c.d_model)  # 词嵌入（GPT 约定：不乘 √d_model）
        if c.positional == "learned":
            self.pos_embed = nn.Embedding(c.max_len, c.d_model)
        elif c.positional == "sinusoidal":
            self.register_buffer("pos_table", sinusoidal_positional_encoding(c.max_len, c.d_model), persistent=False)
        self.dropout = nn.Dropout(c.dropout)
        self.blocks = nn.ModuleList([DecoderOnlyBlock(c) for _ in range(c.n_layers)])
        # pre-LN 的残差流从不经过归一化，所以末尾要再归一化一次；post-LN 每块已归一化
        self.norm = make_norm(c.norm, c.d_model, c.norm_eps) if c.norm_first else nn.Identity()
        self.lm_head = nn.Linear(c.d_model, c.vocab_size, bias=False)
        self._init_parameters()
        self.activation_checkpointing = False  # 见 set_activation_checkpointing
        if c.tie_embeddings:
            self.lm_head.weight = self.tok_embed.weight  # 权重共享：输出层 = 词嵌入矩阵的转置

    def _init_parameters(self) -> None:
        """GPT-2 的初始化：权重 N(0, 0.02²)，偏置为 0；写回残差流的 ``w_o``、``w_2`` 再除以 √(2N)。

        在 meta 设备上（``with torch.device("meta")``，只有形状、没有数值）跳过：那里没有数可写，
        而 meta 张量上的 ``normal_`` 每次要走一遍 Python 的参考实现，70B 的模型要多花好几秒。"""
        if self.tok_embed.weight.is_meta:
            return
        for name, module in self.named_modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                std = 0.02 / math.sqrt(2 * self.config.n_layers) if name.endswith(("w_o", "w_2")) else 0.02
                nn.init.normal_(module.weight, mean=0.0, std=std)
                if getattr(module, "bias", None) is not None:
                    nn.init.zeros_(module.bias)

    def new_cache(self) -> LMCache:
        """为增量生成新建一个空的 K/V 缓存。"""
        return LMCache(len(self.blocks))

    def _check_call(self, tokens, cache, attn_mask) -> None:
        """:meth:`forward` 与 :meth:`hidden_states` 的参数检查：形状、类型与缓存是否配套（词元 id 的范围要读取值，见 ``_checks.check_values``）。"""
        tensor_with_dim("tokens", tokens, 2, "(B, T)")
        non_empty_sequence("tokens", tokens, seq_dim=1)
        weight = self.tok_embed.weight
        if tokens.device != weight.device:
            raise ValueError(f"tokens 在 {tokens.device} 上，模型的参数在 {weight.device} 上：请用 tokens.to({str(weight.device)!r})")
        token_ids("tokens", tokens, self.config.vocab_size)
        if cache is not None:
            if not isinstance(cache, LMCache):
                raise TypeError(f"cache 应是 model.new_cache() 得到的 LMCache，收到 {type(cache).__name__}")
            if len(cache.layers) != len(self.blocks):
                raise ValueError(f"cache 有 {len(cache.layers)} 层，模型有 {len(self.blocks)} 块：请用 model.new_cache()")
            cached = cache.layers[0].k
            if cached is not None and cached.shape[0] != tokens.shape[0]:
                raise ValueError(f"tokens 的批大小是 {tokens.shape[0]}，cache 里存的是批大小 {cached.shape[0]}：两者必须相同")
        if attn_mask is not None:
            start = cache.length if cache is not None else 0
            bool_mask("attn_mask", attn_mask, (tokens.shape[0], self.config.n_heads, tokens.shape[1], start + tokens.shape[1]))

    def _positions(self, tokens: torch.Tensor, start: int, positions) -> torch.Tensor:
        batch, length = tokens.shape
        max_len = self.config.max_len
        if positions is None:
            if start + length > max_len:
                raise ValueError(
                    f"输入长度 {length}（加上已缓存的 {start} 个位置）超过了上下文长度 max_len={max_len}；"
                    f"请截短提示（prompt），或用更大的 max_len 训练模型"
                )
            return torch.arange(start, start + length, device=tokens.device)  # (T,)
        if not isinstance(positions, torch.Tensor):
            raise TypeError(f"positions 应是整数张量 (T,) 或 (B, T)，收到 {type(positions).__name__}")
        if positions.dtype not in INDEX_DTYPES:
            raise TypeError(f"positions 应是 torch.long 或 torch.int32 的整数张量，收到 dtype {positions.dtype}")
        if tuple(positions.shape) not in ((length,), (batch, length)):
            raise ValueError(f"positions 的形状应为 ({length},) 或 ({batch}, {length})，收到 {tuple(positions.shape)}")
        if positions.numel() and check_values(positions) and (int(positions.min()) < 0 or int(positions.max()) >= max_len):
            raise ValueError(
                f"positions 取值在 [{int(positions.min())}, {int(positions.max())}]，超出上下文长度 [0, {max_len - 1}]"
            )
        return positions

    @staticmethod
    def _mask(attn_mask, start: int, length: int, device) -> tuple[torch.Tensor | None, bool]:
        """各层共用的 ``(mask, causal)``：只在需要时造布尔掩码。

        - 没有 ``attn_mask``、缓存为空：``causal=True``，交给注意力自己的因果路径（不造 ``(T, T)`` 的掩码）；
        - 没有 ``attn_mask``、只有一个新词元：它看得见全部已缓存的位置，不需要掩码；
        - 其余：第 i 个新词元看得见 ≤ start+i 的位置，再与 ``attn_mask`` 取“与”。
        """
        if attn_mask is None and start == 0:
            return None, True
        if length == 1:  # 因果掩码全为 True：与它取“与”不改变 attn_mask
            return attn_mask, False
        # 只造需要的那 T 行（与 causal_mask(start+T)[start:] 相同，不必先造 T_k×T_k）
        rows = torch.arange(start, start + length, device=device)[:, None]  # (T, 1)
        mask = torch.arange(start + length, device=device)[None, :] <= rows  # (T, T_k)
        return (mask if attn_mask is None else combine_masks(attn_mask, mask)), False

    def forward(
        self,
        tokens: torch.Tensor,
        *,
        cache: LMCache | None = None,
        positions: torch.Tensor | None = None,
        attn_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """词元 ``tokens`` ``(B, T)`` → 每个位置下一个词元的分数（logits）``(B, T, V)``；
        带 ``cache`` 时接着缓存里的位置往后算（增量解码），``attn_mask`` 是额外的布尔掩码（True = 可以关注）。"""
        x = self.hidden_states(tokens, cache=cache, positions=positions, attn_mask=attn_mask)  # (B, T, d_model)
        return self.lm_head(x)  # (B, T, V)

    def hidden_states(
        self,
        tokens: torch.Tensor,
        *,
        cache: LMCache | None = None,
        positions: torch.Tensor | None = None,
        attn_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """输出层之前的特征（hidden states）：末层归一化后的 ``(B, T, d_model)``，参数与 :meth:`forward` 相同。

        ``forward`` 就是 ``lm_head(hidden_states(...))``；训练时把它与输出层的权重一起交给
        :func:`~tformer_lib.lm.fused_loss.linear_cross_entropy`，就不必造出 ``(B, T, V)`` 的 logits。"""
        self._check_call(tokens, cache, attn_mask)
        start = cache.length if cache is not None else 0  # 已缓存的位置数
        length = tokens.shape[1]
        positions = self._positions(tokens, start, positions)  # (T,) 或 (B, T)
        mask, causal = self._mask(attn_mask, start, length, tokens.device)  # 各层共用
        # 1) 词嵌入 + 位置（RoPE 不加在这里，而是在每个注意力里旋转 q、k；旋转用的表各层共用，只算一次）
        x = self.embed(tokens, positions)  # (B, T, d_model)
        rope = self.rope_tables(positions) if self.config.positional == "rope" else None
        # 2) N 个因果块
        recompute = self.activation_checkpointing and cache is None and torch.is_grad_enabled()
        for i, block in enumerate(self.blocks):
            if recompute:  # 激活重算：块内的中间结果不保存，反向时再算一遍前向
                x = checkpoint(block, x, mask, None, rope, causal, use_reentrant=False)  # (B, T, d_model)
            else:
                x = block(x, mask, cache.layers[i] if cache is not None else None, rope, causal)  # (B, T, d_model)
        if cache is not None:
            cache.length += length
        # 3) 末层归一化（输出层在 forward 里）
        return self.norm(x)  # (B, T, d_model)

    def embed(self, tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """词嵌入 + 绝对位置（learned / sinusoidal；RoPE、ALiBi 与 none 在这里不加位置）再过 dropout：``(B, T)`` → ``(B, T, d_model)``。

        不做参数检查（:meth:`forward` 已查过）；第 14 章的静态缓存解码步（:mod:`tformer_lib.inference`）也调用它。
        """
        x = self.tok_embed(tokens)  # (B, T, d_model)
        if self.config.positional == "learned":
            x = x + self.pos_embed(positions)  # (B, T, d_model)
        elif self.config.positional == "sinusoidal":
            x = x + self.pos_table[positions].to(x.dtype)  # (B, T, d_model)
        return self.dropout(x)

    def rope_tables(self, positions: torch.Tensor) -> RopeTables:
        """各层共用的 RoPE 表（含 ``config.rope_scaling``，第 16 章）；第 14 章的静态缓存与第 13 章的服务也调用它。"""
        c = self.config
        return RopeTables(positions, c.d_k, c.rope_base, c.rope_scaling)

    def set_fast_attention(self, fast: bool) -> None:
        """在显式路径（保留注意力权重）与快速路径之间切换所有注意力模块。"""
        if not isinstance(fast, bool):
            raise TypeError(f"fast 应是 bool，收到 {fast!r}")
        self.config.fast_attention = fast
        for module in self.modules():
            if isinstance(module, MultiHeadAttention):
                module.fast = fast

    def set_activation_checkpointing(self, enabled: bool) -> None:
        """打开/关闭激活重算（activation checkpointing，``torch.utils.checkpoint``）：训练时每块只保存它的输入，
        反向传播时重算块内的前向。省下块内的激活内存，代价是多算一次前向；梯度与不重算时相同（测试保证）。
        推理（``torch.no_grad``）与带缓存的生成不受影响。"""
        if not isinstance(enabled, bool):
            raise TypeError(f"enabled 应是 bool，收到 {enabled!r}")
        self.activation_checkpointing = enabled

    def moe_layers(self) -> list[MoEFeedForward]:
        """各块的混合专家层（稠密模型为空列表）。"""
        return [block.feed_forward for block in self.blocks if isinstance(block.feed_forward, MoEFeedForward)]

    def moe_loss(self) -> torch.Tensor:
        r"""最近一次前向的路由辅助损失 :math:`\alpha \sum_\ell L^{(\ell)}_{\text{aux}} + \beta \sum_\ell L^{(\ell)}_z`
        （各 MoE 层相加，α = ``moe_aux_weight``、β = ``moe_z_weight``；Switch Transformer 也是逐层相加）。

        训练时加在交叉熵上（:class:`~tformer_lib.lm.LMTrainer` 自动加）。稠密模型、或还没前向过时是 0。
        """
        layers = [m for m in self.moe_layers() if m.last is not None]
        total = self.tok_embed.weight.new_zeros(())
        for m in layers:
            total = total + self.config.moe_aux_weight * m.last.aux_loss + self.config.moe_z_weight * m.last.z_loss
        return total

    def attention_weights(self) -> list[torch.Tensor | None]:
        """最近一次前向每块的注意力权重 ``(B, h, T, T_k)``（快速路径下为 None）。"""
        return [block.self_attn.attn_weights for block in self.blocks]


def make_lm(config: LMConfig) -> DecoderOnlyLM:
    """按配置搭出一个初始化好的仅解码器语言模型。"""
    if not isinstance(config, LMConfig):
        raise TypeError(f"config 应是 LMConfig，收到 {type(config).__name__}")
    return DecoderOnlyLM(config)
