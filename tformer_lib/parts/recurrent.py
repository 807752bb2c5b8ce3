"""一个极小的循环编码器（recurrent encoder）：顺序写在递推里，不需要位置编码。

循环神经网络（recurrent neural network，RNN）按 :math:`h_t = \\tanh(W x_t + U h_{t-1} + b)` 一步步往前算：
第 t 步必须等第 t−1 步算完，所以“谁先谁后”天然地进入了结果——代价是 T 个词元就要 T 个**串行**的步骤。
自注意力一次矩阵乘法就让所有位置互相看见（可以并行），却因此对顺序“色盲”（第 2 章）。

本模块用 ``nn.RNNCell`` 显式地按时间循环，让“串行步数”看得见（``last_sequential_steps``），
并提供 :func:`measure_sequence_mixing`：在同一进程里交替测量 RNN 循环与一次自注意力的耗时。
"""

from __future__ import annotations

import time

import torch
from torch import nn

from .._checks import positive_int, tensor_with_dim

__all__ = ["TinyRNNEncoder", "measure_sequence_mixing"]


class TinyRNNEncoder(nn.Module):
    """词嵌入 + 一个 Elman RNN 单元：``ids (B, T) → 各步的隐藏状态 (B, T, d_model)``，没有位置编码。"""

    def __init__(self, vocab_size: int, d_model: int):
        super().__init__()
        self.embed = nn.Embedding(positive_int("vocab_size", vocab_size), positive_int("d_model", d_model))
        self.cell = nn.RNNCell(d_model, d_model)  # h_t = tanh(W x_t + U h_{t-1} + b)
        self.last_sequential_steps = 0  # 上一次 forward 串行执行了多少步

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        tensor_with_dim("ids", ids, 2, "(B, T)")
        return self.run(self.embed(ids))  # (B, T, d_model)

    def run(self, x: torch.Tensor) -> torch.Tensor:
        """对已经嵌入好的 ``x (B, T, d_model)`` 按时间递推，返回 ``(B, T, d_model)``。"""
        tensor_with_dim("x", x, 3, "(B, T, d_model)")
        h = x.new_zeros(x.shape[0], x.shape[2])  # (B, d_model)，h_0 = 0
        outputs = []
        for t in range(x.shape[1]):  # 串行：第 t 步要用第 t−1 步的 h
            h = self.cell(x[:, t], h)  # (B, d_model)
            outputs.append(h)
        self.last_sequential_steps = x.shape[1]
        return torch.stack(outputs, dim=1)  # (B, T, d_model)


def measure_sequence_mixing(
    lengths: tuple[int, ...] = (8, 32, 128, 256),
    d_model: int = 64,
    batch_size: int = 8,
    repeats: int = 5,
    seed: int = 0,
) -> dict:
    """测量“让每个位置看到前文”的两种做法的耗时：RNN 的 T 步循环 vs 一次自注意力（``MultiHeadAttention``）。

    同一进程内交替测量，每个长度取 ``repeats`` 次的中位数（秒）。返回
    ``{"lengths", "rnn_seconds", "attention_seconds", "rnn_steps", "attention_steps", "threads"}``；
    步数是确定的事实（RNN 串行 T 步，注意力 1 次批量矩阵乘法），耗时随机器与负载变化，只用来画图。
    """
    from .attention import MultiHeadAttention

    positive_int("repeats", repeats)
    gen = torch.Generator().manual_seed(seed)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        rnn = TinyRNNEncoder(2, d_model).eval()
        mha = MultiHeadAttention(d_model, n_heads=4).eval()
    rnn_s, att_s, rnn_steps = [], [], []
    with torch.no_grad():
        for T in lengths:
            x = torch.randn(batch_size, positive_int("length", T), d_model, generator=gen)  # (B, T, d_model)
            rnn.run(x), mha(x, x, x)  # 预热
            a, b = [], []
            for _ in range(repeats):
                t0 = time.perf_counter()
                rnn.run(x)
                a.append(time.perf_counter() - t0)
                t0 = time.perf_counter()
                mha(x, x, x)
                b.append(time.perf_counter() - t0)
            rnn_s.append(sorted(a)[len(a) // 2])
            att_s.append(sorted(b)[len(b) // 2])
            rnn_steps.append(rnn.last_sequential_steps)
    return {"lengths": list(lengths), "rnn_seconds": rnn_s, "attention_seconds": att_s,
            "rnn_steps": rnn_steps, "attention_steps": [1] * len(lengths), "threads": torch.get_num_threads()}
