"""检查点（checkpoint）：把训练好的模型连同续训所需的一切存进一个文件。

内容：模型权重、模型配置、源/目标词表、训练器状态（优化器、调度器、步数、epoch、
历史指标、随机数状态）。除张量外只存 ``dict/list/str/int/float/bool/None``，因此可以用
``torch.load(weights_only=True)`` 安全加载——不会执行文件里的任意代码。

写入是原子的（atomic）：先写到同目录的临时文件，``fsync`` 后再 ``os.replace`` 改名，
中途断电或报错也不会留下半个文件覆盖掉旧的检查点。临时文件名是
``.<目标文件名>.tformer-tmp-<进程号>-<随机>.tmp``，一看就知道是本库的；写入的进程被杀掉时它会留下，
下一次保存到同一路径或读取这个检查点时，写它的进程已不在了的临时文件会被删掉。

读取时核对：格式标记与版本、配置与权重（形状逐个比较）、词表大小与配置里的 ``*_vocab_size``。
任何不一致都是一行清楚的 :class:`CheckpointError`。
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import torch
from torch import nn

from ..data.vocab import Vocab
from ..translation.config import TransformerConfig
from ..translation.model import make_model

__all__ = [
    "CheckpointError",
    "save_checkpoint",
    "atomic_torch_save",
    "load_checkpoint",
    "load_model",
    "check_checkpoint_path",
    "clean_stale_temp_files",
    "CHECKPOINT_FORMAT",
]

CHECKPOINT_FORMAT = "tformer-checkpoint"
CHECKPOINT_VERSION = 1


class CheckpointError(RuntimeError):
    """检查点文件损坏、不完整或不是本库写出的。"""


_TMP_MARK = ".tformer-tmp-"


def _temp_prefix(path: Path) -> str:
    return f".{path.name}{_TMP_MARK}"


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OSError):
        return True  # 进程存在但不归我们管，或无法判断：当作还活着，不删它的文件
    return True


def clean_stale_temp_files(path: str | os.PathLike) -> list[Path]:
    """删掉 ``path`` 旁边、由已经不在的进程留下的临时文件（被杀掉的保存留下的），返回删掉的文件。"""
    path = Path(path)
    removed = []
    try:
        candidates = list(path.parent.glob(_temp_prefix(path) + "*.tmp"))
    except OSError:
        return removed
    for tmp in candidates:
        pid_text = tmp.name[len(_temp_prefix(path)):].split("-", 1)[0]
        if not pid_text.isdigit() or (int(pid_text) != os.getpid() and _pid_alive(int(pid_text))):
            continue  # 另一个正在写的进程的文件，不碰
        try:
            tmp.unlink()
            removed.append(tmp)
        except OSError:
            pass  # 没有权限或已被删：不影响这次读写
    return removed


def check_checkpoint_path(path: str | os.PathLike, name: str = "path") -> Path:
    """在花时间训练之前确认 ``path`` 能写成检查点文件；不能时抛出一行的 ``ValueError``（点名 ``name``）。

    拒绝：已存在的目录；上级路径中有一段是普通文件；最近的已存在上级目录没有写权限。
    不存在的上级目录没关系，保存时会创建。
    """
    path = Path(path)
    shown = f"{name} {str(path)!r}"
    if str(path) == "" or path.name in ("", ".", ".."):
        raise ValueError(f"{shown} 不是文件路径；请给出文件名，如 model.pt")
    if path.is_dir():
        raise ValueError(f"{shown} 是一个已存在的目录；请给出文件路径，如 {str(path / 'model.pt')!r}")
    parent = path.parent
    while not parent.exists():
        if parent == parent.parent:
            break
        parent = parent.parent
    if parent.exists() and not parent.is_dir():
        raise ValueError(f"{shown} 的上级 {str(parent)!r} 不是目录（是一个文件）")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise ValueError(f"{shown}：没有在目录 {str(parent)!r} 里写文件的权限")
    if path.exists() and not os.access(path, os.W_OK):
        raise ValueError(f"{shown} 已存在且没有写权限")
    return path


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
    path = check_checkpoint_path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    clean_stale_temp_files(path)  # 上一次被杀掉的保存留下的临时文件
    fd, tmp = tempfile.mkstemp(prefix=f"{_temp_prefix(path)}{os.getpid()}-", suffix=".tmp", dir=path.parent)
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
    clean_stale_temp_files(path)
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
    """由检查点重建 ``(model, src_vocab, tgt_vocab, checkpoint)``；模型处于 eval 模式。

    配置、权重与词表互相核对，不一致时抛出一行的 :class:`CheckpointError`，而不是等到 ``translate`` 时才失败。
    """
    ckpt = path_or_checkpoint if isinstance(path_or_checkpoint, dict) else load_checkpoint(path_or_checkpoint, map_location)
    try:
        config = TransformerConfig.from_dict(ckpt["config"])
    except (ValueError, TypeError, KeyError) as exc:
        raise CheckpointError(f"检查点里的 config 无效：{_one_line(exc)}") from exc
    model = make_model(config)
    _check_weights(ckpt["model"], model.state_dict())
    model.load_state_dict(ckpt["model"])
    model.eval()
    vocabs = []
    for name in ("src_vocab", "tgt_vocab"):
        try:
            vocab = Vocab.from_dict(ckpt[name]) if ckpt.get(name) else None
        except (ValueError, TypeError) as exc:
            raise CheckpointError(f"检查点里的 {name} 无效：{_one_line(exc)}") from exc
        size = getattr(config, f"{name}_size")
        if vocab is not None and len(vocab) != size:
            raise CheckpointError(
                f"检查点的 {name} 有 {len(vocab)} 个词元，但 config.{name}_size={size}：词表与模型配置不一致，"
                "检查点可能被改过或来自不同的训练；请重新训练或换用匹配的检查点"
            )
        vocabs.append(vocab)
    return model, vocabs[0], vocabs[1], ckpt


def _one_line(exc: BaseException) -> str:
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return "；".join(lines[:1]) if lines else type(exc).__name__


def _check_weights(saved: dict, expected: dict) -> None:
    """逐个比较参数名与形状，把不一致概括成一行（PyTorch 自己的报错可能有几十行）。"""
    if not isinstance(saved, dict):
        raise CheckpointError(f"检查点里的 model 应是 state_dict（dict），收到 {type(saved).__name__}")
    missing = [k for k in expected if k not in saved]
    unexpected = [k for k in saved if k not in expected]
    shapes = [
        (k, tuple(saved[k].shape), tuple(v.shape))
        for k, v in expected.items()
        if k in saved and isinstance(saved[k], torch.Tensor) and saved[k].shape != v.shape
    ]
    if not (missing or unexpected or shapes):
        return
    parts = []
    if shapes:
        k, got, want = shapes[0]
        parts.append(f"{len(shapes)} 个参数形状不同（如 {k}：检查点 {got}，config 要求 {want}）")
    if missing:
        parts.append(f"缺少 {len(missing)} 个参数（如 {missing[0]}）")
    if unexpected:
        parts.append(f"多出 {len(unexpected)} 个参数（如 {unexpected[0]}）")
    raise CheckpointError(
        "检查点里的 config 与 model 权重不匹配（config 可能被改过，或权重来自另一个配置）：" + "；".join(parts)
    )
