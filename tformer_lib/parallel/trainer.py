"""``torchrun`` 下的语言模型训练：:class:`~tformer_lib.lm.LMTrainer` 加上数据并行（DDP），其余不变。

每一步：与单进程相同的全局批（同一个种子、同一个打乱），rank r 只取其中第 r、r+p、… 块；前向、反向经
``DistributedDataParallel``，梯度在所有进程间平均——于是参数更新与单进程整批相同（测试证明）。混合专家模型例外：
路由的负载均衡损失按一次前向的词元算（见 :meth:`~tformer_lib.lm.LMTrainer.train_step`），每个进程的那一份是一组，
路由器的梯度与单进程整批不同（交叉熵部分仍相同）。
日志里的损失是各进程的平均；只有 rank 0 打印、显示进度条（保存检查点也只在 rank 0，见 ``lm-train``）。
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from ..lm.training import LMTrainer
from .launch import is_rank0

__all__ = ["DistributedLMTrainer"]


class DistributedLMTrainer(LMTrainer):
    """参数与 :class:`~tformer_lib.lm.LMTrainer` 完全相同；``batch_size`` 是全局批，须能被进程数整除。

    没有初始化进程组（单进程）时它就是 ``LMTrainer``。
    """

    def __init__(self, model, *args, **kwargs):
        if dist.is_initialized() and dist.get_world_size() > 1:
            kwargs["verbose"] = kwargs.get("verbose", False) and is_rank0()
            kwargs["progress"] = kwargs.get("progress") if is_rank0() else False
        super().__init__(model, *args, **kwargs)
        self.world_size = dist.get_world_size() if dist.is_initialized() else 1
        self.rank = dist.get_rank() if dist.is_initialized() else 0
        if self.batch_size % self.world_size != 0:
            raise ValueError(f"batch_size={self.batch_size} 不能被进程数 world_size={self.world_size} 整除")
        if self.fused_loss and self.world_size > 1:
            raise ValueError("fused_loss=True 需要没有包装的模型：DDP 的梯度同步经过模型的 forward，"
                             "而融合的损失只调用 hidden_states；多进程训练请用 fused_loss=False")
        # DDP 构造时把 rank 0 的参数广播给其他进程：即使各进程初始化不同，起点也相同
        self.ddp = DistributedDataParallel(model) if self.world_size > 1 else None

    def batch(self, step: int) -> torch.Tensor:
        """全局批里属于本进程的那几块 ``(B/p, L+1)``。"""
        whole = super().batch(step)  # (B, L+1)：各进程算出同一个全局批
        return whole[self.rank :: self.world_size]  # (B/p, L+1)

    def _count_targets(self, targets):
        """整个全局批的目标数：各进程数自己的一份，all-reduce 求和（本进程的一份可以全是 PAD，只要全局还有目标）。
        ``train_step`` 每步先调用它检查空批（所有进程都调用）；梯度累积时把这个数交给每个微批的 :meth:`_loss` 作分母，
        不累积时 :meth:`_loss` 再调用一次（同一个数）。"""
        local = super()._count_targets(targets)
        if self.ddp is None:
            return local
        count = torch.tensor([float(local)], dtype=torch.float64, device=targets.device)
        dist.all_reduce(count)
        return int(count)

    def _loss(self, inputs, targets, n_targets, share=1.0):
        if self.ddp is None:
            return super()._loss(inputs, targets, n_targets, share)
        # 各进程的块里 PAD 目标数不同：“各自求平均再平均”≠ 整批平均。改用“本进程总和 / (全局目标数 / p)”，
        # DDP 再把 p 个梯度平均，恰好是 Σ总和 / 全局目标数——与单进程整批是同一个量（只差浮点求和的顺序）
        count = n_targets if n_targets is not None else self._count_targets(targets)  # 全局目标数（train_step 已查过不为 0）
        per_rank = count / self.world_size
        model, self.model = self.model, self.ddp  # 前向经 DDP，反向时它在各进程间平均梯度
        try:
            return super()._loss(inputs, targets, per_rank, share)
        finally:
            self.model = model

    def train_step(self) -> float:
        tokens_before = self.tokens_seen
        value = super().train_step()
        if self.ddp is None:
            return value
        stats = torch.tensor([value, float(self.tokens_seen - tokens_before)], dtype=torch.float64)
        dist.all_reduce(stats)  # 损失取平均，词元数求和
        value = float(stats[0]) / self.world_size
        self.history["step_loss"][-1] = value
        self.tokens_seen = tokens_before + int(stats[1])
        return value
