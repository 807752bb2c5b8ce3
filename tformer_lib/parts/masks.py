"""掩码（mask）：全书只有一个约定——布尔张量，True 表示“可以关注”。

形状约定：注意力分数是 ``(B, h, T_q, T_k)``，掩码只需能广播到它。
"""

import torch

from .._checks import positive_int, tensor_with_dim
from ..specials import PAD


def causal_mask(n: int, device=None) -> torch.Tensor:
    """因果掩码（causal mask，也叫序列掩码 sequence mask）：位置 i 只能看见 j ≤ i。

    返回 ``(n, n)`` 的布尔下三角矩阵（含对角线）。
    """
    positive_int("n", n)
    return torch.ones(n, n, dtype=torch.bool, device=device).tril()


def padding_mask(tokens: torch.Tensor, pad_id: int = PAD) -> torch.Tensor:
    """填充掩码（padding mask）：键（key）位置不是填充词元时为 True。

    ``tokens`` 形状 ``(B, T)``，返回 ``(B, 1, 1, T)``，可广播到所有头与所有查询位置。
    """
    tensor_with_dim("tokens", tokens, 2, "(B, T)")
    return (tokens != pad_id)[:, None, None, :]  # (B, 1, 1, T_k)


def combine_masks(*masks: torch.Tensor | None) -> torch.Tensor | None:
    """把若干掩码按“与”合并（两个都允许才允许）；``None`` 表示不设限制，被跳过。"""
    result = None
    for mask in masks:
        if mask is None:
            continue
        if mask.dtype != torch.bool:
            raise TypeError(f"masks 里的每个掩码都应是 torch.bool（True = 可以关注），收到 dtype {mask.dtype}")
        result = mask if result is None else result & mask
    return result


def target_mask(tgt: torch.Tensor, pad_id: int = PAD) -> torch.Tensor:
    """解码器自注意力的掩码：填充掩码与因果掩码的合并，形状 ``(B, 1, T, T)``。"""
    tensor_with_dim("tgt", tgt, 2, "(B, T)")
    return combine_masks(padding_mask(tgt, pad_id), causal_mask(tgt.shape[1], device=tgt.device))
