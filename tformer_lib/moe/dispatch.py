r"""分派与合并（dispatch / combine）：把词元按专家排好队送进去，再按路由权重加回原位。

一个词元有 k 个选择，就有 k 份“任务”（assignment）。整批 N 个词元的 N·k 份任务按专家编号排序后，
专家 e 拿到连续的一段 ``counts[e]`` 行；算完再用 ``index_add`` 按词元编号加回去（散射，scatter）：

    x (N, d) ──gather──▶ 排好队的行 (M, d) ──各专家──▶ (M, d) ──× 权重, scatter-add──▶ (N, d)

容量（capacity）：每个专家一批最多收 :math:`C = \lceil c\,Nk/E \rceil` 份任务（c 是容量因子，capacity factor）；
超出的任务被丢弃（token dropping）——那一份对输出的贡献为 0，词元只靠残差连接通过。排队的优先级与 GShard
相同：先是所有词元的第一选择（按词元顺序），再是第二选择，以此类推。
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from .._checks import non_negative_int, positive_int
from .router import Routing

__all__ = ["expert_capacity", "within_capacity", "DispatchPlan", "plan_dispatch", "dispatch", "combine"]


def expert_capacity(n_tokens: int, n_experts: int, top_k: int, capacity_factor: float) -> int:
    r"""每个专家的容量 :math:`C = \lceil c \cdot N k / E \rceil`（c = 1 时恰好是均匀路由下每个专家的份额）。"""
    n_tokens = non_negative_int("n_tokens", n_tokens)
    positive_int("n_experts", n_experts)
    positive_int("top_k", top_k)
    if (isinstance(capacity_factor, bool) or not isinstance(capacity_factor, numbers.Real)
            or not math.isfinite(capacity_factor) or capacity_factor <= 0):
        raise ValueError(f"capacity_factor 应是正的有限数，收到 {capacity_factor!r}")
    # 先舍去浮点的尾差再取整：1.1 · 200 · 2 / 8 在浮点里是 55.000000000000007，直接 ceil 会得到 56
    return math.ceil(round(capacity_factor * int(n_tokens) * top_k / n_experts, 9))


def within_capacity(experts: torch.Tensor, n_experts: int, capacity: int) -> torch.Tensor:
    """``experts`` ``(N, k)`` 中哪些任务排得进容量 ``capacity``：返回布尔 ``(N, k)``，True = 保留。

    优先级：第一选择全体先于第二选择，同一选择里按词元顺序（先到先得）。
    """
    positive_int("n_experts", n_experts)
    capacity = non_negative_int("capacity", capacity)
    if (not isinstance(experts, torch.Tensor) or experts.dim() != 2 or experts.dtype.is_floating_point
            or experts.dtype == torch.bool or experts.is_complex()):
        raise ValueError(f"experts 应是整数的 (N, k) 张量，收到 {getattr(experts, 'dtype', type(experts).__name__)} "
                         f"{tuple(getattr(experts, 'shape', ()))}")
    if experts.numel() and (int(experts.min()) < 0 or int(experts.max()) >= n_experts):
        raise ValueError(f"experts 的编号应在 [0, {n_experts - 1}] 内，收到 [{int(experts.min())}, {int(experts.max())}]")
    n, k = experts.shape
    queue = experts.t().reshape(-1)  # (k·N,)：先排所有词元的第一选择，再排第二选择……
    arrivals = F.one_hot(queue, n_experts).cumsum(dim=0)  # (k·N, E)：到这份任务为止每个专家已收到几份
    place = arrivals.gather(1, queue[:, None]).squeeze(1) - 1  # (k·N,)：这份任务在它的专家队里排第几（从 0 数）
    return (place < capacity).reshape(k, n).t()  # (N, k)


@dataclass
class DispatchPlan:
    """排队的结果：第 i 行来自词元 ``tokens[i]``，合并时乘 ``weights[i]``；前 ``counts[0]`` 行属于专家 0，依此类推。

    - ``tokens`` ``(M,)``、``weights`` ``(M,)``：M = 保留下来的任务数（≤ N·k）；
    - ``counts``：长度 E 的 Python 整数列表，每个专家的行数；
    - ``n_tokens``：N，合并时输出的行数；``dropped``：因容量被丢掉的任务数。
    """

    tokens: torch.Tensor
    weights: torch.Tensor
    counts: list[int]
    n_tokens: int
    dropped: int


def plan_dispatch(routing: Routing, keep: torch.Tensor | None = None) -> DispatchPlan:
    """把 N·k 份任务按专家编号排队（稳定排序：同一专家内按词元顺序）；``keep`` ``(N, k)`` 为 False 的任务丢掉。"""
    if not isinstance(routing, Routing):
        raise TypeError(f"routing 应是 TopKRouter 返回的 Routing，收到 {type(routing).__name__}")
    n, k = routing.experts.shape
    experts = routing.experts.reshape(-1)  # (N·k,)：词元 0 的 k 个选择，词元 1 的……
    tokens = torch.arange(n, device=experts.device).repeat_interleave(k)  # (N·k,)
    weights = routing.weights.reshape(-1)  # (N·k,)
    dropped = 0
    if keep is not None:
        if not isinstance(keep, torch.Tensor) or keep.dtype != torch.bool or keep.shape != routing.experts.shape:
            raise ValueError(f"keep 应是形状 {tuple(routing.experts.shape)} 的布尔张量，"
                             f"收到 {getattr(keep, 'dtype', type(keep).__name__)} {tuple(getattr(keep, 'shape', ()))}")
        flat = keep.reshape(-1)  # (N·k,)
        dropped = int((~flat).sum())
        experts, tokens, weights = experts[flat], tokens[flat], weights[flat]  # (M,)
    order = torch.argsort(experts, stable=True)  # (M,)
    counts = torch.bincount(experts, minlength=routing.n_experts).tolist()
    return DispatchPlan(tokens[order], weights[order], counts, n, dropped)


def dispatch(x: torch.Tensor, plan: DispatchPlan) -> torch.Tensor:
    """收集（gather）：``x`` ``(N, d)`` → 排好队的行 ``(M, d)``。"""
    if not isinstance(x, torch.Tensor) or x.dim() != 2 or x.shape[0] != plan.n_tokens:
        raise ValueError(f"x 应是 (N={plan.n_tokens}, d) 的张量（与路由时的词元数相同），收到 {tuple(getattr(x, 'shape', ()))}")
    return x.index_select(0, plan.tokens)  # (M, d)


def combine(y: torch.Tensor, plan: DispatchPlan) -> torch.Tensor:
    """散射相加（scatter-add）：专家输出 ``y`` ``(M, d)`` 乘各自的路由权重，加回词元原位 → ``(N, d)``。

    一个词元的任务全被丢弃时，它这一行是 0。
    """
    if not isinstance(y, torch.Tensor) or y.dim() != 2 or y.shape[0] != len(plan.tokens):
        raise ValueError(f"y 应是 (M={len(plan.tokens)}, d) 的专家输出（每份保留的任务一行），收到 {tuple(getattr(y, 'shape', ()))}")
    weighted = y * plan.weights.to(y.dtype)[:, None]  # (M, d)
    return y.new_zeros(plan.n_tokens, y.shape[-1]).index_add(0, plan.tokens, weighted)  # (N, d)
