r"""路由器（router）：决定每个词元去哪 k 个专家，以及两种让训练稳住的辅助损失。

- :class:`TopKRouter`：门控 :math:`s = \mathrm{softmax}(x W_g^\top)`，取最大的 k 个；
  ``renormalize=True`` 时把这 k 个权重重新归一到和为 1（Mixtral、Qwen-MoE 的做法，等价于只对 top-k 的 logits
  做 softmax），``False`` 时保留 softmax 的原值（Switch Transformer、GShard 的做法）。
- :func:`load_balancing_loss`：Switch/GShard 式的负载均衡损失 :math:`E\sum_e f_e P_e`，
  均匀路由时恰为 1；
- :func:`router_z_loss`：ST-MoE 的 z 损失 :math:`\frac1N\sum_n(\log\sum_e e^{z_{ne}})^2`，压住 logits 的大小。
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from .._checks import flag, last_dim, module_dtype, positive_int, tensor_with_dim

__all__ = ["Routing", "TopKRouter", "load_balancing_loss", "router_z_loss"]


@dataclass
class Routing:
    """一次路由的结果（N 个词元、E 个专家、每个词元 k 个）。

    - ``logits`` ``(N, E)``：门控的原始分数 :math:`z = x W_g^\top`；
    - ``probs`` ``(N, E)``：softmax 后的概率 :math:`s`（至少 float32）；
    - ``experts`` ``(N, k)``：选中的专家编号，按概率从大到小；
    - ``weights`` ``(N, k)``：组合输出时各专家的权重（与 ``probs`` 同 dtype）。
    """

    logits: torch.Tensor
    probs: torch.Tensor
    experts: torch.Tensor
    weights: torch.Tensor

    @property
    def n_experts(self) -> int:
        return self.probs.shape[-1]

    @property
    def top_k(self) -> int:
        return self.experts.shape[-1]


class TopKRouter(nn.Module):
    r"""top-k 路由器：一个无偏置的线性层 :math:`W_g \in \mathbb{R}^{E\times d}` 打分，softmax，取前 k 个。

    ``router(x)``：``x`` ``(N, d_model)`` → :class:`Routing`。softmax 在 float32（或更高精度）里算：
    16 位里，E 个相近的概率会舍入成相同的值，top-k 的选择就变成了舍入误差的选择。

    注意 k = 1 且 ``renormalize=True`` 时权重恒为 1：输出与门控概率无关，路由器只能从辅助损失得到梯度。
    Switch Transformer 用 k = 1 时因此保留 softmax 的原值（``renormalize=False``）。
    """

    def __init__(self, d_model: int, n_experts: int, top_k: int, *, renormalize: bool = True):
        super().__init__()
        positive_int("d_model", d_model)
        positive_int("n_experts", n_experts)
        positive_int("top_k", top_k)
        if top_k > n_experts:
            raise ValueError(f"top_k={top_k} 不能大于专家数 n_experts={n_experts}")
        self.top_k = top_k
        self.renormalize = flag("renormalize", renormalize)
        self.gate = nn.Linear(d_model, n_experts, bias=False)  # W_g

    def forward(self, x: torch.Tensor) -> Routing:
        tensor_with_dim("x", x, 2, "(N, d_model)")
        last_dim("x", x, self.gate.in_features, "这个路由器的 d_model")
        module_dtype("x", x, self)
        logits = self.gate(x)  # (N, E)
        probs = torch.softmax(logits.to(torch.promote_types(logits.dtype, torch.float32)), dim=-1)  # (N, E)
        weights, experts = probs.topk(self.top_k, dim=-1)  # (N, k), (N, k)
        if self.renormalize:
            weights = weights / weights.sum(dim=-1, keepdim=True)  # 每行 k 个权重和为 1
        return Routing(logits, probs, experts, weights)


def _check_routing(routing) -> Routing:
    if not isinstance(routing, Routing):
        raise TypeError(f"routing 应是 TopKRouter 返回的 Routing，收到 {type(routing).__name__}")
    return routing


def load_balancing_loss(routing: Routing) -> torch.Tensor:
    r"""负载均衡损失（load-balancing loss，Switch Transformer 式，推广到 top-k）：

    .. math:: L_{\text{aux}} = E \sum_{e=1}^{E} f_e\, P_e,\qquad
              f_e = \frac{\#\{(n, j): \text{第 } n \text{ 个词元的第 } j \text{ 个选择是 } e\}}{N k},\quad
              P_e = \frac1N \sum_n s_{ne}

    :math:`f_e` 是分给专家 e 的份额（计数，不可导），:math:`P_e` 是它的平均概率（可导）：梯度把概率从
    过载的专家挪走。:math:`\sum_e f_e = \sum_e P_e = 1`，所以均匀路由时 :math:`L = 1`，全挤到一个专家时
    :math:`L = E`（概率也全在它身上）。Hugging Face 的 ``load_balancing_loss_func`` 把 :math:`f_e` 除以 N 而不是
    Nk，它的值是这里的 k 倍（测试对照过）。没有词元时返回 0。
    """
    routing = _check_routing(routing)
    n, n_experts = routing.probs.shape
    if n == 0:
        return routing.probs.sum() * 0.0
    counts = torch.bincount(routing.experts.flatten(), minlength=n_experts)  # (E,)
    share = counts.to(routing.probs.dtype) / routing.experts.numel()  # f_e，(E,)
    mean_prob = routing.probs.mean(dim=0)  # P_e，(E,)
    return n_experts * (share * mean_prob).sum()


def router_z_loss(routing: Routing) -> torch.Tensor:
    r"""路由器 z 损失（router z-loss，ST-MoE, Zoph et al. 2022）：:math:`\frac1N\sum_n (\log\sum_e e^{z_{ne}})^2`。

    只罚 logits 整体变大（softmax 对整体平移不敏感，但 16 位里大 logits 会溢出、舍入），不改变路由的偏好。
    没有词元时返回 0。
    """
    routing = _check_routing(routing)
    if routing.logits.shape[0] == 0:
        return routing.probs.sum() * 0.0
    logits = routing.logits.to(routing.probs.dtype)  # (N, E)
    return torch.logsumexp(logits, dim=-1).square().mean()
