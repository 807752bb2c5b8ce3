"""第 9 章的实测：打包训练时要不要文档掩码（document masking）。

用法::

    python -m tformer_lib.experiments.document_masking --out tformer_lib/results/document_masking.json [--threads 1] [--seeds 0 1] [--steps 600]

两组（:data:`ARMS`），模型与数据都是随书配方（d_model 128、4 层、上下文 128、学习的位置嵌入、同一批打包的块），
同一个学习率调度，每个种子两组的初始化与取块顺序相同，只差训练时的掩码：

- ``packing``：今天的做法，块里只有因果掩码——后面的诗看得见前面的诗，位置编号接着往下数；
- ``document_mask``：:func:`~tformer_lib.lm.data.document_layout`——每首诗位置从 0 数、只看自己。

记录：

- 训练数据本身：多少首训练诗在块里从位置 0 开始（其余的在训练时从来不在位置 0 上出现）；
- 每 ``eval_every`` 步的验证损失，用第 9 章的评估（验证诗逐首补齐，每首从位置 0 开始）；
- 位置错配的探针：把前 :data:`TRAINING` ``["probe_poems"]`` 首验证诗按训练的方式打包，分“块里第一首”与“后面的几首”，
  各自比较同一批诗的两种读法——单独读（位置 0 起、没有前文）与打包读（只用因果掩码、看得见前面的诗）；
- 各组训练部分的 CPU 秒数（单线程时约等于机器空闲时的墙钟时间；质量数字与机器负载无关）。
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from ..lm.data import encode_documents, loss_targets, pack_documents, pad_documents, split_documents
from ..lm.model import make_lm
from ..lm.pretrained import POEM_RECIPE, poem_data, poem_model_config
from ..lm.training import LMTrainer
from ..seed import set_seed
from ..specials import BOS, PAD

__all__ = ["RESULTS_PATH", "ARMS", "ARM_LABELS", "TRAINING", "start_positions", "probe_losses",
           "measure_document_masking", "main"]

#: 随包附带的结果文件（第 9 章读它）
RESULTS_PATH = Path(__file__).resolve().parent.parent / "results" / "document_masking.json"

#: 组名 → ``LMTrainer(document_mask=…)``
ARMS = {"packing": False, "document_mask": True}
#: 表格里的中文名
ARM_LABELS = {"packing": "打包（只用因果掩码）", "document_mask": "打包 + 文档掩码"}

#: 训练设置（每组、每个种子相同；其余超参数取随书配方）
TRAINING = dict(steps=600, warmup=60, eval_every=200, probe_poems=600)


def start_positions(blocks: torch.Tensor) -> torch.Tensor:
    """打包的块 ``(N, L+1)`` 里每篇文档的起始位置（它的 BOS 在块里的下标），一维张量。"""
    inputs, _ = loss_targets(blocks)  # (N, L)：块的最后一个词元不作输入
    return (inputs == BOS).nonzero()[:, 1]  # (文档数,)


@torch.no_grad()
def _token_losses(model, inputs: torch.Tensor, targets: torch.Tensor, batch_size: int = 64) -> torch.Tensor:
    """每个位置的交叉熵 ``(N, L)``（只用因果掩码、位置 0..L-1；PAD 目标处为 0）。"""
    out = []
    for i in range(0, len(inputs), batch_size):
        logits = model(inputs[i : i + batch_size])  # (b, L, V)
        t = targets[i : i + batch_size]
        loss = F.cross_entropy(logits.flatten(0, 1), t.flatten(), ignore_index=PAD, reduction="none")  # (b·L,)
        out.append(loss.view(t.shape))  # (b, L)
    return torch.cat(out)  # (N, L)


@torch.no_grad()
def probe_losses(model, docs: list[list[int]], block_len: int) -> dict:
    """位置错配的探针：``docs`` 打包成块后，“块里第一首”与“后面的几首”两组诗各自的平均交叉熵（每个目标词元平均），
    分两种读法——``alone``：每首单独、位置 0 起（第 9 章的评估）；``packed``：整块送进去、只用因果掩码。"""
    model.eval()
    blocks = pack_documents(docs, block_len, seed=0)  # (N, block_len)
    inputs, targets = loss_targets(blocks)  # (N, L), (N, L)
    packed = _token_losses(model, inputs, targets)  # (N, L)
    sums = {(group, way): 0.0 for group in ("first", "later") for way in ("alone", "packed")}
    counts = {"first": 0, "later": 0}
    pieces, groups = [], []
    for row in range(len(inputs)):
        starts = (inputs[row] == BOS).nonzero().flatten().tolist() + [inputs.shape[1]]
        for k, (s, e) in enumerate(zip(starts, starts[1:])):
            group = "first" if k == 0 else "later"
            keep = targets[row, s:e] != PAD
            sums[group, "packed"] += float(packed[row, s:e][keep].sum())
            counts[group] += int(keep.sum())
            pieces.append(blocks[row, s : e + 1].tolist())  # 这首诗在块里的词元（含作目标的最后一个）
            groups.append(group)
    alone_inputs, alone_targets = loss_targets(pad_documents(pieces))  # (文档数, 最长)
    alone = _token_losses(model, alone_inputs, alone_targets)  # (文档数, 最长)
    for group, row in zip(groups, alone):
        sums[group, "alone"] += float(row.sum())
    return {f"{group}_{way}": sums[group, way] / max(1, counts[group]) for group, way in sums} | {
        "first_tokens": counts["first"], "later_tokens": counts["later"]}


def _train(arm: str, seed: int, data: dict, t: dict, probe_docs) -> dict:
    set_seed(seed)
    model = make_lm(poem_model_config(data["tokenizer"].vocab_size))
    r = POEM_RECIPE
    trainer = LMTrainer(model, data["train_blocks"], data["valid"], batch_size=r["batch_size"], lr=r["lr"],
                        warmup=t["warmup"], total_steps=t["steps"], min_lr_ratio=r["min_lr_ratio"],
                        weight_decay=r["weight_decay"], clip=r["clip"], seed=seed, eval_every=t["eval_every"],
                        progress=False, document_mask=ARMS[arm])
    trainer.fit()
    evals = [{"step": e["step"], "valid_loss": e["valid_loss"]} for e in trainer.history["evals"]]
    return {"arm": arm, "seed": seed, "evals": evals, "valid_loss": evals[-1]["valid_loss"],
            "train_cpu_seconds": trainer.cpu_seconds, "tokens_seen": trainer.tokens_seen,
            "probe": probe_losses(model, probe_docs, r["block_len"]), "train_loss": trainer.history["step_loss"]}


def measure_document_masking(seeds=(0, 1), steps: int | None = None, verbose: bool = False) -> dict:
    """训练每组、每个种子并量出上面列的各项；返回结果字典（不含机器记录）。``steps`` 缩短训练（测试用）。"""
    t = dict(TRAINING)
    if steps is not None:
        t.update(steps=steps, warmup=max(1, min(t["warmup"], steps // 10)), eval_every=max(1, steps // 3))
    data = poem_data()
    starts = start_positions(data["train_blocks"])
    probe_docs = encode_documents(split_documents("valid")[: t["probe_poems"]], data["tokenizer"])
    runs = []
    for seed in seeds:
        for arm in ARMS:
            runs.append(_train(arm, seed, data, t, probe_docs))
            if verbose:
                print(arm, seed, f"验证损失 {runs[-1]['valid_loss']:.4f}", runs[-1]["probe"], flush=True)
    return {
        "runs": runs,
        "train_documents": {"documents": len(starts), "blocks": len(data["train_blocks"]),
                            "share_at_position_0": float((starts == 0).float().mean()),
                            "mean_start": float(starts.float().mean()),
                            "median_start": float(starts.float().median())},
        "settings": {"training": t, "seeds": list(seeds), "arms": dict(ARMS), "recipe": POEM_RECIPE,
                     "valid_poems": len(data["valid"][0])},
    }


def main(argv=None) -> int:
    from ..measurement.benchmarking import machine_info, measurement_parser, measurement_record, parse_measurement_args, save_results

    p = measurement_parser("tformer_lib.experiments.document_masking",
                           "第 9 章：打包训练时只用因果掩码 vs 文档掩码，在唐诗上的实测")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    p.add_argument("--steps", type=int, default=None, help=f"训练步数（默认 {TRAINING['steps']}）")
    args = parse_measurement_args(p, argv)
    info = machine_info()
    start = time.perf_counter()
    result = measure_document_masking(seeds=tuple(args.seeds), steps=args.steps, verbose=True)
    result = {**measurement_record("tformer_lib.experiments.document_masking", argv, info, start), **result}
    for arm in ARMS:
        runs = [r for r in result["runs"] if r["arm"] == arm]
        print(f"{arm:<14} 验证损失 {statistics.fmean(r['valid_loss'] for r in runs):.4f}  "
              f"后面几首：单独读 {statistics.fmean(r['probe']['later_alone'] for r in runs):.4f}、"
              f"打包读 {statistics.fmean(r['probe']['later_packed'] for r in runs):.4f}  "
              f"训练 {statistics.fmean(r['train_cpu_seconds'] for r in runs):.0f} CPU 秒")
    if args.out:
        save_results(result, args.out)
        print(f"写入 {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
