"""基准：书中玩具中→英模型的训练时间与质量，以及去掉位置编码的消融。

训练 ``TOY_TRAINING`` 设定的模型（不读写缓存），报告训练耗时、测试集（全部为主宾互换句）上
贪心与束搜索的完全匹配率与 BLEU；``--ablation`` 时再训练一个 ``positional="none"`` 的模型对比。

用法：``.venv/bin/python benchmarks/toy_translation.py [--threads 1] [--epochs 8] [--ablation]``
"""

from __future__ import annotations

import argparse
import time

import torch


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--epochs", type=int, default=None, help="默认 TOY_TRAINING['epochs']")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--ablation", action="store_true", help="再训练一个不带位置编码的模型")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)

    from tformer_lib import count_parameters
    from tformer_lib.translation.decoding import beam_search
    from tformer_lib.translation.pretrained import TOY_TRAINING, load_or_train_toy_model, load_toy_data
    from tformer_lib.training import evaluate

    data = load_toy_data()
    print(f"corpus: {data['corpus']}, src vocab {len(data['src_vocab'])}, tgt vocab {len(data['tgt_vocab'])}, "
          f"threads={args.threads}")
    results = {}
    for positional in ["sinusoidal"] + (["none"] if args.ablation else []):
        start = time.perf_counter()
        model, sv, tv, hist = load_or_train_toy_model(positional, epochs=args.epochs, seed=args.seed, cache=False)
        seconds = time.perf_counter() - start
        greedy = evaluate(model, data["test"], tv)
        t0 = time.perf_counter()
        beam = evaluate(model, data["test"], tv, decode_fn=lambda m, s: beam_search(m, s, beam_size=4))
        beam_s = time.perf_counter() - t0
        epochs = args.epochs or TOY_TRAINING["epochs"]
        print(f"positional={positional}: {count_parameters(model)} parameters, {epochs} epochs in {seconds:.1f}s "
              f"(incl. per-epoch validation)")
        print(f"  valid exact match by epoch: {[round(x, 3) for x in hist['valid_exact_match']]}")
        print(f"  test (order-swapped, n={len(data['test'])}): greedy exact match {greedy['exact_match']:.3f}, "
              f"BLEU {greedy['bleu']:.1f}; beam(4) exact match {beam['exact_match']:.3f}, BLEU {beam['bleu']:.1f} "
              f"({beam_s:.1f}s)")
        results[positional] = {"seconds": seconds, "greedy": greedy, "beam": beam}
    return results


if __name__ == "__main__":
    main()
