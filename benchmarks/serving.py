"""推理服务基准：在随书唐诗模型上比较静态与连续批处理（吞吐、TTFT、TPOT、分页缓存内存），
以及推测解码（草稿 = 目标的前几块）在几个 k 下的接受率与加速比。同一次运行里交替测量，报告中位数。

用法：python benchmarks/serving.py [--threads 1] [--requests 96] [--rounds 3] [--out results.json] [--quick]

``--quick`` 是 CI 用的小规模版本：只验证两种批处理与推测解码输出相同、流程能跑通（数字不作结论）。
"""

import argparse
import json
import random
import sys

import torch

from tformer_lib.data.poems import load_poems
from tformer_lib.lm.data import poem_prompt
from tformer_lib.lm.pretrained import load_poem_model
from tformer_lib.serving.benchmark import batching_benchmark, speculative_benchmark
from tformer_lib.serving.speculative import layer_skip_draft
from tformer_lib.serving.workload import make_workload
from tformer_lib.specials import EOS


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--requests", type=int, default=96)
    p.add_argument("--max-batch", type=int, default=16)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--draft-layers", type=int, default=1)
    p.add_argument("--out", default=None, help="把结果写成 JSON")
    p.add_argument("--quick", action="store_true")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    if args.quick:
        args.requests, args.rounds = 12, 1
    model, tokenizer, _ = load_poem_model()
    rng = random.Random(0)
    poems = load_poems("valid")
    # 提示长短不一：体裁 + 题目，一部分再带上诗的前一两句
    texts = []
    for poem in rng.sample(poems, 200):
        head = "".join(line for line in poem.lines[: rng.choice([0, 0, 1, 2])])
        texts.append(poem_prompt(poem.form, poem.title) + head)
    prompts = [tokenizer.encode(t, add_bos=True) for t in texts]
    items = make_workload(prompts, args.requests, max_len=model.config.max_len, seed=0, mean_new_tokens=20, rate=1000)
    batching = batching_benchmark(model, items, rounds=args.rounds, max_batch=args.max_batch, eos_id=EOS)
    draft = layer_skip_draft(model, args.draft_layers)
    spec = speculative_benchmark(model, draft, prompts[:4 if args.quick else 12], 40, ks=(1, 2, 4),
                                 rounds=args.rounds, eos_id=EOS)
    s, c = batching["static"], batching["continuous"]
    print(f"机器：{batching['machine']}")
    print(f"负载：{batching['workload']}")
    print(f"吞吐（词元/秒）静态 {s['throughput']:.0f}，连续 {c['throughput']:.0f}；"
          f"逐轮比值中位数 {batching['throughput_ratio_median']:.2f}×（{', '.join(f'{r:.2f}' for r in batching['throughput_ratios'])}）")
    for name, row in (("静态", s), ("连续", c)):
        print(f"{name}：TTFT p50 {row['ttft_p50'] * 1e3:.0f} ms / p95 {row['ttft_p95'] * 1e3:.0f} ms；"
              f"TPOT p50 {row['tpot_p50'] * 1e3:.1f} ms / p95 {row['tpot_p95'] * 1e3:.1f} ms")
    mem = batching["memory"]
    print(f"K/V 缓存：分页峰值 {mem['paged_peak_bytes'] / 2**20:.2f} MiB，按上下文预留的连续缓存 "
          f"{mem['contiguous_bytes'] / 2**20:.2f} MiB")
    print(f"推测解码（草稿 = 前 {args.draft_layers} 块，开销比 c = {spec['cost_ratio']:.2f}）：")
    for row in spec["rows"]:
        print(f"  k={row['k']}：接受率 {row['acceptance_rate']:.2f}，每次验证 {row['tokens_per_target_pass']:.2f} 词元，"
              f"加速比 {row['speedup_median']:.2f}×（公式 {row['expected_speedup']:.2f}×）")
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            json.dump({"batching": batching, "speculative": spec}, f, ensure_ascii=False, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
