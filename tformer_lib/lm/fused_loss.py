r"""输出层与交叉熵融合（fused linear cross-entropy）：训练时不造出整个 ``(N, V)`` 的 logits，也不造出它的梯度。

普通的做法先算 ``logits = hidden @ weight.T``（N 个位置 × V 个词），再算交叉熵；反向时还要一个同样大小的
``∂L/∂logits``。两者在 float32 里各占 :math:`N \cdot V \cdot 4` 字节：N = 8 × 2048 个位置、V = 128 000 个词时
各约 8.4 GB——比整个 1B 模型的权重还大。这里按行分块（chunk），每次只算 ``chunk_size`` 行：

    logits (c, V) → 减去行最大值、取 exp、求和 → logsumexp 与损失项；需要梯度时把同一块 exp 除以行和就是 softmax，
    当场算 g = softmax − one_hot(target)（再乘 1/目标数），
    ∂L/∂hidden[块] = g @ weight，∂L/∂weight += gᵀ @ hidden[块]

为什么能在前向里就算梯度：交叉熵是计算图的最后一步，上游传回来的只是一个标量 ``grad_output``
（通常是 1；梯度累积、损失缩放时是别的数），所以反向只需把存好的两个梯度乘上它（Liger Kernel 的
FusedLinearCrossEntropy 的做法；Wijmans et al., 2024, *Cut Your Losses in Large-Vocabulary Language Models* 的
Cut Cross-Entropy 同样不造整块的 logits，但只存 logsumexp，反向时逐块重算）。

代价：矩阵乘法的 FLOPs 与普通做法相同（前向一次、反向两次）；任一时刻活着的只有一块 ``(c, V)`` 的 logits，
外加与输入同形的两个 float32 梯度 ``(N, d)``、``(V, d)``。logits 总在 float32 里算（与 ``LMTrainer`` 的
``logits.float()`` 一样；autocast 下也不降到 16 位）；梯度在反向乘上 ``grad_output`` 之后才转回输入的 dtype
（16 位输入配损失缩放时，小梯度不会在乘上缩放因子之前就下溢）。
"""

from __future__ import annotations

import numbers

import torch
from torch.autograd.function import once_differentiable

from .._checks import check_values, one_of, positive_int, tensor_with_dim
from ..specials import PAD

__all__ = ["linear_cross_entropy"]


class _LinearCrossEntropy(torch.autograd.Function):
    """前向逐块算损失，需要时顺便算好梯度；反向只乘 ``grad_output``。"""

    @staticmethod
    def forward(ctx, hidden, weight, targets, ignore_index, reduction, chunk_size, want_hidden, want_weight):
        w = weight.float()  # (V, d)：float32 的参数不复制
        valid = targets != ignore_index  # (N,)
        count = valid.sum()  # ()：留在设备上，不让主机等
        # mean：梯度乘 1/目标数；一个目标也没有时损失是 0/0 = NaN、梯度是 0（与 F.cross_entropy 相同）
        scale = 1.0 if reduction == "sum" else 1.0 / count.clamp(min=1)
        total = torch.zeros((), dtype=torch.float32, device=hidden.device)
        # 两个梯度都留在 float32 里，反向乘上 grad_output 之后才转回输入的 dtype：16 位输入配损失缩放时，
        # 先转 16 位会让小梯度在乘上缩放因子之前就下溢成 0
        grad_hidden = torch.empty(hidden.shape, dtype=torch.float32, device=hidden.device) if want_hidden else None  # (N, d)
        grad_weight = torch.zeros_like(w) if want_weight else None  # (V, d)，float32 里累加
        with torch.autocast(hidden.device.type, enabled=False):  # 这一层的矩阵乘法留在 float32
            for start in range(0, hidden.shape[0], chunk_size):
                rows = slice(start, start + chunk_size)
                h = hidden[rows].float()  # (c, d)
                keep = valid[rows]  # (c,)
                target = torch.where(keep, targets[rows], 0)[:, None]  # (c, 1)：被忽略的位置随便指一个词
                logits = h @ w.T  # (c, V)
                picked = logits.gather(1, target)[:, 0]  # (c,)：先取出目标的 logit，下面原地改写 logits
                top = logits.amax(dim=1, keepdim=True)  # (c, 1)
                p = logits.sub_(top).exp_()  # (c, V)：原地变成 exp(logit − 行最大值)，只算一遍 exp
                total_exp = p.sum(dim=1)  # (c,)
                lse = top[:, 0] + total_exp.log()  # (c,)：logsumexp
                total += torch.where(keep, lse - picked, 0.0).sum()  # 被忽略的行不计（即使那一行有 NaN/inf）
                if not (want_hidden or want_weight):
                    continue
                row_scale = keep * scale  # (c,)：被忽略的行为 0，mean 再乘 1/目标数
                g = p.mul_((row_scale / total_exp)[:, None])  # (c, V)：softmax × row_scale，不再多占一块
                g.scatter_add_(1, target, -row_scale[:, None])  # 减去 one_hot(target) × row_scale
                if want_hidden:
                    grad_hidden[rows] = g @ w  # (c, d)
                if want_weight:
                    grad_weight.addmm_(g.T, h)  # (V, d) += (V, c) @ (c, d)
        ctx.dtypes = hidden.dtype, weight.dtype
        ctx.save_for_backward(grad_hidden, grad_weight)
        return total if reduction == "sum" else total / count

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_output):
        grad_hidden, grad_weight = ctx.saved_tensors
        grads = [None if g is None else (g * grad_output.float()).to(dtype)
                 for g, dtype in zip((grad_hidden, grad_weight), ctx.dtypes)]
        return (*grads, None, None, None, None, None, None)


def linear_cross_entropy(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, *,
                         ignore_index: int = PAD, reduction: str = "mean", chunk_size: int | None = None) -> torch.Tensor:
    """``F.cross_entropy(hidden @ weight.T, targets, ignore_index=…, reduction=…)``，但每次只造 ``chunk_size`` 行的 logits。

    - ``hidden``：``(N, d)`` 末层归一化后的特征（如 :meth:`~tformer_lib.lm.DecoderOnlyLM.hidden_states` 展平）；
    - ``weight``：``(V, d)`` 输出层的权重（没有偏置；与词嵌入共享也可以，梯度照常累加）；
    - ``targets``：``(N,)`` 的 ``torch.long``，等于 ``ignore_index`` 的位置不计损失；
    - ``reduction``：``"mean"``（总和 / 不被忽略的目标数）或 ``"sum"``；
    - ``chunk_size``：每块的行数 c，默认 ``max(128, d)``——这样一块 logits ``(c, V)`` 与它累加进去的权重梯度
      ``(V, d)`` 一样大（d ≥ 128 时），不多占一份更大的内存；块再小，逐块的开销与对 ``(V, d)`` 梯度的反复读写
      （每块一次 ``addmm_``）就显出来了。

    返回 float32 的标量。只在需要梯度时（开着梯度、且 ``hidden`` 或 ``weight`` 要梯度）才在前向里算梯度。
    ``hidden`` 与 ``weight`` 的 dtype 可以不同（autocast 下特征是 16 位），都逐块转成 float32 计算，梯度转回各自的 dtype（float64 的输入也在 float32 里算：误差是 float32 的量级）。
    只有一阶导数：梯度在前向里已算成数值，``create_graph=True`` 的二阶导数（如梯度惩罚）不会经过它。
    """
    tensor_with_dim("hidden", hidden, 2, "(N, d)")
    tensor_with_dim("weight", weight, 2, "(V, d)")
    tensor_with_dim("targets", targets, 1, "(N,)")
    for name, x in (("hidden", hidden), ("weight", weight)):
        if not x.dtype.is_floating_point:
            raise TypeError(f"{name} 应是浮点张量，收到 dtype {x.dtype}")
    if weight.shape[0] == 0:
        raise ValueError(f"weight 的形状 {tuple(weight.shape)} 应为 (V, d)、V ≥ 1：词表里至少要有一个词")
    if weight.shape[1] != hidden.shape[1]:
        raise ValueError(f"weight 的形状 {tuple(weight.shape)} 应为 (V, d)、d 与 hidden 的 d={hidden.shape[1]} 相同")
    if targets.dtype != torch.long:
        raise TypeError(f"targets 应是 torch.long（int64）的词元 id，收到 dtype {targets.dtype}")
    if targets.shape[0] != hidden.shape[0]:
        raise ValueError(f"targets 的长度 {targets.shape[0]} 应与 hidden 的行数 N={hidden.shape[0]} 相同")
    for name, x in (("weight", weight), ("targets", targets)):
        if x.device != hidden.device:
            raise ValueError(f"{name} 在 {x.device} 上，hidden 在 {hidden.device} 上：三者应在同一设备上")
    if isinstance(ignore_index, bool) or not isinstance(ignore_index, numbers.Integral):
        raise TypeError(f"ignore_index 应是整数，收到 {type(ignore_index).__name__} {ignore_index!r}")
    one_of("reduction", reduction, ("mean", "sum"))
    chunk_size = max(128, hidden.shape[1]) if chunk_size is None else positive_int("chunk_size", chunk_size)
    vocab = weight.shape[0]
    kept = targets[targets != ignore_index] if check_values(targets) else targets[:0]  # 读取值：见 check_values
    if kept.numel() and (int(kept.min()) < 0 or int(kept.max()) >= vocab):
        raise ValueError(f"targets 中不被忽略的 id 落在 [{int(kept.min())}, {int(kept.max())}]，"
                         f"超出了词表范围 [0, {vocab - 1}]（ignore_index={ignore_index}）")
    grad = torch.is_grad_enabled()
    return _LinearCrossEntropy.apply(hidden, weight, targets, int(ignore_index), reduction, chunk_size,
                                     grad and hidden.requires_grad, grad and weight.requires_grad)
