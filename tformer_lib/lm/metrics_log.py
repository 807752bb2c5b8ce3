"""训练指标的 JSON-lines 记录（metrics log）：``lm-train`` 在检查点旁边写 ``<检查点>.metrics.jsonl``。

每一行是一个训练步::

    {"step": 400, "loss": 5.21, "lr": 0.00291, "tokens_per_s": 6850.0, "valid_loss": 4.9, "valid_ppl": 134.2}

* ``loss``/``lr``：这一步的训练损失与所用学习率（``LMTrainer.history`` 里逐步记下的）；
* ``tokens_per_s``：自上一次写入以来的平均吞吐（目标词元数 / 训练的墙钟秒数，不含评估）；
* ``valid_loss``/``valid_ppl``：这一步做了评估时才有，否则为 ``null``。

续训（``--resume``）时接着原文件写，并丢掉检查点之后的旧行，所以文件与一口气训完的一样逐步连续。
:func:`read_metrics` 读回，:func:`tformer_lib.plotting.plot_lm_metrics` 画图。
"""

from __future__ import annotations

import json
import os
from pathlib import Path

__all__ = ["metrics_path", "MetricsLog", "read_metrics"]


def metrics_path(checkpoint: str | os.PathLike) -> Path:
    """检查点旁边的指标文件：``poem.pt`` → ``poem.metrics.jsonl``。"""
    path = Path(checkpoint)
    return path.with_name(path.stem + ".metrics.jsonl")


def read_metrics(path: str | os.PathLike) -> list[dict]:
    """读回 JSON-lines 指标文件：每行一个字典，按文件顺序。"""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"找不到指标文件 {str(path)!r}（lm-train 把它写在检查点旁边：<检查点名>.metrics.jsonl）")
    rows = []
    with path.open(encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if line.strip():
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError as exc:
                    raise ValueError(f"指标文件 {str(path)!r} 第 {n} 行不是 JSON：{exc}") from None
    return rows


class MetricsLog:
    """把 :class:`~tformer_lib.lm.LMTrainer` 的逐步记录追加到 JSON-lines 文件。

    ``log(trainer)`` 写出上次写入之后的所有步；可以当作 ``trainer.fit(callback=…)`` 的回调（每次评估后调用），
    也可以在每次保存检查点时调用。``resume_from``（续训时：原检查点的指标文件）给出时先抄下其中
    不晚于 ``trainer.step`` 的行，否则清空旧文件。
    """

    def __init__(self, path: str | os.PathLike, trainer, resume_from: str | os.PathLike | None = None):
        self.path = Path(path)
        self.written = trainer.step  # 已写到第几步
        self._tokens, self._seconds = trainer.tokens_seen, trainer.seconds
        kept = []
        if resume_from is not None and Path(resume_from).is_file():
            kept = [r for r in read_metrics(resume_from) if r.get("step", 0) <= trainer.step]
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.path.open("w", encoding="utf-8") as f:
            for row in kept:
                f.write(json.dumps(row, ensure_ascii=False) + "\n")

    def __call__(self, trainer, info=None) -> None:
        self.log(trainer)

    def log(self, trainer) -> None:
        if trainer.step <= self.written:
            return
        seconds = trainer.seconds - self._seconds
        tokens = trainer.tokens_seen - self._tokens
        speed = tokens / seconds if seconds > 0 else None
        evals = {e["step"]: e for e in trainer.history["evals"]}
        losses, lrs = trainer.history["step_loss"], trainer.history["step_lr"]
        with self.path.open("a", encoding="utf-8") as f:
            for step in range(self.written + 1, trainer.step + 1):  # 第 step 步的记录在下标 step − 1
                ev = evals.get(step, {})
                row = {"step": step, "loss": losses[step - 1], "lr": lrs[step - 1], "tokens_per_s": speed,
                       "valid_loss": ev.get("valid_loss"), "valid_ppl": ev.get("valid_ppl")}
                f.write(json.dumps(row, ensure_ascii=False) + "\n")
        self.written, self._tokens, self._seconds = trainer.step, trainer.tokens_seen, trainer.seconds
