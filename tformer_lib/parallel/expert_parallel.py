r"""专家并行（expert parallelism，第 16 章）：E 个专家分到 p 个进程，词元用 all-to-all 送去它的专家、再送回来。

每个进程持有全部的注意力、嵌入与路由器（与数据并行一样，各进程一份、梯度求和），但只持有 E/p 个专家；
每个进程处理自己的那一片批次（一“组”词元，GShard 的 group）。一个 MoE 层里：

1. 本地路由、按容量丢弃、按专家排队（与单进程的 :class:`~tformer_lib.moe.MoEFeedForward` 完全相同）；
2. **all-to-all（分派）**：先交换每个专家的行数（E 个整数），再把属于进程 q 的专家的行发给 q；
3. 本地专家算自己收到的行；
4. **all-to-all（合并）**：结果按原路送回，乘路由权重加回原位。

all-to-all 的反向仍是 all-to-all（发送与接收的行数对调）：:class:`~tformer_lib.parallel.all_to_all.AllToAll`。于是专家的梯度自动汇集了所有
进程送来的词元，不需要再 all-reduce；其余参数的梯度照数据并行求和。

**与单进程的关系**：容量和负载均衡损失都按“组”算，所以 p 个进程的专家并行等于单进程把同一个模型依次用在
p 片批次上（:func:`train_moe_groups`）——前向、反向与 AdamW 每一步都相同（测试在 2 与 4 个进程上证明）。
不丢词元、不加辅助损失时，它也就等于整批一次前向。
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from .._checks import non_negative_int, positive_int
from ..moe import MoEFeedForward, combine, dispatch, plan_dispatch
from ..lm.data import loss_targets
from ..specials import PAD
from .all_to_all import AllToAll, all_to_all
from .comm import recording
from .data_parallel import check_run, global_batches, new_model, rank_batches
from .launch import launch

__all__ = ["ExpertParallelMoE", "expert_parallel_payload", "shard_experts", "train_expert_parallel",
           "train_moe_groups"]


class ExpertParallelMoE(MoEFeedForward):
    """:class:`~tformer_lib.moe.MoEFeedForward` 的专家并行版本：本进程只持有第 ``rank`` 份专家（连续 E/p 个）。

    路由器与共享专家是原层的同一批参数（各进程一份）；``experts`` 只含本地的专家，``first_expert`` 是第一个的全局编号。
    需要已初始化的进程组（``world_size`` 个进程）。
    """

    def __init__(self, moe: MoEFeedForward, rank: int, world_size: int):
        nn.Module.__init__(self)
        if not isinstance(moe, MoEFeedForward):
            raise TypeError(f"moe 应是 MoEFeedForward，收到 {type(moe).__name__}")
        positive_int("world_size", world_size)
        rank = non_negative_int("rank", rank)
        if rank >= world_size:
            raise ValueError(f"rank 应是 0 到 world_size-1={world_size - 1} 之间的整数，收到 {rank!r}")
        if moe.n_experts % world_size != 0:
            raise ValueError(f"专家数 n_experts={moe.n_experts} 不能被进程数 world_size={world_size} 整除")
        self.total_experts, self.world_size, self.rank = moe.n_experts, world_size, rank
        self.local_experts = moe.n_experts // world_size
        self.first_expert = rank * self.local_experts
        self.router, self.shared, self.capacity_factor = moe.router, moe.shared, moe.capacity_factor
        self.experts = nn.ModuleList(list(moe.experts)[self.first_expert : self.first_expert + self.local_experts])
        self.last = None
        self.train(moe.training)  # 保持原层的训练/推理模式（推理时不丢词元）

    @property
    def n_experts(self) -> int:
        return self.total_experts

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not dist.is_initialized() or (dist.get_rank(), dist.get_world_size()) != (self.rank, self.world_size):
            actual = (dist.get_rank(), dist.get_world_size()) if dist.is_initialized() else "没有进程组"
            raise RuntimeError(f"这一层按 rank={self.rank}、world_size={self.world_size} 切分，"
                               f"但进程组是 (rank, world_size) = {actual}：每个进程要用自己的 rank 调用 shard_experts")
        p, e_local = self.world_size, self.local_experts
        flat = x.reshape(-1, x.shape[-1])  # (B, T, d) → (N, d)
        routing, keep = self.route(flat)
        plan = plan_dispatch(routing, keep)  # 行按全局专家编号排好：进程 q 的专家正好是连续的一段
        rows = dispatch(flat, plan)  # (M, d)
        # 1) 交换行数：counts[q·E/p + j] 是本进程要发给进程 q 的专家 j 的行数
        counts = torch.tensor(plan.counts, dtype=torch.int64, device=flat.device)  # (E,)
        incoming = all_to_all(counts, [e_local] * p, [e_local] * p).reshape(p, e_local)  # (p, E/p)：来源 × 本地专家
        send = [sum(plan.counts[q * e_local : (q + 1) * e_local]) for q in range(p)]  # 发给每个进程的行数
        receive = incoming.sum(dim=1).tolist()  # 从每个进程收到的行数
        # 2) 分派：收到的行按 (来源进程, 本地专家) 排列
        received = AllToAll.apply(rows, send, receive)  # (R, d)
        pieces = list(received.split(incoming.flatten().tolist()))  # 第 q·E/p + j 段：来自 q、给专家 j
        # 3) 本地专家：把各来源给专家 j 的段拼起来一起算，再切回各段
        for j, expert in enumerate(self.experts):
            mine = [pieces[q * e_local + j] for q in range(p)]
            outs = expert(torch.cat(mine)).split([len(m) for m in mine])  # (Σ_q n_qj, d) → 各段
            for q in range(p):
                pieces[q * e_local + j] = outs[q]
        # 4) 合并：按原路送回，顺序正是本进程发出时的顺序
        back = AllToAll.apply(torch.cat(pieces), receive, send)  # (M, d)
        y = combine(back, plan)  # (N, d)
        if self.shared is not None:
            y = y + self.shared(flat)  # (N, d)
        self.record(routing, counts.cpu(), plan.dropped)
        return y.reshape(x.shape)  # (B, T, d)


def expert_parallel_payload(sent_rows: int, received_rows: int, d_model: int, n_experts: int,
                            element_bytes: int = 4) -> int:
    r"""一个 MoE 层一个训练步（前向 + 反向）里，一个进程交给 all-to-all 的字节数（含留给自己的那部分）：

    .. math:: 2(M + R)\,d\,b + 8E

    M = 本进程的词元保留下来的任务数（发出的行），R = 本进程的专家收到的行（来自所有进程），b = 每个元素的字节数。
    前向：分派发出 M 行、合并送回 R 行；反向：两者的梯度各按原路返回（R 行、M 行）；另有一次交换行数的 E 个 int64。
    对所有进程求和时 ΣM = ΣR，合计 :math:`4\,d\,b\sum M + 8Ep`；其中发往别的进程的部分在路由均匀时约占 (p−1)/p。
    """
    sent_rows, received_rows = non_negative_int("sent_rows", sent_rows), non_negative_int("received_rows", received_rows)
    d_model, n_experts = positive_int("d_model", d_model), positive_int("n_experts", n_experts)
    element_bytes = positive_int("element_bytes", element_bytes)
    return 2 * (sent_rows + received_rows) * d_model * element_bytes + 8 * n_experts


def shard_experts(model, rank: int, world_size: int):
    """把模型每块的 :class:`~tformer_lib.moe.MoEFeedForward` 换成本进程的 :class:`ExpertParallelMoE`（原地，返回模型）。"""
    moe = [b for b in model.blocks if isinstance(b.feed_forward, MoEFeedForward)]
    if not moe:
        raise ValueError("model 没有混合专家层：请用 LMConfig(moe_experts=E, …) 搭模型")
    for block in moe:
        block.feed_forward = ExpertParallelMoE(block.feed_forward, rank, world_size)
    return model


def _global_name(name: str, model) -> str:
    """本地专家参数名 ``blocks.i.feed_forward.experts.j.…`` → 全局编号 ``experts.(first + j).…``。"""
    parts = name.split(".")
    if len(parts) > 4 and parts[2] == "feed_forward" and parts[3] == "experts":
        layer = model.blocks[int(parts[1])].feed_forward
        if isinstance(layer, ExpertParallelMoE):
            parts[4] = str(layer.first_expert + int(parts[4]))
    return ".".join(parts)


def _group_objective(model, block: torch.Tensor, n_targets: float, n_groups: int) -> tuple[torch.Tensor, float]:
    """一组词元的目标函数：交叉熵总和 / 全局目标数 + 路由辅助损失 / 组数。返回 ``(objective, 交叉熵总和)``。"""
    inputs, targets = loss_targets(block)  # (b, L), (b, L)：PAD 与 BOS 目标不计
    logits = model(inputs)  # (b, L, V)
    total = F.cross_entropy(logits.flatten(0, 1), targets.flatten(), ignore_index=PAD, reduction="sum")  # (b·L, V)
    return total / n_targets + model.moe_loss() / n_groups, float(total.detach())


def _ep_worker(rank: int, world_size: int, config_dict: dict, state: dict, blocks: torch.Tensor, steps: int,
               batch_size: int, lr: float, seed: int) -> dict:
    model = shard_experts(new_model(config_dict, state), rank, world_size).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    layers = [b.feed_forward for b in model.blocks if isinstance(b.feed_forward, ExpertParallelMoE)]
    local = {id(p) for layer in layers for p in layer.experts.parameters()}  # 本进程独有的专家参数
    batches = rank_batches(len(blocks), batch_size, rank, world_size, seed)
    losses, sent = [], []
    for step in range(steps):
        block = blocks[batches[step]]  # (b, L+1)
        stats = torch.tensor([0.0, float((loss_targets(block)[1] != PAD).sum())], dtype=torch.float64)
        dist.all_reduce(stats)  # 全局目标数
        optimizer.zero_grad(set_to_none=True)
        with recording() as log:
            objective, total = _group_objective(model, block, max(1.0, float(stats[1])), world_size)
            objective.backward()
        sent.append(sum(b for op, b in log if op == "all_to_all_single"))
        for p in model.parameters():  # 各进程一份的参数：梯度求和（损失已按全局目标数归一）；本地专家的梯度已经完整
            if id(p) not in local and p.grad is not None:
                dist.all_reduce(p.grad)
        optimizer.step()
        value = torch.tensor([total], dtype=torch.float64)
        dist.all_reduce(value)
        losses.append(float(value) / max(1.0, float(stats[1])))
    loads = [layer.last.load.tolist() for layer in layers]  # 每层：本进程的词元发给每个专家的行数
    params = {_global_name(n, model): p.detach().clone() for n, p in model.named_parameters()
              if id(p) in local or rank == 0}
    return {"losses": losses, "params": params, "bytes_last_step": sent[-1], "load_last_step": loads}


def train_expert_parallel(model, blocks: torch.Tensor, steps: int, batch_size: int, lr: float, *,
                          world_size: int = 2, seed: int = 0, timeout: float = 120.0) -> dict:
    """在 ``world_size`` 个进程上用专家并行训练 ``steps`` 步（AdamW，``lr``），``model`` 不被修改。

    返回 ``{"losses": [...], "params": {全局参数名: 张量}, "bytes_last_step": [每进程], "load_last_step": [每进程 [每层 (E,)]]}``：
    ``params`` 合并自各进程（专家取自它的所有者），可直接与 :func:`train_moe_groups` 的结果逐个比较。
    """
    check_run(blocks, steps, batch_size, lr, world_size)
    if model.config.moe_experts % world_size != 0:
        raise ValueError(f"专家数 moe_experts={model.config.moe_experts} 不能被进程数 world_size={world_size} 整除")
    outs = launch(_ep_worker, world_size, (model.config.to_dict(), model.state_dict(), blocks, steps, batch_size, lr,
                                           seed), timeout=timeout)
    params = {}
    for out in outs:
        params.update(out["params"])
    return {"losses": outs[0]["losses"], "params": params, "bytes_last_step": [o["bytes_last_step"] for o in outs],
            "load_last_step": [o["load_last_step"] for o in outs]}


def train_moe_groups(model, blocks: torch.Tensor, steps: int, batch_size: int, lr: float, *, world_size: int = 2,
                     seed: int = 0) -> dict:
    """参照：一个进程，每步把全局批切成与专家并行相同的 ``world_size`` 组，依次前向（容量与辅助损失按组算），
    目标函数相加后一次反向、一次 AdamW。``model`` 不被修改。返回 ``{"losses", "params"}``。"""
    check_run(blocks, steps, batch_size, lr, world_size)
    model = new_model(model.config.to_dict(), model.state_dict()).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    per_group = batch_size // world_size
    losses = []
    for indices in global_batches(len(blocks), batch_size, world_size, seed)[:steps]:
        batch = blocks[indices]  # (B, L+1)：前 B/p 块是 rank 0 的，依此类推
        n_targets = max(1.0, float((loss_targets(batch)[1] != PAD).sum()))
        optimizer.zero_grad(set_to_none=True)
        objective, total = torch.zeros(()), 0.0
        for group in batch.split(per_group):  # 组 r = 专家并行里 rank r 的那一片
            part, value = _group_objective(model, group, n_targets, world_size)
            objective, total = objective + part, total + value
        objective.backward()
        optimizer.step()
        losses.append(total / n_targets)
    return {"losses": losses, "params": {k: v.detach().clone() for k, v in model.named_parameters()}}
