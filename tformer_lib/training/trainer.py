"""训练器（trainer）：按 epoch 训练，每个 epoch 结束在验证集上评估，并记下全部指标。

一个训练步（step）：

1. 教师强制（teacher forcing）：把 ``tgt_in = BOS + y`` 整句喂给解码器，一次算出每个位置的 logits；
2. 标签平滑损失（按真实词元平均），反向传播；
3. 梯度裁剪（gradient clipping）→ Adam 更新 → 预热调度器更新学习率。

每个 epoch 的评估：验证损失（不带平滑的交叉熵）、词元准确率（token accuracy，教师强制下
argmax 命中的比例）、整句完全匹配率（exact match，贪心解码）与 BLEU（``sacrebleu``）。

可复现：批次顺序只由 ``seed + epoch`` 决定；dropout 用的 torch 随机状态随检查点保存，
所以「训练 2 个 epoch」与「训练 1 个 epoch → 存盘 → 读盘再训 1 个 epoch」的每一步损失逐位相同。
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Sequence

import torch
from torch import nn

from ..data.batching import Batch, batch_iterator, num_batches
from ..translation.decoding import model_max_len, greedy_decode, ids_to_lists
from .loss import check_smoothing, label_smoothing_loss
from .schedule import make_optimizer, make_scheduler

__all__ = ["History", "Trainer", "evaluate", "TrainingDivergedError", "METRIC_NAMES", "epoch_line"]

IdPair = tuple[list[int], list[int]]
Callback = Callable[[str, dict], None]



#: 评估指标的中文名（命令行与 ``verbose`` 的打印用；字典里的键仍是英文）
METRIC_NAMES = {"loss": "损失", "token_accuracy": "词元准确率", "exact_match": "整句正确率", "bleu": "BLEU"}


def epoch_line(record: dict) -> str:
    """一个 epoch 的记录压成一行中文：``第 1 个 epoch（第 94 步）：训练损失 1.844，学习率 0.00588，验证损失 …``。"""
    parts = [f"训练损失 {record['train_loss']:.4g}", f"学习率 {record['lr']:.3g}"]
    for key, value in record.items():
        if key.startswith("valid_") and len(key) > len("valid_"):
            name = METRIC_NAMES.get(key[6:], key[6:])
            parts.append(f"验证{' ' if name[0].isascii() else ''}{name} {value:.4g}")  # 中文与拉丁字母之间空一格
    return f"第 {record['epoch']} 个 epoch（第 {record['step']} 步）：" + "，".join(parts)

class TrainingDivergedError(FloatingPointError):
    """损失变成 NaN 或无穷大时抛出；消息里写明第几步以及可以尝试的办法。"""


class History:
    """训练记录：``steps`` 是每步的损失与学习率，``epochs`` 是每个 epoch 的指标字典。

    ``history["valid_exact_match"]`` 取出所有 epoch 的该项指标（列表）。
    只含普通 Python 类型，可以原样存进检查点。``seconds`` 是耗时，每次运行都不同，别打印进笔记本。
    """

    def __init__(self):
        self.step_loss: list[float] = []
        self.step_lr: list[float] = []
        self.epochs: list[dict] = []

    def __getitem__(self, name: str) -> list:
        if not self.epochs or name not in self.epochs[0]:
            known = sorted(self.epochs[0]) if self.epochs else []
            raise KeyError(f"History 中没有指标 {name!r}；已有：{known}")
        return [e[name] for e in self.epochs]

    def __len__(self) -> int:
        return len(self.epochs)

    @property
    def last(self) -> dict:
        """最后一个 epoch 的指标；还没训练时为空字典。"""
        return dict(self.epochs[-1]) if self.epochs else {}

    def to_dict(self) -> dict:
        return {"step_loss": list(self.step_loss), "step_lr": list(self.step_lr), "epochs": [dict(e) for e in self.epochs]}

    @classmethod
    def from_dict(cls, data: dict) -> "History":
        h = cls()
        h.step_loss = [float(x) for x in data.get("step_loss", [])]
        h.step_lr = [float(x) for x in data.get("step_lr", [])]
        h.epochs = [dict(e) for e in data.get("epochs", [])]
        return h

    def __repr__(self) -> str:
        return f"History(epochs={len(self.epochs)}, steps={len(self.step_loss)}, last={self.last})"


def _bleu(hyps: list[str], refs: list[str]) -> float:
    import sacrebleu

    return float(sacrebleu.corpus_bleu(hyps, [refs]).score)


@torch.no_grad()
def evaluate(
    model: nn.Module,
    data: Sequence[IdPair],
    tgt_vocab=None,
    batch_size: int = 256,
    max_len: int | None = None,
    decode: bool = True,
    decode_fn: Callable[[nn.Module, torch.Tensor], torch.Tensor] | None = None,
) -> dict:
    """在 ``data``（id 句子对）上评估，返回 ``{"loss", "token_accuracy", "exact_match", "bleu"}``。

    * ``loss``：教师强制下不带平滑的交叉熵（每个真实词元平均）；
    * ``token_accuracy``：教师强制下 argmax 与参考词相同的比例；
    * ``exact_match``：解码（默认贪心）出的整句与参考完全相同的比例；
    * ``bleu``：整份数据的 corpus BLEU（0–100），需要 ``tgt_vocab`` 把 id 变回词。

    ``decode=False`` 时只算前两项（更快）。``decode_fn(model, src) -> (B, L)`` 可换成束搜索等。
    """
    if len(data) == 0:
        raise ValueError("data 为空：没有可评估的句子对")
    was_training = model.training
    model.eval()
    total_loss, total_correct, total_tokens = 0.0, 0, 0
    n_exact = 0
    hyps: list[str] = []
    refs: list[str] = []
    device = next(model.parameters()).device
    try:
        for batch in batch_iterator(data, batch_size, pad_id=model.config.pad_id):
            batch = batch.to(device)  # 模型在 GPU 上时把批次也搬过去
            logits = model(batch.src, batch.tgt_in, batch.src_mask, batch.tgt_mask)  # (B, T, V)
            total_loss += float(label_smoothing_loss(logits, batch.tgt_out, 0.0, model.config.pad_id, "sum"))
            keep = batch.tgt_out != model.config.pad_id  # (B, T)
            total_correct += int(((logits.argmax(-1) == batch.tgt_out) & keep).sum())
            total_tokens += batch.n_tokens
            if decode:
                limit = max_len
                if limit is None:  # 默认：参考译文长度 + 5，但不超过模型能表示的长度
                    limit = batch.tgt_out.shape[1] + 5
                    model_limit = model_max_len(model)
                    limit = limit if model_limit is None else min(limit, model_limit)
                out = decode_fn(model, batch.src) if decode_fn else greedy_decode(model, batch.src, limit)
                for hyp, ref in zip(ids_to_lists(out), ids_to_lists(batch.tgt_out)):
                    n_exact += hyp == ref
                    if tgt_vocab is not None:
                        hyps.append(" ".join(tgt_vocab.decode(hyp)))
                        refs.append(" ".join(tgt_vocab.decode(ref)))
                    else:
                        hyps.append(" ".join(map(str, hyp)))
                        refs.append(" ".join(map(str, ref)))
    finally:
        model.train(was_training)
    result = {"loss": total_loss / total_tokens, "token_accuracy": total_correct / total_tokens}
    if decode:
        result["exact_match"] = n_exact / len(data)
        result["bleu"] = _bleu(hyps, refs)
    return result


class Trainer:
    """把模型、数据、优化器、调度器与评估串起来的训练器。

    参数
    ----
    model: :func:`tformer_lib.make_model` 得到的模型。
    train_data / valid_data: id 句子对列表（:func:`tformer_lib.data.encode_pairs` 的输出，不含 BOS/EOS）。
    tgt_vocab: 目标词表，用于计算 BLEU 时把 id 变回词；可省略。
    batch_size, warmup, lr_factor: 批大小；预热步数；学习率 = ``lr_factor · noam_rate``。
    label_smoothing: ε，论文用 0.1。
    clip_grad_norm: 梯度范数上限；``None`` 不裁剪。
    seed: 决定每个 epoch 的批次顺序（``seed + epoch``）。不设置全局种子——请在建模型前调用 ``set_seed``。
    progress: 是否显示 tqdm 进度条；``None`` = 只在终端（tty）里显示，笔记本与 CI 中关闭。
    callbacks: 回调函数 ``fn(event, info)``，``event`` 为 ``"step"``（info 含 step/epoch/loss/lr）
        或 ``"epoch"``（info 为该 epoch 的指标，外加 ``"history"``）。笔记本可用它实时画损失曲线。
    eval_decode: 每个 epoch 是否做解码评估（exact match 与 BLEU）；关掉可以更快。

    批次会被搬到模型所在的设备（device）上：想用 GPU，先 ``model.to("cuda")`` 再建训练器。
    """

    def __init__(
        self,
        model: nn.Module,
        train_data: Sequence[IdPair],
        valid_data: Sequence[IdPair] | None = None,
        *,
        tgt_vocab=None,
        batch_size: int = 64,
        warmup: int = 400,
        lr_factor: float = 1.0,
        label_smoothing: float = 0.1,
        clip_grad_norm: float | None = 1.0,
        seed: int = 0,
        progress: bool | None = None,
        callbacks: Sequence[Callback] = (),
        eval_decode: bool = True,
        eval_batch_size: int = 256,
        verbose: bool = False,
    ):
        if not isinstance(model, nn.Module) or not hasattr(model, "config"):
            raise TypeError(f"model 应是 make_model(config) 得到的 Transformer，收到 {type(model).__name__}")
        if len(train_data) == 0:
            raise ValueError("train_data 为空：至少需要一个训练句子对")
        if not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size 应为正整数，收到 {batch_size!r}")
        check_smoothing(label_smoothing)
        if clip_grad_norm is not None and not clip_grad_norm > 0:
            raise ValueError(f"clip_grad_norm 应为正数或 None，收到 {clip_grad_norm!r}")
        for i, cb in enumerate(callbacks):
            if not callable(cb):
                raise TypeError(f"callbacks[{i}] 应是可调用对象 fn(event, info)，收到 {type(cb).__name__}")
        self.model = model
        self.train_data = list(train_data)
        self.valid_data = list(valid_data) if valid_data else []
        self.tgt_vocab = tgt_vocab
        self.batch_size = batch_size
        self.label_smoothing = float(label_smoothing)
        self.clip_grad_norm = clip_grad_norm
        self.seed = int(seed)
        self.progress = progress
        self.callbacks = list(callbacks)
        self.eval_decode = eval_decode
        self.eval_batch_size = eval_batch_size
        self.verbose = verbose
        self.optimizer = make_optimizer(model)
        self.scheduler = make_scheduler(self.optimizer, model.config.d_model, warmup, lr_factor)
        self.step = 0  # 已完成的训练步数
        self.epoch = 0  # 已完成的 epoch 数
        self.history = History()

    # ---- 训练 ---------------------------------------------------------------------------
    def _show_progress(self) -> bool:
        if self.progress is not None:
            return bool(self.progress)
        return sys.stderr.isatty()

    def train_step(self, batch: Batch) -> float:
        """一个训练步；返回这一步的（平滑）损失。"""
        self.model.train()
        logits = self.model(batch.src, batch.tgt_in, batch.src_mask, batch.tgt_mask)  # (B, T, V)
        loss = label_smoothing_loss(logits, batch.tgt_out, self.label_smoothing, self.model.config.pad_id)
        if not torch.isfinite(loss):
            lr = self.optimizer.param_groups[0]["lr"]
            raise TrainingDivergedError(
                f"第 {self.step + 1} 步（epoch {self.epoch + 1}）的损失变成了 {loss.item()}（学习率 {lr:.3g}）。"
                "可以尝试：调小 lr_factor、加大 warmup、设置 clip_grad_norm（如 1.0），"
                "或检查数据里是否有空的目标句/越界的 id。"
            )
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if self.clip_grad_norm is not None:
            nn.utils.clip_grad_norm_(self.model.parameters(), self.clip_grad_norm)
        self.optimizer.step()
        self.scheduler.step()
        self.step += 1
        return loss.item()

    def fit(self, epochs: int) -> History:
        """再训练 ``epochs`` 个 epoch（从已完成的 epoch 接着数），返回 :attr:`history`。"""
        if not isinstance(epochs, int) or epochs < 0:
            raise ValueError(f"epochs 应为 ≥0 的整数，收到 {epochs!r}")
        for _ in range(epochs):
            self.train_epoch()
        return self.history

    def train_epoch(self) -> dict:
        """训练一个 epoch 并评估，返回这个 epoch 的指标字典。"""
        from tqdm.auto import tqdm

        start = time.perf_counter()
        epoch_index = self.epoch + 1
        batches = batch_iterator(
            self.train_data, self.batch_size, shuffle=True, seed=self.seed * 100_003 + epoch_index,
            pad_id=self.model.config.pad_id,
        )
        bar = tqdm(
            batches, total=num_batches(len(self.train_data), self.batch_size), desc=f"epoch {epoch_index}",
            disable=not self._show_progress(), leave=False,
        )
        total, tokens = 0.0, 0
        device = next(self.model.parameters()).device
        for batch in bar:
            batch = batch.to(device)
            lr = self.optimizer.param_groups[0]["lr"]
            loss = self.train_step(batch)
            total += loss * batch.n_tokens
            tokens += batch.n_tokens
            self.history.step_loss.append(loss)
            self.history.step_lr.append(lr)
            bar.set_postfix(loss=f"{loss:.3f}")
            self._emit("step", {"step": self.step, "epoch": epoch_index, "loss": loss, "lr": lr})
        bar.close()
        record = {"epoch": epoch_index, "step": self.step, "train_loss": total / max(tokens, 1),
                  "lr": self.optimizer.param_groups[0]["lr"]}
        if self.valid_data:
            metrics = evaluate(self.model, self.valid_data, self.tgt_vocab, self.eval_batch_size,
                               decode=self.eval_decode)
            record.update({f"valid_{k}": v for k, v in metrics.items()})
        record["seconds"] = time.perf_counter() - start
        self.epoch = epoch_index
        self.history.epochs.append(record)
        if self.verbose:
            print(epoch_line(record), flush=True)
        self._emit("epoch", {**record, "history": self.history})
        return record

    def _emit(self, event: str, info: dict) -> None:
        for cb in self.callbacks:
            cb(event, info)

    def evaluate(self, data: Sequence[IdPair], **kwargs) -> dict:
        """在任意 id 句子对上评估（参数同 :func:`evaluate`）。"""
        return evaluate(self.model, data, kwargs.pop("tgt_vocab", self.tgt_vocab), **kwargs)

    # ---- 续训所需的状态（只含普通类型与张量，可 weights_only 加载）--------------------------------
    def state_dict(self) -> dict:
        return {
            "step": self.step,
            "epoch": self.epoch,
            "seed": self.seed,
            "history": self.history.to_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "torch_rng_state": torch.get_rng_state(),
        }

    def load_state_dict(self, state: dict) -> None:
        missing = {"step", "epoch", "optimizer", "scheduler"} - set(state)
        if missing:
            raise ValueError(f"训练器状态缺少字段 {sorted(missing)}；它应来自 Trainer.state_dict()")
        self.step = int(state["step"])
        self.epoch = int(state["epoch"])
        self.seed = int(state.get("seed", self.seed))
        self.history = History.from_dict(state.get("history", {}))
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        if state.get("torch_rng_state") is not None:
            torch.set_rng_state(state["torch_rng_state"])
