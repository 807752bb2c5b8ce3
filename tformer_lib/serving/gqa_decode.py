r"""分组查询注意力（GQA）在解码时省下多少时间：同一个模型形状，只改 K/V 头数 ``n_kv_heads``，量一步解码。

第 10 章说 GQA/MQA 的速度收益来自**解码时少读 K/V 缓存**（内存带宽），训练时测不到。这里测它：
``B`` 条序列各有一段长 ``T`` 的 K/V 缓存，每条送 1 个新词元进模型（库本身的解码路径：
:class:`~tformer_lib.lm.DecoderOnlyLM` + :class:`~tformer_lib.lm.LMCache`），``n_kv_heads`` 取 h（MHA）、
一个 GQA 的值与 1（MQA）。

- **随机权重、随机的缓存内容**：解码一步的耗时与这些数的取值无关，只与形状有关，所以缓存直接填随机数
  （:func:`filled_cache`），不必先花几十秒预填充；
- **交替计时**（:func:`~tformer_lib.measurement.benchmarking.interleaved_samples`）：每一轮把三种模型依次各测一步，
  记下每种的中位数、四分位与最小/最大值，以及逐轮的耗时比（对 MHA）；
- **字节与屋顶线**：每一步搬动的字节（权重、K/V、激活）用第 13 章的 :func:`~.roofline.decode_cost`
  （与 :func:`~tformer_lib.lm.lm_kv_cache_bytes_per_token` 同一个公式）；屋顶线的预测时间
  = max(FLOPs ÷ 峰值, 字节 ÷ 带宽)，峰值与带宽在同一次运行里现测
  （:func:`~tformer_lib.measurement.profiling.matmul_peak_flops`、:func:`~.roofline.measure_memory_bandwidth`）。

大小的选择（在测量机 2 核、1 线程上量过）：``d_model=512``、8 个头、4 块、``B=4``、``T`` 到 2048——这时 MHA 的 K/V
字节从权重的零头涨到权重的两倍多。一层的 K（或 V）张量 ``(B, h_kv, T, d_k)`` 保持在 32 MiB 以下：
``LMCache`` 每步用 ``torch.cat`` 新建一份缓存，超过 32 MiB 的分配由 glibc 直接向系统要新页（mmap），每步都要
缺页、清零，MHA 在 ``B=8, T=2048``（33.6 MB）时一步慢了约 5 倍，这是分配器的台阶，不是带宽。

``python -m tformer_lib.serving.gqa_decode --out tformer_lib/results/gqa_decode.json`` 写出随包的结果文件
（:data:`RESULTS_PATH`）。
"""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import torch

from .._checks import language_model, non_negative_int, positive_int, positive_ints
from ..lm.cache import LMCache
from ..lm.config import LMConfig
from ..lm.model import make_lm
from .roofline import decode_cost, measure_memory_bandwidth

__all__ = ["RESULTS_PATH", "COMMAND", "decode_config", "filled_cache", "decode_step", "gqa_decode_benchmark",
           "load_results"]

MODULE = "tformer_lib.serving.gqa_decode"
RESULTS_PATH = Path(__file__).resolve().parent.parent / "results" / "gqa_decode.json"
#: 重新生成随包结果文件的命令（写进文件里）
COMMAND = f"python -m {MODULE} --out tformer_lib/results/gqa_decode.json"


def decode_config(n_kv_heads: int, *, d_model: int = 512, n_heads: int = 8, n_layers: int = 4, d_ff: int = 1408,
                  vocab_size: int = 4096, max_len: int = 4096) -> LMConfig:
    """测量用的模型形状：现代结构（pre-LN、RMSNorm、SwiGLU、RoPE、不共享输出层）加快速注意力路径。

    ``fast_attention=True``：SDPA 带 ``enable_gqa`` 直接按组读共用的 K/V 头；显式路径会先把 K/V 复制给同组的
    每个查询头（``repeat_interleave``），复制出的张量与 MHA 一样大，省下的读取又还回去了。
    ``d_ff=1408`` ≈ 8/3 · 512（SwiGLU 的惯例，第 10 章）。
    """
    return LMConfig(vocab_size=vocab_size, d_model=d_model, n_heads=n_heads, n_kv_heads=n_kv_heads,
                    n_layers=n_layers, d_ff=d_ff, max_len=max_len, norm_first=True, norm="rms",
                    activation="swiglu", positional="rope", tie_embeddings=False, fast_attention=True)


def filled_cache(model, batch: int, context: int, seed: int = 0) -> LMCache:
    """一份已经存了 ``context`` 个位置的缓存：每层 K、V 各是随机的 ``(batch, n_kv_heads, context, d_k)``。

    与预填充 ``context`` 个词元之后的缓存形状、dtype 相同（测试核对），内容是随机数——解码一步的耗时与它无关。
    """
    language_model("model", model)
    positive_int("batch", batch)
    positive_int("context", context)
    non_negative_int("seed", seed)
    c = model.config
    if context >= c.max_len:
        raise ValueError(f"context={context} 应小于 max_len={c.max_len}：还要留一个位置给新词元")
    dtype = next(model.parameters()).dtype
    gen = torch.Generator().manual_seed(seed)
    cache = model.new_cache()
    for layer in cache.layers:
        layer.k = torch.randn(batch, c.kv_heads, context, c.d_k, generator=gen).to(dtype)  # (B, h_kv, T, d_k)
        layer.v = torch.randn(batch, c.kv_heads, context, c.d_k, generator=gen).to(dtype)  # (B, h_kv, T, d_k)
    cache.length = context
    return cache


def decode_step(model, cache: LMCache, seed: int = 0):
    """返回一个无参函数：整批各送 1 个新词元、带缓存前向一次（解码一步），再把缓存截回原来的长度。

    每次调用做的是同一步：缓存长度、新词元都不变（计时可以反复调用）。返回的函数本身返回 logits ``(B, 1, V)``。
    """
    language_model("model", model)
    non_negative_int("seed", seed)
    if not isinstance(cache, LMCache) or len(cache.layers) != len(model.blocks) or cache.layers[0].k is None:
        raise ValueError(f"cache 应是这个模型已经存了位置的 LMCache（如 filled_cache(model, …)），收到 {type(cache).__name__}")
    if cache.layers[0].k.shape[1] != model.config.kv_heads:
        raise ValueError(f"cache 每层存 {cache.layers[0].k.shape[1]} 个 K/V 头，模型有 {model.config.kv_heads} 个："
                         "用同一个模型的 filled_cache")
    length = len(cache)
    batch = cache.layers[0].k.shape[0]
    gen = torch.Generator().manual_seed(seed)
    tokens = torch.randint(4, model.config.vocab_size, (batch, 1), generator=gen)  # (B, 1)
    model.eval()

    @torch.no_grad()
    def step() -> torch.Tensor:
        logits = model(tokens, cache=cache)  # (B, 1, V)
        cache.crop(length)
        return logits

    return step


def _spread(seconds: Sequence[float]) -> dict:
    q1, med, q3 = statistics.quantiles(seconds, n=4, method="inclusive") if len(seconds) > 1 else [seconds[0]] * 3
    return {"median": med, "q1": q1, "q3": q3, "min": min(seconds), "max": max(seconds)}


def gqa_decode_benchmark(*, kv_heads: Sequence[int] = (8, 2, 1), contexts: Sequence[int] = (128, 256, 512, 1024, 2048),
                         batch: int = 4, rounds: int = 41, warmup: int = 3, n_heads: int = 8, d_model: int = 512,
                         n_layers: int = 4, log=print) -> dict:
    """对每个缓存长度 ``T``（``contexts``），三种 K/V 头数交替各测 ``rounds`` 轮解码一步；第一个 ``kv_heads`` 是基准（MHA）。

    每一行：``context``（缓存里已有的位置数，新词元看 ``context + 1`` 个）、每种头数的秒数（逐轮）与分布、
    逐轮耗时比（对基准）的中位数与四分位、:func:`~.roofline.decode_cost` 数的 FLOPs 与字节（各部分）、
    屋顶线的预测秒数与预测比值（字节之比）。
    """
    from ..measurement.benchmarking import interleaved_samples, machine_info, ratio_summary
    from ..measurement.profiling import matmul_peak_flops

    kv_heads = positive_ints("kv_heads", kv_heads)
    contexts = positive_ints("contexts", contexts)
    for name, values in (("kv_heads", kv_heads), ("contexts", contexts)):
        if len(set(values)) != len(values):
            raise ValueError(f"{name} 里不能有重复的值（每个值一组结果），收到 {values}")
    positive_int("batch", batch)
    positive_int("rounds", rounds)
    non_negative_int("warmup", warmup)
    machine = machine_info()
    configs = {h: decode_config(h, n_heads=n_heads, d_model=d_model, n_layers=n_layers,
                                max_len=max(max(contexts) + 1, 128)) for h in kv_heads}
    models = {}
    for h, c in configs.items():
        torch.manual_seed(0)
        models[h] = make_lm(c).eval()
    bandwidth, peak = measure_memory_bandwidth(), matmul_peak_flops()
    base = kv_heads[0]
    rows = []
    for t in contexts:
        steps = {f"{h}": decode_step(models[h], filled_cache(models[h], batch, t)) for h in kv_heads}
        samples = interleaved_samples(steps, rounds, warmup)
        row = {"context": t, "batch": batch, "variants": {}}
        for h in kv_heads:
            cost = decode_cost(configs[h], batch, t + 1)
            predicted = max(cost["flops"] / peak, cost["bytes"] / bandwidth)
            row["variants"][str(h)] = {
                "n_kv_heads": h, "seconds": samples[str(h)], **{k: v for k, v in _spread(samples[str(h)]).items()},
                "flops": cost["flops"], "bytes": cost["bytes_parts"], "predicted_seconds": predicted,
                "ratio_to_base": ratio_summary(samples[str(h)], samples[str(base)]),
                "predicted_ratio_to_base": cost["bytes"] / decode_cost(configs[base], batch, t + 1)["bytes"],
            }
        rows.append(row)
        del steps
        if log is not None:
            log(f"T={t:5d}: " + "，".join(
                f"h_kv={h} {row['variants'][str(h)]['median'] * 1e3:.1f} ms"
                f"（比 {row['variants'][str(h)]['ratio_to_base']['median']:.2f}，字节比 "
                f"{row['variants'][str(h)]['predicted_ratio_to_base']:.2f}）" for h in kv_heads))
    shape = configs[base]
    return {"machine": machine, "bandwidth_bytes_per_s": bandwidth, "peak_flops": peak,
            "model": {"d_model": shape.d_model, "n_heads": shape.n_heads, "n_layers": shape.n_layers,
                      "d_ff": shape.d_ff, "vocab_size": shape.vocab_size, "activation": shape.activation,
                      "positional": shape.positional, "fast_attention": shape.fast_attention,
                      "parameters": {str(h): sum(p.numel() for p in m.parameters()) for h, m in models.items()}},
            "kv_heads": kv_heads, "base": base, "batch": batch, "rounds": rounds, "warmup": warmup, "rows": rows}


def load_results(path=None) -> dict:
    """读取结果文件（默认随包的 :data:`RESULTS_PATH`）。"""
    from ..measurement.benchmarking import read_results

    return read_results(path if path is not None else RESULTS_PATH, COMMAND)


def main(argv=None) -> int:
    from ..measurement.benchmarking import measurement_parser, measurement_record, parse_measurement_args, save_results

    parser = measurement_parser(MODULE, "GQA 的解码时间：MHA / GQA / MQA 同一形状、带满缓存解码一步，交替计时")
    parser.add_argument("--rounds", type=int, default=41)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--contexts", default="128,256,512,1024,2048", help="逗号分隔的缓存长度")
    parser.add_argument("--kv-heads", default="8,2,1", help="逗号分隔的 K/V 头数；第一个是基准（MHA）")
    args = parse_measurement_args(parser, argv)
    start = time.perf_counter()
    try:
        contexts = [int(x) for x in args.contexts.split(",")]
        kv_heads = [int(x) for x in args.kv_heads.split(",")]
    except ValueError:
        parser.error(f"--contexts 与 --kv-heads 应是逗号分隔的整数，收到 {args.contexts!r}、{args.kv_heads!r}")
    result = gqa_decode_benchmark(kv_heads=kv_heads, contexts=contexts, batch=args.batch, rounds=args.rounds)
    argv = sys.argv[1:] if argv is None else list(argv)
    record = measurement_record(MODULE, argv, result.pop("machine"), start)
    result = {**record, **result}
    if args.out:
        print(f"已写入 {save_results(result, args.out)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
