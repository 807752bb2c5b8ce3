"""逐位置前馈网络（position-wise feed-forward network）。"""

import torch
from torch import nn

from .._checks import dropout_rate, flag, module_dtype, positive_int

_ACTIVATIONS = {
    "relu": nn.ReLU,
    "gelu": nn.GELU,  # 精确的 GELU：x·Φ(x)
    "gelu_tanh": lambda: nn.GELU(approximate="tanh"),  # tanh 近似的 GELU（GPT-2 用的那一种）
    "swiglu": nn.SiLU,
}


class PositionwiseFeedForward(nn.Module):
    r"""对每个位置独立地做同一个两层网络：:math:`\mathrm{FFN}(x) = W_2\,\phi(W_1 x + b_1) + b_2`。

    默认激活 :math:`\phi` 是论文的 ReLU，也可选 GELU（``"gelu"`` 精确，``"gelu_tanh"`` 是 GPT-2 的 tanh 近似）。
    ``bias=False`` 去掉三个线性层的偏置（LLaMA、Qwen2 的 FFN 没有偏置）。形状 ``(B, T, d_model)`` 进、``(B, T, d_model)`` 出。

    ``activation="swiglu"`` 是门控线性单元（gated linear unit）的 SwiGLU 变体（Shazeer, 2020；LLaMA 用它）：
    :math:`\mathrm{FFN}(x) = W_2\,(\mathrm{SiLU}(W_1 x) \odot W_3 x)`，多一个矩阵 ``w_3``（“门”的另一半）。
    参数量是普通 FFN 的 1.5 倍；想与之持平，把 ``d_ff`` 取成原来的 2/3。
    """

    def __init__(
        self, d_model: int, d_ff: int, dropout: float = 0.0, activation: str = "relu", *, bias: bool = True
    ):
        super().__init__()
        positive_int("d_model", d_model)
        positive_int("d_ff", d_ff)
        dropout_rate("dropout", dropout)
        flag("bias", bias)
        if activation not in _ACTIVATIONS:
            raise ValueError(f"activation 应是 {sorted(_ACTIVATIONS)} 之一，收到 {activation!r}")
        self.w_1 = nn.Linear(d_model, d_ff, bias=bias)
        self.w_3 = nn.Linear(d_model, d_ff, bias=bias) if activation == "swiglu" else None  # SwiGLU 的门
        self.activation = _ACTIVATIONS[activation]()
        self.dropout = nn.Dropout(dropout)
        self.w_2 = nn.Linear(d_ff, d_model, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        module_dtype("x", x, self)
        hidden = self.activation(self.w_1(x))  # (B, T, d_ff)
        if self.w_3 is not None:
            hidden = hidden * self.w_3(x)  # SwiGLU：SiLU(W_1 x) ⊙ W_3 x，(B, T, d_ff)
        return self.w_2(self.dropout(hidden))  # (B, T, d_model)
