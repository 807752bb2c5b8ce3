"""基准：K/V 缓存（KV cache）让贪心解码快多少。

同一个模型、同一批源句，各生成 50 个词（不在 EOS 处停），分别用缓存与不用缓存，
在同一次运行中交替测量（计时代码在 :mod:`tformer_lib.measurement.benchmarking`）、取逐轮比值的中位数与四分位范围，
并核对两者生成的词元完全相同。

用法：``.venv/bin/python benchmarks/kv_cache.py [--threads 1] [--tokens 50] [--d-model 512] [--layers 6]``
"""

from __future__ import annotations

import argparse
import statistics

import torch


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--tokens", type=int, default=50, help="生成的词元数（默认 50）")
    p.add_argument("--d-model", type=int, default=512)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--layers", type=int, default=6, help="编码器与解码器各几层（默认 6，论文的基础模型）")
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--src-len", type=int, default=20)
    p.add_argument("--vocab", type=int, default=1000)
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)

    from tformer_lib import TransformerConfig, make_model, set_seed
    from tformer_lib.translation.decoding import greedy_decode

    set_seed(0)
    cfg = TransformerConfig(args.vocab, args.vocab, d_model=args.d_model, n_heads=args.heads, d_ff=4 * args.d_model,
                            n_encoder_layers=args.layers, n_decoder_layers=args.layers, dropout=0.0,
                            max_len=max(args.tokens, args.src_len) + 8)
    model = make_model(cfg).eval()
    src = torch.randint(4, args.vocab, (args.batch, args.src_len))  # (B, S)

    from tformer_lib.measurement.benchmarking import interleaved_samples, machine_info, ratio_summary

    outs = {}

    def run(use_cache: bool) -> None:
        outs[use_cache] = greedy_decode(model, src, max_len=args.tokens, use_cache=use_cache, stop_at_eos=False)

    # 交替测量（见 tformer_lib.measurement.benchmarking）：每轮先有缓存、后无缓存，逐轮得到比值
    times = interleaved_samples({"cached": lambda: run(True), "uncached": lambda: run(False)},
                                rounds=args.repeats, warmup=1)
    same = torch.equal(outs[True], outs[False])
    cached, uncached = statistics.median(times["cached"]), statistics.median(times["uncached"])
    speedup = ratio_summary(times["uncached"], times["cached"])
    m = machine_info()
    print(f"{m['cpu']}, torch {m['torch']}, {m['date']}")
    print(f"model d_model={args.d_model} h={args.heads} layers={args.layers}+{args.layers}, batch={args.batch}, "
          f"src_len={args.src_len}, tokens={args.tokens}, threads={args.threads}")
    print(f"uncached {uncached * 1000:.0f} ms, cached {cached * 1000:.0f} ms (median of {args.repeats}); "
          f"speed-up {speedup['median']:.1f}x [IQR {speedup['q1']:.1f}-{speedup['q3']:.1f}]; identical tokens: {same}")
    return {"cached_s": cached, "uncached_s": uncached, "ratio": speedup["median"], "identical": same,
            "machine": m}


if __name__ == "__main__":
    main()
