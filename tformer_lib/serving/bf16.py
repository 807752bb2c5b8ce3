"""用 bfloat16（bf16）服务：权重与 K/V 缓存的字节减半，输出离 float32（fp32）有多远。

第 11 章讲了 bf16 的格式：与 fp32 同样 8 位指数、只有 7 位尾数（相对精度约 2⁻⁸）。推理服务直接把整个模型转成
bf16（``model.to(torch.bfloat16)``，:func:`bf16_copy`）：引擎的分页缓存按模型参数的 dtype 建存储，于是每块的
字节、整个缓存占用的字节都减半——这些是**确定**的，与机器无关（测试核对）。

输出变了多少却与机器有关：PyTorch 按 CPU 指令集挑选 bf16 矩阵乘法的内核，不同的内核累加与舍入的方式不同，
贪心选出的词元也就可能不同。所以这些数只放进结果文件，每条“指令集通道”各测一份（:data:`LANES`：子进程设好
``ATEN_CPU_CAPABILITY`` 与 ``ONEDNN_MAX_CPU_ISA`` 两个环境变量，``avx2``、``default``，或两个都不设、用测量机自己
支持的最高指令集）：``python -m tformer_lib.serving.bf16 --out tformer_lib/results/bf16_serving.json``
在三个子进程里各跑一遍 :func:`compare_bf16`。

度量（:func:`compare_bf16`，负载是第 13 章结果文件 ``serving.json`` 的那份 96 个请求）：

- **逐请求相同**：bf16 引擎与 fp32 引擎贪心写出的词元完全相同的请求数；``tokens_before_divergence``：
  第一个不同的词元之前、两者相同的词元占 fp32 词元总数的比例（一旦有一个字不同，后面的上下文就不同了）；
- **逐位置的 top-1 一致**（teacher forcing）：把 fp32 写出的序列原样送进两个模型，比较每个生成位置上屏蔽特殊词之后
  logits 的 argmax，以及 logits 的最大绝对差——不受“一步不同、步步不同”的连锁影响；
- **批处理是否改变 bf16 的答案**：bf16 引擎与 bf16 模型逐条 ``generate`` 的输出相同的请求数。fp32 下两者逐词元相同
  （本章的规矩）；bf16 的舍入更粗，批的形状不同（引擎把一步的词元拼成一行）也可能让 argmax 换一个字。
"""

from __future__ import annotations

import copy
import json
import numbers
import os
import subprocess
import sys
import time
from pathlib import Path

import torch
from torch import nn

from .._checks import check_suppress_ids, language_model
from ..specials import BOS, EOS, PAD
from .engine import Engine

__all__ = ["RESULTS_PATH", "COMMAND", "LANES", "parameter_bytes", "bf16_copy", "serve", "teacher_forced_agreement",
           "compare_bf16", "load_results"]

MODULE = "tformer_lib.serving.bf16"
RESULTS_PATH = Path(__file__).resolve().parent.parent / "results" / "bf16_serving.json"
#: 重新生成随包结果文件的命令（写进文件里）
COMMAND = f"python -m {MODULE} --out tformer_lib/results/bf16_serving.json"
#: 指令集通道 → 子进程的环境变量（None = 删掉这个变量，用这台机器自己的能力）
LANES = {
    "avx2": {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2"},
    "default": {"ATEN_CPU_CAPABILITY": "default", "ONEDNN_MAX_CPU_ISA": "SSE41"},
    "native": {"ATEN_CPU_CAPABILITY": None, "ONEDNN_MAX_CPU_ISA": None},
}


def parameter_bytes(model: nn.Module) -> int:
    """模型全部参数占的字节（每个参数的元素个数 × 每个元素的字节）。"""
    language_model("model", model)
    return sum(p.numel() * p.element_size() for p in model.parameters())


def bf16_copy(model: nn.Module) -> nn.Module:
    """``model`` 的一份 bfloat16 副本（eval 模式）；原模型不变。"""
    language_model("model", model)
    return copy.deepcopy(model).to(torch.bfloat16).eval()


def serve(model: nn.Module, items, *, max_batch: int = 16, eos_id: int | None = EOS, block_size: int = 16):
    """把 ``items``（:class:`~.workload.WorkItem` 列表）一次全部交给一个新引擎（到达时刻都记 0），跑完；
    返回 ``(每个请求的输出词元列表, 引擎)``。与 :class:`~.engine.Engine` 一样，``model`` 被切到 eval 模式。"""
    engine = Engine(model, max_batch=max_batch, eos_id=eos_id, block_size=block_size)
    requests = [engine.add_request(list(it.prompt), it.max_new_tokens, arrival=0.0) for it in items]
    engine.run()
    return [r.output for r in requests], engine


@torch.no_grad()
def teacher_forced_agreement(reference: nn.Module, other: nn.Module, prompts, outputs,
                             suppress_ids=(PAD, BOS)) -> dict:
    """把 ``prompt + output`` 原样送进两个模型，在每个生成位置上比较：屏蔽 ``suppress_ids`` 后 argmax 是否相同
    （``top1_agreement``）、logits 的最大绝对差（``max_abs_logit_diff``，按 float32 算）与 ``reference`` 的
    logits 最大绝对值（``max_abs_logit``，差的参照）。``positions``：比较了多少个位置。"""
    language_model("reference", reference)
    language_model("other", other)
    vocab = reference.config.vocab_size
    if other.config.vocab_size != vocab:
        raise ValueError(f"reference 与 other 的词表应一样大，收到 {vocab} 与 {other.config.vocab_size}")
    prompts = [_ids(f"prompts[{i}]", p, vocab, allow_empty=False) for i, p in enumerate(_sequence("prompts", prompts))]
    outputs = [_ids(f"outputs[{i}]", o, vocab, allow_empty=True) for i, o in enumerate(_sequence("outputs", outputs))]
    if len(prompts) != len(outputs):
        raise ValueError(f"prompts 与 outputs 应一样多，收到 {len(prompts)} 与 {len(outputs)}")
    suppress_ids = check_suppress_ids(suppress_ids, vocab)
    if len(set(suppress_ids)) >= vocab:
        raise ValueError(f"suppress_ids 屏蔽了全部 {vocab} 个词元：没有可比较的 argmax")
    same = total = 0
    max_diff = max_logit = 0.0
    for prompt, output in zip(prompts, outputs):
        if not output:
            continue
        tokens = torch.tensor([list(prompt) + list(output[:-1])])  # (1, T)：最后一个输出词元不必再送
        start = len(prompt) - 1  # 位置 start 的 logits 预测第一个输出词元
        a = reference(tokens)[0, start:].float()  # (n_out, V)
        b = other(tokens)[0, start:].float()  # (n_out, V)
        max_diff = max(max_diff, float((a - b).abs().max()))
        max_logit = max(max_logit, float(a.abs().max()))
        a[:, list(suppress_ids)] = float("-inf")
        b[:, list(suppress_ids)] = float("-inf")
        same += int((a.argmax(-1) == b.argmax(-1)).sum())
        total += a.shape[0]
    if total == 0:
        raise ValueError("outputs 全是空的：没有可比较的位置")
    return {"positions": total, "top1_agreement": same / total,
            "max_abs_logit_diff": max_diff, "max_abs_logit": max_logit}


def _sequence(name: str, values) -> list:
    if isinstance(values, (str, bytes, torch.Tensor)) or not hasattr(values, "__len__"):
        raise TypeError(f"{name} 应是词元 id 列表组成的列表，收到 {type(values).__name__}")
    return list(values)


def _ids(name: str, ids, vocab: int, *, allow_empty: bool) -> list[int]:
    """一条词元 id 序列（列表、元组或一维张量）：整数（不是 bool）、在 ``[0, vocab)`` 内。"""
    if isinstance(ids, torch.Tensor):
        ids = ids.tolist() if ids.dim() == 1 else ids
    if isinstance(ids, (str, bytes)) or not isinstance(ids, (list, tuple)):
        raise TypeError(f"{name} 应是词元 id 的列表，收到 {type(ids).__name__}")
    if not ids and not allow_empty:
        raise ValueError(f"{name} 是空的：提示至少要有一个词元")
    for t in ids:
        if isinstance(t, bool) or not isinstance(t, numbers.Integral) or not 0 <= t < vocab:
            raise ValueError(f"{name} 里应是 [0, {vocab}) 内的整数 id，收到 {t!r}")
    return [int(t) for t in ids]


def _prefix_match(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def compare_bf16(model: nn.Module, items, *, max_batch: int = 16, eos_id: int | None = EOS) -> dict:
    """fp32 的 ``model`` 与它的 bf16 副本各用一个引擎服务同一份负载 ``items``（非空）；返回字节与输出的比较（见模块说明）。

    ``model`` 必须是 float32（否则报错）；它会被切到 eval 模式。"""
    from ..lm.generate import generate

    language_model("model", model)
    dtype = next(model.parameters()).dtype
    if dtype != torch.float32:
        raise ValueError(f"model 应是 float32 的模型（比较的基准；bf16 副本由这里生成），收到 {dtype}")
    if isinstance(items, (str, bytes)) or not hasattr(items, "__len__") or len(items) == 0:
        raise ValueError(f"items 应是非空的 WorkItem 列表，收到 {items!r:.60}")
    model.eval()  # 服务用 eval 模式（与 Engine 相同）：调用者的模型也被切到 eval
    half = bf16_copy(model)
    out32, engine32 = serve(model, items, max_batch=max_batch, eos_id=eos_id)
    out16, engine16 = serve(half, items, max_batch=max_batch, eos_id=eos_id)
    prompts = [list(it.prompt) for it in items]
    alone16 = [generate(half, torch.tensor(p), it.max_new_tokens, method="greedy", eos_id=eos_id).tolist()
               for p, it in zip(prompts, items)]
    tokens32 = sum(map(len, out32))
    return {
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "env": {k: os.environ.get(k) for k in ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA")},
        "requests": len(items),
        "parameter_bytes": {"fp32": parameter_bytes(model), "bf16": parameter_bytes(half)},
        "bytes_per_block": {"fp32": engine32.cache.bytes_per_block, "bf16": engine16.cache.bytes_per_block},
        "peak_held_bytes": {"fp32": engine32.peak_held_bytes, "bf16": engine16.peak_held_bytes},
        "steps": {"fp32": engine32.steps, "bf16": engine16.steps},
        "tokens": {"fp32": tokens32, "bf16": sum(map(len, out16))},
        "identical_requests": sum(a == b for a, b in zip(out32, out16)),
        "tokens_before_divergence": sum(_prefix_match(a, b) for a, b in zip(out32, out16)) / tokens32,
        "teacher_forced": teacher_forced_agreement(model, half, prompts, out32),
        "bf16_engine_equals_bf16_generate": sum(a == b for a, b in zip(out16, alone16)),
    }


def chapter_workload(tokenizer, max_len: int) -> tuple[list, dict]:
    """第 13 章结果文件 ``serving.json`` 的那份负载（同样的提示、种子与参数），以及描述它的字典。"""
    from .measure import benchmark_prompts
    from .workload import make_workload

    spec = {"requests": 96, "seed": 0, "mean_new_tokens": 20, "arrival_rate_per_s": 1000, "max_batch": 16}
    items = make_workload(benchmark_prompts(tokenizer), spec["requests"], max_len=max_len, seed=spec["seed"],
                          mean_new_tokens=spec["mean_new_tokens"], rate=spec["arrival_rate_per_s"])
    return items, spec


def _child() -> dict:
    import warnings

    from ..lm.pretrained import load_poem_model
    from ..unknown_tokens import UnknownTokenWarning

    model, tokenizer, _ = load_poem_model()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UnknownTokenWarning)  # 几个诗题里有词表外的字，当作 <unk>，与 serving.json 相同
        items, spec = chapter_workload(tokenizer, model.config.max_len)
    return {"workload": spec, **compare_bf16(model, items, max_batch=spec["max_batch"])}


def _run_lane(lane: str, threads: int) -> dict:
    env = os.environ.copy()
    for key, value in LANES[lane].items():
        if value is None:
            env.pop(key, None)
        else:
            env[key] = value
    done = subprocess.run([sys.executable, "-m", MODULE, "--child", "--threads", str(threads)], env=env,
                          capture_output=True, text=True, timeout=900)
    if done.returncode != 0:
        raise RuntimeError(f"通道 {lane} 的子进程失败（返回码 {done.returncode}）：{done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def load_results(path=None) -> dict:
    """读取结果文件（默认随包的 :data:`RESULTS_PATH`）。"""
    from ..measurement.benchmarking import read_results

    return read_results(path if path is not None else RESULTS_PATH, COMMAND)


def main(argv=None) -> int:
    from ..measurement.benchmarking import (machine_info, measurement_parser, measurement_record, parse_measurement_args,
                                save_results)

    parser = measurement_parser(MODULE, "bf16 服务：字节减半，输出离 fp32 多远（每个指令集通道各测一份）")
    parser.add_argument("--lanes", default="avx2,default,native", help=f"逗号分隔，取自 {', '.join(LANES)}")
    parser.add_argument("--child", action="store_true", help="（内部用）在当前进程里测一份，JSON 打印到标准输出")
    args = parse_measurement_args(parser, argv)
    if args.child:
        print(json.dumps(_child(), ensure_ascii=False))
        return 0
    lanes = args.lanes.split(",")
    unknown = [lane for lane in lanes if lane not in LANES]
    if unknown:
        parser.error(f"--lanes 里有不认识的通道 {unknown}；可选 {list(LANES)}")
    start, machine = time.perf_counter(), machine_info()
    result = {"lanes": {}}
    for lane in lanes:
        result["lanes"][lane] = row = _run_lane(lane, args.threads)
        print(f"{lane}（{row['cpu_capability']}）：相同的请求 {row['identical_requests']}/{row['requests']}，"
              f"top-1 一致 {row['teacher_forced']['top1_agreement']:.4f}，"
              f"最大 |Δlogit| {row['teacher_forced']['max_abs_logit_diff']:.3f}，"
              f"bf16 引擎 = bf16 逐条生成 {row['bf16_engine_equals_bf16_generate']}/{row['requests']}")
    argv = sys.argv[1:] if argv is None else list(argv)
    result = {**measurement_record(MODULE, argv, machine, start), **result}
    if args.out:
        print(f"已写入 {save_results(result, args.out)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
