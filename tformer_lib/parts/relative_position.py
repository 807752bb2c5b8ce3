"""相对位置（relative position）：不给每个位置发“身份证”，而是让注意力分数直接看两个词元相隔多远。

两篇经典做法，本模块各取一半：

- Shaw et al.（2018）把相对距离 ``j − i`` 截断到 ``[−K, K]``，超过 K 的一律算作 K——远处的细节不重要，
  而截断让同一套参数适用于任意长度；
- T5（Raffel et al., 2020）给每个头、每个（截断后的）相对距离学一个**标量**偏置，直接加到注意力分数上：
  :math:`\\mathrm{score}_{ij} = q_i\\cdot k_j/\\sqrt{d_k} + b_h(\\mathrm{clip}(j - i))`。

偏置加在 softmax 之前，形状 ``(h, T_q, T_k)``，可以直接作为 ``torch.nn.functional.scaled_dot_product_attention``
的浮点 ``attn_mask``（它被加到分数上）。
"""

from __future__ import annotations

import torch
from torch import nn

from .._checks import positive_int

__all__ = ["relative_position_index", "RelativePositionBias"]


def relative_position_index(t_q: int, t_k: int, max_distance: int) -> torch.Tensor:
    """``(T_q, T_k)`` 的整数下标 ``clamp(j − i, −K, K) + K``（K = ``max_distance``），取值 ``0 … 2K``。

    第 ``i`` 行是查询位置 i，第 ``j`` 列是键位置 j；键在查询右边时 ``j − i`` 为正。
    """
    positive_int("t_q", t_q)
    positive_int("t_k", t_k)
    positive_int("max_distance", max_distance)
    rel = torch.arange(t_k)[None, :] - torch.arange(t_q)[:, None]  # (T_q, T_k)：j − i
    return rel.clamp(-max_distance, max_distance) + max_distance  # (T_q, T_k)，0 … 2K


class RelativePositionBias(nn.Module):
    """每个头、每个截断相对距离一个可学习标量：``forward(t_q, t_k) → (h, T_q, T_k)`` 的加性偏置。

    参数只有 ``(2K + 1) × h`` 个，与序列长度无关，所以训练时没见过的长度也照样有偏置可用
    （超过 K 的距离共用两端的那个桶）。初始化为 0：训练开始时不改变注意力。
    """

    def __init__(self, n_heads: int, max_distance: int = 8):
        super().__init__()
        self.n_heads = positive_int("n_heads", n_heads)
        self.max_distance = positive_int("max_distance", max_distance)
        self.bias = nn.Embedding(2 * max_distance + 1, n_heads)  # 第 r 行：相对距离 r − K 的各头偏置
        nn.init.zeros_(self.bias.weight)

    def forward(self, t_q: int, t_k: int) -> torch.Tensor:
        index = relative_position_index(t_q, t_k, self.max_distance).to(self.bias.weight.device)  # (T_q, T_k)
        return self.bias(index).permute(2, 0, 1)  # (T_q, T_k, h) → (h, T_q, T_k)

    def extra_repr(self) -> str:
        return f"n_heads={self.n_heads}, max_distance={self.max_distance}"
