"""书中用的玩具中→英模型：「有缓存就读，没有就训练并缓存」（load or train）。

第 5–8 章都要一个训练好的小模型。第一次调用 :func:`load_or_train_toy_model` 会在 CPU 上
训练它（单线程约半分钟），并把检查点存到用户缓存目录；之后的调用几秒内读回同一个模型。

查找顺序：

1. **随包附带的检查点**（``tformer_lib/checkpoints/``）：书中默认的两个模型（正弦位置编码、
   无位置编码）已预先训练好随包发布，所以各章在任何机器上读到的都是逐位相同的权重——
   不同线程数或 CPU 上重新训练，浮点累加顺序不同，权重会在末几位上略有差异；
2. 用户缓存目录：环境变量 ``TFORMER_CACHE`` 指定的目录；否则 ``$XDG_CACHE_HOME/tformer``；
   否则 ``~/.cache/tformer``；
3. 都没有就现训练，并存进用户缓存目录。

文件名包含配置、训练设置、种子与语料内容的指纹，改了任何一项都会重新训练。
附带的检查点由 :func:`build_shipped_checkpoints` 在单线程下生成（改了默认配方后要重新生成）。

本函数不改变 ``torch`` 的线程数（那是调用者的决定）。训练前后全局随机状态（random / numpy / torch）
保持不变，所以笔记本之后的随机结果与模型从哪里来无关。
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import warnings
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import torch

from ..data.batching import encode_pairs
from ..data.toy_zh_en import ToyCorpus, make_toy_corpus
from ..data.vocab import Vocab
from ..seed import cpu_fingerprint, set_seed
from ..training.checkpoint import CheckpointError, load_model, save_checkpoint
from ..training.trainer import History, Trainer
from .config import TransformerConfig
from .model import Transformer, make_model

__all__ = [
    "cache_dir",
    "toy_model_config",
    "load_toy_data",
    "load_or_train_toy_model",
    "TOY_TRAINING",
    "DEFAULT",
    "shipped_checkpoint_path",
    "build_shipped_checkpoints",
]

#: 玩具模型的训练设置（改动任一项都会使缓存失效）
TOY_TRAINING = {
    "epochs": 8,
    "batch_size": 64,
    "warmup": 200,
    "lr_factor": 1.0,
    "label_smoothing": 0.1,
    "clip_grad_norm": 1.0,
    "eval_decode": True,
    "corpus_seed": 0,
}
_TRAINING_KEYS = ("batch_size", "warmup", "lr_factor", "label_smoothing", "clip_grad_norm", "eval_decode")


class _Default:
    def __repr__(self) -> str:
        return "DEFAULT"


#: 训练设置参数的默认值标记：表示「用 TOY_TRAINING 里的值」（``clip_grad_norm=None`` 则表示不裁剪）
DEFAULT = _Default()
_CACHE_VERSION = 2  # 2：训练集加入全部名词短语（短语说完要输出 EOS）


#: 随包附带的检查点所在目录
SHIPPED_DIR = Path(__file__).resolve().parent.parent / "checkpoints"
#: 随包附带的配方：位置编码种类（其余全用默认值、seed=0）
SHIPPED_POSITIONAL = ("sinusoidal", "none")


def cache_dir() -> Path:
    """缓存目录：``TFORMER_CACHE`` > ``$XDG_CACHE_HOME/tformer`` > ``~/.cache/tformer``。"""
    env = os.environ.get("TFORMER_CACHE")
    if env:
        return Path(env).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "tformer"


def toy_model_config(src_vocab_size: int, tgt_vocab_size: int, positional: str = "sinusoidal", **overrides) -> TransformerConfig:
    """玩具模型的配置：d_model=64、4 个头、d_ff=128、编码器/解码器各 2 层、dropout 0.1（约 18 万参数）。"""
    kwargs = dict(
        d_model=64, n_heads=4, d_ff=128, n_encoder_layers=2, n_decoder_layers=2,
        dropout=0.1, max_len=64, positional=positional,
    )
    kwargs.update(overrides)
    return TransformerConfig(src_vocab_size, tgt_vocab_size, **kwargs)


def load_toy_data(seed: int = 0) -> dict:
    """玩具语料、由训练集建立的词表，以及编码成 id 的三个划分。

    返回 ``{"corpus", "src_vocab", "tgt_vocab", "train", "valid", "test"}``，
    其中 ``train/valid/test`` 是 id 句子对（不含 BOS/EOS），可直接交给 :class:`~tformer_lib.training.Trainer`。
    """
    corpus: ToyCorpus = make_toy_corpus(seed=seed)
    src_vocab = Vocab.build([z.split() for z, _ in corpus.train])
    tgt_vocab = Vocab.build([e.split() for _, e in corpus.train])
    return {
        "corpus": corpus,
        "src_vocab": src_vocab,
        "tgt_vocab": tgt_vocab,
        **{name: encode_pairs(corpus.split(name), src_vocab, tgt_vocab) for name in ("train", "valid", "test")},
    }


def _fingerprint(config: TransformerConfig, training: dict, seed: int, corpus: ToyCorpus) -> str:
    """配置、训练设置、种子与语料内容的指纹：任何一项变了，缓存文件名就变。"""
    corpus_hash = hashlib.sha256(
        json.dumps([corpus.train, corpus.valid, corpus.test], ensure_ascii=False).encode()
    ).hexdigest()
    blob = json.dumps({"config": config.to_dict(), "training": training, "seed": seed, "v": _CACHE_VERSION,
                       "corpus": corpus_hash}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:12]


@contextmanager
def preserve_global_rng():
    """训练会消耗并重设全局随机状态（set_seed、dropout）；结束后恢复调用者原来的状态。"""
    py_state, np_state, torch_state = random.getstate(), np.random.get_state(), torch.get_rng_state()
    try:
        yield
    finally:
        random.setstate(py_state)
        np.random.set_state(np_state)
        torch.set_rng_state(torch_state)


def load_or_train_toy_model(
    positional: str = "sinusoidal",
    *,
    epochs: int | None = None,
    seed: int = 0,
    cache: bool = True,
    retrain: bool = False,
    directory: str | os.PathLike | None = None,
    progress: bool | None = False,
    verbose: bool = False,
    batch_size=DEFAULT,
    warmup=DEFAULT,
    lr_factor=DEFAULT,
    label_smoothing=DEFAULT,
    clip_grad_norm=DEFAULT,
    eval_decode=DEFAULT,
    **config_overrides,
) -> tuple[Transformer, Vocab, Vocab, History]:
    """返回 ``(model, src_vocab, tgt_vocab, history)``：书中的玩具中→英模型（eval 模式）。

    参数
    ----
    positional: ``"sinusoidal"``（默认，论文的正弦位置编码）、``"learned"`` 或 ``"none"``
        （第 7 章的消融实验：去掉位置编码后，主宾互换的测试句几乎全错）。
    epochs: 训练轮数，默认 ``TOY_TRAINING["epochs"]``。
    seed: 传给 :func:`~tformer_lib.set_seed`，决定初始化与 dropout。
    cache / retrain: 是否读写缓存；``retrain=True`` 忽略已有缓存重新训练。
    directory: 缓存目录，默认 :func:`cache_dir`。
    progress / verbose: 训练时是否显示进度条 / 每个 epoch 打印一行指标。
    batch_size, warmup, lr_factor, label_smoothing, clip_grad_norm, eval_decode:
        覆盖 ``TOY_TRAINING`` 中的训练设置（不给则用默认值；``clip_grad_norm=None`` 表示不裁剪）。
        例：第 7 章比较「不预热、高学习率」下的 post-LN 与 pre-LN：
        ``load_or_train_toy_model(norm_first=True, warmup=1, lr_factor=0.5, epochs=2)``。
    config_overrides: 覆盖 :func:`toy_model_config` 的字段（如 ``d_model=128``、``norm_first=True``）。

    每一组（模型配置, 训练设置, 种子, 语料）有自己的缓存文件。
    无论读缓存还是现训练，调用前后的全局随机状态都不变。
    """
    given = dict(batch_size=batch_size, warmup=warmup, lr_factor=lr_factor, label_smoothing=label_smoothing,
                 clip_grad_norm=clip_grad_norm, eval_decode=eval_decode)
    training_overrides = {k: v for k, v in given.items() if v is not DEFAULT}
    with preserve_global_rng():  # 建模型（初始化）与训练都会消耗全局随机数
        return _load_or_train(positional, epochs, seed, cache, retrain, directory, progress, verbose,
                              config_overrides, training_overrides)


def _load_or_train(positional, epochs, seed, cache, retrain, directory, progress, verbose, config_overrides,
                   training_overrides):
    data = load_toy_data(TOY_TRAINING["corpus_seed"])
    src_vocab, tgt_vocab = data["src_vocab"], data["tgt_vocab"]
    config = toy_model_config(len(src_vocab), len(tgt_vocab), positional, **config_overrides)
    training = {**TOY_TRAINING, **training_overrides}
    if epochs is not None:
        if not isinstance(epochs, int) or epochs < 1:
            raise ValueError(f"epochs 应为正整数，收到 {epochs!r}")
        training["epochs"] = epochs
    name = f"toy_zh_en-{positional}-{_fingerprint(config, training, seed, data['corpus'])}.pt"
    path = (Path(directory).expanduser() if directory is not None else cache_dir()) / name

    if cache and not retrain:
        for candidate in (SHIPPED_DIR / name, path):  # 先找随包附带的，再找用户缓存
            if not candidate.exists():
                continue
            try:
                model, sv, tv, ckpt = load_model(candidate)
                if sv == src_vocab and tv == tgt_vocab:
                    return model, sv, tv, History.from_dict(ckpt["extra"].get("history", {}))
                warnings.warn(f"缓存 {candidate} 的词表与当前语料不一致，重新训练", stacklevel=3)
            except CheckpointError as exc:
                warnings.warn(f"缓存 {candidate} 无法读取（{exc}），重新训练", stacklevel=3)

    set_seed(seed)
    model = make_model(config)
    trainer = Trainer(
        model, data["train"], data["valid"], tgt_vocab=tgt_vocab,
        batch_size=training["batch_size"], warmup=training["warmup"], lr_factor=training["lr_factor"],
        label_smoothing=training["label_smoothing"], clip_grad_norm=training["clip_grad_norm"],
        eval_decode=training["eval_decode"], seed=seed, progress=progress, verbose=verbose,
    )
    history = trainer.fit(training["epochs"])
    model.eval()
    if cache:
        save_checkpoint(path, model, src_vocab, tgt_vocab,
                        extra={"history": history.to_dict(), "training": training, "seed": seed, **_task_record()})
    return model, src_vocab, tgt_vocab, history


def _task_record() -> dict:
    """检查点里记下任务名与语料种子，命令行的 ``evaluate`` 据此重建同一份数据划分。"""
    return {"task": "toy_zh_en", "data_seed": TOY_TRAINING["corpus_seed"]}


#: 另外随包附带的“只训了前几个 epoch”的快照（第 7 章比较 1-epoch 模型的贪心与束搜索）：(positional, epochs)
SHIPPED_SNAPSHOTS = (("sinusoidal", 1),)


def shipped_checkpoint_path(positional: str = "sinusoidal", epochs: int | None = None) -> Path:
    """默认配方（``load_or_train_toy_model(positional, epochs=epochs)``，其余参数全默认）对应的随包检查点路径。"""
    data = load_toy_data(TOY_TRAINING["corpus_seed"])
    config = toy_model_config(len(data["src_vocab"]), len(data["tgt_vocab"]), positional)
    training = {**TOY_TRAINING, **({"epochs": epochs} if epochs is not None else {})}
    return SHIPPED_DIR / f"toy_zh_en-{positional}-{_fingerprint(config, training, 0, data['corpus'])}.pt"


def build_shipped_checkpoints(directory: str | os.PathLike | None = None,
                              which: tuple | None = None) -> list[Path]:
    """（维护者用）单线程训练默认配方的模型（与 :data:`SHIPPED_SNAPSHOTS` 里的快照），写成随包附带的检查点，
    并删掉过时的旧文件。``which`` 只重建其中几个：``(positional, epochs)`` 的元组（epochs=None 为完整配方）。

    改了 ``TOY_TRAINING``、:func:`toy_model_config` 或语料之后运行::

        .venv/bin/python -c "from tformer_lib.translation.pretrained import build_shipped_checkpoints as b; b()"
    """
    out_dir = Path(directory) if directory is not None else SHIPPED_DIR
    out_dir.mkdir(parents=True, exist_ok=True)
    previous = torch.get_num_threads()
    torch.set_num_threads(1)  # 维护者的生成脚本：固定单线程，测试也在单线程下复现它
    try:
        every = [(p, None) for p in SHIPPED_POSITIONAL] + list(SHIPPED_SNAPSHOTS)
        written = []
        for positional, epochs in (every if which is None else which):
            target = out_dir / shipped_checkpoint_path(positional, epochs).name
            model, sv, tv, history = load_or_train_toy_model(positional, epochs=epochs, cache=False)
            training = {**TOY_TRAINING, **({"epochs": epochs} if epochs is not None else {})}
            save_checkpoint(target, model, sv, tv, extra={"history": history.to_dict(), "training": training,
                                                          "seed": 0, "threads": 1,
                                                          "cpu": cpu_fingerprint(), **_task_record()})
            written.append(target)
        current = {out_dir / shipped_checkpoint_path(p, e).name for p, e in every}
        for old in out_dir.glob("toy_zh_en-*.pt"):
            if old not in current:
                old.unlink()
        return written
    finally:
        torch.set_num_threads(previous)
