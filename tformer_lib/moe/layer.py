r"""混合专家前馈层（mixture-of-experts feed-forward layer）：E 个前馈网络，每个词元只走其中 k 个。

    x (B, T, d) → 展平 (N, d) → 路由 top-k → 分派 → E 个专家（各是第 4 章的 FFN）→ 合并 (N, d)
                                                           [+ 共享专家 FFN(x)] → (B, T, d)

参数量是 E 个 FFN，每个词元的计算量只有 k 个——“激活参数”（active parameters）与总参数分开，这是
Mixtral 8×7B（47B 参数、每词元约 13B 激活）、DeepSeek-V3 这类模型的来历。
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from .._checks import dropout_rate, flag, last_dim, module_dtype, non_negative_int, positive_int
from ..parts.feedforward import PositionwiseFeedForward
from .dispatch import combine, dispatch, expert_capacity, plan_dispatch, within_capacity
from .router import Routing, TopKRouter, load_balancing_loss, router_z_loss

__all__ = ["MoEFeedForward", "MoEStats", "moe_loop"]


def check_input(x, layer: nn.Module) -> None:
    """``x`` 的类型、最后一维与 dtype（都不看数据，不花时间）：与稠密 FFN 一样给出清楚的错误。"""
    if not isinstance(x, torch.Tensor) or x.dim() < 1:
        raise TypeError(f"x 应是形状为 (..., d_model) 的 torch.Tensor，收到 {type(x).__name__}")
    last_dim("x", x, layer.router.gate.in_features, "这个混合专家层的 d_model")
    module_dtype("x", x, layer)


@dataclass
class MoEStats:
    """最近一次前向的路由统计（训练循环取辅助损失、画负载图用）。

    - ``aux_loss``、``z_loss``：:func:`~tformer_lib.moe.load_balancing_loss` 与
      :func:`~tformer_lib.moe.router_z_loss`，带梯度；
    - ``load`` ``(E,)``：每个专家实际收到的任务数（丢弃之后）；
    - ``assignments``：N·k（丢弃之前的任务总数）；``dropped``：因容量丢掉的任务数。
    """

    aux_loss: torch.Tensor
    z_loss: torch.Tensor
    load: torch.Tensor
    assignments: int
    dropped: int

    @property
    def drop_rate(self) -> float:
        """丢弃的任务占全部任务的比例（没有任务时为 0）。"""
        return self.dropped / self.assignments if self.assignments else 0.0


class MoEFeedForward(nn.Module):
    r"""混合专家前馈层：``(B, T, d_model)`` 进、``(B, T, d_model)`` 出，可替换 :class:`~tformer_lib.PositionwiseFeedForward`。

    .. math:: y = \sum_{j=1}^{k} g_j(x)\,\mathrm{FFN}_{e_j(x)}(x) \;[+\ \mathrm{FFN}_{\text{shared}}(x)]

    - ``n_experts`` 个专家，每个是 ``PositionwiseFeedForward(d_model, d_ff, dropout, activation, bias=bias)``
      （``activation="swiglu"`` 即 Mixtral 的专家）；路由见 :class:`~tformer_lib.moe.TopKRouter`（``top_k``、
      ``renormalize``）；
    - ``capacity_factor``：None = 不丢词元（dropless）；给出 c 时，**训练模式下**每个专家每次前向最多收
      :math:`\lceil cNk/E\rceil` 份任务，多的丢掉（:mod:`~tformer_lib.moe.dispatch`）。容量按这一次前向的 N 个词元算——
      它们就是 GShard 所说的一“组”（group）。推理（``eval()``）时不丢：否则一个词元的输出会取决于同批里有谁，
      带 K/V 缓存逐个生成也会与整句前向不同；
    - ``n_shared_experts`` = s > 0 时另加一个人人都走的共享专家（DeepSeek-MoE 的做法），宽 s·d_ff——与 s 个宽 d_ff
      的共享专家输出之和完全相同（把它们的权重拼起来就是）。

    每次前向后 ``self.last`` 是一份 :class:`MoEStats`（辅助损失与负载）。
    """

    def __init__(self, d_model: int, d_ff: int, n_experts: int, top_k: int = 2, *, dropout: float = 0.0,
                 activation: str = "swiglu", bias: bool = True, capacity_factor: float | None = None,
                 renormalize: bool = True, n_shared_experts: int = 0):
        super().__init__()
        positive_int("d_ff", d_ff)
        dropout_rate("dropout", dropout)
        flag("bias", bias)
        if capacity_factor is not None:
            expert_capacity(1, 1, 1, capacity_factor)  # 只为检查：正的有限数
        n_shared_experts = non_negative_int("n_shared_experts", n_shared_experts)
        self.router = TopKRouter(d_model, n_experts, top_k, renormalize=renormalize)
        self.experts = nn.ModuleList(
            [PositionwiseFeedForward(d_model, d_ff, dropout, activation, bias=bias) for _ in range(n_experts)]
        )
        self.shared = (PositionwiseFeedForward(d_model, n_shared_experts * d_ff, dropout, activation, bias=bias)
                       if n_shared_experts else None)
        self.capacity_factor = capacity_factor
        self.last: MoEStats | None = None

    @property
    def n_experts(self) -> int:
        return len(self.experts)

    @property
    def top_k(self) -> int:
        return self.router.top_k

    def route(self, flat: torch.Tensor) -> tuple[Routing, torch.Tensor | None]:
        """路由 ``(N, d_model)`` 的词元，并按容量决定保留哪些任务（``keep`` ``(N, k)``；不限容量时为 None）。"""
        routing = self.router(flat)
        keep = None
        if self.capacity_factor is not None and self.training:
            capacity = expert_capacity(flat.shape[0], self.n_experts, self.top_k, self.capacity_factor)
            keep = within_capacity(routing.experts, self.n_experts, capacity)  # (N, k)
        return routing, keep

    def record(self, routing: Routing, load: torch.Tensor, dropped: int) -> None:
        """记下这次前向的 :class:`MoEStats`（专家并行的版本也调用它）。"""
        self.last = MoEStats(load_balancing_loss(routing), router_z_loss(routing), load, routing.experts.numel(), dropped)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        check_input(x, self)
        flat = x.reshape(-1, x.shape[-1])  # (B, T, d) → (N, d)
        routing, keep = self.route(flat)
        plan = plan_dispatch(routing, keep)
        rows = dispatch(flat, plan)  # (M, d)：按专家排好队
        outputs = [expert(part) for expert, part in zip(self.experts, rows.split(plan.counts))]  # 专家 e：(counts[e], d)
        y = combine(torch.cat(outputs), plan)  # (N, d)
        if self.shared is not None:
            y = y + self.shared(flat)  # (N, d)
        self.record(routing, torch.tensor(plan.counts), plan.dropped)
        return y.reshape(x.shape)  # (B, T, d)


def moe_loop(layer: MoEFeedForward, x: torch.Tensor) -> torch.Tensor:
    """参照实现：对专家逐个循环，用布尔掩码挑出去它那里的词元——与 :class:`MoEFeedForward` 的排序分派算的是同一个式子。

    读起来最直白、最慢；测试用它证明分派/合并没有算错。不记 ``layer.last``。
    """
    if not isinstance(layer, MoEFeedForward):
        raise TypeError(f"layer 应是 MoEFeedForward，收到 {type(layer).__name__}")
    flat = x.reshape(-1, x.shape[-1])  # (N, d)
    routing, keep = layer.route(flat)
    out = torch.zeros_like(flat)  # (N, d)
    for e, expert in enumerate(layer.experts):
        hit = routing.experts == e  # (N, k)：哪个词元的哪个选择是专家 e
        if keep is not None:
            hit = hit & keep
        token, slot = hit.nonzero(as_tuple=True)  # 各 (n_e,)
        weight = routing.weights[token, slot].to(flat.dtype)[:, None]  # (n_e, 1)
        out = out.index_add(0, token, weight * expert(flat[token]))  # (N, d)
    if layer.shared is not None:
        out = out + layer.shared(flat)
    return out.reshape(x.shape)  # (B, T, d)
