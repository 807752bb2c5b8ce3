"""基准：同一份随机的 LLaMA 结构权重，我们的 DecoderOnlyLM vs ``transformers`` 的 ``LlamaForCausalLM``。

权重由 ``transformers`` 按配置随机生成（不下载任何东西），``save_pretrained`` 写成 safetensors，再用
:func:`tformer_lib.lm.load_hf` 读成我们的模型——两边算的是逐元素相同的一组数（先核对 logits）。两种大小：
随书唐诗模型的尺寸（词表 4457、d_model 128、4 块）与一个大一些、仍放得进这台 CPU 的（d_model 512、8 块）。

同一进程、1 个线程、交替测量（每一轮各条路径各跑一次，相邻两轮顺序相反），报告中位数与四分位范围，以及逐轮相除的比值：

- **训练一步**：前向 + 交叉熵 + 反向 + AdamW（两边同样的 ``torch.optim.AdamW``）；一步不到 1 秒时每个样本是连续
  几步的平均（约 1 秒），轮数是其余各项的两倍；再各剖析一步，记下矩阵乘法的调用次数与占用时的比例；我们的一栏有两行：同样先造出
  logits 再 ``F.cross_entropy``（两边做的运算一样），以及库里输出层与交叉熵融合的损失
  （:func:`~tformer_lib.lm.linear_cross_entropy`，``LMTrainer(fused_loss=True)``；矩阵乘法一样多，只是不造出
  ``(B·T, V)`` 的 logits 与它的梯度）；
- **预填充**：一次前向 ``(1, 64)``，不求梯度；
- **贪心解码**：8 个词元的提示接着生成 64 个，批大小 1 与 16；我们的一栏是第 9 章的 ``generate``（eager）和
  第 14 章编译的静态缓存（``StaticDecoder``，编译时间单独报告），对面是 ``LlamaForCausalLM.generate``；
- **服务**：同一组长短不一的请求（提示 4–24 个词元、各要 8–48 个新词元），我们的引擎（连续批处理 + 分页缓存，
  第 13 章；``max_batch=8``）对 ``generate`` 按 8 条一批左填充的静态批次；吞吐只数请求真正要的词元。引擎测两种步：
  eager，和编译的固定形状步（``decode_step="compiled"``，:mod:`tformer_lib.serving.decode_step`；编译时间单独报告）；
  再加一行“同样的 K/V 内存”：分页缓存的块数取 transformers 那几批的峰值位置数（一批左填充到最宽的提示、再长到最长
  的要求），``max_batch`` 放到 16——分页按每条序列的实际长度分块（接纳时按它的最终长度预留），同样多的内存里能同时跑
  更多条。每条路径的前向次数（``steps``）与送进模型的行数（``rows``，:func:`serving_work`）也记下来：吞吐的差别
  可以拆成“步数 × 每步的用时”，行数说明一步为什么贵（或不贵）。一次运行不到 1 秒的路径（编译的引擎约 0.4 秒），
  每个样本是连续几次运行的平均（约 1 秒，次数记在 ``runs_per_sample``）。

每条路径的词元都与我们单独贪心生成的相同（结果里的 ``identical``）。最后一行：各项的“我们 / transformers”比值。

用法：``python benchmarks/vs_transformers.py [--rounds 5] [--out tformer_lib/results/vs_transformers.json] [--quick]``
（``--quick``：很小的模型、1 轮、不编译，只核对流程与词元，CI 用）。
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time

import torch
import torch.nn.functional as F

COMMAND = "python benchmarks/vs_transformers.py"

SIZES = {  # 名字 → (词表, d_model, 块数, 头数, K/V 头数, d_ff, 上下文)
    "poem": (4457, 128, 4, 4, 2, 344, 128),
    "larger": (4457, 512, 8, 8, 4, 1376, 256),
    "quick": (300, 32, 2, 2, 1, 64, 96),
}


def _summary(samples: list[float]) -> dict:
    q1, med, q3 = statistics.quantiles(samples, n=4, method="inclusive") if len(samples) > 1 else (samples[0],) * 3
    return {"median": med, "q1": q1, "q3": q3, "samples": samples}


def build_pair(size: str, seed: int = 0):
    """``(ours, theirs)``：同一份随机权重的我们的模型与 ``LlamaForCausalLM``（都在 eval 模式，float32）。"""
    from transformers import LlamaConfig, LlamaForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # save_pretrained 的进度条不进日志

    from tformer_lib.lm import load_hf

    vocab, d, layers, heads, kv_heads, d_ff, context = SIZES[size]
    config = LlamaConfig(vocab_size=vocab, hidden_size=d, intermediate_size=d_ff, num_hidden_layers=layers,
                         num_attention_heads=heads, num_key_value_heads=kv_heads, max_position_embeddings=context,
                         rms_norm_eps=1e-5, rope_theta=10000.0, tie_word_embeddings=False, pad_token_id=0,
                         bos_token_id=1, eos_token_id=2, attn_implementation="sdpa")
    torch.manual_seed(seed)
    theirs = LlamaForCausalLM(config).eval()
    with tempfile.TemporaryDirectory() as tmp:
        theirs.save_pretrained(tmp)
        ours, _ = load_hf(tmp)
    return ours.eval(), theirs


def _train_step(model, tokens, hf: bool, fused: bool = False):
    """训练一步的函数。``fused``：我们的模型改用 :func:`~tformer_lib.lm.linear_cross_entropy`（输出层与交叉熵融合，
    不造出 ``(B·T, V)`` 的 logits 与它的梯度；``LMTrainer(fused_loss=True)`` 也是这样算）。"""
    from tformer_lib.lm import linear_cross_entropy

    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    inputs, targets = tokens[:, :-1], tokens[:, 1:]  # (B, T-1)

    def step():
        if fused:
            hidden = model.hidden_states(inputs).flatten(0, 1)  # (B·(T-1), d_model)
            loss = linear_cross_entropy(hidden, model.lm_head.weight, targets.flatten())
        else:
            logits = model(input_ids=inputs).logits if hf else model(inputs)  # (B, T-1, V)
            loss = F.cross_entropy(logits.flatten(0, 1), targets.flatten())
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        return float(loss.detach())

    return step


def _matmul_profile(fn) -> dict:
    """剖析 ``fn()`` 一次：矩阵乘法（``aten::mm``/``addmm``/``addmm_``/``bmm``）的调用次数与自身用时占全部算子自身用时的比例。"""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        fn()
    events = prof.key_averages()
    matmuls = [e for e in events if e.key in ("aten::mm", "aten::addmm", "aten::addmm_", "aten::bmm")]
    total = sum(e.self_cpu_time_total for e in events)
    return {"matmul_calls": sum(e.count for e in matmuls),
            "matmul_share": sum(e.self_cpu_time_total for e in matmuls) / total}


def _repeated(fn, repeat: int):
    """连着调用 ``fn`` ``repeat`` 次的函数；计时时除以 ``repeat`` 得到每次的秒数（见 ``run`` 里的训练一步）。"""
    def many():
        for _ in range(repeat):
            fn()
    return many


def _runs_per_second(fn) -> int:
    """``fn`` 连着跑几次约 1 秒（至少 1 次）：先跑一次计时。"""
    start = time.perf_counter()
    fn()
    return max(1, round(1.0 / (time.perf_counter() - start)))


def _requests(vocab: int, n: int, seed: int = 0) -> list[tuple[list[int], int]]:
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        length = int(torch.randint(4, 25, (1,), generator=g))
        prompt = [1] + torch.randint(3, vocab, (length - 1,), generator=g).tolist()
        out.append((prompt, int(torch.randint(8, 49, (1,), generator=g))))
    return out


def _hf_static_batches(theirs, requests, batch: int) -> list[list[int]]:
    """``generate`` 按 ``batch`` 条一批、左填充：每批生成到本批最长的要求，再截取每条要的长度。"""
    outputs = []
    for i in range(0, len(requests), batch):
        group = requests[i:i + batch]
        width = max(len(p) for p, _ in group)
        ids = torch.tensor([[0] * (width - len(p)) + p for p, _ in group])  # (b, width) 左填充
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p, _ in group])
        longest = max(n for _, n in group)
        new = theirs.generate(input_ids=ids, attention_mask=mask, max_new_tokens=longest, min_new_tokens=longest,
                              do_sample=False, suppress_tokens=[0, 1], pad_token_id=0, eos_token_id=None)[:, width:]
        outputs += [new[j, :n].tolist() for j, (_, n) in enumerate(group)]
    return outputs


def serving_work(requests, vocab: int, context: int, same_memory: dict, batch: int = 8) -> dict:
    """每条服务路径做几次前向（``steps``）、送进模型多少行（``rows``，每个词元在每层都是矩阵乘法的一行）。
    没有 EOS，每条请求正好生成它要的词元数，调度只看长度、与模型无关：

    - ``transformers``：每批 1 次预填充（本批行数 × 最宽的提示）+ (最长的要求 − 1) 次解码（每次本批行数）；
    - 引擎：:attr:`Engine.steps` 与 :attr:`Engine.forward_rows`，用一个很小的随机模型、``decode_step="fixed"``
      数（eager 与 compiled 的调度相同；eager 的步只送真实的词元，行数是 ``rows["useful"]``）；
    - ``useful``：每条提示一次、每个新词元（最后一个除外）再送回一次——哪种调度也少不了的行数。
    """
    from tformer_lib.lm import LMConfig, make_lm
    from tformer_lib.serving import Engine
    from tformer_lib.serving.engine import Request

    torch.manual_seed(0)
    tiny = make_lm(LMConfig(vocab_size=vocab, d_model=8, n_heads=1, n_layers=1, d_ff=8, max_len=context)).eval()
    groups = [requests[i:i + batch] for i in range(0, len(requests), batch)]
    steps = {"transformers": sum(max(n for _, n in g) for g in groups)}
    rows = {"transformers": sum(len(g) * (max(len(p) for p, _ in g) + max(n for _, n in g) - 1) for g in groups),
            "useful": sum(len(p) + n - 1 for p, n in requests)}
    for name, options in (("engine", {"max_batch": batch}), ("engine_same_kv_memory", same_memory)):
        engine = Engine(tiny, decode_step="fixed", **options)
        engine.run([Request(list(p), n) for p, n in requests])
        steps[name], rows[name] = engine.steps, engine.forward_rows
    return {"steps": steps, "rows": rows}


def run(size: str, rounds: int, quick: bool) -> dict:
    from tformer_lib.measurement.benchmarking import interleaved_samples, ratio_summary
    from tformer_lib.inference import StaticDecoder
    from tformer_lib.lm import generate
    from tformer_lib.serving import Engine
    from tformer_lib.serving.engine import Request

    torch._dynamo.reset()  # 每种大小从零编译：上一种大小的图不占 Dynamo 的重编译名额
    ours, theirs = build_pair(size)
    vocab, context = SIZES[size][0], SIZES[size][-1]
    g = torch.Generator().manual_seed(1)
    probe = torch.randint(3, vocab, (2, 32), generator=g)  # (2, 32)
    with torch.no_grad():
        logit_diff = float((ours(probe) - theirs(input_ids=probe).logits).abs().max())
    result = {"size": size, "config": dict(zip(("vocab", "d_model", "layers", "heads", "kv_heads", "d_ff", "context"),
                                                SIZES[size])),
              "parameters": sum(p.numel() for p in ours.parameters()), "max_abs_logit_diff": logit_diff}

    # 训练一步（两份独立的拷贝：训练会改权重）
    import copy

    batch, seq = (2, 32) if quick else (8, min(128, context))
    tokens = torch.randint(3, vocab, (batch, seq), generator=g)  # (B, T)
    steps = {"ours": _train_step(copy.deepcopy(ours).train(), tokens, hf=False),
             "ours_fused_loss": _train_step(copy.deepcopy(ours).train(), tokens, hf=False, fused=True),
             "transformers": _train_step(copy.deepcopy(theirs).train(), tokens, hf=True)}
    first = {name: fn() for name, fn in steps.items()}
    result["train_first_loss_diff"] = max(abs(first[k] - first["transformers"]) for k in ("ours", "ours_fused_loss"))
    # 一步只有零点几秒时，单步的抖动比两边的差还大：每个样本取连续 repeat 步的平均（一个样本约 1 秒），轮数加倍
    repeat = _runs_per_second(steps["transformers"])
    times = interleaved_samples({k: _repeated(fn, repeat) for k, fn in steps.items()}, 2 * rounds, warmup=1,
                                alternate=True)
    times = {k: [t / repeat for t in v] for k, v in times.items()}  # 每步的秒数
    result["train_step"] = {"seconds": {k: _summary(v) for k, v in times.items()},
                            "ours/transformers": ratio_summary(times["ours"], times["transformers"]),
                            "ours_fused_loss/transformers": ratio_summary(times["ours_fused_loss"], times["transformers"]),
                            "batch": [batch, seq], "steps_per_sample": repeat, "rounds": 2 * rounds,
                            "profile": {k: _matmul_profile(fn) for k, fn in steps.items()}}

    # 预填充
    prompt = torch.randint(3, vocab, (1, 64), generator=g)  # (1, 64)
    with torch.no_grad():
        times = interleaved_samples({"ours": lambda: ours(prompt), "transformers": lambda: theirs(input_ids=prompt)},
                                    rounds, warmup=1, alternate=True)
    result["prefill"] = {"seconds": {k: _summary(v) for k, v in times.items()},
                         "ours/transformers": ratio_summary(times["ours"], times["transformers"])}

    # 贪心解码
    new_tokens = 16 if quick else 64
    compiled = StaticDecoder(ours, compile=not quick, freeze=not quick, skip_guards=not quick, cpp_wrapper=not quick)
    result["decode"] = {}
    for b in (1, 16):
        p = torch.randint(3, vocab, (b, 8), generator=g)  # (B, 8)
        start = time.perf_counter()
        compiled.generate(p, 2, method="greedy")
        compile_seconds = time.perf_counter() - start
        want = generate(ours, p, new_tokens, method="greedy")
        hf_out = theirs.generate(input_ids=p, attention_mask=torch.ones_like(p), max_new_tokens=new_tokens,
                                 min_new_tokens=new_tokens, do_sample=False, suppress_tokens=[0, 1], pad_token_id=0,
                                 eos_token_id=None)[:, 8:]
        identical = {"compiled": bool(torch.equal(compiled.generate(p, new_tokens, method="greedy"), want)),
                     "transformers": bool(torch.equal(hf_out, want))}
        paths = {
            "generate": lambda p=p: generate(ours, p, new_tokens, method="greedy"),
            "compiled": lambda p=p: compiled.generate(p, new_tokens, method="greedy"),
            "transformers": lambda p=p: theirs.generate(
                input_ids=p, attention_mask=torch.ones_like(p), max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                do_sample=False, suppress_tokens=[0, 1], pad_token_id=0, eos_token_id=None),
        }
        with torch.no_grad():
            times = interleaved_samples(paths, rounds, warmup=1, alternate=True)
        result["decode"][f"B{b}"] = {
            "ms_per_step": {k: _summary([t / new_tokens * 1e3 for t in v]) for k, v in times.items()},
            "generate/transformers": ratio_summary(times["generate"], times["transformers"]),
            "compiled/transformers": ratio_summary(times["compiled"], times["transformers"]),
            "identical_to_our_greedy": identical, "compile_seconds": compile_seconds}

    # 服务：引擎 vs generate 的静态批次
    requests = _requests(vocab, 16 if quick else 48)
    useful = sum(n for _, n in requests)
    want = [generate(ours, torch.tensor(p), n, method="greedy").tolist() for p, n in requests]

    def engine_run(decode_step, **options):
        reqs = [Request(list(p), n) for p, n in requests]
        Engine(ours, decode_step=decode_step, **{"max_batch": 8, **options}).run(reqs)
        return [r.output for r in reqs]

    # 同样的 K/V 内存：transformers 的一批左填充到最宽的提示、再一起长到最长的要求，峰值是最大那批的 行数 × 总宽；
    # 分页缓存按每条序列的实际长度分块，同样多的位置能同时放下更多条序列（max_batch 放到 16，由块数限制）
    hf_positions = max(len(g) * (max(len(p) for p, _ in g) + max(n for _, n in g))
                       for g in (requests[i:i + 8] for i in range(0, len(requests), 8)))
    same_memory = {"max_batch": 16, "num_blocks": hf_positions // 16, "block_size": 16}

    compiled_step = "fixed" if quick else "compiled"  # --quick 不编译，但走同一个固定形状的函数
    start = time.perf_counter()
    identical = {"engine_compiled": engine_run(compiled_step) == want}  # 第一次跑：编译解码与各预填充长度的图
    compile_seconds = time.perf_counter() - start
    identical |= {"engine": engine_run("eager") == want, "transformers": _hf_static_batches(theirs, requests, 8) == want,
                  "engine_compiled_same_kv_memory": engine_run(compiled_step, **same_memory) == want}
    paths = {"engine": lambda: engine_run("eager"), "engine_compiled": lambda: engine_run(compiled_step),
             "engine_compiled_same_kv_memory": lambda: engine_run(compiled_step, **same_memory),
             "transformers": lambda: _hf_static_batches(theirs, requests, 8)}
    # 与训练一步同理：一次运行不到 1 秒的路径，每个样本取连续几次运行的平均（约 1 秒），一次短暂的干扰摊薄在几次里
    with torch.no_grad():
        runs = {k: 1 if quick else _runs_per_second(fn) for k, fn in paths.items()}  # --quick 只核对流程
        times = interleaved_samples({k: _repeated(fn, runs[k]) for k, fn in paths.items()}, rounds, warmup=1,
                                    alternate=True)
    times = {k: [t / runs[k] for t in v] for k, v in times.items()}  # 每次运行的秒数
    result["serving"] = {"requests": len(requests), "useful_tokens": useful,
                         "tokens_per_second": {k: _summary([useful / t for t in v]) for k, v in times.items()},
                         "engine/transformers_throughput": ratio_summary(times["transformers"], times["engine"]),
                         "engine_compiled/transformers_throughput": ratio_summary(times["transformers"],
                                                                                  times["engine_compiled"]),
                         "engine_compiled_same_kv_memory/transformers_throughput": ratio_summary(
                             times["transformers"], times["engine_compiled_same_kv_memory"]),
                         "same_kv_memory": {"positions": hf_positions, **same_memory},
                         "batch": {"transformers": 8, "engine_max_batch": 8}, "runs_per_sample": runs,
                         **serving_work(requests, vocab, context, same_memory),
                         "engine_compile_seconds": compile_seconds, "identical_to_our_greedy": identical}
    return result


def main(argv=None) -> int:
    from tformer_lib.measurement.benchmarking import machine_info, save_results

    parser = argparse.ArgumentParser(description="同一份 LLaMA 结构的权重：我们的实现 vs transformers")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--out", default=None, help="结果 JSON 的路径（原子写入）")
    parser.add_argument("--quick", action="store_true", help="CI 用：很小的模型、1 轮、不编译")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    info = machine_info()
    info["command"] = " ".join([COMMAND, *(sys.argv[1:] if argv is None else argv)])
    started = time.perf_counter()
    rounds = 1 if args.quick else args.rounds
    sizes = ("quick",) if args.quick else ("poem", "larger")
    result = {"machine": info, "rounds": rounds, "sizes": [run(s, rounds, args.quick) for s in sizes]}
    result["machine"]["seconds"] = round(time.perf_counter() - started, 1)
    if args.out:
        save_results(result, args.out)
    summary = []
    for r in result["sizes"]:
        d1 = r["decode"]["B1"]
        print(f"{r['size']}（{r['parameters']:,} 参数，logits 最大差 {r['max_abs_logit_diff']:.1e}）："
              f"训练一步 ours/transformers {r['train_step']['ours/transformers']['median']:.2f}×"
              f"（融合的损失 {r['train_step']['ours_fused_loss/transformers']['median']:.2f}×），"
              f"预填充 {r['prefill']['ours/transformers']['median']:.2f}×，"
              f"B=1 解码 generate {d1['generate/transformers']['median']:.2f}× / 编译 {d1['compiled/transformers']['median']:.2f}×，"
              f"B=16 解码 generate {r['decode']['B16']['generate/transformers']['median']:.2f}×，"
              f"引擎吞吐 {r['serving']['engine/transformers_throughput']['median']:.2f}× transformers"
              f"（编译的固定形状步 {r['serving']['engine_compiled/transformers_throughput']['median']:.2f}×，"
              f"同样的 K/V 内存、至多 16 条 {r['serving']['engine_compiled_same_kv_memory/transformers_throughput']['median']:.2f}×）；"
              f"词元相同 {r['decode']['B1']['identical_to_our_greedy']}、{r['serving']['identical_to_our_greedy']}")
        summary.append(f"{r['size']}: train {r['train_step']['ours/transformers']['median']:.2f}× "
                       f"(fused loss {r['train_step']['ours_fused_loss/transformers']['median']:.2f}×), "
                       f"decode-B1 {d1['generate/transformers']['median']:.2f}× (compiled {d1['compiled/transformers']['median']:.2f}×), "
                       f"engine {r['serving']['engine/transformers_throughput']['median']:.2f}× tokens/s "
                       f"(compiled {r['serving']['engine_compiled/transformers_throughput']['median']:.2f}×, "
                       f"same KV memory {r['serving']['engine_compiled_same_kv_memory/transformers_throughput']['median']:.2f}×)")
    print("ours/transformers — " + "; ".join(summary))
    differ = [f"{r['size']} {where}" for r in result["sizes"]
              for where, flags in [("B1", r["decode"]["B1"]["identical_to_our_greedy"]),
                                   ("B16", r["decode"]["B16"]["identical_to_our_greedy"]),
                                   ("serving", r["serving"]["identical_to_our_greedy"])] if not all(flags.values())]
    if differ or any(r["max_abs_logit_diff"] > 1e-4 for r in result["sizes"]):
        print(f"词元或 logits 与我们的贪心生成不同：{differ}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
