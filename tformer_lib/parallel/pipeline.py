"""流水线并行（pipeline parallelism）：把模型按层切成 p 段（stage），每段放在一个进程上，一批切成 m 个微批
（micro-batch）依次流过各段。

- 手写的 GPipe（:func:`pipeline_worker` ``mode="manual"``）：第 0 段把 m 个微批的前向依次算完、把激活发给下一段；
  最后一段算损失、反向，把“对激活的梯度”发回；第 0 段收到后接着反向。所有微批的梯度累加后
  统一更新一次。``mode="manual_1f1b"`` 是同一个执行器按 1F1B 的顺序
  （:func:`~tformer_lib.parallel.schedule.stage_order`）做事。发送用 ``dist.isend``（不阻塞），接收用阻塞的
  ``dist.recv``：1F1B 里两段会同时要发送，阻塞的 ``send`` 会互相等死。
- 手写的两种调度都记下实测时间线：每一步开头 ``dist.barrier()`` 之后，每次前向、反向的起止时刻
  （``time.perf_counter``，秒）——:func:`measure_pipeline_timeline`，格式与理想调度
  （:func:`~tformer_lib.parallel.schedule.ideal_schedule`）相同，可以并排画出来比较。
- PyTorch 的 ``torch.distributed.pipelining``：``PipelineStage`` + ``ScheduleGPipe`` 或 ``Schedule1F1B``
  （1F1B：稳态里一次前向、一次反向交替，同时在飞的微批最多 p 个，省激活内存；气泡一样大）。

气泡（bubble）：GPipe 里每段在开头等 p−1 个微批到达、末尾等 p−1 个反向回来，空闲比例
(p−1)/(m+p−1)（:func:`bubble_fraction`）；m 越大气泡越小。

为什么与整批训练相同：整批的损失是全部 N 个非 PAD 目标的平均 L = (1/N)Σ_i ℓ_i。若每个微批各自求平均再除以 m，
得到的是“平均的平均”，各微批 PAD 多少不一（打包块的尾巴）时它 ≠ L，梯度也就不同。所以四种调度里每个微批的损失都是
本微批的损失**总和 / 整批的 N**（:func:`_micro_batch_loss`；N 由每段都有的整批目标直接数出，不用通信），各微批的梯度
累加起来正好是 ∇L——与数据并行的 :func:`~tformer_lib.parallel.data_parallel.global_mean_lm_loss` 同一个道理。
PyTorch 的调度默认还会把梯度除以 m（``scale_grads``），这里关掉它。测试用各微批 PAD 不均（含一个全是 PAD 的微批）的数据核对。
"""

from __future__ import annotations

import inspect
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from .._checks import non_negative_int, positive_int
from ..lm.data import loss_targets
from ..parts.positional import RopeTables
from ..specials import PAD
from .comm import record, recording
from .schedule import PipelineEvent, idle_fraction, stage_order

__all__ = ["bubble_fraction", "LMStage", "split_points", "pipeline_worker", "PIPELINE_MODES", "MANUAL_MODES", "stage_name_map",
           "measure_pipeline_timeline"]

#: :func:`pipeline_worker` 接受的全部 mode："manual" = 手写 GPipe（isend/recv，记下时间线），"manual_1f1b" = 同一个
#: 手写执行器按 1F1B 的顺序，"gpipe"/"1f1b" = torch.distributed.pipelining 的两种调度
PIPELINE_MODES = ("manual", "manual_1f1b", "gpipe", "1f1b")
#: 手写执行器的两种顺序（mode → :func:`~tformer_lib.parallel.schedule.stage_order` 的调度名）
MANUAL_MODES = {"manual": "gpipe", "manual_1f1b": "1f1b"}


def bubble_fraction(stages: int, micro_batches: int) -> float:
    """GPipe（与 1F1B）调度里每段的空闲比例 (p−1)/(m+p−1)。"""
    stages, micro_batches = positive_int("stages", stages), positive_int("micro_batches", micro_batches)
    return (stages - 1) / (micro_batches + stages - 1)


def split_points(n_layers: int, stages: int) -> list[tuple[int, int]]:
    """把 ``n_layers`` 个块尽量均分成 ``stages`` 段，返回每段的 ``(start, stop)``。"""
    positive_int("n_layers", n_layers)
    positive_int("stages", stages)
    if stages > n_layers:
        raise ValueError(f"stages={stages} 多于块数 n_layers={n_layers}：每段至少要有一个块")
    bounds = [round(i * n_layers / stages) for i in range(stages + 1)]
    return list(zip(bounds[:-1], bounds[1:]))


class LMStage(nn.Module):
    """:class:`~tformer_lib.lm.DecoderOnlyLM` 的一段：第一段含嵌入，最后一段含末层归一化与输出层。

    输入：第一段是词元 ``(b, T)``，其余段是上一段的隐藏状态 ``(b, T, d_model)``；输出：隐藏状态，或最后一段的
    logits ``(b, T, V)``。要求 ``tie_embeddings=False``（共享的矩阵不能同时放在首尾两段）。
    """

    def __init__(self, model, stage: int, stages: int):
        super().__init__()
        c = model.config
        if c.tie_embeddings:
            raise ValueError("流水线切分要求 tie_embeddings=False：输出层与词嵌入共享时首尾两段要共用一个矩阵")
        bounds = split_points(c.n_layers, stages)
        stage = non_negative_int("stage", stage)
        if stage >= stages:
            raise ValueError(f"stage 应是 0 到 stages-1={stages - 1} 之间的整数，收到 {stage!r}")
        self.start, self.stop = bounds[stage]
        self.first, self.last = stage == 0, stage == stages - 1
        self.positional, self.d_k, self.rope_base, self.rope_scaling = c.positional, c.d_k, c.rope_base, c.rope_scaling
        if self.first:
            self.tok_embed = model.tok_embed
            if c.positional == "learned":
                self.pos_embed = model.pos_embed
            elif c.positional == "sinusoidal":
                self.register_buffer("pos_table", model.pos_table, persistent=False)
        self.blocks = nn.ModuleList(model.blocks[self.start : self.stop])
        if self.last:
            self.norm, self.lm_head = model.norm, model.lm_head

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        length = x.shape[1]
        positions = torch.arange(length, device=x.device)  # (T,)
        if self.first:
            tokens, x = x, self.tok_embed(x)  # (b, T, d_model)
            if self.positional == "learned":
                x = x + self.pos_embed(positions)  # (b, T, d_model)
            elif self.positional == "sinusoidal":
                x = x + self.pos_table[positions].to(x.dtype)  # (b, T, d_model)
        rope = RopeTables(positions, self.d_k, self.rope_base, self.rope_scaling) if self.positional == "rope" else None
        for block in self.blocks:
            x = block(x, None, None, rope, causal=True)  # (b, T, d_model)：因果掩码交给注意力自己
        return self.lm_head(self.norm(x)) if self.last else x  # (b, T, V) 或 (b, T, d_model)


def stage_name_map(n_layers: int, stage: int, stages: int) -> dict[str, str]:
    """段内参数名 → 完整模型的参数名前缀替换（``blocks.0.`` → ``blocks.{start}.``）。"""
    start, stop = split_points(n_layers, stages)[stage]
    return {f"blocks.{i}.": f"blocks.{start + i}." for i in range(stop - start)}


def _full_name(name: str, mapping: dict[str, str]) -> str:
    for old, new in mapping.items():
        if name.startswith(old):
            return new + name[len(old):]
    return name


def _micro_batch_loss(logits: torch.Tensor, targets: torch.Tensor, n_targets: int) -> torch.Tensor:
    """一个微批的损失：本微批非 PAD 目标的交叉熵**总和** / 整批的非 PAD 目标数 ``n_targets``。

    各微批的这个量加起来就是整批的平均损失（不论 PAD 怎样分布在各微批里）；全是 PAD 的微批贡献 0，而不是 0/0。
    """
    total = F.cross_entropy(logits.flatten(0, 1), targets.flatten(), ignore_index=PAD, reduction="sum")  # (b·T, V)
    return total / n_targets


def _batch_targets(targets: torch.Tensor) -> int:
    """整批的非 PAD 目标数 N（至少 1：全是 PAD 的批损失为 0）。"""
    return max(1, int((targets != PAD).sum()))


def _run_manual(stage: LMStage, order, inputs, targets, micro_batches: int, rank: int, d_model: int, clock):
    """按 ``order``（``[("F", i), ("B", j), …]``）执行本段的一步；返回（本段算出的损失之和 = 整批平均, 本段的事件列表）。

    前向 i：第一段直接取第 i 个微批，其余段先 ``recv`` 上一段的激活；算完把输出 ``isend`` 给下一段（最后一段算损失）。
    反向 j：最后一段从损失开始，其余段先 ``recv`` 下一段发回的梯度；算完把“对输入激活的梯度” ``isend`` 给上一段。
    事件只计本段的计算（收到数据之后到算完），等待与通信算作空闲。
    """
    m = micro_batches
    n_targets = _batch_targets(targets)
    tgt_mbs = targets.chunk(m)
    in_mbs = inputs.chunk(m) if stage.first else None
    received, outputs, pending, events = {}, {}, [], []
    total = 0.0
    for kind, i in order:
        if kind == "F":
            if stage.first:
                x = in_mbs[i]
            else:
                x = torch.empty(tgt_mbs[i].shape[0], tgt_mbs[i].shape[1], d_model)  # (b, T, d_model)
                dist.recv(x, rank - 1)
                x.requires_grad_(True)
                received[i] = x
            start = clock()
            y = stage(x)  # (b, T, d_model) 或最后一段的 (b, T, V)
            if stage.last:
                y = _micro_batch_loss(y, tgt_mbs[i], n_targets)  # 本微批的总和 / 整批的 N：各微批相加 = 整批平均
                total += float(y.detach())
            end = clock()
            if not stage.last:
                record("send", y)
                out = y.detach().contiguous()
                pending.append((dist.isend(out, rank + 1), out))
            outputs[i] = y
        else:
            y = outputs.pop(i)
            grad = None
            if not stage.last:
                grad = torch.empty_like(y)  # (b, T, d_model)：下一段对这个激活的梯度
                dist.recv(grad, rank + 1)
            start = clock()
            y.backward(grad)
            end = clock()
            if not stage.first:
                g = received.pop(i).grad.contiguous()  # (b, T, d_model)
                record("send", g)
                pending.append((dist.isend(g, rank - 1), g))
        events.append(PipelineEvent(rank, kind, i, start, end))
    for handle, _ in pending:
        handle.wait()
    return total, events


def pipeline_worker(rank: int, world_size: int, mode: str, config_dict: dict, state: dict, blocks: torch.Tensor,
                    steps: int, batch_size: int, micro_batches: int, lr: float) -> dict:
    """每个进程一段，用 ``mode`` 的调度训练 ``steps`` 步（第 s 步用 ``blocks[s·B:(s+1)·B]``，SGD）。

    返回本段的参数（已换成完整模型的名字）、最后一段算出的每步损失（整批平均）、每步的通信字节，以及手写模式下
    每一步的时间线 ``timeline[step] = [PipelineEvent, …]``（本段的事件，秒，从该步开头 barrier 之后 rank 0 的时刻算起）。
    """
    from ..lm import LMConfig, make_lm

    if mode not in PIPELINE_MODES:
        raise ValueError(f"mode 应是 {PIPELINE_MODES} 之一，收到 {mode!r}")
    model = make_lm(LMConfig.from_dict(config_dict))
    model.load_state_dict(state)
    stage = LMStage(model, rank, world_size)
    optimizer = torch.optim.SGD(stage.parameters(), lr=lr)
    schedule = None
    batch_targets = {"n": 1}  # 当前这一步整批的非 PAD 目标数：调度按微批调用 loss_fn，它从这里读
    if mode not in MANUAL_MODES:
        from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

        pstage = PipelineStage(stage, rank, world_size, torch.device("cpu"))
        kind = ScheduleGPipe if mode == "gpipe" else Schedule1F1B
        # scale_grads=False：损失已按整批的 N 归一，不要再把梯度除以 m（较早的 torch 没有这个参数，也不除）
        extra = {"scale_grads": False} if "scale_grads" in inspect.signature(kind).parameters else {}
        schedule = kind(pstage, n_microbatches=micro_batches,
                        loss_fn=lambda logits, target: _micro_batch_loss(logits, target, batch_targets["n"]), **extra)
    losses, timeline = [], []
    with recording() as sent:
        for step in range(steps):
            batch = blocks[step * batch_size : (step + 1) * batch_size]
            inputs, targets = loss_targets(batch)  # (B, T), (B, T)：PAD 与 BOS 目标不计，与第 9 章相同
            optimizer.zero_grad(set_to_none=True)
            total = torch.zeros((), dtype=torch.float64)
            if schedule is not None:
                batch_targets["n"] = _batch_targets(targets)
                if stage.first:
                    schedule.step(inputs)
                else:
                    parts: list = []
                    schedule.step(target=targets, losses=parts)
                    total += sum(float(p.detach()) for p in parts)  # 各微批的“总和 / N”相加 = 整批平均
            else:  # 手写：按本段的调度顺序执行
                # 时间线的零点：barrier 之后 rank 0 的时刻，广播给各段。perf_counter 在一台机器上是全系统共用的
                # 单调时钟（Linux 的 CLOCK_MONOTONIC），所以各段的时刻可以直接比较
                dist.barrier()
                t0 = torch.tensor(time.perf_counter(), dtype=torch.float64)
                dist.broadcast(t0, 0)
                origin = float(t0)
                loss, events = _run_manual(stage, stage_order(MANUAL_MODES[mode], world_size, micro_batches, rank),
                                           inputs, targets, micro_batches, rank, model.config.d_model,
                                           lambda: time.perf_counter() - origin)
                total += loss
                timeline.append(events)
            optimizer.step()
            dist.broadcast(total, world_size - 1)  # 损失只有最后一段知道
            losses.append(float(total))
    mapping = stage_name_map(model.config.n_layers, rank, world_size)
    return {"bytes_per_step": sum(n for _, n in sent) / steps, "losses": losses, "timeline": timeline, "params": {_full_name(k, mapping): v.detach().clone() for k, v in stage.named_parameters()}}


def measure_pipeline_timeline(model, blocks: torch.Tensor, *, schedule: str = "gpipe", stages: int = 2,
                              micro_batches: int = 4, batch_size: int = 8, steps: int = 3, lr: float = 0.1,
                              timeout: float = 120.0) -> dict:
    """起 ``stages`` 个进程跑手写流水线（``schedule`` = ``"gpipe"`` 或 ``"1f1b"``），返回一步的实测时间线。

    ``model``：``tie_embeddings=False`` 的 :class:`~tformer_lib.lm.DecoderOnlyLM`（不被修改）；``blocks``：
    ``(steps·batch_size, T+1)`` 的词元，第 s 步用 ``blocks[s·B:(s+1)·B]``，``steps ≥ 2``。第一步含预热（内存分配等）不算；其余各步里
    取跨度最短的一步（机器忙时某一步可能被操作系统调度打断，最短的一步最接近流水线本身的样子）。

    返回 ``{"events": [PipelineEvent, …]（所有段，按开始时间排序，秒）, "idle_fraction": 实测空闲比例,
    "bubble_fraction": (p−1)/(m+p−1), "losses": 每步损失, "schedule", "stages", "micro_batches"}``。
    实测的时间随机器负载而变：只画进图里，不要打印进会被比较的文本。
    """
    from .launch import launch
    from .schedule import SCHEDULES

    if schedule not in SCHEDULES:
        raise ValueError(f"schedule 应是 {SCHEDULES} 之一，收到 {schedule!r}")
    stages, micro_batches = positive_int("stages", stages), positive_int("micro_batches", micro_batches)
    batch_size, steps = positive_int("batch_size", batch_size), positive_int("steps", steps)
    split_points(model.config.n_layers, stages)  # 段比块多 → 在起进程之前就报错，而不是在子进程里
    if not isinstance(blocks, torch.Tensor) or blocks.dim() != 2:
        raise ValueError(f"blocks 应是 (steps·batch_size, T+1) 的二维词元张量，收到 {getattr(blocks, 'shape', type(blocks))}")
    if steps < 2:
        raise ValueError(f"steps 应 ≥ 2，收到 {steps}：第一步含预热、不算进时间线，至少还要一步")
    if batch_size % micro_batches:
        raise ValueError(f"batch_size={batch_size} 不能被 micro_batches={micro_batches} 整除")
    if blocks.shape[0] < steps * batch_size:
        raise ValueError(f"blocks 只有 {blocks.shape[0]} 行，{steps} 步 × batch_size={batch_size} 需要 {steps * batch_size} 行")
    mode = {"gpipe": "manual", "1f1b": "manual_1f1b"}[schedule]
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    results = launch(pipeline_worker, stages, (mode, model.config.to_dict(), state, blocks, steps, batch_size,
                                               micro_batches, lr), timeout=timeout)
    candidates = [sorted((e for r in results for e in r["timeline"][k]), key=lambda e: (e.start, e.rank))
                  for k in range(1, steps)]
    events = min(candidates, key=lambda ev: max(e.end for e in ev) - min(e.start for e in ev))
    return {"events": events, "idle_fraction": idle_fraction(events, stages),
            "bubble_fraction": bubble_fraction(stages, micro_batches), "losses": results[-1]["losses"],
            "schedule": schedule, "stages": stages, "micro_batches": micro_batches}
