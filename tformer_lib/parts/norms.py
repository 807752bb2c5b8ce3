"""归一化层（normalization）：层归一化 LayerNorm 与均方根归一化 RMSNorm，以及按名字挑选的工厂。

- LayerNorm（Ba et al., 2016）：减均值、除标准差，再乘 γ 加 β；
- RMSNorm（Zhang & Sennrich, 2019）：不减均值，只除以均方根（root mean square），再乘 γ；
  少一次求均值、少一个偏置，LLaMA 等现代大模型都用它。
"""

import torch
from torch import nn

from .._checks import finite_positive, positive_int

NORM_KINDS = ("layer", "rms")


class RMSNorm(nn.Module):
    r"""均方根归一化：:math:`\mathrm{RMSNorm}(x) = \dfrac{x}{\sqrt{\mathrm{mean}(x^2) + \epsilon}} \odot \gamma`。

    只在最后一维上归一化，``weight`` 即 γ（初始为 1）；与 ``torch.nn.RMSNorm(d_model, eps)`` 逐元素相同（测试保证）。
    形状 ``(..., d_model)`` 进、``(..., d_model)`` 出。
    """

    def __init__(self, d_model: int, eps: float = 1e-5):
        super().__init__()
        self.d_model = positive_int("d_model", d_model)
        self.eps = finite_positive("eps", eps)
        self.weight = nn.Parameter(torch.ones(d_model))  # γ

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[-1] != self.d_model:
            raise ValueError(f"x 的最后一维是 {x.shape[-1]}，而这个 RMSNorm 期望 d_model={self.d_model}")
        # 均方根 rms = sqrt(mean(x^2) + eps)：半精度输入升到 float32 里算（避免下溢），float64 就用 float64；
        # 乘完 γ 再转回输入的 dtype——与 torch.nn.RMSNorm 相同（fp16 输入、fp32 权重 → fp16 输出）
        xc = x.to(torch.promote_types(x.dtype, torch.float32))
        inv_rms = torch.rsqrt(xc.pow(2).mean(dim=-1, keepdim=True) + self.eps)  # (..., 1)
        return (xc * inv_rms * self.weight.to(xc.dtype)).to(x.dtype)  # (..., d_model)

    def extra_repr(self) -> str:
        return f"{self.d_model}, eps={self.eps}"


def make_norm(kind: str, d_model: int, eps: float = 1e-5) -> nn.Module:
    """按名字建归一化层：``"layer"`` → ``nn.LayerNorm``，``"rms"`` → :class:`RMSNorm`；``eps`` 是分母里的 ε。"""
    if kind == "layer":
        finite_positive("eps", eps)
        return nn.LayerNorm(d_model, eps=eps)
    if kind == "rms":
        return RMSNorm(d_model, eps=eps)
    raise ValueError(f"norm 应是 {NORM_KINDS} 之一，收到 {kind!r}")
