"""第 17 章的实测表：底座 vs 全量微调 vs LoRA（r = 4/16/64）vs QLoRA，各 2 个种子，在一位诗人（杜甫）的诗上。

用法::

    python -m tformer_lib.finetune.measure --out tformer_lib/results/finetune.json [--threads 1] [--seeds 0 1]

两步：

1. **选学习率**（种子 0）：全量微调与 LoRA r=16 各试几个学习率，取目标诗人 valid 诗上困惑度最低的
   （QLoRA 用 LoRA 的学习率）；
2. **报告**：每种方法、每个种子在目标诗人的 test 诗上的困惑度（学到多少），其他诗人的 test 诗上的困惑度（忘了多少），
   可训练参数个数，一个训练步的中位时间（毫秒；同一台机器、同一次运行里依次量，受机器负载影响），以及
   模型状态的字节公式（:func:`~tformer_lib.finetune.finetune_memory`）。

全部在 CPU 上，约几分钟（单线程）。质量数字与机器负载无关，只有步时间有关。
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path


from .lora import trainable_parameters
from .memory import finetune_memory
from .poet import poet_data
from .train import FINETUNE_RECIPE, finetune_poet, finetune_scores

__all__ = ["RESULTS_PATH", "LR_CANDIDATES", "RANKS", "SAMPLE_PROMPTS", "measure_finetuning", "summarize", "main"]

#: 随包附带的结果文件（第 17 章读它）
RESULTS_PATH = Path(__file__).resolve().parent.parent / "results" / "finetune.json"

#: 第一步试的学习率
LR_CANDIDATES = {"full": (1e-4, 3e-4, 1e-3), "lora": (5e-4, 1e-3, 2e-3, 4e-3)}
#: LoRA 的秩
RANKS = (4, 16, 64)
#: 给读者“看一眼”的提示 (体裁, 题目, 首字)：种子 0 的每种方法各作一首（温度 0.8、采样种子 0）
SAMPLE_PROMPTS = (("五言律诗", "春望", ""), ("七言律诗", "登高", ""), ("五言绝句", "", "月"), ("七言绝句", "夜雨", ""))


def measure_finetuning(base, tokenizer, *, seeds=(0, 1), recipe: dict = FINETUNE_RECIPE, ranks=RANKS,
                       lr_candidates=LR_CANDIDATES) -> dict:
    """见模块说明；返回可写成 JSON 的字典（``lr_sweep``、``chosen_lr``、``rows``）。``base`` 不被修改。"""
    data = poet_data(tokenizer, recipe["author"])
    sweep = []
    for method, rank in (("full", None), ("lora", 16)):
        for lr in lr_candidates[method]:
            model, _ = finetune_poet(base, data, method, rank, seed=0, lr=lr, recipe=recipe)
            sweep.append({"method": method, "rank": rank, "lr": lr,
                          "target_valid_ppl": finetune_scores(model, data, ("target_valid",))["target_valid"]})
    chosen = {m: min((r for r in sweep if r["method"] == m), key=lambda r: r["target_valid_ppl"])["lr"]
              for m in ("full", "lora")}
    chosen["qlora"] = chosen["lora"]
    from ..lm.quality import sample_poems

    def samples(model):
        return sample_poems(model, tokenizer, SAMPLE_PROMPTS, temperature=0.8, seed=0)

    base_scores = finetune_scores(base, data)
    rows = [{"name": "base", "method": "base", "rank": None, "seed": None, "trainable": 0, **base_scores,
             "samples": samples(base)}]
    plan = [("full", None)] + [("lora", r) for r in ranks] + [("qlora", 16)]
    c = base.config
    for method, rank in plan:
        for seed in seeds:
            model, trainer = finetune_poet(base, data, method, rank, seed=seed, lr=chosen[method], recipe=recipe)
            lora_args = {} if method == "full" else {"rank": rank, "targets": recipe["targets"]}
            memory = finetune_memory(c, method, batch=recipe["batch_size"], length=c.max_len, **lora_args)
            rows.append({
                "name": "full" if method == "full" else f"{method}-r{rank}", "method": method, "rank": rank,
                "seed": seed, "lr": chosen[method], "trainable": trainable_parameters(model),
                **finetune_scores(model, data),
                "final_train_loss": trainer.history["step_loss"][-1],
                "ms_per_step": 1000 * trainer.seconds / trainer.step,  # 只算 fit 里的训练步
                "memory_formula": memory,
                **({"samples": samples(model)} if seed == seeds[0] else {}),
            })
    return {"author": recipe["author"], "recipe": {k: (list(v) if isinstance(v, tuple) else v) for k, v in recipe.items()},
            "train_blocks": list(data["train_blocks"].shape),
            "poems": {k: int(data[k][0].shape[0]) for k in ("target_valid", "target_test", "others_test")},
            "lr_sweep": sweep, "chosen_lr": chosen, "seeds": list(seeds),
            "sample_prompts": [list(p) for p in SAMPLE_PROMPTS], "rows": rows}


def summarize(result: dict) -> list[dict]:
    """每种方法一行：两个种子的均值与极差（max − min）。"""
    groups: dict[str, list[dict]] = {}
    for row in result["rows"]:
        groups.setdefault(row["name"], []).append(row)
    out = []
    for name, rows in groups.items():
        line = {"name": name, "trainable": rows[0]["trainable"], "n": len(rows)}
        for key in ("target_test", "others_test", "ms_per_step"):
            values = [r[key] for r in rows if key in r]
            if values:
                line[key] = statistics.fmean(values)
                line[key + "_range"] = max(values) - min(values)
        out.append(line)
    return out


def main(argv=None) -> int:
    from ..lm import load_poem_model
    from ..measurement.benchmarking import machine_info, measurement_parser, measurement_record, parse_measurement_args, save_results

    p = measurement_parser("tformer_lib.finetune.measure", "第 17 章：全量微调 vs LoRA vs QLoRA 在一位诗人上的实测")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    args = parse_measurement_args(p, argv)  # 测量之前就确认 --out 能写
    info = machine_info()
    start = time.perf_counter()
    base, tokenizer, _ = load_poem_model()
    result = measure_finetuning(base, tokenizer, seeds=tuple(args.seeds))
    result = {**measurement_record("tformer_lib.finetune.measure", argv, info, start), **result}
    print("选出的学习率：", result["chosen_lr"])
    print(f"{'方法':<10}{'可训练参数':>11}{'目标 test 困惑度':>16}{'其他诗人 test':>14}{'ms/步':>8}")
    for line in summarize(result):
        print(f"{line['name']:<10}{line['trainable']:>11}{line['target_test']:>16.2f}{line['others_test']:>14.2f}"
              f"{line.get('ms_per_step', float('nan')):>8.0f}")
    if args.out:
        save_results(result, args.out)
        print(f"写入 {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
