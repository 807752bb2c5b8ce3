"""第 16 章的实测：唐诗模型的稠密 FFN vs 同样“激活参数”的混合专家，各 2 个种子。

用法::

    python -m tformer_lib.experiments.moe --out tformer_lib/results/moe.json [--threads 1] [--seeds 0 1] [--steps 600]

三组（:data:`MOE_ARMS`），模型其余部分与随书配方相同（d_model 128、4 层、上下文 128），同一批数据、同一个学习率调度：

- ``dense``：每块一个 d_ff = 512 的 FFN；
- ``top1``：4 个 d_ff = 512 的专家，每个词元走 1 个（Switch Transformer 的做法：不重新归一，容量因子 1.25）——
  每个词元的 FFN 计算与稠密相同，FFN 参数是 4 倍；
- ``top2_fine``：8 个 d_ff = 256 的专家，每个词元走 2 个（细粒度专家，DeepSeek-MoE 的思路）——激活的 FFN 参数仍与稠密相同。

记录：每 ``eval_every`` 步的验证损失；训练中每 ``load_every`` 步各层各专家收到的任务份额（负载）与丢弃率；
训完后把容量因子换成 :data:`CAPACITY_FACTORS` 中的每个值（训练模式、不求梯度），在打包好的验证块上量丢弃率与损失；
各组训练一步的中位时间（同一次运行里交替计时，受机器负载影响；质量数字与负载无关）。
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

import torch

from ..lm.data import encode_documents, loss_targets, pack_documents, split_documents
from ..lm.model import make_lm
from ..lm.pretrained import POEM_RECIPE, poem_data, poem_model_config
from ..lm.training import LMTrainer
from ..seed import set_seed
from ..specials import PAD
from ..translation.model import count_parameters

__all__ = ["RESULTS_PATH", "MOE_ARMS", "MOE_LABELS", "MOE_TRAINING", "CAPACITY_FACTORS", "moe_arm_config",
           "active_parameters", "evaluate_with_capacity", "measure_moe", "main"]

#: 随包附带的结果文件（第 16 章读它）
RESULTS_PATH = Path(__file__).resolve().parent.parent / "results" / "moe.json"

#: 组名 → 相对随书配方的改动
MOE_ARMS: dict[str, dict] = {
    "dense": {},
    "top1": dict(moe_experts=4, moe_top_k=1, moe_renormalize=False, moe_capacity_factor=1.25),
    "top2_fine": dict(moe_experts=8, moe_top_k=2, d_ff=256, moe_capacity_factor=1.25),
}
#: 图表里的中文名
MOE_LABELS = {"dense": "稠密 FFN", "top1": "4 专家 · top-1", "top2_fine": "8 个半宽专家 · top-2"}

#: 训练设置（每组、每个种子相同）
MOE_TRAINING = dict(steps=600, batch_size=16, lr=3e-3, warmup=60, min_lr_ratio=0.1, weight_decay=0.1, clip=1.0,
                    eval_every=100, load_every=20, valid_poems=400)

#: 训完后量丢弃率用的容量因子
CAPACITY_FACTORS = (0.5, 0.75, 1.0, 1.25, 1.5, 2.0)


def moe_arm_config(arm: str, vocab_size: int):
    """组 ``arm`` 的 :class:`~tformer_lib.lm.LMConfig`：随书配方 + 这一组的改动。"""
    if arm not in MOE_ARMS:
        raise ValueError(f"arm 应是 {tuple(MOE_ARMS)} 之一，收到 {arm!r}")
    return poem_model_config(vocab_size, POEM_RECIPE, **MOE_ARMS[arm])


def active_parameters(model) -> int:
    """每个词元实际用到的参数：总参数减去每层没被选中的 E − k 个专家（共享专家、路由器、注意力都算在内）。"""
    total = count_parameters(model)
    for layer in model.moe_layers():
        per_expert = count_parameters(layer.experts[0])
        total -= (layer.n_experts - layer.top_k) * per_expert
    return total


def _valid_blocks(tokenizer, n_poems: int, block_len: int) -> torch.Tensor:
    """验证集的前 ``n_poems`` 首诗打包成与训练相同的块（测丢弃率：块里几乎没有 PAD，与训练时的组一样大）。"""
    docs = encode_documents(split_documents("valid")[:n_poems], tokenizer)
    return pack_documents(docs, block_len, seed=0)


def _layer_shares(model) -> list[list[float]]:
    return [(m.last.load.double() / max(1, int(m.last.load.sum()))).tolist() for m in model.moe_layers()]


@torch.no_grad()
def evaluate_with_capacity(model, blocks: torch.Tensor, factor: float, batch_size: int) -> dict:
    """训练模式（容量生效）下、不求梯度，按训练时的批大小过一遍 ``blocks``：丢弃率与平均交叉熵。"""
    layers = model.moe_layers()
    saved = [m.capacity_factor for m in layers]
    model.train()
    dropped = assignments = 0
    total, count = 0.0, 0
    try:
        for m in layers:
            m.capacity_factor = factor
        for i in range(0, len(blocks), batch_size):
            inputs, targets = loss_targets(blocks[i : i + batch_size])  # (b, L), (b, L)
            logits = model(inputs)  # (b, L, V)
            total += float(torch.nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten(), ignore_index=PAD,
                                                             reduction="sum"))
            count += int((targets != PAD).sum())
            dropped += sum(m.last.dropped for m in layers)
            assignments += sum(m.last.assignments for m in layers)
    finally:
        for m, cf in zip(layers, saved):
            m.capacity_factor = cf
        model.eval()
    return {"capacity_factor": factor, "drop_rate": dropped / max(1, assignments), "valid_loss": total / max(1, count)}


def _train(arm: str, seed: int, data: dict, valid, t: dict) -> tuple[dict, object]:
    set_seed(seed)
    model = make_lm(moe_arm_config(arm, data["tokenizer"].vocab_size))
    trainer = LMTrainer(model, data["train_blocks"], valid, batch_size=t["batch_size"], lr=t["lr"], warmup=t["warmup"],
                        total_steps=t["steps"], min_lr_ratio=t["min_lr_ratio"], weight_decay=t["weight_decay"],
                        clip=t["clip"], seed=seed, eval_every=t["eval_every"], progress=False)
    evals = [{"step": 0, "valid_loss": trainer.evaluate()["valid_loss"]}]
    load, window = [], []
    while trainer.step < t["steps"]:
        trainer.train_step()
        if model.moe_layers():
            window.append((_layer_shares(model), sum(m.last.dropped for m in model.moe_layers()),
                           sum(m.last.assignments for m in model.moe_layers())))
            if trainer.step % t["load_every"] == 0:
                layers = len(window[0][0])
                shares = [[statistics.fmean(w[0][i][e] for w in window) for e in range(len(window[0][0][i]))]
                          for i in range(layers)]
                load.append({"step": trainer.step, "shares": shares,
                             "drop_rate": sum(w[1] for w in window) / max(1, sum(w[2] for w in window))})
                window = []
        if trainer.step % t["eval_every"] == 0 or trainer.step == t["steps"]:
            evals.append({"step": trainer.step, "valid_loss": trainer.evaluate()["valid_loss"]})
    return {"arm": arm, "seed": seed, "evals": evals, "load": load, "train_loss": trainer.history["step_loss"]}, model


def _step_times(models: dict, blocks: torch.Tensor, batch_size: int, rounds: int = 5) -> dict[str, float]:
    """各组训练一步（前向 + 反向 + AdamW）的中位毫秒数，交替计时。"""
    from ..measurement.benchmarking import interleaved_samples

    trainers = {arm: LMTrainer(m, blocks, None, batch_size=batch_size, total_steps=10_000, progress=False)
                for arm, m in models.items()}
    samples = interleaved_samples({arm: tr.train_step for arm, tr in trainers.items()}, rounds=rounds)
    return {arm: 1000 * statistics.median(v) for arm, v in samples.items()}


def measure_moe(seeds=(0, 1), steps: int | None = None, arms=tuple(MOE_ARMS), verbose: bool = False) -> dict:
    """训练每组、每个种子并量出上面列的各项；返回结果字典（不含机器记录）。``steps`` 缩短训练（测试用）。"""
    t = dict(MOE_TRAINING)
    if steps is not None:
        t.update(steps=steps, warmup=max(1, min(t["warmup"], steps // 10)), eval_every=max(1, steps // 2),
                 load_every=max(1, steps // 4))
    data = poem_data()
    valid = tuple(x[: t["valid_poems"]] for x in data["valid"])
    blocks = _valid_blocks(data["tokenizer"], t["valid_poems"], POEM_RECIPE["block_len"])
    runs, capacity, last = [], [], {}
    for arm in arms:
        for seed in seeds:
            run, model = _train(arm, seed, data, valid, t)
            runs.append(run)
            last[arm] = model
            if model.moe_layers():
                for factor in CAPACITY_FACTORS:
                    capacity.append({"arm": arm, "seed": seed, **evaluate_with_capacity(model, blocks, factor, t["batch_size"])})
            if verbose:
                print(arm, seed, run["evals"][-1], flush=True)
    info = {arm: {"parameters": count_parameters(m), "active_parameters": active_parameters(m),
                  "config": m.config.to_dict()} for arm, m in last.items()}
    for arm, ms in _step_times(last, data["train_blocks"], t["batch_size"]).items():
        info[arm]["ms_per_step"] = ms
    return {"runs": runs, "capacity": capacity, "arms": info,
            "settings": {"training": t, "seeds": list(seeds), "arms": list(arms), "capacity_factors": list(CAPACITY_FACTORS),
                         "valid_blocks": len(blocks)}}


def main(argv=None) -> int:
    from ..measurement.benchmarking import machine_info, measurement_parser, measurement_record, parse_measurement_args, save_results

    p = measurement_parser("tformer_lib.experiments.moe", "第 16 章：稠密 FFN vs 混合专家（同样的激活参数）在唐诗上的实测")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    p.add_argument("--steps", type=int, default=None, help=f"训练步数（默认 {MOE_TRAINING['steps']}）")
    args = parse_measurement_args(p, argv)
    info = machine_info()
    start = time.perf_counter()
    result = measure_moe(seeds=tuple(args.seeds), steps=args.steps, verbose=True)
    result = {**measurement_record("tformer_lib.experiments.moe", argv, info, start), **result}
    for arm, a in result["arms"].items():
        final = [r["evals"][-1]["valid_loss"] for r in result["runs"] if r["arm"] == arm]
        print(f"{arm:<10} 参数 {a['parameters']:>9,}  激活 {a['active_parameters']:>9,}  "
              f"验证损失 {statistics.fmean(final):.4f}  {a['ms_per_step']:.0f} ms/步")
    if args.out:
        save_results(result, args.out)
        print(f"写入 {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
