"""命令行（command line）：``python -m tformer_lib train | translate | evaluate | lm-train | lm-generate | serve | lm-finetune``。

例子::

    python -m tformer_lib translate "狗 咬 人" "人 咬 狗"            # 随库附带的玩具模型，不用先训练
    python -m tformer_lib train --task toy_zh_en --epochs 8 --out toy.pt
    python -m tformer_lib translate --checkpoint toy.pt "狗 咬 人"
    python -m tformer_lib evaluate --split test --method beam

出错时（检查点不存在或损坏、任务未知、参数不合法）在标准错误上打印一行说明，退出码非 0。
``train`` 在开始训练之前就检查 ``--out`` 能否写入，不会训练完才发现存不下。
``translate`` 遇到词表外的词（或标点）时在标准错误上警告一行；加 ``--strict`` 则报错退出。
``translate`` 与 ``evaluate`` 不给 ``--checkpoint`` 时用随库附带的玩具中→英模型（与 ``lm-generate``、``serve`` 一样）。
``--temperature 0`` 表示贪心（OpenAI 风格客户端的约定）。
长时间的工作显示进度：终端里是进度条，输出被管道或重定向时每个阶段打印一行（标准错误）。
"""

from __future__ import annotations

import argparse
import math
import sys
import warnings
from collections.abc import Sequence

from .base import CLIError, Parser, one_line

TASKS = ("copy", "reverse", "toy_zh_en")
#: 模型规模：d_model、头数 h、d_ff
SIZES = {"tiny": (32, 4, 64), "small": (64, 4, 128), "medium": (128, 8, 256)}
#: 合成任务的默认训练设置（benchmarks/copy_task.py 与测试共用）
COPY_SETUP = {
    "n_train": 6000, "n_test": 200, "n_symbols": 10, "min_len": 3, "max_len": 10,
    "size": "small", "layers": 1, "dropout": 0.1,
    "batch_size": 64, "warmup": 100, "lr_factor": 0.5, "label_smoothing": 0.0, "epochs": 10,
}
#: 第 7 章与基准共用：玩具中→英任务的默认层数与 epoch 数见 tformer_lib.translation.pretrained.TOY_TRAINING
TOY_LAYERS = 2


def build_synthetic(task: str, seed: int = 0, size: str | None = None, layers: int | None = None,
                    positional: str = "sinusoidal", **overrides):
    """合成任务的 ``(model, vocab, train, test)``；``train/test`` 是 id 句子对，测试集 200 条留出序列。"""
    from ..data import encode_pairs, make_synthetic_splits, synthetic_vocab
    from ..seed import set_seed
    from ..translation.config import TransformerConfig
    from ..translation.model import make_model

    s = {**COPY_SETUP, **overrides}
    splits = make_synthetic_splits(task, n_train=s["n_train"], n_test=s["n_test"], n_symbols=s["n_symbols"],
                                   min_len=s["min_len"], max_len=s["max_len"], seed=seed)
    vocab = synthetic_vocab(s["n_symbols"])
    d_model, n_heads, d_ff = SIZES[size or s["size"]]
    n_layers = layers or s["layers"]
    set_seed(seed)
    config = TransformerConfig(len(vocab), len(vocab), d_model=d_model, n_heads=n_heads, d_ff=d_ff,
                               n_encoder_layers=n_layers, n_decoder_layers=n_layers, dropout=s["dropout"],
                               max_len=2 * s["max_len"] + 16, positional=positional)
    model = make_model(config)
    return model, vocab, encode_pairs(splits["train"], vocab, vocab), encode_pairs(splits["test"], vocab, vocab)


def _parser() -> argparse.ArgumentParser:
    p = Parser(
        prog="python -m tformer_lib",
        description="训练、使用与评估《Transformer 原理深讲》的小模型："
                    "train / translate / evaluate（玩具中→英翻译）、lm-train / lm-generate（唐诗语言模型）、serve（推理服务）、"
                    "lm-finetune（微调）。",
    )
    p.add_argument("--threads", type=int, default=None, help="torch 线程数（默认不改；与其他任务共享 CPU 时建议 1）")
    sub = p.add_subparsers(dest="command", required=True)  # 不给 metavar：argparse 按注册顺序列出全部子命令

    t = sub.add_parser("train", help="训练一个模型并保存检查点",
                       description="训练一个模型（复制、反转或玩具中→英翻译），每个 epoch 评估一次，最后保存检查点。")
    t.add_argument("--task", required=True, choices=TASKS, help="任务：copy、reverse 或 toy_zh_en")
    t.add_argument("--size", choices=sorted(SIZES), default="small", help="模型规模（默认 small：d_model=64）")
    t.add_argument("--layers", type=int, default=None, help="编码器与解码器各几层（默认：合成任务 1，翻译 2）")
    t.add_argument("--positional", choices=["sinusoidal", "learned", "none"], default="sinusoidal",
                   help="位置编码；none 用于消融实验")
    t.add_argument("--epochs", type=int, default=None, help="训练轮数（默认：合成任务 10，翻译 8）")
    t.add_argument("--seed", type=int, default=0)
    t.add_argument("--out", required=True, help="检查点输出路径，如 toy.pt")
    t.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                   help="显示进度条（默认只在终端里显示）")
    t.add_argument("--quiet", action="store_true", help="不打印每个 epoch 的指标")

    tr = sub.add_parser("translate", help="用检查点翻译句子",
                        description="用训练好的检查点翻译句子；不给句子时从标准输入逐行读取。")
    tr.add_argument("--checkpoint", default=None, help="检查点路径（默认：随库附带的玩具中→英模型）")
    tr.add_argument("sentences", nargs="*", help='要翻译的句子，如 "狗 咬 人"（也可不带空格："狗咬人"）')
    tr.add_argument("--method", choices=["greedy", "beam", "sample"], default="greedy")
    tr.add_argument("--beam-size", type=int, default=4)
    tr.add_argument("--temperature", type=float, default=1.0, help="采样温度（--method sample；0 = 贪心）")
    tr.add_argument("--top-k", type=int, default=None)
    tr.add_argument("--seed", type=int, default=0, help="采样用的随机种子")
    tr.add_argument("--strict", action="store_true",
                    help="句子里有词表外的词（或标点）时报错退出；默认只警告，并把它们当作 <unk> 翻译")

    e = sub.add_parser("evaluate", help="在某个数据划分上评估检查点",
                       description="重新生成检查点所属任务的数据划分，报告损失、词元准确率、完全匹配率与 BLEU。")
    e.add_argument("--checkpoint", default=None, help="检查点路径（默认：随库附带的玩具中→英模型）")
    e.add_argument("--split", choices=["train", "valid", "test"], default="test")
    e.add_argument("--method", choices=["greedy", "beam"], default="greedy")
    e.add_argument("--beam-size", type=int, default=4)
    e.add_argument("--limit", type=int, default=None, help="只评估前 N 句（试跑束搜索时用；默认整个划分）")
    e.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                   help="显示进度条（默认只在终端里显示；否则每解码一段打印一行）")

    from .lm import register_lm_commands  # 语言模型的 lm-train / lm-generate

    register_lm_commands(sub)
    from .serve import register_serve_command  # 推理服务 serve

    register_serve_command(sub)
    from .finetune import register_finetune_command  # 微调 lm-finetune

    register_finetune_command(sub)
    return p


def _task_data(task: str, seed: int, src_vocab=None, tgt_vocab=None) -> dict:
    """按任务名重建数据划分（id 句子对）。"""
    if task == "toy_zh_en":
        from ..translation.pretrained import load_toy_data

        return load_toy_data(seed)
    if task in ("copy", "reverse"):
        from ..data import encode_pairs, make_synthetic_splits, synthetic_vocab

        s = COPY_SETUP
        splits = make_synthetic_splits(task, n_train=s["n_train"], n_test=s["n_test"], n_symbols=s["n_symbols"],
                                       min_len=s["min_len"], max_len=s["max_len"], seed=seed)
        v = synthetic_vocab(s["n_symbols"])
        return {"src_vocab": v, "tgt_vocab": v, "train": encode_pairs(splits["train"], v, v),
                "valid": encode_pairs(splits["test"], v, v), "test": encode_pairs(splits["test"], v, v)}
    raise CLIError(f"未知任务 {task!r}；可选：{', '.join(TASKS)}")


def _cmd_train(args) -> int:
    from ..seed import set_seed
    from ..training import Trainer, save_checkpoint
    from ..translation.model import make_model
    from ..translation.pretrained import TOY_TRAINING, load_toy_data, toy_model_config

    if args.epochs is not None and args.epochs < 1:
        raise CLIError(f"--epochs 应为正整数，收到 {args.epochs}")
    if args.layers is not None and args.layers < 1:
        raise CLIError(f"--layers 应为正整数，收到 {args.layers}")
    from ..training.checkpoint import check_checkpoint_path

    try:  # 训练之前就确认存得下，免得训练完才失败、白跑一趟
        check_checkpoint_path(args.out, "--out")
    except ValueError as exc:
        raise CLIError(str(exc)) from None
    verbose = not args.quiet
    if args.task == "toy_zh_en":
        data = load_toy_data(TOY_TRAINING["corpus_seed"])
        src_vocab, tgt_vocab = data["src_vocab"], data["tgt_vocab"]
        d_model, n_heads, d_ff = SIZES[args.size]
        layers = args.layers or TOY_LAYERS
        set_seed(args.seed)
        model = make_model(toy_model_config(len(src_vocab), len(tgt_vocab), args.positional, d_model=d_model,
                                            n_heads=n_heads, d_ff=d_ff, n_encoder_layers=layers,
                                            n_decoder_layers=layers))
        s = TOY_TRAINING
        train, valid, epochs, data_seed = data["train"], data["valid"], args.epochs or s["epochs"], s["corpus_seed"]
    else:
        model, src_vocab, train, valid = build_synthetic(args.task, args.seed, args.size, args.layers, args.positional)
        tgt_vocab = src_vocab
        s = COPY_SETUP
        epochs, data_seed = args.epochs or s["epochs"], args.seed
    trainer = Trainer(model, train, valid, tgt_vocab=tgt_vocab, batch_size=s["batch_size"], warmup=s["warmup"],
                      lr_factor=s["lr_factor"], label_smoothing=s["label_smoothing"], seed=args.seed,
                      progress=args.progress, verbose=verbose)
    if verbose:
        from ..data.batching import num_batches
        from .progress import stage

        stage(f"开始训练 {args.task}：{epochs} 个 epoch，每个 {num_batches(len(train), s['batch_size'])} 步；"
              "每个 epoch 结束时评估验证集并打印一行")
    trainer.fit(epochs)
    path = save_checkpoint(args.out, model, src_vocab, tgt_vocab, trainer=trainer,
                           extra={"task": args.task, "data_seed": data_seed})
    last = trainer.history.last
    print(f"已保存 {path}（epochs={trainer.epoch}，验证集整句正确率 {last.get('valid_exact_match', float('nan')):.3f}）")
    return 0


def _load(path: str | None):
    from ..training import CheckpointError, load_model

    if path is None:  # 默认：随库附带的玩具模型（第 5–8 章用的那个）
        from ..translation.pretrained import shipped_checkpoint_path

        path = str(shipped_checkpoint_path("sinusoidal"))
    try:
        model, src_vocab, tgt_vocab, ckpt = load_model(path)
    except (CheckpointError, FileNotFoundError) as exc:
        raise CLIError(f"--checkpoint：{exc}") from None
    if src_vocab is None or tgt_vocab is None:
        raise CLIError(f"检查点 {path!r} 没有保存词表，无法翻译或评估")
    return model, src_vocab, tgt_vocab, ckpt


def _check_decoding_options(args) -> None:
    """在读检查点之前检查解码选项，错误点名命令行上的选项（--beam-size 而不是 beam_size）。"""
    if getattr(args, "beam_size", 1) < 1:
        raise CLIError(f"--beam-size 应为正整数，收到 {args.beam_size}")
    temperature = getattr(args, "temperature", 1.0)
    if not (math.isfinite(temperature) and temperature >= 0):
        raise CLIError(f"--temperature 应是 ≥ 0 的有限数（0 表示贪心），收到 {temperature:g}")
    top_k = getattr(args, "top_k", None)
    if top_k is not None and top_k < 1:
        raise CLIError(f"--top-k 应为正整数，收到 {top_k}")


def _cmd_translate(args) -> int:
    import torch

    from ..translation.decoding import UnknownTokenError, UnknownTokenWarning, translate

    _check_decoding_options(args)
    model, src_vocab, tgt_vocab, ckpt = _load(args.checkpoint)
    sentences = args.sentences or [line.strip() for line in sys.stdin if line.strip()]
    if not sentences:
        raise CLIError("没有要翻译的句子：请在命令行给出，或从标准输入逐行提供")
    task = ckpt.get("extra", {}).get("task")
    tokenize = None if task in (None, "toy_zh_en") else str.split
    gen = torch.Generator().manual_seed(args.seed) if args.method == "sample" else None
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", UnknownTokenWarning)
        try:
            outputs = translate(model, sentences, src_vocab, tgt_vocab, method=args.method,
                                beam_size=args.beam_size, temperature=args.temperature, top_k=args.top_k,
                                generator=gen, tokenize=tokenize, on_unknown="error" if args.strict else "warn")
        except UnknownTokenError as exc:
            raise CLIError(f"{exc.summary}；请换成词表里的词，或去掉 --strict 只警告") from None
    for w in caught:  # 每个警告一行，不带 Python 的文件名与行号
        if issubclass(w.category, UnknownTokenWarning):
            print(f"警告：{w.message.summary}；加 --strict 则报错退出", file=sys.stderr)
        else:
            warnings.showwarning(w.message, w.category, w.filename, w.lineno)
    for out in outputs:
        print(out)
    return 0


def _cmd_evaluate(args) -> int:
    import torch

    from ..specials import PAD
    from ..training import evaluate
    from ..training.trainer import METRIC_NAMES
    from ..translation.decoding import beam_search, ids_to_lists
    from .progress import StageProgress

    _check_decoding_options(args)
    model, src_vocab, tgt_vocab, ckpt = _load(args.checkpoint)
    ckpt_name = args.checkpoint or "随库附带的玩具模型"
    extra = ckpt.get("extra", {})
    task = extra.get("task")
    if task is None:
        raise CLIError(f"检查点 {ckpt_name!r} 没有记录任务名（extra['task']），不知道该在哪份数据上评估")
    data = _task_data(task, int(extra.get("data_seed", 0)))
    if data["src_vocab"] != src_vocab or data["tgt_vocab"] != tgt_vocab:
        raise CLIError("检查点的词表与重新生成的数据不一致（可能来自旧版本的语料），无法评估")
    if args.limit is not None and args.limit < 1:
        raise CLIError(f"--limit 应为正整数，收到 {args.limit}")
    pairs = data[args.split][: args.limit]
    decode_fn, progress = None, None  # 贪心几秒就完，不需要进度
    if args.method == "beam":  # 束搜索逐句进行（测试集 500 句在笔记本电脑上要几分钟）：一段一段解码并报告进度
        progress = StageProgress(len(pairs), f"束搜索（k={args.beam_size}）解码 {args.split}", unit="句",
                                 bar=args.progress)

        def decode_fn(m, src):  # 每句独立解码，所以分段的结果与一次解码整批相同
            rows = []
            for i in range(0, len(src), 16):
                part = src[i : i + 16]  # (≤16, S)
                rows += ids_to_lists(beam_search(m, part, beam_size=args.beam_size))
                progress.update(len(part))
            width = max(1, max(len(r) for r in rows))
            return torch.tensor([r + [PAD] * (width - len(r)) for r in rows], dtype=torch.long)  # (B, L)

    try:
        metrics = evaluate(model, pairs, tgt_vocab, decode_fn=decode_fn)
    finally:
        if progress is not None:
            progress.close()
    print(f"任务 {task}，划分 {args.split}，解码 {args.method}，{len(pairs)} 句")
    for k, v in metrics.items():
        print(f"{METRIC_NAMES.get(k, k)}（{k}）：{v:.4f}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """命令行入口；返回退出码：0 成功；2 参数写错（argparse 认不出的选项、缺少参数、类型不对）；
    1 其余的错误，包括能解析、取值却不合法的参数（如 ``--threads 0``）与运行时的错误。"""
    args = _parser().parse_args(argv)
    from ..training import CheckpointError, TrainingDivergedError

    try:
        if args.threads is not None:
            if args.threads < 1:
                raise CLIError(f"--threads 应为正整数，收到 {args.threads}")
            import torch

            torch.set_num_threads(args.threads)
        handlers = {"train": _cmd_train, "translate": _cmd_translate, "evaluate": _cmd_evaluate}
        return handlers.get(args.command, getattr(args, "run", None))(args)
    except (CLIError, CheckpointError, OSError, TrainingDivergedError, ValueError, TypeError) as exc:
        print(f"错误：{one_line(exc)}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
