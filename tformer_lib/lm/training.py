"""在词元流上训练语言模型：定长块、AdamW、预热 + 余弦衰减、梯度裁剪、验证困惑度、可精确续训的检查点。

一个训练步（step）：

1. 取一批块 ``(B, L+1)``，右移一位得到输入与目标（:func:`~tformer_lib.lm.data.loss_targets`）；
2. 交叉熵（PAD 目标不计），反向传播；
3. 梯度裁剪（clipping）→ AdamW 更新 → 学习率调度器走一步。

可复现：第 s 步用哪些块只由 ``seed`` 与 s 决定；随机数状态随检查点保存，所以
“训 2n 步”与“训 n 步 → 存盘 → 读盘再训 n 步”的每一步损失逐位相同（测试保证）。
"""

from __future__ import annotations

import math
import os
import sys
import time
from contextlib import nullcontext
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from .._checks import finite_positive, flag, positive_int
from ..specials import PAD
from ..training.checkpoint import CHECKPOINT_FORMAT, CHECKPOINT_VERSION, CheckpointError, atomic_torch_save, load_checkpoint
from ..training.trainer import TrainingDivergedError
from .config import LMConfig
from .data import document_layout, loss_targets
from .fused_loss import linear_cross_entropy
from .model import DecoderOnlyLM, make_lm
from .quality import lm_perplexity

__all__ = ["WarmupCosine", "make_adamw", "LMTrainer", "save_lm_checkpoint", "load_lm", "AUTOCAST_DTYPES"]

#: ``LMTrainer(autocast=…)`` 的取值：None = 全 float32；"bf16"/"fp16" = ``torch.autocast`` 下的 16 位算子
#: （"fp16" 另用 ``torch.amp.GradScaler`` 做损失缩放）。参数、梯度与 AdamW 状态始终是 float32。
AUTOCAST_DTYPES = {None: None, "bf16": torch.bfloat16, "fp16": torch.float16}


class WarmupCosine:
    r"""学习率倍率：前 ``warmup`` 步从 1/warmup 线性升到 1，之后按余弦降到 ``min_ratio``，在 ``total_steps`` 处到底。

    .. math:: m(s) = r + (1 - r)\cdot\tfrac12\left(1 + \cos\left(\pi\,\tfrac{s - w}{S - w}\right)\right),\ s \ge w

    写成类而不是闭包，调度器的 ``state_dict()`` 才只含普通数字，能被 ``torch.load(weights_only=True)`` 读回。
    """

    def __init__(self, warmup: int, total_steps: int, min_ratio: float = 0.1):
        warmup, total_steps = positive_int("warmup", warmup), positive_int("total_steps", total_steps)
        if total_steps < warmup:
            raise ValueError(f"total_steps 应是 ≥ warmup={warmup} 的整数，收到 {total_steps!r}")
        if not 0 <= min_ratio <= 1:
            raise ValueError(f"min_ratio 应在 [0, 1] 内，收到 {min_ratio!r}")
        self.warmup, self.total_steps, self.min_ratio = warmup, total_steps, float(min_ratio)

    def __call__(self, step: int) -> float:
        if step < self.warmup:
            return (step + 1) / self.warmup
        progress = min(1.0, (step - self.warmup) / max(1, self.total_steps - self.warmup))
        return self.min_ratio + (1 - self.min_ratio) * 0.5 * (1 + math.cos(math.pi * progress))


def make_adamw(model: nn.Module, lr: float, weight_decay: float = 0.1, betas=(0.9, 0.95)) -> torch.optim.AdamW:
    """AdamW：矩阵（含嵌入）做权重衰减（weight decay），偏置与归一化的 γ/β 不做。"""
    if not (isinstance(lr, (int, float)) and lr > 0 and math.isfinite(lr)):
        raise ValueError(f"lr 应为正的有限数，收到 {lr!r}")
    decay = [p for p in model.parameters() if p.requires_grad and p.dim() >= 2]
    other = [p for p in model.parameters() if p.requires_grad and p.dim() < 2]
    groups = [{"params": decay, "weight_decay": weight_decay}, {"params": other, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=lr, betas=betas)


def _check_valid(valid) -> None:
    """``valid`` 应是 ``None`` 或 ``(inputs, targets)``：两个形状相同的 ``(M, L)`` 整数张量。"""
    if valid is None:
        return
    if not isinstance(valid, (tuple, list)) or len(valid) != 2:
        raise TypeError(f"valid 应是 None 或 (inputs, targets) 两个张量，收到 {type(valid).__name__}")
    inputs, targets = valid
    for name, x in (("valid[0]（inputs）", inputs), ("valid[1]（targets）", targets)):
        if not isinstance(x, torch.Tensor) or x.dim() != 2 or x.dtype != torch.long:
            got = f"{x.dtype} {tuple(x.shape)}" if isinstance(x, torch.Tensor) else type(x).__name__
            raise ValueError(f"{name} 应是 (M, L) 的 LongTensor，收到 {got}")
    if inputs.shape != targets.shape:
        raise ValueError(f"valid 的 inputs {tuple(inputs.shape)} 与 targets {tuple(targets.shape)} 形状应相同")


class LMTrainer:
    """按步数训练语言模型，每 ``eval_every`` 步在验证数据上评估一次。

    train_blocks: ``(N, L+1)`` 的定长块（:func:`~tformer_lib.lm.data.pack_documents`）。
    valid: ``(inputs, targets)``，各 ``(M, L)``；``None`` 不评估。
    total_steps: 学习率调度的总长度；:meth:`fit` 默认训到这一步。
    progress: 进度条；``None`` = 只在终端（tty）里显示，笔记本与 CI 中关闭。
    accumulation_steps: 梯度累积（gradient accumulation）：每步把 ``batch_size`` 切成这么多个微批依次反向。
    autocast: None | "bf16" | "fp16"：在 ``torch.autocast`` 下前向（混合精度）；"fp16" 另带 ``GradScaler``。
    activation_checkpointing: 激活重算（:meth:`~tformer_lib.lm.DecoderOnlyLM.set_activation_checkpointing`）。
    document_mask: 文档掩码（document masking）：每个块里的每篇文档位置从 0 数起、只看自己
        （:func:`~tformer_lib.lm.data.document_layout`）；默认 False = 只用因果掩码，后面的文档看得见前面的。
    fused_loss: 输出层与交叉熵融合（:func:`~tformer_lib.lm.fused_loss.linear_cross_entropy`）：不造出
        ``(B·L, V)`` 的 logits 与它的梯度，损失与默认做法相同（到浮点误差）。只用于没有被 DDP 包起来的模型，
        且输出层是不带偏置的浮点 ``nn.Linear``（装了 LoRA 或量化的输出层会被拒绝）。
    ``history``：``step_loss``/``step_lr`` 每步一个数，``evals`` 是每次评估的字典（step、valid_loss、valid_ppl）。
    """

    def __init__(
        self,
        model: DecoderOnlyLM,
        train_blocks: torch.Tensor,
        valid: tuple[torch.Tensor, torch.Tensor] | None = None,
        *,
        batch_size: int = 32,
        lr: float = 3e-3,
        warmup: int = 100,
        total_steps: int = 1000,
        min_lr_ratio: float = 0.1,
        weight_decay: float = 0.1,
        clip: float | None = 1.0,
        seed: int = 0,
        eval_every: int = 200,
        progress: bool | None = None,
        verbose: bool = False,
        accumulation_steps: int = 1,
        autocast: str | None = None,
        activation_checkpointing: bool = False,
        document_mask: bool = False,
        fused_loss: bool = False,
    ):
        if not isinstance(model, DecoderOnlyLM):
            raise TypeError(f"model 应是 make_lm(config) 得到的 DecoderOnlyLM，收到 {type(model).__name__}")
        if not isinstance(train_blocks, torch.Tensor) or train_blocks.dim() != 2 or train_blocks.shape[1] < 2:
            raise ValueError(f"train_blocks 应是 (N, L+1) 的 LongTensor、L ≥ 1，收到 {getattr(train_blocks, 'shape', train_blocks)}")
        batch_size = positive_int("batch_size", batch_size)
        if batch_size > len(train_blocks):
            raise ValueError(f"batch_size 应是 [1, {len(train_blocks)}] 内的整数，收到 {batch_size!r}")
        accumulation_steps = positive_int("accumulation_steps", accumulation_steps)
        if batch_size % accumulation_steps != 0:
            raise ValueError(f"batch_size={batch_size} 不能被 accumulation_steps={accumulation_steps} 整除")
        if autocast not in AUTOCAST_DTYPES:
            raise ValueError(f"autocast 应是 {tuple(AUTOCAST_DTYPES)} 之一，收到 {autocast!r}")
        if not isinstance(activation_checkpointing, bool):
            raise TypeError(f"activation_checkpointing 应是 bool，收到 {activation_checkpointing!r}")
        if not isinstance(document_mask, bool):
            raise TypeError(f"document_mask 应是 bool，收到 {document_mask!r}")
        _check_valid(valid)
        positive_int("total_steps", total_steps)
        positive_int("eval_every", eval_every)
        if clip is not None:
            finite_positive("clip", clip)
        if isinstance(weight_decay, bool) or not isinstance(weight_decay, (int, float)) or not 0 <= weight_decay < math.inf:
            raise ValueError(f"weight_decay 应是 ≥0 的有限数，收到 {weight_decay!r}")
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise TypeError(f"seed 应是整数，收到 {type(seed).__name__} {seed!r}")
        if progress is not None:
            flag("progress", progress)
        flag("verbose", verbose)
        self.fused_loss = flag("fused_loss", fused_loss)
        head = model.lm_head
        if fused_loss and (type(head) is not nn.Linear or head.bias is not None or not head.weight.is_floating_point()):
            raise ValueError(f"fused_loss=True 要求输出层是不带偏置的浮点 nn.Linear（融合的损失只读它的 weight），"
                             f"收到 {type(head).__name__}（例如装了 LoRA 或量化的输出层）：请用 fused_loss=False")
        model.set_activation_checkpointing(activation_checkpointing)
        self.accumulation_steps, self.autocast, self.document_mask = accumulation_steps, autocast, document_mask
        device_type = next(model.parameters()).device.type
        # float16 的梯度会下溢为 0：按损失缩放（loss scaling）补救；bfloat16 的指数位与 float32 相同，不需要
        self.scaler = torch.amp.GradScaler(device_type) if autocast == "fp16" else None
        self.model, self.train_blocks, self.valid = model, train_blocks, valid
        self.batch_size, self.clip, self.seed = batch_size, clip, seed
        self.eval_every, self.progress, self.verbose = eval_every, progress, verbose
        self.total_steps = total_steps
        self.optimizer = make_adamw(model, lr, weight_decay)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, WarmupCosine(warmup, total_steps, min_lr_ratio))
        self.step = 0
        self.history: dict[str, list] = {"step_loss": [], "step_lr": [], "evals": []}
        self.seconds = 0.0  # 训练的墙钟耗时（每次运行都不同，别打印进笔记本）
        self.cpu_seconds = 0.0  # 本进程的 CPU 时间：单线程时约等于“机器空闲时”的墙钟耗时
        self.tokens_seen = 0

    @property
    def batches_per_epoch(self) -> int:
        return len(self.train_blocks) // self.batch_size

    def batch(self, step: int) -> torch.Tensor:
        """第 ``step`` 步（从 0 数）的那一批块：每个 epoch 按 ``seed`` 与 epoch 编号重新打乱，丢掉不满一批的尾巴。"""
        return self.train_blocks[self._batch_rows(step)]

    def _batch_rows(self, step: int) -> torch.Tensor:
        """第 ``step`` 步那一批（整个全局批）的块在 ``train_blocks`` 里的行号 ``(batch_size,)``。"""
        epoch, k = divmod(step, self.batches_per_epoch)
        order = torch.randperm(len(self.train_blocks), generator=torch.Generator().manual_seed(self.seed * 100_003 + epoch))
        return order[k * self.batch_size : (k + 1) * self.batch_size]

    def _loss(self, inputs: torch.Tensor, targets: torch.Tensor, n_targets: int | None,
              share: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
        """一批（或一个微批）的 ``(目标函数, 交叉熵)``。

        交叉熵：``n_targets``（整批的非 PAD 目标数，:meth:`_count_targets` 数的）给出时是“总和 / n_targets”（梯度累积用）。目标函数 = 交叉熵 + 混合专家的
        路由辅助损失 × ``share``（这个微批占整批的份额；稠密模型这一项是 0）。日志与返回值只记交叉熵，
        稠密与 MoE 的损失才能直接比较。
        """
        lm = getattr(self.model, "module", self.model)  # DDP 包着时取里面的模型
        if self.fused_loss and lm is not self.model:  # DDP 的梯度同步挂在它自己的 forward 上，绕过 forward 就不同步
            raise ValueError("fused_loss=True 需要没有包装的模型（DecoderOnlyLM）：DDP 的梯度同步经过它的 forward，"
                             "而融合的损失只调用 hidden_states；请用 fused_loss=False")
        layout = {}
        if self.document_mask:  # 每篇文档位置从 0 数、只看自己：positions (B, L)，attn_mask (B, 1, L, L)
            layout = dict(zip(("positions", "attn_mask"), document_layout(inputs)))
        # autocast 下矩阵乘法在 16 位里算；损失总在 float32 里算
        precision = torch.autocast(inputs.device.type, AUTOCAST_DTYPES[self.autocast]) if self.autocast else nullcontext()
        reduction = "mean" if n_targets is None else "sum"
        if self.fused_loss:  # 特征与输出层的权重直接进融合的交叉熵，不造出 logits
            with precision:
                hidden = lm.hidden_states(inputs, **layout).flatten(0, 1)  # (B·L, d_model)
            ce = linear_cross_entropy(hidden, lm.lm_head.weight, targets.flatten(), ignore_index=PAD, reduction=reduction)
        else:
            with precision:
                logits = self.model(inputs, **layout)  # (B, L, V)
            logits = logits.float().flatten(0, 1)  # (B·L, V)
            ce = F.cross_entropy(logits, targets.flatten(), ignore_index=PAD, reduction=reduction)
        if n_targets is not None:
            ce = ce / n_targets
        if not lm.moe_layers():
            return ce, ce
        return ce + share * lm.moe_loss().float(), ce

    def _count_targets(self, targets: torch.Tensor) -> int:
        """这一步整批里要预测的目标数（非 PAD）。:class:`~tformer_lib.parallel.DistributedLMTrainer` 里每个进程只拿到
        全局批的一份，它把各进程的数加起来：所有进程看到同一个数，要报错就一起报错，不会有进程等在 all-reduce 里。"""
        return int((targets != PAD).sum())

    def _check_finite(self, loss: torch.Tensor) -> None:
        if not torch.isfinite(loss):
            raise TrainingDivergedError(
                f"第 {self.step + 1} 步的损失变成了 {loss.item()}（学习率 {self.scheduler.get_last_lr()[0]:.3g}）。"
                "可以尝试：调小 lr、加大 warmup，或设置 clip（如 1.0）。"
            )

    def train_step(self) -> float:
        """一个训练步，返回这一步的损失。

        ``accumulation_steps = k > 1`` 时把一批切成 k 个微批（micro-batch）依次前向、反向，梯度在 ``.grad`` 里累加；
        每个微批的损失是“总和 / 整批的非 PAD 目标数”，所以累加出的梯度与一次算整批相同（测试保证）。
        混合专家模型例外：负载均衡损失与容量按一次前向的词元（一组）算，每个微批是一组，
        所以路由器的梯度与整批一次前向不同（交叉熵部分仍相同）。
        一批里没有要预测的目标（目标全是 PAD 或 BOS；多进程时数的是整个全局批）时报 ValueError，参数、优化器、步数与模型的
        train/eval 模式都不动。
        """
        device = next(self.model.parameters()).device
        inputs, targets = loss_targets(self.batch(self.step).to(device))  # (B, L), (B, L)
        n_targets = self._count_targets(targets)  # 整批的非 PAD 目标数（多进程时是整个全局批的）
        if n_targets == 0:  # 否则交叉熵是 0/0：不累积时是 NaN，累积时是一个梯度为 0 的 AdamW 步
            rows = self._batch_rows(self.step).tolist()
            shown = ", ".join(map(str, rows[:8])) + ("，……" if len(rows) > 8 else "")
            raise ValueError(f"第 {self.step + 1} 步的一批（batch_size={self.batch_size} 块：train_blocks 的第 {shown} 行；"
                             "多进程时数的是整个全局批）里没有要预测的目标（目标全是 PAD 或 BOS），交叉熵没有定义："
                             "train_blocks 的每一批至少要有一个真实词元作目标（块里 BOS 之后至少还有一个真实词元）")
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        scale = (lambda t: self.scaler.scale(t)) if self.scaler is not None else (lambda t: t)
        if self.accumulation_steps == 1:
            objective, loss = self._loss(inputs, targets, None)
            self._check_finite(objective)
            scale(objective).backward()
        else:
            loss = torch.zeros(())
            for inp, tgt in zip(inputs.chunk(self.accumulation_steps), targets.chunk(self.accumulation_steps)):
                objective, part = self._loss(inp, tgt, n_targets, 1 / self.accumulation_steps)  # 微批 (B/k, L)
                self._check_finite(objective)
                scale(objective).backward()
                loss = loss + part.detach().cpu()
        if self.scaler is not None:
            self.scaler.unscale_(self.optimizer)  # 先除回缩放因子，裁剪才看得到真实的梯度范数
        if self.clip is not None:
            nn.utils.clip_grad_norm_(self.model.parameters(), self.clip)
        self.history["step_lr"].append(self.scheduler.get_last_lr()[0])
        if self.scaler is not None:
            self.scaler.step(self.optimizer)  # 梯度里有 inf/NaN 时跳过这一步，并减小缩放因子
            self.scaler.update()
        else:
            self.optimizer.step()
        self.scheduler.step()
        self.step += 1
        self.tokens_seen += int((targets != PAD).sum())
        value = float(loss.detach())
        self.history["step_loss"].append(value)
        return value

    def evaluate(self) -> dict:
        """验证集上的平均交叉熵与困惑度（perplexity）。"""
        if self.valid is None:
            raise ValueError("这个 LMTrainer 建立时 valid=None，没有验证数据可评估：建立时传入 valid=(inputs, targets)")
        loss, ppl = lm_perplexity(self.model, *self.valid)
        return {"step": self.step, "valid_loss": loss, "valid_ppl": ppl}

    def fit(self, steps: int | None = None, callback=None) -> dict:
        """再训 ``steps`` 步（默认训到 ``total_steps``）；每 ``eval_every`` 步与最后一步评估。返回最后一次评估。

        ``callback(trainer, info)`` 在每次评估后调用（笔记本可用它实时画曲线）。
        """
        from tqdm.auto import tqdm

        end = self.total_steps if steps is None else self.step + positive_int("steps", steps)
        show = sys.stderr.isatty() if self.progress is None else bool(self.progress)
        bar = tqdm(total=end - self.step, disable=not show, leave=False, desc="lm-train")
        info: dict = {}
        start, cpu_start = time.perf_counter(), time.process_time()
        try:
            while self.step < end:
                loss = self.train_step()
                bar.update(1)
                bar.set_postfix(loss=f"{loss:.3f}")
                if self.valid is not None and (self.step % self.eval_every == 0 or self.step == end):
                    self.seconds += time.perf_counter() - start
                    self.cpu_seconds += time.process_time() - cpu_start
                    info = self.evaluate()
                    start, cpu_start = time.perf_counter(), time.process_time()
                    self.history["evals"].append(info)
                    if self.verbose:
                        print(f"第 {info['step']} 步：训练损失 {loss:.3f}，验证损失 {info['valid_loss']:.3f}，"
                              f"验证困惑度 {info['valid_ppl']:.1f}", flush=True)
                    if callback is not None:
                        callback(self, info)
        finally:
            self.seconds += time.perf_counter() - start
            self.cpu_seconds += time.process_time() - cpu_start
            bar.close()
        return info

    def state_dict(self) -> dict:
        """续训所需的一切（不含模型权重）：优化器、调度器、步数、历史、随机数状态。"""
        return {
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "step": self.step,
            "seed": self.seed,
            "batch_size": self.batch_size,
            "total_steps": self.total_steps,
            "document_mask": self.document_mask,
            "history": {k: list(v) for k, v in self.history.items()},
            "seconds": self.seconds,
            "cpu_seconds": self.cpu_seconds,
            "tokens_seen": self.tokens_seen,
            "rng": torch.get_rng_state(),
            "scaler": self.scaler.state_dict() if self.scaler is not None else None,
        }

    def load_state_dict(self, state: dict) -> None:
        for key in ("seed", "batch_size", "total_steps"):
            if state[key] != getattr(self, key):
                raise ValueError(f"检查点里的 {key}={state[key]!r} 与这个训练器的 {getattr(self, key)!r} 不同，无法精确续训")
        if state.get("document_mask", False) != self.document_mask:  # 旧检查点没有这一项：当时只有因果掩码
            raise ValueError(f"检查点里的 document_mask={state.get('document_mask', False)!r} 与这个训练器的 "
                             f"{self.document_mask!r} 不同，无法精确续训")
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.step = int(state["step"])
        self.history = {k: list(v) for k, v in state["history"].items()}
        self.seconds, self.tokens_seen = float(state["seconds"]), int(state["tokens_seen"])
        self.cpu_seconds = float(state.get("cpu_seconds", 0.0))
        torch.set_rng_state(state["rng"])
        if self.scaler is not None and state.get("scaler"):
            self.scaler.load_state_dict(state["scaler"])


def save_lm_checkpoint(
    path: str | os.PathLike, model: DecoderOnlyLM, tokenizer=None, trainer: LMTrainer | None = None,
    extra: dict | None = None, half: bool = False,
) -> Path:
    """原子地保存语言模型检查点（与编码器–解码器的检查点同一格式标记，另加 ``kind="lm"``）。

    ``trainer`` 给出时连同优化器等一起保存，可续训；``half=True`` 把权重存成 float16（随书检查点用它减半体积，
    读回时还原为 float32）。
    """
    if not isinstance(model, DecoderOnlyLM):
        raise TypeError(f"model 应是 DecoderOnlyLM，收到 {type(model).__name__}")
    state = model.state_dict()
    if half:
        halves: dict[int, torch.Tensor] = {}  # 共享的权重（输出层 = 词嵌入）只转换、只存一份
        state = {k: halves.setdefault(v.data_ptr(), v.half()) if v.is_floating_point() else v for k, v in state.items()}
    payload = {
        "format": CHECKPOINT_FORMAT,
        "version": CHECKPOINT_VERSION,
        "kind": "lm",
        "torch_version": str(torch.__version__),
        "config": model.config.to_dict(),
        "model": state,
        "tokenizer": tokenizer.to_dict() if tokenizer is not None else None,
        "trainer": trainer.state_dict() if trainer is not None else None,
        "extra": dict(extra) if extra else {},
    }
    return atomic_torch_save(payload, path)


def load_lm(path_or_checkpoint, map_location: str | torch.device = "cpu"):
    """由检查点重建 ``(model, tokenizer, checkpoint)``；模型为 float32、eval 模式。"""
    from ..text import CharTokenizer

    ckpt = path_or_checkpoint if isinstance(path_or_checkpoint, dict) else load_checkpoint(path_or_checkpoint, map_location)
    if ckpt.get("kind") != "lm":
        raise CheckpointError("这个检查点不是语言模型（缺少 kind='lm'）；编码器–解码器的检查点请用 load_model")
    try:
        model = make_lm(LMConfig.from_dict(ckpt["config"]))
        model.load_state_dict({k: v.float() if v.is_floating_point() else v for k, v in ckpt["model"].items()})
    except (ValueError, TypeError, RuntimeError, KeyError) as exc:
        raise CheckpointError(f"检查点里的配置或权重与本库的语言模型不匹配：{exc}") from exc
    tokenizer = CharTokenizer.from_dict(ckpt["tokenizer"]) if ckpt.get("tokenizer") else None
    return model.eval(), tokenizer, ckpt
