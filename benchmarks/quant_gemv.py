"""基准：权重读取成为瓶颈时，少读字节才变快——一个大到装不进缓存的矩阵–向量乘（GEMV），fp32 vs bf16 vs int8。

批大小 1 的解码里，每个线性层都是 ``y = W x``：每个权重只用一次（2 FLOP / 权重），时间几乎全花在把 W 从内存里
读出来。``--n 8192`` 时 fp32 的 W 有 256 MiB，远大于任何一级 CPU 缓存；bf16 读一半字节，int8 读四分之一。
可字节少不等于快：

- **int8 eager**（:class:`~tformer_lib.quant.Int8Linear` 的前向）：先把整块 int8 权重转成 fp32（读 1 字节、写 4 字节），
  再做 fp32 的 GEMV（再读 4 字节）——比 fp32 读写得还多，所以更慢；
- **int8 compiled**：``torch.compile`` 之后的 ``Int8Linear``（fp32 的 x）。torch 2.13 的 Inductor 没有把转换融进乘法：它先生成
  一个把 int8 权重转成 fp32 的内核（写出整块 fp32 权重），再调用 ``mm``——搬的字节与 eager 相同，按 eager 计。Inductor 的
  权重 int8 融合（换成 ``_weight_int8pack_mm``）只在 x 与比例因子都是 bf16 时才匹配；
- **int8 fused kernel**：PyTorch 自带的 CPU 内核 ``torch._weight_int8pack_mm``（gpt-fast 在 CPU 上用的就是它），
  边读 int8 边乘；分别给它 fp32 与 bf16 的 x（它对两种输入的实现快慢不同，实测见结果）。

同一次运行里交替计时（:func:`tformer_lib.measurement.benchmarking.interleaved_samples`），报告中位数与四分位范围；带宽用
:func:`tformer_lib.serving.roofline.measure_memory_bandwidth` 在同一次运行里测（开始与结束各一次），每种做法的
“屋顶线时间” = 它必须读写的字节 ÷ 带宽。所有做法的输出与反量化权重的矩阵乘法核对一致。

用法：``python benchmarks/quant_gemv.py [--n 8192] [--threads 1] [--rounds 15] [--out tformer_lib/results/quant_gemv.json]``
最后一行：每种做法与 fp32 的时间之比（逐轮相除的中位数，小于 1 即更快）。
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import torch
import torch.nn.functional as F


def _summary(samples: list[float]) -> dict:
    q1, med, q3 = statistics.quantiles(samples, n=4, method="inclusive") if len(samples) > 1 else (samples[0],) * 3
    return {"median_s": med, "q1_s": q1, "q3_s": q3, "min_s": min(samples), "samples_s": samples}


def run(n: int, rounds: int, compile_: bool = True) -> dict:
    from tformer_lib.measurement.benchmarking import interleaved_samples, machine_info, ratio_summary
    from tformer_lib.measurement.profiling import matmul_peak_flops
    from tformer_lib.quant import Int8Linear, linear_weight_bytes
    from tformer_lib.serving.roofline import arithmetic_intensity, attainable_flops, measure_memory_bandwidth

    info = machine_info()
    torch.manual_seed(0)
    linear = torch.nn.Linear(n, n, bias=False)
    w32 = linear.weight.detach()
    w16 = w32.to(torch.bfloat16)
    int8 = Int8Linear.from_linear(linear)
    x32 = torch.randn(1, n)
    x16 = x32.to(torch.bfloat16)
    scale16 = int8.scale.to(torch.bfloat16)  # bf16 输入时内核要求比例因子也是 bf16

    variants = {
        "fp32": lambda: F.linear(x32, w32),
        "bf16": lambda: F.linear(x16, w16),
        "int8 eager": lambda: int8(x32),
        "int8 fused (fp32 x)": lambda: torch._weight_int8pack_mm(x32, int8.weight, int8.scale),
        "int8 fused (bf16 x)": lambda: torch._weight_int8pack_mm(x16, int8.weight, scale16),
    }
    weight_format = {"fp32": "fp32", "bf16": "bf16", "int8 eager": "int8", "int8 fused (fp32 x)": "int8",
                     "int8 fused (bf16 x)": "int8"}
    compile_seconds = {}
    if compile_:
        for name, fn in (("fp32 compiled", lambda x: F.linear(x, w32)), ("int8 compiled", int8)):
            compiled = torch.compile(fn, dynamic=False)
            start = time.perf_counter()
            compiled(x32)  # 第一次调用触发编译
            compile_seconds[name] = time.perf_counter() - start
            variants[name] = lambda c=compiled: c(x32)
            weight_format[name] = "fp32" if name.startswith("fp32") else "int8"

    with torch.no_grad():
        reference = x32.double() @ int8.dequantized_weight(torch.float64).T  # (1, n)
        scale = float(reference.abs().max())
        errors = {}
        for name, fn in variants.items():
            out = fn().double()
            target = (x32.double() @ w32.double().T) if weight_format[name] != "int8" else reference
            errors[name] = float((out - target).abs().max()) / scale
        bandwidth_before = measure_memory_bandwidth(256)
        samples = interleaved_samples(variants, rounds, warmup=2)
        bandwidth_after = measure_memory_bandwidth(256)
    peak = matmul_peak_flops(1024)
    bandwidth = statistics.median([bandwidth_before, bandwidth_after])
    flops = 2 * n * n
    rows = {}
    for name, s in samples.items():
        fmt = weight_format[name]
        x_bytes = n * (2 if "bf16" in name else 4)
        moved = linear_weight_bytes(n, n, fmt) + 2 * x_bytes  # 权重（+比例因子）读一遍，x 读一遍，y 写一遍
        if name == "int8 fused (bf16 x)":
            moved -= 2 * n  # 比例因子是 bf16（2 字节）而不是 float32
        if name in ("int8 eager", "int8 compiled"):
            moved += 2 * 4 * n * n  # 先写出一份 fp32 权重，GEMV 再把它读一遍（编译后也是这样，见模块说明）
        med = statistics.median(s)
        intensity = arithmetic_intensity(flops, moved)
        rows[name] = {
            **_summary(s), "weight_format": fmt, "bytes_moved": moved, "intensity_flop_per_byte": intensity,
            "achieved_bandwidth": moved / med, "achieved_flops": flops / med,
            "roofline_seconds": moved / bandwidth, "fraction_of_roofline": (moved / bandwidth) / med,
            "attainable_flops": attainable_flops(intensity, peak, bandwidth),
            "relative_error_vs_reference": errors[name],
        }
    ratios = {name: ratio_summary(samples[name], samples["fp32"]) for name in samples if name != "fp32"}
    return {
        "machine": info, "load_average_end": round(os.getloadavg()[0], 2),
        "n": n, "rounds": rounds, "flops": flops,
        "bandwidth": bandwidth, "bandwidth_before": bandwidth_before, "bandwidth_after": bandwidth_after,
        "peak_flops": peak, "compile_seconds": compile_seconds, "variants": rows,
        "time_ratio_vs_fp32": {k: {"median": v["median"], "q1": v["q1"], "q3": v["q3"]} for k, v in ratios.items()},
    }


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n", type=int, default=8192, help="方阵 W 的边长（默认 8192：fp32 256 MiB）")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--no-compile", action="store_true", help="不测 torch.compile 的两种（省下编译时间）")
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    result = run(args.n, args.rounds, compile_=not args.no_compile)
    result["command"] = "python benchmarks/quant_gemv.py " + " ".join(sys.argv[1:] if argv is None else argv)
    bw = result["bandwidth"]
    print(f"n={args.n}，线程 {args.threads}，实测带宽 {bw / 1e9:.1f} GB/s（前 {result['bandwidth_before'] / 1e9:.1f}、"
          f"后 {result['bandwidth_after'] / 1e9:.1f}），矩阵乘峰值 {result['peak_flops'] / 1e9:.1f} GFLOP/s")
    for name, r in result["variants"].items():
        print(f"{name:<20} 中位数 {r['median_s'] * 1e3:8.2f} ms  [{r['q1_s'] * 1e3:.2f}, {r['q3_s'] * 1e3:.2f}]  "
              f"搬 {r['bytes_moved'] / 2**20:7.1f} MiB  {r['achieved_bandwidth'] / 1e9:5.1f} GB/s  "
              f"屋顶线的 {r['fraction_of_roofline']:.0%}  相对误差 {r['relative_error_vs_reference']:.1e}")
    if result["compile_seconds"]:
        print("编译耗时：" + "，".join(f"{k} {v:.1f} s" for k, v in result["compile_seconds"].items()))
    if args.out:
        from tformer_lib.measurement.benchmarking import save_results

        save_results(result, args.out)
        print(f"写入 {args.out}")
    ratio = result["time_ratio_vs_fp32"]
    keys = ("int8 fused (bf16 x)", "int8 fused (fp32 x)", "int8 compiled", "int8 eager", "bf16")
    parts = [f"{k}/fp32 = {ratio[k]['median']:.2f}×" for k in keys if k in ratio]
    print(", ".join(parts))
    return result


if __name__ == "__main__":
    main()
