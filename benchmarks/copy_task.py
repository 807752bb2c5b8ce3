"""基准：复制任务（copy task）训练到 200 条留出序列 100% 完全匹配要多久。

用法：``.venv/bin/python benchmarks/copy_task.py [--threads 1] [--seed 0] [--task copy|reverse]``
打印每个 epoch 的留出集完全匹配率、总训练时间与线程数。
"""

from __future__ import annotations

import argparse
import time

import torch


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, default=1, help="torch 线程数（默认 1）")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--task", choices=["copy", "reverse"], default="copy")
    p.add_argument("--max-epochs", type=int, default=20)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)

    from tformer_lib.commands.cli import COPY_SETUP, build_synthetic
    from tformer_lib.training import Trainer, evaluate

    model, vocab, train, test = build_synthetic(args.task, seed=args.seed)
    setup = COPY_SETUP
    trainer = Trainer(model, train, None, tgt_vocab=vocab, batch_size=setup["batch_size"], warmup=setup["warmup"],
                      lr_factor=setup["lr_factor"], label_smoothing=setup["label_smoothing"], seed=args.seed)
    start = time.perf_counter()
    train_time = 0.0
    result = {}
    for epoch in range(1, args.max_epochs + 1):
        t0 = time.perf_counter()
        trainer.train_epoch()
        train_time += time.perf_counter() - t0
        result = evaluate(model, test, vocab)
        print(f"epoch {epoch:2d}  held-out exact match {result['exact_match']:.3f}  "
              f"train time {train_time:.1f}s", flush=True)
        if result["exact_match"] == 1.0:
            break
    total = time.perf_counter() - start
    print(f"task={args.task} threads={args.threads} seed={args.seed}: exact match {result['exact_match']:.3f} on "
          f"{len(test)} held-out sequences after {epoch} epochs; training {train_time:.1f}s, "
          f"with per-epoch evaluation {total:.1f}s")
    return {"epochs": epoch, "train_seconds": train_time, **result}


if __name__ == "__main__":
    main()
