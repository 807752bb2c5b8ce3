"""真实模型的账：LLaMA-2-7B / 70B 每种权重格式的字节、每词元 K/V 字节、一块 80 GB 显存能同时放几条会话。

纯公式（:mod:`~tformer_lib.quant.sizes` 作用在 :data:`~tformer_lib.lm.PRESETS` 的配置上），不造模型，几毫秒算完::

    python -m tformer_lib.quant.real_models --out tformer_lib/results/quant_real_models.json
"""

from __future__ import annotations

import torch

from ..lm import PRESETS
from .sizes import kv_bytes_per_token, parameter_count, sessions_per_memory, weight_bytes

__all__ = ["real_model_rows", "main"]


def real_model_rows(names=("llama-2-7b", "llama-2-70b"), *, context: int = 4096, memory_bytes: int = 80 * 10**9,
                    weight_formats=("bf16", "int8", "int4-g128"), kv_formats=("bf16", "int8")) -> list[dict]:
    """真实模型（:data:`~tformer_lib.lm.PRESETS`）每种权重格式的字节、每词元 K/V 字节，以及一块 ``memory_bytes``
    的显存能同时放几条长 ``context`` 的会话。未量化的参数按 bfloat16 计（这些模型发布时的格式）。纯公式，不造模型。"""
    rows = []
    for name in names:
        if name not in PRESETS:
            raise ValueError(f"没有名为 {name!r} 的预设；可选：{sorted(PRESETS)}")
        c = PRESETS[name]
        for fmt in weight_formats:
            rows.append({
                "model": name, "weights": fmt, "parameters": parameter_count(c),
                "weight_bytes": weight_bytes(c, fmt, torch.bfloat16),
                "kv_bytes_per_token": {kv: kv_bytes_per_token(c, kv) for kv in kv_formats},
                "sessions": {kv: sessions_per_memory(c, fmt, kv, context, memory_bytes) for kv in kv_formats},
                "context": context, "memory_bytes": memory_bytes,
            })
    return rows


def main(argv=None) -> int:
    """``python -m tformer_lib.quant.real_models [--out PATH] [--context 4096]``：打印（并写出）真实模型的字节与会话数。"""
    import argparse
    import sys

    from ..measurement.benchmarking import machine_info, save_results

    p = argparse.ArgumentParser(description="真实模型每种格式的权重字节、K/V 字节与每 80 GB 的会话数（纯公式）")
    p.add_argument("--out", default=None)
    p.add_argument("--context", type=int, default=4096)
    args = p.parse_args(argv)
    rows = real_model_rows(("llama-2-7b", "llama-2-70b"), context=args.context)
    print(f"{'模型':<13}{'权重':<11}{'权重 GB':>9}{'KV 字节/词元 bf16':>18}{'int8':>9}{'会话数 bf16 KV':>15}{'int8 KV':>9}")
    for r in rows:
        kv, s = r["kv_bytes_per_token"], r["sessions"]
        print(f"{r['model']:<13}{r['weights']:<11}{r['weight_bytes'] / 1e9:>9.2f}{kv['bf16']:>18}{kv['int8']:>9}"
              f"{s['bf16']:>15}{s['int8']:>9}")
    if args.out:
        info = machine_info()
        result = {"date": info["date"], "torch": info["torch"], "rows": rows,
                  "command": "python -m tformer_lib.quant.real_models " + " ".join(sys.argv[1:] if argv is None else argv),
                  "note": "纯公式（PRESETS 的 LMConfig）；未量化的参数按 bfloat16；会话数 = ⌊(80·10⁹ − 权重) / (K/V 字节/词元 × context)⌋，不计激活与框架开销"}
        save_results(result, args.out)
        print(f"写入 {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
