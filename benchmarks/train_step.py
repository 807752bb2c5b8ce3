"""训练一步（前向 + 反向 + 优化器）的速度：我们的模型（快速注意力路径）vs ``torch.nn.Transformer``；
另测显式注意力与快速注意力（SDPA）在长度 64–512 上的前向 + 反向耗时。

测量代码在库里（:mod:`tformer_lib.measurement.benchmarking`，第 8 章也用它），本脚本只是命令行外壳。
同一进程内 A/B 交替测量若干轮，报告逐轮比值的中位数与四分位范围。

用法：python benchmarks/train_step.py [--threads 1] [--rounds 15] [--base] [--out results.json]
重新生成第 8 章读取的随包结果：python benchmarks/train_step.py --threads 1 --out tformer_lib/results/train_step.json
"""

import argparse

from tformer_lib.measurement.benchmarking import run_benchmarks, save_results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1, help="torch 线程数（默认 1：共享的 2 核机器上更稳定）")
    parser.add_argument("--rounds", type=int, default=15, help="每组交替测量的轮数")
    parser.add_argument("--base", action="store_true", help="也测论文 base 配置（较慢）")
    parser.add_argument("--out", help="把结果（含机器、线程数、日期）写成这个 JSON 文件")
    args = parser.parse_args()
    result = run_benchmarks(rounds=args.rounds, threads=args.threads, include_base=args.base)
    m = result["machine"]
    print(f"\n{m['cpu']}，torch {m['torch']}，threads={m['threads']}，{m['date']}")
    if args.out:
        print("写入", save_results(result, args.out))


if __name__ == "__main__":
    main()
