"""静态缓存上的一次前向：预填充（prefill，整段提示）和解码一步（decode，每行 1 个新词元）是同一个函数。

它不是第二个模型：词嵌入用 :meth:`DecoderOnlyLM.embed`，每块用模型自己的 :class:`DecoderOnlyBlock`
（其中的 :class:`~tformer_lib.MultiHeadAttention` 把缓存当作普通的自注意力缓存），末尾用模型自己的归一化与输出层。
与 :meth:`DecoderOnlyLM.forward` 的区别只有三处，全都为了“形状不随步数变”：

1. 位置与写入的槽位都是**张量**（``slots``），不是 Python 整数——整数每步不同，会让编译器每步重新编译；
2. 掩码覆盖全部 L 个槽位：第 b 行在槽位 s 处的查询能看见槽位 j，当且仅当 ``pads[b] ≤ j ≤ s``
   （左侧 ``pads[b]`` 个槽位是填充，见 :mod:`tformer_lib.serving.ragged`）；
3. 不做参数检查（检查里的 ``int(tokens.max())`` 会让编译器“断图”（graph break）；调用者负责检查）。
"""

from __future__ import annotations

import torch

from .static_cache import StaticKVCache

__all__ = ["static_positions_and_mask", "static_forward"]


def static_positions_and_mask(slots: torch.Tensor, pads: torch.Tensor, max_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    """由槽位 ``slots`` ``(T,)`` 与每行左填充数 ``pads`` ``(B,)`` 算出位置 ``(B, T)`` 和掩码 ``(B, 1, T, L)``。

    第 b 行槽位 s 上的真实位置是 ``s - pads[b]``（填充处取 0，反正被屏蔽）。
    """
    positions = (slots[None, :] - pads[:, None]).clamp(min=0)  # (B, T)
    keys = torch.arange(max_len, device=slots.device)  # (L,)
    after_pad = keys[None, None, :] >= pads[:, None, None]  # (B, 1, L)：不是左侧填充
    causal = keys[None, None, :] <= slots[None, :, None]  # (1, T, L)：不在查询之后
    return positions, (after_pad & causal)[:, None]  # (B, T), (B, 1, T, L)


def static_forward(model, cache: StaticKVCache, tokens: torch.Tensor, slots: torch.Tensor,
                   pads: torch.Tensor) -> torch.Tensor:
    """``tokens`` ``(B, T)`` 写进槽位 ``slots`` ``(T,)``，返回 logits ``(B, T, V)``；K/V 原地写进 ``cache``。"""
    positions, mask = static_positions_and_mask(slots, pads, cache.max_len)  # (B, T), (B, 1, T, L)
    cache.slots = slots
    x = model.embed(tokens, positions)  # (B, T, d_model)
    c = model.config
    rope = model.rope_tables(positions) if c.positional == "rope" else None  # 各层共用的旋转表
    for block, layer_cache in zip(model.blocks, cache.layers):
        x = block(x, mask, layer_cache, rope)  # (B, T, d_model)
    return model.lm_head(model.norm(x))  # (B, T, V)
