"""随书附带的唐诗字符级语言模型：配方（recipe）、数据准备、从头训练与读取。

第 9–10 章在任何机器上都读同一份权重（``tformer_lib/checkpoints/poem_char.pt``，float16 存储）；
:func:`train_poem_model` 用同一配方从头再训一遍。:func:`build_poem_checkpoint`（维护者用）
按配方的线程数训练并写出随书检查点，同时记下耗时与吞吐（tokens/s）。

随书检查点（2026-12-01 生成，``checkpoint["extra"]`` 里有全部记录）：d_model=128、4 层、4 头、上下文 128、
词表 4,457 个字，约 138 万参数，文件 2.9 MB；单线程训 1,600 步、见过 296 万个目标词元，CPU 时间 439 秒
（约 7.3 分钟，即机器空闲时的墙钟时间）；当时 2 核机器被其他任务占满（负载 8–10），墙钟实际用了 1,535 秒。
在留出的 test 划分上（``extra["quality"]``，200 个提示、种子 0）：困惑度 82.2，调好的字二元模型 181.6（低 55%）；
温度 0.8 采样的诗 94.5% 体裁正确（再加 top-p 0.9 为 97%）；生成的诗句没有一句原样出现在训练集里。
"""

from __future__ import annotations

import os
from functools import lru_cache
from pathlib import Path

import torch

from ..seed import set_seed
from .config import LMConfig
from .data import build_poem_tokenizer, encode_documents, loss_targets, pack_documents, pad_documents, split_documents
from .model import DecoderOnlyLM, make_lm
from .training import LMTrainer, load_lm, save_lm_checkpoint

__all__ = ["POEM_RECIPE", "poem_data", "poem_model_config", "train_poem_model", "shipped_poem_checkpoint",
           "load_poem_model", "build_poem_checkpoint"]

#: 随书模型的配方。改动任一项后要重新运行 :func:`build_poem_checkpoint`。
POEM_RECIPE = {
    "model": dict(d_model=128, n_heads=4, n_layers=4, d_ff=512, max_len=128, positional="learned",
                  norm="layer", norm_first=True, activation="gelu", tie_embeddings=True, dropout=0.0,
                  fast_attention=True),  # 训练走 SDPA 快速路径；要看注意力权重时 model.set_fast_attention(False)
    "min_freq": 5,  # 出现少于 5 次的字记作 UNK
    "block_len": 129,  # 每块 max_len + 1 个词元（输入与目标错开一位）
    "batch_size": 16,
    "lr": 3e-3,
    "warmup": 100,
    "total_steps": 1600,
    "min_lr_ratio": 0.1,
    "weight_decay": 0.1,
    "clip": 1.0,
    "seed": 0,
    "eval_every": 400,
    "threads": 1,
}

SHIPPED_POEM = Path(__file__).resolve().parent.parent / "checkpoints" / "poem_char.pt"


@lru_cache(maxsize=4)
def _poem_data(min_freq: int, block_len: int, seed: int) -> dict:
    tokenizer = build_poem_tokenizer(min_freq)
    out = {"tokenizer": tokenizer}
    out["train_blocks"] = pack_documents(encode_documents(split_documents("train"), tokenizer), block_len, seed=seed)
    for split in ("valid", "test"):
        out[split] = loss_targets(pad_documents(encode_documents(split_documents(split), tokenizer)))
    return out


def poem_data(recipe: dict = POEM_RECIPE) -> dict:
    """``tokenizer``、``train_blocks`` ``(N, block_len)``，以及逐首诗的 ``valid``/``test`` ``(inputs, targets)``。"""
    data = _poem_data(recipe["min_freq"], recipe["block_len"], recipe["seed"])
    return dict(data)


def poem_model_config(vocab_size: int, recipe: dict = POEM_RECIPE, **overrides) -> LMConfig:
    """配方里的模型配置（``overrides`` 可替换其中任一项，第 10 章的对比实验用它）。"""
    return LMConfig(vocab_size, **{**recipe["model"], **overrides})


def train_poem_model(recipe: dict = POEM_RECIPE, *, steps: int | None = None, progress: bool | None = None,
                     verbose: bool = False, callback=None, **overrides) -> tuple[DecoderOnlyLM, object, LMTrainer]:
    """按配方从头训练，返回 ``(model, tokenizer, trainer)``。``steps`` 只训前若干步（学习率调度仍按全长）。

    不改变 torch 的线程数（那是调用者的决定）；``overrides`` 替换模型配置中的项。
    """
    data = poem_data(recipe)
    set_seed(recipe["seed"])
    model = make_lm(poem_model_config(data["tokenizer"].vocab_size, recipe, **overrides))
    trainer = LMTrainer(
        model, data["train_blocks"], data["valid"], batch_size=recipe["batch_size"], lr=recipe["lr"],
        warmup=recipe["warmup"], total_steps=recipe["total_steps"], min_lr_ratio=recipe["min_lr_ratio"],
        weight_decay=recipe["weight_decay"], clip=recipe["clip"], seed=recipe["seed"],
        eval_every=recipe["eval_every"], progress=progress, verbose=verbose,
    )
    trainer.fit(steps, callback=callback)
    return model.eval(), data["tokenizer"], trainer


def shipped_poem_checkpoint() -> Path:
    """随书检查点的路径。"""
    return SHIPPED_POEM


def load_poem_model() -> tuple[DecoderOnlyLM, object, dict]:
    """读随书附带的唐诗模型：``(model, tokenizer, checkpoint)``；``checkpoint["extra"]`` 里有训练曲线与耗时。"""
    return load_lm(SHIPPED_POEM)


def build_poem_checkpoint(path: str | os.PathLike | None = None, verbose: bool = True,
                          from_checkpoint: str | os.PathLike | None = None) -> Path:
    """（维护者用）按配方的线程数从头训练并写出随书检查点（权重 float16，不含优化器状态）::

        .venv/bin/python -c "from tformer_lib.lm.pretrained import build_poem_checkpoint as b; b()"

    也可以先用命令行训练（``python -m tformer_lib --threads 1 lm-train --out run.pt --save-every 200``，
    中途被打断可用 ``--resume`` 精确续训），再 ``build_poem_checkpoint(from_checkpoint="run.pt")`` 转成随书检查点；
    这时核对它的配方与 :data:`POEM_RECIPE` 相同且已训完全部步数。
    """
    from ..seed import cpu_fingerprint

    if from_checkpoint is not None:
        model, tokenizer, ckpt = load_lm(from_checkpoint)
        state = ckpt.get("trainer") or {}
        if ckpt.get("extra", {}).get("recipe") != POEM_RECIPE:
            raise ValueError(f"{from_checkpoint} 的配方与 POEM_RECIPE 不同")
        if state.get("step") != POEM_RECIPE["total_steps"]:
            raise ValueError(f"{from_checkpoint} 只训了 {state.get('step')} 步，配方要 {POEM_RECIPE['total_steps']} 步")
        history, seconds, cpu_seconds, tokens = state["history"], state["seconds"], state["cpu_seconds"], state["tokens_seen"]
    else:
        previous = torch.get_num_threads()
        torch.set_num_threads(POEM_RECIPE["threads"])
        try:
            model, tokenizer, trainer = train_poem_model(verbose=verbose)
        finally:
            torch.set_num_threads(previous)
        history, seconds, cpu_seconds, tokens = trainer.history, trainer.seconds, trainer.cpu_seconds, trainer.tokens_seen
    extra = {
        "recipe": {k: (dict(v) if isinstance(v, dict) else v) for k, v in POEM_RECIPE.items()},
        "history": history,
        "seconds": seconds,  # 墙钟时间：与别的任务共用机器时会长很多
        "cpu_seconds": cpu_seconds,  # 单线程的 CPU 时间 ≈ 机器空闲时的墙钟时间
        "tokens_seen": tokens,
        "tokens_per_second": tokens / max(seconds, 1e-9),
        "tokens_per_cpu_second": tokens / max(cpu_seconds, 1e-9),
        "threads": POEM_RECIPE["threads"],
        "cpu": cpu_fingerprint(),
        "torch_version": str(torch.__version__),
    }
    return save_lm_checkpoint(path or SHIPPED_POEM, model, tokenizer, extra=extra, half=True)
