"""推测解码用的草稿模型（draft model）：与随书唐诗模型同一份数据、同一个分词器，只有 1 块、d_model=64。

草稿要“便宜得多、又常常猜对”。只取目标的前几块（:func:`~.speculative.layer_skip_draft`）不用另训，但每一步仍要
走目标的词嵌入、输出层和好几块；这里另训一个小模型：配方与 :data:`~tformer_lib.lm.pretrained.POEM_RECIPE` 相同
（同样的数据、分词器、训练步数、学习率调度与种子），只把模型换小，参数约为目标的四分之一（大半在词嵌入里）。

随书草稿检查点 ``tformer_lib/checkpoints/poem_draft.pt``（float16 存储，``checkpoint["extra"]`` 里有训练记录）由

    python -m tformer_lib.serving.draft            # 写到随书位置；--out 另存别处

生成（单线程几分钟 CPU 时间）。注意：在 CPU 上、批大小为 1 时，一次前向的耗时主要是每个模块调用的固定开销而不是
乘加，所以草稿与目标的开销比 c 远高于两者乘加次数之比（测量见 ``tformer_lib/results/serving.json``）。
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import torch

from ..lm.pretrained import POEM_RECIPE, load_poem_model, train_poem_model
from ..lm.training import load_lm, save_lm_checkpoint

__all__ = ["DRAFT_RECIPE", "SHIPPED_DRAFT", "train_draft_model", "build_draft_checkpoint", "load_draft_model"]

#: 草稿模型的配方：随书模型的配方，只换小模型（1 块、d_model=64、4 头、d_ff=256）。
DRAFT_RECIPE = {**POEM_RECIPE, "model": {**POEM_RECIPE["model"], "d_model": 64, "n_heads": 4, "n_layers": 1,
                                          "d_ff": 256}}

SHIPPED_DRAFT = Path(__file__).resolve().parent.parent / "checkpoints" / "poem_draft.pt"


def train_draft_model(recipe: dict = DRAFT_RECIPE, *, steps: int | None = None, verbose: bool = False):
    """按草稿配方从头训练，返回 ``(model, tokenizer, trainer)``（与 :func:`~tformer_lib.lm.pretrained.train_poem_model` 相同）。"""
    return train_poem_model(recipe, steps=steps, progress=False, verbose=verbose)


def build_draft_checkpoint(path: str | os.PathLike | None = None, *, steps: int | None = None,
                           verbose: bool = True) -> Path:
    """（维护者用）按配方的线程数训练草稿并原子地写出检查点（权重 float16），记下耗时与验证集损失。"""
    from ..seed import cpu_fingerprint

    previous = torch.get_num_threads()
    torch.set_num_threads(DRAFT_RECIPE["threads"])
    try:
        model, tokenizer, trainer = train_draft_model(steps=steps, verbose=verbose)
    finally:
        torch.set_num_threads(previous)
    extra = {
        "recipe": {k: (dict(v) if isinstance(v, dict) else v) for k, v in DRAFT_RECIPE.items()},
        "steps": steps or DRAFT_RECIPE["total_steps"],
        "history": trainer.history,
        "seconds": trainer.seconds,
        "cpu_seconds": trainer.cpu_seconds,
        "tokens_seen": trainer.tokens_seen,
        "threads": DRAFT_RECIPE["threads"],
        "cpu": cpu_fingerprint(),
        "torch_version": str(torch.__version__),
    }
    return save_lm_checkpoint(path or SHIPPED_DRAFT, model, tokenizer, extra=extra, half=True)


def load_draft_model(path: str | os.PathLike | None = None):
    """读草稿检查点：``(model, tokenizer, checkpoint)``；并核对它的分词器与随书唐诗模型的相同（两者必须共用词表）。"""
    if path is not None and not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"path 应是检查点文件的路径（str 或 Path）或 None（随包的草稿），收到 {type(path).__name__} {path!r:.40}")
    model, tokenizer, ckpt = load_lm(path or SHIPPED_DRAFT)
    _, target_tokenizer, _ = load_poem_model()
    if tokenizer is None or tokenizer.to_dict() != target_tokenizer.to_dict():
        raise ValueError(f"{path or SHIPPED_DRAFT} 的分词器与随书唐诗模型的不同：草稿与目标必须共用词表")
    return model, tokenizer, ckpt


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description="训练推测解码用的草稿模型并保存检查点")
    p.add_argument("--out", default=None, help=f"检查点路径（默认随书位置 {SHIPPED_DRAFT.name}）")
    p.add_argument("--steps", type=int, default=None, help="只训前若干步（学习率调度仍按全长）")
    args = p.parse_args(argv)
    path = build_draft_checkpoint(args.out, steps=args.steps)
    print(f"已保存 {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
