"""检查点（checkpoint）：把训练好的模型连同续训所需的一切存进一个文件。

内容：模型权重、模型配置、源/目标词表、训练器状态（优化器、调度器、步数、epoch、
历史指标、随机数状态）。除张量外只存 ``dict/list/str/int/float/bool/None``，因此可以用
``torch.load(weights_only=True)`` 安全加载——不会执行文件里的任意代码。

写入是原子的（atomic）：先写到同目录的临时文件，``fsync`` 后再 ``os.replace`` 改名，
中途断电或报错也不会留下半个文件覆盖掉旧的检查点。
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import torch
from torch import nn

from ..config import TransformerConfig
from ..data.vocab import Vocab
from ..model import make_model

__all__ = ["CheckpointError", "save_checkpoint", "atomic_torch_save", "load_checkpoint", "load_model", "CHECKPOINT_FORMAT"]

CHECKPOINT_FORMAT = "tformer-checkpoint"
CHECKPOINT_VERSION = 1


class CheckpointError(RuntimeError):
    """检查点文件损坏、不完整或不是本库写出的。"""


def save_checkpoint(
    path: str | os.PathLike,
    model: nn.Module,
    src_vocab: Vocab | None = None,
    tgt_vocab: Vocab | None = None,
    trainer=None,
    extra: dict | None = None,
) -> Path:
    """原子地保存检查点，返回路径。``trainer`` 给出时连同其优化器/调度器/步数一起保存，可续训。

    ``extra`` 可放少量普通类型的附加信息（如数据集名、种子）。
    """
    if not hasattr(model, "config") or not isinstance(model.config, TransformerConfig):
        raise TypeError(f"model 应是 make_model(config) 得到的 Transformer，收到 {type(model).__name__}")
    for name, vocab in (("src_vocab", src_vocab), ("tgt_vocab", tgt_vocab)):
        if vocab is not None and not isinstance(vocab, Vocab):
            raise TypeError(f"{name} 应是 Vocab 或 None，收到 {type(vocab).__name__}")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    payload = {
        "format": CHECKPOINT_FORMAT,
        "version": CHECKPOINT_VERSION,
        "torch_version": str(torch.__version__),
        "config": model.config.to_dict(),
        "model": model.state_dict(),
        "src_vocab": src_vocab.to_dict() if src_vocab is not None else None,
        "tgt_vocab": tgt_vocab.to_dict() if tgt_vocab is not None else None,
        "trainer": trainer.state_dict() if trainer is not None else None,
        "extra": dict(extra) if extra else {},
    }
    return atomic_torch_save(payload, path)


def atomic_torch_save(payload: dict, path: str | os.PathLike) -> Path:
    """原子地 ``torch.save(payload)`` 到 ``path``：写同目录的临时文件、fsync、再改名；返回路径。

    :func:`save_checkpoint` 与语言模型的检查点（:mod:`tformer_lib.lm.training`）共用这一个机制。
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            torch.save(payload, f)
            f.flush()
            os.fsync(f.fileno())
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp 建的是 0600；改成普通文件的权限（受 umask 约束）
        os.replace(tmp, path)  # 原子改名：读者要么看到旧文件，要么看到完整的新文件
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return path


def load_checkpoint(path: str | os.PathLike, map_location: str | torch.device = "cpu") -> dict:
    """用 ``weights_only=True`` 读取检查点并检查格式，返回其中的字典。

    文件不存在 → ``FileNotFoundError``；损坏或不是本库的检查点 → :class:`CheckpointError`。
    """
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"找不到检查点文件 {str(path)!r}；请检查路径，或先用 `python -m tformer_lib train` 训练一个")
    if path.is_dir():
        raise CheckpointError(f"{str(path)!r} 是目录，不是检查点文件")
    try:
        data = torch.load(path, map_location=map_location, weights_only=True)
    except Exception as exc:  # 截断、乱码、或含有不安全对象的 pickle
        raise CheckpointError(
            f"无法读取检查点 {str(path)!r}：文件已损坏、不完整，或不是本库保存的检查点"
            f"（{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}）。请删除它后重新训练。"
        ) from exc
    if not isinstance(data, dict) or data.get("format") != CHECKPOINT_FORMAT:
        raise CheckpointError(f"{str(path)!r} 不是 tformer 检查点（缺少 format={CHECKPOINT_FORMAT!r} 标记）")
    if data.get("version") != CHECKPOINT_VERSION:
        raise CheckpointError(
            f"{str(path)!r} 的检查点版本是 {data.get('version')!r}，本库只能读取版本 {CHECKPOINT_VERSION}"
        )
    for key in ("config", "model"):
        if key not in data:
            raise CheckpointError(f"{str(path)!r} 缺少字段 {key!r}，文件不完整")
    return data


def load_model(
    path_or_checkpoint: str | os.PathLike | dict, map_location: str | torch.device = "cpu"
) -> tuple[nn.Module, Vocab | None, Vocab | None, dict]:
    """由检查点重建 ``(model, src_vocab, tgt_vocab, checkpoint)``；模型处于 eval 模式。"""
    ckpt = path_or_checkpoint if isinstance(path_or_checkpoint, dict) else load_checkpoint(path_or_checkpoint, map_location)
    try:
        config = TransformerConfig.from_dict(ckpt["config"])
        model = make_model(config)
        model.load_state_dict(ckpt["model"])
    except (ValueError, TypeError, RuntimeError, KeyError) as exc:
        raise CheckpointError(f"检查点里的配置或权重与本库的模型不匹配：{exc}") from exc
    model.eval()
    src_vocab = Vocab.from_dict(ckpt["src_vocab"]) if ckpt.get("src_vocab") else None
    tgt_vocab = Vocab.from_dict(ckpt["tgt_vocab"]) if ckpt.get("tgt_vocab") else None
    return model, src_vocab, tgt_vocab, ckpt
