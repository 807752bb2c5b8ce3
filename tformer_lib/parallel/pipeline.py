"""流水线并行（pipeline parallelism）：把模型按层切成 p 段（stage），每段放在一个进程上，一批切成 m 个微批
（micro-batch）依次流过各段。

- 手写的 GPipe（:func:`pipeline_worker` ``mode="manual"``）：第 0 段把 m 个微批的前向依次算完、用 ``dist.send``
  把激活发给下一段；最后一段算损失、反向，把“对激活的梯度”发回；第 0 段收到后接着反向。所有微批的梯度累加后
  统一更新一次——与整批训练相同（每个微批的损失除以 m）。
- PyTorch 的 ``torch.distributed.pipelining``：``PipelineStage`` + ``ScheduleGPipe`` 或 ``Schedule1F1B``
  （1F1B：稳态里一次前向、一次反向交替，同时在飞的微批最多 p 个，省激活内存；气泡一样大）。

气泡（bubble）：GPipe 里每段在开头等 p−1 个微批到达、末尾等 p−1 个反向回来，空闲比例
(p−1)/(m+p−1)（:func:`bubble_fraction`）；m 越大气泡越小。
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from ..masks import causal_mask
from ..specials import PAD
from .comm import record, recording

__all__ = ["bubble_fraction", "LMStage", "split_points", "pipeline_worker", "PIPELINE_MODES", "stage_name_map"]

#: "manual" = 手写 GPipe（send/recv），"gpipe"/"1f1b" = torch.distributed.pipelining 的两种调度
PIPELINE_MODES = ("manual", "gpipe", "1f1b")


def bubble_fraction(stages: int, micro_batches: int) -> float:
    """GPipe（与 1F1B）调度里每段的空闲比例 (p−1)/(m+p−1)。"""
    for name, value in (("stages", stages), ("micro_batches", micro_batches)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} 应是正整数，收到 {value!r}")
    return (stages - 1) / (micro_batches + stages - 1)


def split_points(n_layers: int, stages: int) -> list[tuple[int, int]]:
    """把 ``n_layers`` 个块尽量均分成 ``stages`` 段，返回每段的 ``(start, stop)``。"""
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
        self.start, self.stop = split_points(c.n_layers, stages)[stage]
        self.first, self.last = stage == 0, stage == stages - 1
        self.positional = c.positional
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
        mask = causal_mask(length, device=x.device)  # (T, T)
        rope = positions if self.positional == "rope" else None
        for block in self.blocks:
            x = block(x, mask, None, rope)  # (b, T, d_model)
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


def _ce(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.flatten(0, 1), targets.flatten(), ignore_index=PAD)  # (b·T, V)


def pipeline_worker(rank: int, world_size: int, mode: str, config_dict: dict, state: dict, blocks: torch.Tensor,
                    steps: int, batch_size: int, micro_batches: int, lr: float) -> dict:
    """每个进程一段，用 ``mode`` 的调度训练 ``steps`` 步（第 s 步用 ``blocks[s·B:(s+1)·B]``，SGD）。

    返回本段的参数（已换成完整模型的名字）与最后一段算出的每步损失（整批平均）。
    """
    from ..lm import LMConfig, make_lm

    if mode not in PIPELINE_MODES:
        raise ValueError(f"mode 应是 {PIPELINE_MODES} 之一，收到 {mode!r}")
    model = make_lm(LMConfig.from_dict(config_dict))
    model.load_state_dict(state)
    stage = LMStage(model, rank, world_size)
    optimizer = torch.optim.SGD(stage.parameters(), lr=lr)
    schedule = None
    if mode != "manual":
        from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

        pstage = PipelineStage(stage, rank, world_size, torch.device("cpu"))
        kind = ScheduleGPipe if mode == "gpipe" else Schedule1F1B
        schedule = kind(pstage, n_microbatches=micro_batches, loss_fn=_ce)
    losses = []
    with recording() as sent:
        for step in range(steps):
            batch = blocks[step * batch_size : (step + 1) * batch_size]
            inputs, targets = batch[:, :-1], batch[:, 1:]  # (B, T), (B, T)
            optimizer.zero_grad(set_to_none=True)
            total = torch.zeros((), dtype=torch.float64)
            if schedule is not None:
                if stage.first:
                    schedule.step(inputs)
                else:
                    parts: list = []
                    schedule.step(target=targets, losses=parts)
                    total += sum(float(p.detach()) for p in parts) / micro_batches
            elif stage.first:  # 手写 GPipe，第 0 段：全部前向 → 全部反向
                outs = []
                for mb in inputs.chunk(micro_batches):
                    act = stage(mb)  # (b, T, d_model)
                    record("send", act)
                    dist.send(act.detach().contiguous(), rank + 1)
                    outs.append(act)
                for act in outs:
                    grad = torch.empty_like(act)
                    dist.recv(grad, rank + 1)  # 下一段对这个激活的梯度
                    act.backward(grad)
            else:  # 手写 GPipe，最后一段：也是先全部前向、再全部反向（send/recv 是阻塞的，顺序必须与第 0 段对上）
                acts, parts = [], []
                for mb_t in targets.chunk(micro_batches):
                    act = torch.empty(mb_t.shape[0], mb_t.shape[1], model.config.d_model)  # (b, T, d_model)
                    dist.recv(act, rank - 1)
                    act.requires_grad_(True)
                    acts.append(act)
                    parts.append(_ce(stage(act), mb_t) / micro_batches)  # 每个微批的平均损失 / m → 整批平均
                for act, loss in zip(acts, parts):
                    loss.backward()
                    record("send", act.grad)
                    dist.send(act.grad.contiguous(), rank - 1)
                    total += float(loss.detach())
            optimizer.step()
            dist.broadcast(total, world_size - 1)  # 损失只有最后一段知道
            losses.append(float(total))
    mapping = stage_name_map(model.config.n_layers, rank, world_size)
    return {"bytes_per_step": sum(n for _, n in sent) / steps, "losses": losses, "params": {_full_name(k, mapping): v.detach().clone() for k, v in stage.named_parameters()}}
