"""语言模型的命令行子命令：``python -m tformer_lib lm-train …`` 与 ``lm-generate …``。

例子::

    python -m tformer_lib --threads 1 lm-train --out poem.pt            # 按随书配方从头训练
    python -m tformer_lib lm-train --out poem.pt --steps 200 --save-every 100   # 先训 200 步
    python -m tformer_lib lm-train --out poem.pt --resume poem.pt        # 从检查点精确续训
    python -m tformer_lib lm-train --out small.pt --steps 100 --lr 1e-3 --batch-size 8 --d-model 64 --n-layers 2
    python -m tformer_lib lm-generate --form 五言绝句 --title 春晓 -n 3 --seed 1
    python -m tformer_lib lm-generate --checkpoint poem.pt --form 七绝 --first 月
    python -m tformer_lib lm-generate --adapter dufu.lora.pt --form 五律 --title 春望   # 随书模型 + LoRA 适配器（第 17 章）

``lm-train`` 把每一步的指标（step、loss、lr、tokens_per_s，评估步另有 valid_loss、valid_ppl）写进检查点旁边的
``<检查点名>.metrics.jsonl``（见 :mod:`tformer_lib.lm.metrics_log`），
``tformer_lib.plotting.lm.plot_lm_metrics("poem.metrics.jsonl")`` 画出来。
``lm-generate`` 的题目或首字里有词表外的字（emoji、生僻字）时在标准错误上警告一行（与 ``translate`` 相同）；
加 ``--strict`` 则报错退出。

由 :mod:`tformer_lib.commands.cli` 的一个挂钩（:func:`register_lm_commands`）注册。
"""

from __future__ import annotations

import argparse
import math
import sys
import warnings
from pathlib import Path

__all__ = ["register_lm_commands"]

#: 配方里的模型大小，只用来写 --help（与 tformer_lib.lm.pretrained.POEM_RECIPE 一致，有测试核对）
POEM_MODEL = {"d_model": 128, "n_layers": 4, "n_heads": 4, "d_ff": 512}

_SHORT_FORMS = {"五绝": "五言绝句", "七绝": "七言绝句", "五律": "五言律诗", "七律": "七言律诗"}


def register_lm_commands(sub) -> None:
    """往 ``python -m tformer_lib`` 的子命令表里加 ``lm-train`` 与 ``lm-generate``。"""
    t = sub.add_parser("lm-train", help="训练唐诗字符级语言模型（第 9 章）",
                       description="按随书配方（tformer_lib.lm.pretrained.POEM_RECIPE）在唐诗上训练语言模型，"
                                   "定期评估验证困惑度，原子地保存可续训的检查点。")
    t.add_argument("--out", required=True, help="检查点输出路径，如 poem.pt")
    t.add_argument("--resume", default=None, help="从这个检查点（需含训练器状态）精确续训")
    t.add_argument("--steps", type=int, default=None, help="本次最多训多少步（默认训完整个调度）")
    t.add_argument("--total-steps", type=int, default=None, help="学习率调度的总步数（默认按配方）")
    t.add_argument("--save-every", type=int, default=None, help="每隔多少步保存一次检查点")
    t.add_argument("--seed", type=int, default=None, help="随机种子（默认按配方）")
    t.add_argument("--lr", type=float, default=None, help="峰值学习率（默认按配方：3e-3）")
    t.add_argument("--batch-size", type=int, default=None, help="每步多少个块（默认按配方：16）")
    t.add_argument("--warmup", type=int, default=None, help="学习率预热步数（默认按配方：100；须 ≤ --total-steps）")
    t.add_argument("--eval-every", type=int, default=None, help="每隔多少步评估一次验证困惑度（默认按配方：400）")
    t.add_argument("--device", default="cpu", help="在哪个设备上训练，如 cpu、cuda、cuda:1（默认 cpu）")
    for flag, key in (("--d-model", "d_model"), ("--n-layers", "n_layers"), ("--n-heads", "n_heads"), ("--d-ff", "d_ff")):
        t.add_argument(flag, type=int, default=None, help=f"模型大小：替换配方里的 {key}（默认 {POEM_MODEL[key]}）")
    for flag, choices in (("--positional", ["learned", "sinusoidal", "rope", "alibi", "none"]), ("--norm", ["layer", "rms"]),
                          ("--activation", ["relu", "gelu", "swiglu"])):
        t.add_argument(flag, choices=choices, default=None, help="替换配方里的这一项")
    t.add_argument("--n-kv-heads", type=int, default=None, help="K/V 头数（GQA；1 = MQA）")
    t.add_argument("--post-ln", action="store_true", help="用后置归一化 post-LN（默认 pre-LN）")
    t.add_argument("--accumulation-steps", type=int, default=1, help="梯度累积：每步把一批切成几个微批（默认 1）")
    t.add_argument("--autocast", choices=["bf16", "fp16"], default=None, help="混合精度前向（fp16 带 GradScaler）")
    t.add_argument("--activation-checkpointing", action="store_true", help="激活重算：省激活内存，多算一次前向")
    t.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                   help="显示进度条（默认只在终端里显示）")
    t.add_argument("--quiet", action="store_true", help="不打印评估结果")
    t.set_defaults(run=_cmd_lm_train)

    g = sub.add_parser("lm-generate", help="用语言模型作诗",
                       description="按体裁与题目（或首字）作诗；不给 --checkpoint 时用随书附带的模型。")
    g.add_argument("--checkpoint", default=None, help="检查点路径（默认：随书模型）")
    g.add_argument("--adapter", default=None,
                   help="LoRA 适配器文件（lm-finetune --adapter-out 的输出），装在 --checkpoint 的模型（或随书模型）上")
    g.add_argument("--form", default="五言绝句", help="体裁：五言绝句/七言绝句/五言律诗/七言律诗（或五绝、七律等简称）")
    g.add_argument("--title", default="", help="题目（可省略）")
    g.add_argument("--first", default="", help="首字（可省略）")
    g.add_argument("-n", "--num", type=int, default=1, help="作几首")
    g.add_argument("--temperature", type=float, default=0.8, help="采样温度（默认 0.8；0 = 贪心）")
    g.add_argument("--top-k", type=int, default=None)
    g.add_argument("--top-p", type=float, default=None)
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("--strict", action="store_true",
                   help="题目或首字里有词表外的字时报错退出；默认只警告，并把它们当作 <unk>")
    g.set_defaults(run=_cmd_lm_generate)


def _positive(name: str, value) -> None:
    from .base import CLIError

    if value is not None and value < 1:
        raise CLIError(f"{name} 应为正整数，收到 {value}")


def _cmd_lm_train(args) -> int:
    import torch

    from ..lm.metrics_log import MetricsLog, metrics_path
    from ..lm.model import make_lm
    from ..lm.pretrained import POEM_RECIPE, poem_data, poem_model_config
    from ..lm.training import load_lm, save_lm_checkpoint
    from ..parallel.launch import init_from_env, is_rank0
    from ..parallel.trainer import DistributedLMTrainer
    from ..seed import set_seed
    from .base import CLIError
    from .progress import stage

    for name in ("--steps", "--total-steps", "--save-every", "--n-kv-heads", "--accumulation-steps", "--batch-size",
                 "--warmup", "--eval-every", "--d-model", "--n-layers", "--n-heads", "--d-ff"):
        _positive(name, getattr(args, name[2:].replace("-", "_")))
    if args.lr is not None and not (math.isfinite(args.lr) and args.lr > 0):
        raise CLIError(f"--lr 应是有限的正数，收到 {args.lr:g}")
    try:
        device = torch.device(args.device)
    except RuntimeError as exc:
        raise CLIError(f"--device {args.device!r} 不是 torch 认得的设备（如 cpu、cuda、cuda:1）：{exc}") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise CLIError(f"--device {args.device!r}：这台机器上没有可用的 CUDA；请用 --device cpu")
    out = Path(args.out)
    if out.is_dir():
        raise CLIError(f"--out {args.out!r} 是目录；请给一个文件路径，如 {out / 'poem.pt'}")
    recipe = {**POEM_RECIPE, "model": dict(POEM_RECIPE["model"])}
    size_flags = {k: getattr(args, k) for k in ("d_model", "n_layers", "n_heads", "d_ff")}
    if args.resume:
        changed = [f"--{k.replace('_', '-')}" for k, v in {**size_flags, "lr": args.lr, "batch_size": args.batch_size,
                                                                  "warmup": args.warmup, "eval_every": args.eval_every}.items()
                   if v is not None]
        if changed:
            raise CLIError(f"续训（--resume）沿用检查点里的配方，不能再改 {'、'.join(changed)}")
        model, tokenizer, ckpt = load_lm(args.resume)
        if not ckpt.get("trainer"):
            raise CLIError(f"检查点 {args.resume!r} 没有训练器状态，无法续训（随书模型只存了权重）")
        recipe = ckpt["extra"]["recipe"]
    else:
        overrides = {k: v for k, v in (("positional", args.positional), ("norm", args.norm),
                                       ("activation", args.activation), ("n_kv_heads", args.n_kv_heads),
                                       *size_flags.items()) if v is not None}
        if args.post_ln:
            overrides["norm_first"] = False
        recipe["model"].update(overrides)
        if args.total_steps is not None:
            recipe["total_steps"] = args.total_steps
        if args.seed is not None:
            recipe["seed"] = args.seed
        if args.lr is not None:
            recipe["lr"] = args.lr
        for key in ("batch_size", "warmup", "eval_every"):
            if getattr(args, key) is not None:
                recipe[key] = getattr(args, key)
        if recipe["warmup"] > recipe["total_steps"]:
            raise CLIError(f"--warmup {recipe['warmup']} 不能大于 --total-steps {recipe['total_steps']}（短跑时两个都给，"
                           "如 --total-steps 50 --warmup 10）")
    stage("准备唐诗数据（分词、打包成定长块）……")
    data = poem_data(recipe)
    if not args.resume:
        tokenizer = data["tokenizer"]
        set_seed(recipe["seed"])
        try:
            model = make_lm(poem_model_config(tokenizer.vocab_size, recipe))
        except ValueError as exc:  # 如 d_model 不能被 n_heads 整除：点名命令行上的选项
            raise CLIError(f"模型大小的选项不合法（--d-model/--n-layers/--n-heads/--d-ff）：{exc}") from None
    model.to(device)
    # 在 torchrun 下（WORLD_SIZE > 1）组进程组、做数据并行；单进程时 DistributedLMTrainer 就是 LMTrainer
    _, world_size = init_from_env()
    trainer = DistributedLMTrainer(
        model, data["train_blocks"], data["valid"], batch_size=recipe["batch_size"], lr=recipe["lr"],
        warmup=recipe["warmup"], total_steps=recipe["total_steps"], min_lr_ratio=recipe["min_lr_ratio"],
        weight_decay=recipe["weight_decay"], clip=recipe["clip"], seed=recipe["seed"],
        eval_every=recipe["eval_every"], progress=args.progress, verbose=not args.quiet,
        accumulation_steps=args.accumulation_steps, autocast=args.autocast,
        activation_checkpointing=args.activation_checkpointing,
    )
    if args.resume:
        trainer.load_state_dict(ckpt["trainer"])  # 含随机数状态：续训与一口气训完逐位相同
    end = recipe["total_steps"] if args.steps is None else min(recipe["total_steps"], trainer.step + args.steps)
    log = MetricsLog(metrics_path(out), trainer,
                     resume_from=metrics_path(args.resume) if args.resume else None) if is_rank0() else None
    if is_rank0():
        m = recipe["model"]
        stage(f"开始训练：第 {trainer.step + 1}–{end} 步（调度共 {recipe['total_steps']} 步），"
              f"d_model={m['d_model']}、{m['n_layers']} 层、{m['n_heads']} 头，批大小 {recipe['batch_size']}，"
              f"lr={recipe['lr']:g}，设备 {device}；每 {recipe['eval_every']} 步评估一次；指标写入 {log.path}")

    def save():
        path = save_lm_checkpoint(out, model, tokenizer, trainer=trainer, extra={"recipe": recipe}) if is_rank0() else out
        if log is not None:
            log.log(trainer)
        if world_size > 1:
            torch.distributed.barrier()  # 只有 rank 0 写盘；其他进程等它写完
        return path

    chunk = args.save_every or max(1, end - trainer.step)
    path = None
    while trainer.step < end:
        trainer.fit(min(chunk, end - trainer.step), callback=log)
        path = save()
    if path is None:
        path = save()
    ppl = trainer.history["evals"][-1]["valid_ppl"] if trainer.history["evals"] else float("nan")
    if is_rank0():
        print(f"已保存 {path}（第 {trainer.step}/{recipe['total_steps']} 步，验证困惑度 {ppl:.1f}；指标见 {log.path}）")
    if world_size > 1:
        torch.distributed.destroy_process_group()
    return 0


def _cmd_lm_generate(args) -> int:
    from ..data.poems import FORMS
    from ..lm.pretrained import load_poem_model
    from ..lm.quality import poem_lines, sample_poems
    from ..lm.training import load_lm
    from ..unknown_tokens import UnknownTokenError, UnknownTokenWarning
    from .base import CLIError

    form = _SHORT_FORMS.get(args.form, args.form)
    if form not in FORMS.values():
        raise CLIError(f"--form {args.form!r} 不是支持的体裁；可选：{', '.join(FORMS.values())}（或 {', '.join(_SHORT_FORMS)}）")
    if len(args.first) > 1:
        raise CLIError(f"--first 应是一个字，收到 {args.first!r}")
    _positive("--num", args.num)
    model, tokenizer, _ = load_lm(args.checkpoint) if args.checkpoint else load_poem_model()
    if tokenizer is None:
        raise CLIError(f"检查点 {args.checkpoint!r} 没有保存分词器，无法作诗")
    if args.adapter is not None:
        from ..finetune import apply_adapter, load_adapter, merge_lora, quantize_base_for
        from ..quant import dequantize_model

        adapter = load_adapter(args.adapter)
        model = quantize_base_for(model, [adapter])  # QLoRA 的适配器：底座先量化成训练时的格式
        model = dequantize_model(merge_lora(apply_adapter(model, adapter))).eval()  # 合并成浮点：之后与普通模型一样快
    prompts = [(form, args.title, args.first)] * args.num
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", UnknownTokenWarning)
        try:
            texts = sample_poems(model, tokenizer, prompts, temperature=args.temperature, top_k=args.top_k,
                                 top_p=args.top_p, seed=args.seed, on_unknown="error" if args.strict else "warn")
        except UnknownTokenError as exc:
            raise CLIError(f"{exc.summary}；请换成词表里的字，或去掉 --strict 只警告") from None
    for w in caught:  # 与 translate 相同：每个警告一行，不带 Python 的文件名与行号
        if issubclass(w.category, UnknownTokenWarning):
            print(f"警告：{w.message.summary}；加 --strict 则报错退出", file=sys.stderr)
        else:
            warnings.showwarning(w.message, w.category, w.filename, w.lineno)
    for i, text in enumerate(texts):
        if i:
            print()
        lines = poem_lines(text)
        if lines is None:
            print(text)
        else:
            print("\n".join(lines[j] + "，" + lines[j + 1] + "。" if j + 1 < len(lines) else lines[j]
                            for j in range(0, len(lines), 2)))
    return 0
