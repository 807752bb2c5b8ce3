"""混合专家（mixture of experts, MoE，第 16 章）：路由、分派/合并、专家前馈层。

- :mod:`.router`：top-k 路由器（softmax 后取 k 个，可重新归一），负载均衡损失与 z 损失；
- :mod:`.dispatch`：容量与丢弃（capacity, token dropping），按专家排序的 gather / scatter-add；
- :mod:`.layer`：:class:`MoEFeedForward`（可放进 ``DecoderOnlyBlock``：``LMConfig(moe_experts=E, …)``）与逐专家
  循环的参照实现 :func:`moe_loop`。

专家并行（expert parallelism，专家分到几个进程、词元用 all-to-all 送过去）在
:mod:`tformer_lib.parallel.expert_parallel`。
"""

from .dispatch import DispatchPlan, combine, dispatch, expert_capacity, plan_dispatch, within_capacity
from .layer import MoEFeedForward, MoEStats, moe_loop
from .router import Routing, TopKRouter, load_balancing_loss, router_z_loss

__all__ = ["Routing", "TopKRouter", "load_balancing_loss", "router_z_loss", "expert_capacity", "within_capacity",
           "DispatchPlan", "plan_dispatch", "dispatch", "combine", "MoEFeedForward", "MoEStats", "moe_loop"]
