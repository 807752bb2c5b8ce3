"""解码基准（随书唐诗模型，1 线程）：今天的 ``generate``、编译的静态缓存路径、``transformers`` 的 ``generate``
（同一份权重的 GPT-2 孪生模型），批大小 1 与 16，每词元毫秒；同一次运行里交替测量，报告中位数与四分位范围。
另有：编译耗时、一步解码的时间分解（剖析器）、FLOP 与字节下限、编译路径上的推测解码（α、c、r 与公式）。

用法（``benchmarks/decode.py`` 是它的薄包装）::

    python benchmarks/decode.py [--rounds 7] [--new-tokens 100] [--out tformer_lib/results/decode.json] [--quick]

最后一行打印 ``compiled/generate = X×, compiled/transformers = Y×``（批大小 1，逐轮比值的中位数）。
``--quick`` 是 CI 用的小规模版本：很小的随机模型、几个词元、**不编译**（静态缓存走 eager），只核对各条路径输出相同、
流程跑通（数字不作结论）。
"""

from __future__ import annotations

import argparse
import functools
import statistics
import sys
import time
from pathlib import Path

import torch

from ..lm.generate import generate
from ..measurement.benchmarking import machine_info, ratio_summary, save_results
from ..measurement.profiling import matmul_peak_flops
from ..serving.roofline import measure_memory_bandwidth
from ..serving.speculative import expected_speedup
from .breakdown import profile_breakdown
from .compiled import StaticDecoder
from .floors import decode_floors, times_above_floor
from .hf_twin import to_gpt2
from .speculative import CompiledSpeculative

__all__ = ["RESULTS_PATH", "run_decode_benchmark", "main"]

RESULTS_PATH = Path(__file__).resolve().parent.parent / "results" / "decode.json"
COMMAND = "python benchmarks/decode.py --out tformer_lib/results/decode.json"


def _timed(fn) -> tuple[object, float, float]:
    start, start_cpu = time.perf_counter(), time.process_time()
    result = fn()
    return result, time.perf_counter() - start, time.process_time() - start_cpu


def _summary(seconds: list[float], tokens: int) -> dict:
    ms = sorted(s / tokens * 1e3 for s in seconds)
    q = statistics.quantiles(ms, n=4, method="inclusive") if len(ms) > 1 else [ms[0]] * 3
    return {"median": q[1], "q1": q[0], "q3": q[2], "min": ms[0], "max": ms[-1], "samples": ms}


def _models(quick: bool):
    if quick:
        from ..lm import LMConfig, make_lm

        torch.manual_seed(0)
        target = make_lm(LMConfig(vocab_size=300, d_model=32, n_heads=2, n_layers=2, d_ff=64, max_len=48,
                                  fast_attention=True))
        torch.manual_seed(1)
        draft = make_lm(LMConfig(vocab_size=300, d_model=16, n_heads=2, n_layers=1, d_ff=32, max_len=48,
                                 fast_attention=True))
        prompts = [[2] + [5 + (7 * i + j) % 200 for j in range(6)] for i in range(16)]
        return target.eval(), draft.eval(), prompts
    from ..lm import load_poem_model
    from ..serving.measure import benchmark_prompts
    from ..serving.draft import load_draft_model

    target, tokenizer, _ = load_poem_model()
    draft, _, _ = load_draft_model()
    prompts = [p[:8] for p in benchmark_prompts(tokenizer, 64) if len(p) >= 8][:16]  # 16 条等长提示（8 个词元）
    return target.eval(), draft.eval(), prompts


def run_decode_benchmark(*, rounds: int = 7, new_tokens: int = 100, quick: bool = False, ks=(1, 2)) -> dict:
    """跑完整个基准，返回结果字典（见模块说明）。``quick=True`` 时不编译（见模块说明）。"""
    fast = dict(compile=not quick, freeze=not quick, skip_guards=not quick, cpp_wrapper=not quick)
    torch.set_num_threads(1)
    machine = machine_info()
    machine["command"] = COMMAND + (" --quick" if quick else "")
    started = time.perf_counter()
    target, draft, prompts = _models(quick)
    hf = to_gpt2(target)
    suppress = [0, 1]  # PAD、BOS：与我们的 generate 一样不许生成
    batches = {1: torch.tensor(prompts[:1]), 16: torch.tensor(prompts[:16])}
    compiled = StaticDecoder(target, **fast)
    compile_seconds = {}
    outputs = {}
    for b, prompt in batches.items():
        _, wall, _ = _timed(lambda: compiled.generate(prompt, 2, method="greedy"))
        compile_seconds[b] = {"decode_step": compiled.compile_seconds[b], "first_generate": wall}
        expected = generate(target, prompt, new_tokens, method="greedy")
        got = compiled.generate(prompt, new_tokens, method="greedy")
        ours_hf = hf.generate(prompt, max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False,
                              suppress_tokens=suppress, pad_token_id=0, eos_token_id=None)[:, prompt.shape[1]:]
        outputs[b] = {"compiled_equals_generate": bool(torch.equal(got, expected)),
                      "transformers_equals_generate": bool(torch.equal(ours_hf, expected))}

    paths = {}
    for b, prompt in batches.items():
        paths[f"generate/B{b}"] = lambda p=prompt: generate(target, p, new_tokens, method="greedy")
        paths[f"compiled/B{b}"] = lambda p=prompt: compiled.generate(p, new_tokens, method="greedy")
        paths[f"transformers/B{b}"] = lambda p=prompt: hf.generate(
            p, max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False, suppress_tokens=suppress,
            pad_token_id=0, eos_token_id=None)
    load = [round(__import__("os").getloadavg()[0], 2)]
    wall = {name: [] for name in paths}
    cpu = {name: [] for name in paths}
    with torch.no_grad():
        for name, fn in paths.items():  # 热身一次
            fn()
        for _ in range(rounds):
            for name, fn in paths.items():
                _, w, c = _timed(fn)
                wall[name].append(w)
                cpu[name].append(c)
            load.append(round(__import__("os").getloadavg()[0], 2))
    table = {name: {"ms_per_token": _summary(wall[name], new_tokens),
                    "cpu_ms_per_token": _summary(cpu[name], new_tokens)} for name in paths}
    ratios = {}
    for b in batches:
        for other in ("generate", "transformers"):
            ratios[f"compiled/{other}/B{b}"] = {
                "wall": ratio_summary(wall[f"compiled/B{b}"], wall[f"{other}/B{b}"]),
                "cpu": ratio_summary(cpu[f"compiled/B{b}"], cpu[f"{other}/B{b}"])}

    # 一步解码的时间分解与下限（批大小 1，上下文 = 提示 + 一半新词元）
    context = batches[1].shape[1] + new_tokens // 2
    peak, bandwidth = matmul_peak_flops(512), measure_memory_bandwidth(256 if not quick else 32)
    breakdown, floors = {}, {}
    eager_static = StaticDecoder(target, compile=False)
    # 开了 cpp_wrapper，矩阵乘法在 C++ 包装里直接调用，剖析器看不见它们、拆不出四份：剖析另用一个只差这一项的解码器
    visible = StaticDecoder(target, **{**fast, "cpp_wrapper": False})
    for b in batches:
        tokens = torch.full((b, 1), 5, dtype=torch.long)
        pads, slot = torch.zeros(b, dtype=torch.long), torch.tensor([context - 1])
        cache = target.new_cache()
        with torch.no_grad():
            target(torch.full((b, context - 1), 5, dtype=torch.long), cache=cache)

        def dynamic_step(cache=cache, tokens=tokens):  # 今天的路径：LMCache 上的一步 + 选词，再回退到原长
            with torch.no_grad():
                from ..lm.generate import greedy_tokens

                greedy_tokens(target(tokens, cache=cache)[:, -1], suppress)
                cache.crop(context - 1)

        def eager_step(b=b, tokens=tokens, pads=pads, slot=slot):
            with torch.no_grad():
                eager_static.decode_step(eager_static.cache(b), tokens, slot, pads)

        def compiled_step(b=b, tokens=tokens, pads=pads, slot=slot, decoder=compiled):
            with torch.no_grad():
                decoder.decode_step(decoder.cache(b), tokens, slot, pads)

        steps = 5 if quick else 30
        breakdown[f"B{b}"] = {name: {k: v for k, v in profile_breakdown(fn, steps=steps).items() if k not in ("ops",)}
                              for name, fn in (("generate", dynamic_step), ("eager_static", eager_step),
                                               ("compiled_python_wrapper", functools.partial(compiled_step, decoder=visible)),
                                               ("compiled", compiled_step))}
        floors[f"B{b}"] = decode_floors(target.config, b, context, peak_flops=peak, bandwidth=bandwidth)
        floors[f"B{b}"]["times_above"] = {
            name: times_above_floor(table[f"{name}/B{b}"]["ms_per_token"]["median"] / 1e3, floors[f"B{b}"])
            for name in ("generate", "compiled", "transformers")}

    # 编译路径上的推测解码（批大小 1）
    spec_prompts = prompts[:4] if quick else prompts[:8]
    spec_tokens = min(new_tokens, 40)
    step_cost = {"target": [], "draft": []}
    spec = {}
    drafter = StaticDecoder(draft, **fast)
    tok1, pads1 = torch.tensor([[5]]), torch.zeros(1, dtype=torch.long)
    with torch.no_grad():
        drafter.decode_step(drafter.cache(1), tok1, torch.tensor([10]), pads1)
        for _ in range(5 if quick else 20):
            for name, dec in (("target", compiled), ("draft", drafter)):
                _, _, c = _timed(lambda dec=dec: [dec.decode_step(dec.cache(1), tok1, torch.tensor([10]), pads1)
                                                  for _ in range(10)])
                step_cost[name].append(c / 10)
    c_ratio = statistics.median(step_cost["draft"]) / statistics.median(step_cost["target"])
    for k in ks:
        runner = CompiledSpeculative(target, draft, k, **fast)
        runner.target, runner.draft = compiled, drafter  # 与普通解码共用同一张解码图（同样的编译选项）
        start = time.perf_counter()
        runner.generate(spec_prompts[0], 4)
        verify_compile = time.perf_counter() - start
        verify_in = torch.full((1, k + 1), 5, dtype=torch.long)
        slots = torch.arange(10, 11 + k)
        banned = torch.zeros(target.config.vocab_size, dtype=torch.bool)
        verify_cost = []
        with torch.no_grad():
            for _ in range(5 if quick else 20):
                _, _, c = _timed(lambda: [runner._verify(compiled.cache(1), verify_in, slots, pads1, banned)
                                          for _ in range(10)])
                verify_cost.append(c / 10)
        r_ratio = statistics.median(verify_cost) / statistics.median(step_cost["target"])
        plain_cpu, spec_cpu, same, alphas = [], [], True, []
        with torch.no_grad():
            for _ in range(max(1, rounds // 2)):
                for p in spec_prompts:
                    ref, _, c_plain = _timed(lambda p=p: compiled.generate(torch.tensor(p), spec_tokens, method="greedy"))
                    (out, st), _, c_spec = _timed(lambda p=p: runner.generate(p, spec_tokens))
                    same &= out == ref.tolist()
                    plain_cpu.append(c_plain)
                    spec_cpu.append(c_spec)
                    alphas.append((st.accepted, st.accepted + st.rejected))
        alpha = sum(a for a, _ in alphas) / max(1, sum(t for _, t in alphas))
        speedup = ratio_summary(plain_cpu, spec_cpu)
        spec[f"k={k}"] = {"k": k, "identical_to_greedy": bool(same), "alpha": alpha, "cost_ratio_c": c_ratio,
                          "verify_ratio_r": r_ratio, "verify_compile_seconds": verify_compile,
                          "expected_speedup_formula": expected_speedup(min(alpha, 1.0), k, c_ratio),
                          "expected_speedup_with_r": expected_speedup(min(alpha, 1.0), k, c_ratio) / (
                              (k * c_ratio + r_ratio) / (k * c_ratio + 1)),
                          "measured_cpu_speedup": {"median": speedup["median"], "q1": speedup["q1"], "q3": speedup["q3"]}}
    machine["load_average_during"] = load
    machine["seconds"] = round(time.perf_counter() - started, 1)
    return {"machine": machine, "quick": quick, "settings": {
        "rounds": rounds, "new_tokens": new_tokens, "prompt_tokens": int(batches[1].shape[1]), "batches": list(batches),
        "compiled_options": {**fast, "mode": "default", "dynamic": False},
        "config": target.config.to_dict(), "method": "greedy",
        "note": "ms/token = 整个 generate 调用（含预填充）÷ 新词元数；wall 是墙钟，cpu 是进程 CPU 时间（机器繁忙时更稳）"},
        "outputs": outputs, "compile_seconds": compile_seconds, "table": table, "ratios": ratios,
        "peak_flops": peak, "bandwidth": bandwidth, "breakdown": breakdown, "floors": floors,
        "speculative": {"formula": "expected_speedup = (1 - α^(k+1)) / ((1 - α)(k·c + r))，r = 验证一次 ÷ 目标一步",
                        "prompts": len(spec_prompts), "new_tokens": spec_tokens, "rows": spec}}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description="解码基准：generate vs 编译的静态缓存 vs transformers")
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--new-tokens", type=int, default=100)
    p.add_argument("--out", default=None, help=f"结果 JSON（默认不写；随书结果在 {RESULTS_PATH}）")
    p.add_argument("--quick", action="store_true", help="CI 用：很小的随机模型，只核对流程与输出相同")
    args = p.parse_args(argv)
    rounds, new_tokens = (2, 8) if args.quick else (args.rounds, args.new_tokens)
    result = run_decode_benchmark(rounds=rounds, new_tokens=new_tokens, quick=args.quick,
                                  ks=(1,) if args.quick else (1, 2))
    # 重新生成这份结果的命令（参数照实记下）
    result["machine"]["command"] = " ".join(["python benchmarks/decode.py", *(sys.argv[1:] if argv is None else argv)])
    if args.out:
        save_results(result, args.out)
    m = result["machine"]
    print(f"机器：{m['cpu']}，{m['threads']} 线程，负载 {m['load_average_during']}，{m['date']}")
    for b in result["settings"]["batches"]:
        row = "  ".join(f"{name} {result['table'][f'{name}/B{b}']['ms_per_token']['median']:.3f}"
                        for name in ("generate", "compiled", "transformers"))
        print(f"B={b}  ms/token（墙钟中位数）：{row}；编译 {result['compile_seconds'][b]['decode_step']:.1f} s")
    for name, row in result["speculative"]["rows"].items():
        print(f"推测解码 {name}：α={row['alpha']:.2f} c={row['cost_ratio_c']:.2f} r={row['verify_ratio_r']:.2f} "
              f"公式 {row['expected_speedup_with_r']:.2f}× 实测 {row['measured_cpu_speedup']['median']:.2f}× "
              f"输出相同 {row['identical_to_greedy']}")
    for key, ok in result["outputs"].items():
        print(f"B={key} 输出相同：{ok}")
    x = result["ratios"]["compiled/generate/B1"]["wall"]["median"]
    y = result["ratios"]["compiled/transformers/B1"]["wall"]["median"]
    print(f"compiled/generate = {x:.2f}×, compiled/transformers = {y:.2f}×")
    return 0


if __name__ == "__main__":
    sys.exit(main())
