"""量化在随书唐诗模型上的代价：每种格式的字节、留出集困惑度、温度 0.8 下的体裁正确率与背书率。

用法::

    python -m tformer_lib.quant.measure --out tformer_lib/results/quantization.json [--threads 1] [--samples 200]

每一行是一种“权重格式 + K/V 缓存格式”。困惑度**经过缓存**计算（每批新建一个 ``model.new_cache()``，一次前向
写入整段）：注意力读到的 K/V 与逐词元生成时完全一样，所以 int8 K/V 的误差也算了进去；对普通缓存，
它与不带缓存的 :func:`~tformer_lib.lm.lm_perplexity` 相同。作诗用 :func:`~tformer_lib.lm.sample_poems`
（200 个留出提示、种子 0，与随书检查点的质量记录同一口径）；体裁正确率附上二项分布的标准误
√(p(1−p)/n)，两行的差小于两三个标准误就分不出好坏。质量数字不随机器负载变化；只有总耗时会。
"""

from __future__ import annotations

import copy
import math
import sys
import time

import torch
import torch.nn.functional as F

from ..specials import PAD
from .kv_cache import use_int8_kv_cache
from .quantize import quantize_model
from .sizes import kv_bytes_per_token, tensor_bytes, weight_bytes

__all__ = ["ROWS", "perplexity_through_cache", "measure_quantization", "main"]

#: (行名, 权重格式, K/V 缓存格式)
ROWS = (
    ("fp32", "fp32", "fp32"),
    ("bf16", "bf16", "bf16"),
    ("int8", "int8", "fp32"),
    ("int4-g32", "int4-g32", "fp32"),
    ("int4-g64", "int4-g64", "fp32"),
    ("int4-g128", "int4-g128", "fp32"),
    ("int8-kv", "fp32", "int8"),
    ("int8+int8-kv", "int8", "int8"),
)


@torch.no_grad()
def _logits_through_cache(model, inputs: torch.Tensor) -> tuple[torch.Tensor, object]:
    cache = model.new_cache()
    return model(inputs, cache=cache).float(), cache  # (b, L, V)


@torch.no_grad()
def perplexity_through_cache(model, inputs: torch.Tensor, targets: torch.Tensor, batch_size: int = 64) -> tuple[float, float]:
    """``(平均交叉熵, 困惑度)``，PAD 目标不计；每批的 K/V 都经过 ``model.new_cache()`` 给出的缓存。"""
    model.eval()
    total, count = 0.0, 0
    for i in range(0, inputs.shape[0], batch_size):
        logits, _ = _logits_through_cache(model, inputs[i : i + batch_size])  # (b, L, V)
        t = targets[i : i + batch_size]
        total += float(F.cross_entropy(logits.flatten(0, 1), t.flatten(), ignore_index=PAD, reduction="sum"))
        count += int((t != PAD).sum())
    loss = total / max(count, 1)
    return loss, math.exp(loss)


def _prepare(base, weight_fmt: str, kv_fmt: str):
    model = quantize_model(copy.deepcopy(base), weight_fmt).eval()
    if kv_fmt == "int8":
        use_int8_kv_cache(model)
    return model


def measure_quantization(base, tokenizer, data: dict, *, rows=ROWS, n_samples: int = 200, n_eval: int | None = None,
                         temperature: float = 0.8, seed: int = 0, split: str = "test") -> list[dict]:
    """对 ``rows`` 里的每种格式量一遍（``base`` 是 float32 的模型，不被修改）；返回每行一个字典。

    ``n_eval`` 只用留出集的前若干首诗算困惑度（默认全部）；``n_samples`` 个提示作诗。
    """
    from ..lm.quality import form_accuracy, quality_prompts, sample_poems, train_line_set, verbatim_line_rate

    inputs, targets = data[split]
    if n_eval is not None:
        inputs, targets = inputs[:n_eval], targets[:n_eval]
    prompts = quality_prompts(split, n_samples, seed)
    train_lines = train_line_set()
    probe = inputs[:64]
    reference = None
    table = []
    for name, weight_fmt, kv_fmt in rows:
        start = time.perf_counter()
        model = _prepare(base, weight_fmt, kv_fmt)
        held = tensor_bytes(model)
        rest_dtype = torch.bfloat16 if weight_fmt == "bf16" else torch.float32
        if held != weight_bytes(model, weight_fmt, rest_dtype):
            raise RuntimeError(f"{name}：张量占 {held} 字节，与公式 {weight_bytes(model, weight_fmt, rest_dtype)} 不符")
        logits, cache = _logits_through_cache(model, probe)
        per_token = cache.nbytes() // (probe.shape[0] * probe.shape[1])
        if per_token != kv_bytes_per_token(model.config, kv_fmt):
            raise RuntimeError(f"{name}：缓存每词元 {per_token} 字节，与公式 {kv_bytes_per_token(model.config, kv_fmt)} 不符")
        if reference is None:
            reference = logits
        keep = probe != PAD
        loss, ppl = perplexity_through_cache(model, inputs, targets)
        texts = sample_poems(model, tokenizer, prompts, temperature=temperature, seed=seed)
        form = form_accuracy(texts, [p[0] for p in prompts])
        table.append({
            "name": name, "weights": weight_fmt, "kv_cache": kv_fmt,
            "weight_bytes": held, "kv_bytes_per_token": per_token,
            "loss": loss, "perplexity": ppl,
            "form_accuracy": form, "form_accuracy_stderr": math.sqrt(form * (1 - form) / len(prompts)),
            "verbatim_line_rate": verbatim_line_rate(texts, train_lines),
            "max_abs_logit_diff_vs_first_row": float((logits - reference).abs()[keep].max()),
            "top1_agreement_vs_first_row": float((logits.argmax(-1) == reference.argmax(-1))[keep].float().mean()),
            "samples": texts[:4],
            "seconds": time.perf_counter() - start,
        })
    return table


def main(argv=None) -> int:
    from ..lm import load_poem_model, poem_data
    from ..measurement.benchmarking import machine_info, measurement_parser, measurement_record, parse_measurement_args, save_results

    p = measurement_parser("tformer_lib.quant.measure", "量化在随书唐诗模型上的代价：字节、困惑度、体裁正确率、背书率")
    p.add_argument("--samples", type=int, default=200, help="作诗的提示数")
    p.add_argument("--eval-poems", type=int, default=None, help="只用留出集的前若干首诗算困惑度（默认全部）")
    args = parse_measurement_args(p, argv)  # 测量之前就确认 --out 能写
    info = machine_info()
    start = time.perf_counter()
    model, tokenizer, _ = load_poem_model()
    table = measure_quantization(model, tokenizer, poem_data(), n_samples=args.samples, n_eval=args.eval_poems)
    result = {
        **measurement_record("tformer_lib.quant.measure", argv, info, start),
        "split": "test", "temperature": 0.8, "seed": 0, "n_samples": args.samples,
        "rows": table,
    }
    print(f"{'格式':<14}{'权重字节':>10}{'KV 字节/词元':>13}{'困惑度':>9}{'体裁正确':>9}{'背书率':>8}{'top-1 一致':>10}")
    for r in table:
        print(f"{r['name']:<14}{r['weight_bytes']:>10}{r['kv_bytes_per_token']:>13}{r['perplexity']:>9.2f}"
              f"{r['form_accuracy']:>9.3f}{r['verbatim_line_rate']:>8.3f}{r['top1_agreement_vs_first_row']:>10.4f}")
    if args.out:
        save_results(result, args.out)
        print(f"写入 {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
