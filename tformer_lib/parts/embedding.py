"""词嵌入（token embedding）：查表得到向量，再乘以 √d_model。"""

import math

import torch
from torch import nn

from .._checks import positive_int, token_ids


class TokenEmbedding(nn.Module):
    """词元 id ``(B, T)`` → 向量 ``(B, T, d_model)``，并乘以 √d_model。

    乘 √d_model 是论文 3.4 节的做法：嵌入初始化得较小，放大后与位置编码（幅度约为 1）处在同一量级，
    位置信号不会淹没词义；权重与输出层共享时也让两边的尺度相配。
    """

    def __init__(self, vocab_size: int, d_model: int):
        super().__init__()
        self.vocab_size = positive_int("vocab_size", vocab_size)
        self.d_model = positive_int("d_model", d_model)
        self.lut = nn.Embedding(vocab_size, d_model)  # 查找表（lookup table）

    def forward(self, tokens: torch.Tensor, name: str = "tokens") -> torch.Tensor:
        """``name`` 是出错时报告的参数名：模型传入 ``"src"`` 或 ``"tgt_in"``，让错误指向调用者自己的参数。"""
        token_ids(name, tokens, self.vocab_size)
        return self.lut(tokens) * math.sqrt(self.d_model)  # (B, T, d_model)
