"""``python -m tformer_lib lm-finetune``：在一位诗人的诗上微调语言模型（第 17 章），写出适配器文件和/或合并后的检查点。

例子::

    python -m tformer_lib --threads 1 lm-finetune --lora-rank 16 --adapter-out dufu.lora.pt --out dufu.pt
    python -m tformer_lib lm-finetune --method full --lr 1e-3 --out dufu-full.pt       # 全量微调
    python -m tformer_lib lm-finetune --method qlora --adapter-out dufu.qlora.pt        # int4 底座 + LoRA
    python -m tformer_lib lm-generate --checkpoint dufu.pt --form 五律 --title 春望       # 合并后的检查点
    python -m tformer_lib lm-generate --adapter dufu.lora.pt --form 五律 --title 春望     # 随书模型 + 适配器
    python -m tformer_lib serve --model dufu.pt                                         # 或 serve --adapter dufu=dufu.lora.pt

合并后的检查点（``--out``）是普通的语言模型检查点：``lm-generate``、``serve`` 与 :func:`~tformer_lib.lm.save_hf` 都接受它。
适配器文件（``--adapter-out``）只存支路，要与训练时的底座一起用（``lm-generate --adapter``、``serve --adapter``）。
由 :mod:`tformer_lib.commands.cli` 的一个挂钩（:func:`register_finetune_command`）注册。
"""

from __future__ import annotations

import math
from pathlib import Path

__all__ = ["register_finetune_command"]


def register_finetune_command(sub) -> None:
    """往 ``python -m tformer_lib`` 的子命令表里加 ``lm-finetune``。"""
    from ..finetune.train import FINETUNE_RECIPE

    f = sub.add_parser("lm-finetune", help="在一位诗人的诗上微调语言模型：全量、LoRA 或 QLoRA（第 17 章）",
                       description="按 tformer_lib.finetune.FINETUNE_RECIPE 微调，打印目标诗人与其他诗人 test 诗上的困惑度，"
                                   "写出适配器文件（--adapter-out）和/或合并后的检查点（--out）。")
    f.add_argument("--base", default=None, help="底座检查点（默认：随书唐诗模型）")
    f.add_argument("--author", default=FINETUNE_RECIPE["author"], help=f"诗人（默认 {FINETUNE_RECIPE['author']}）")
    f.add_argument("--method", choices=["full", "lora", "qlora"], default="lora", help="微调方法（默认 lora）")
    f.add_argument("--lora-rank", type=int, default=16, help="LoRA 的秩 r（默认 16；α = 2r）")
    f.add_argument("--steps", type=int, default=FINETUNE_RECIPE["steps"], help=f"训练步数（默认 {FINETUNE_RECIPE['steps']}）")
    f.add_argument("--lr", type=float, default=None, help="峰值学习率（默认按配方：全量 1e-3，LoRA/QLoRA 2e-3）")
    f.add_argument("--seed", type=int, default=0)
    f.add_argument("--out", default=None, help="合并后的检查点（lm-generate、serve、save_hf 都接受）")
    f.add_argument("--adapter-out", default=None, help="只含 LoRA 支路的适配器文件（--method lora/qlora）")
    f.set_defaults(run=_cmd_lm_finetune)


def _cmd_lm_finetune(args) -> int:
    from ..finetune.adapter_file import save_adapter
    from ..finetune.lora import merge_lora, trainable_parameters
    from ..finetune.poet import poet_data
    from ..finetune.train import FINETUNE_RECIPE, finetune_poet, finetune_scores
    from ..lm.pretrained import load_poem_model
    from ..lm.training import load_lm, save_lm_checkpoint
    from ..quant.quantize import dequantize_model
    from ..training.checkpoint import check_checkpoint_path
    from .base import CLIError
    from .progress import stage

    if args.out is None and args.adapter_out is None:
        raise CLIError("至少给 --out（合并后的检查点）或 --adapter-out（适配器文件）之一，否则训练的结果没处放")
    if args.method == "full" and args.adapter_out is not None:
        raise CLIError("全量微调没有适配器：--adapter-out 只用于 --method lora/qlora；请用 --out")
    for flag in ("--steps", "--lora-rank"):
        value = getattr(args, flag[2:].replace("-", "_"))
        if value < 1:
            raise CLIError(f"{flag} 应为正整数，收到 {value}")
    if args.lr is not None and not (math.isfinite(args.lr) and args.lr > 0):
        raise CLIError(f"--lr 应是有限的正数，收到 {args.lr:g}")
    for flag in ("out", "adapter_out"):  # 训练之前就查完：能写成文件，且两个输出不是同一个文件
        path = getattr(args, flag)
        if path is not None:
            try:
                check_checkpoint_path(path, f"--{flag.replace('_', '-')}")
            except ValueError as exc:
                raise CLIError(str(exc)) from None
    if args.out is not None and args.adapter_out is not None and Path(args.out).resolve() == Path(args.adapter_out).resolve():
        raise CLIError(f"--out 与 --adapter-out 是同一个文件 {args.out!r}：后写的会覆盖先写的；请给两个不同的路径")
    base, tokenizer, _ = load_lm(args.base) if args.base else load_poem_model()
    if tokenizer is None:
        raise CLIError(f"底座检查点 {args.base!r} 没有保存分词器，无法编码诗")
    stage(f"准备 {args.author} 的诗……")
    data = poet_data(tokenizer, args.author, block_len=base.config.max_len + 1)
    before = finetune_scores(base, data, ("target_test", "others_test"))
    rank = None if args.method == "full" else args.lora_rank
    stage(f"{args.method} 微调 {args.steps} 步（{data['train_blocks'].shape[0]} 个训练块）……")
    model, trainer = finetune_poet(base, data, args.method, rank, seed=args.seed, lr=args.lr, steps=args.steps)
    after = finetune_scores(model, data, ("target_test", "others_test"))
    print(f"可训练参数 {trainable_parameters(model):,}；最后一步的训练损失 {trainer.history['step_loss'][-1]:.3f}")
    print(f"{args.author} 的 test 诗困惑度 {before['target_test']:.1f} → {after['target_test']:.1f}；"
          f"其他诗人的 test 诗 {before['others_test']:.1f} → {after['others_test']:.1f}")
    record = {"author": args.author, "method": args.method, "rank": rank, "steps": args.steps, "seed": args.seed,
              "lr": args.lr or FINETUNE_RECIPE["lr"][args.method], "base": args.base or "随书唐诗模型",
              "perplexity_before": before, "perplexity_after": after}
    if args.adapter_out is not None:
        print(f"已保存适配器 {save_adapter(args.adapter_out, model, extra=record)}")
    if args.out is not None:
        merged = dequantize_model(merge_lora(model)) if args.method != "full" else model  # QLoRA：整个模型转回浮点
        print(f"已保存合并后的检查点 {save_lm_checkpoint(args.out, merged, tokenizer, extra={'finetune': record})}")
    return 0
