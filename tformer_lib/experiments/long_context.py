"""第 16 章的实测：在 64 个词元上训练的唐诗模型，读 128 与 256 个词元时困惑度随位置怎么变。

用法::

    python -m tformer_lib.experiments.long_context --out tformer_lib/results/long_context.json [--threads 1] [--seeds 0 1]

两种基础模型（随书配方的大小：d_model 128、4 层），都在首尾相接的唐诗词元流（:func:`~tformer_lib.lm.stream_blocks`）
上以上下文 :data:`TRAIN_LEN` = 64 训练，同一批数据、同一个学习率调度：

- ``rope``：旋转位置编码；读长序列时比较 :data:`ZERO_SHOT` 里的几种办法——不缩放、位置插值（PI）、NTK-aware、YaRN，
  缩放倍数 s = 评测长度 / 64，不再训练；
- ``alibi``：ALiBi，不做任何改动直接读长序列。

再从每个 ``rope`` 模型出发，在 256 长的块上各微调 :data:`FINETUNE` 的步数（:data:`FINETUNED`）：不缩放（对照：
只是“见过长序列”）、PI 与 YaRN（s = 4）。评测在验证集的词元流切成的 65 / 129 / 257 长的块上，记录每个位置的平均交叉熵。

唐诗一首只有几十个字，长窗口里是好几首互不相干的诗：这个实验量的是“读过训练长度之后模型还稳不稳”
（困惑度是否随位置爆炸），量不出“模型能不能利用远处的内容”——那需要远处确实有用的数据与大得多的模型。
"""

from __future__ import annotations

import dataclasses
import math
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from ..lm.data import encode_documents, loss_targets, split_documents, stream_blocks
from ..lm.model import make_lm
from ..lm.pretrained import POEM_RECIPE, poem_data, poem_model_config
from ..lm.training import LMTrainer
from ..parts.rope_scaling import RopeScaling
from ..seed import set_seed
from ..specials import PAD

__all__ = ["RESULTS_PATH", "TRAIN_LEN", "EVAL_LENS", "BASES", "ZERO_SHOT", "FINETUNED", "LONG_TRAINING", "FINETUNE",
           "METHOD_LABELS", "RANGES", "scaled_model", "position_losses", "range_losses", "measure_long_context", "summary",
           "main"]

#: 随包附带的结果文件（第 16 章读它）
RESULTS_PATH = Path(__file__).resolve().parent.parent / "results" / "long_context.json"

TRAIN_LEN = 64  # 训练时的上下文长度 L
EVAL_LENS = (64, 128, 256)  # 评测长度：L、2L、4L
BASES = ("rope", "alibi")  # 从头训练的两种模型
ZERO_SHOT = ("none", "linear", "ntk", "yarn")  # rope 模型不再训练时读长序列的办法（"none" = 不缩放）
FINETUNED = ("none", "linear", "yarn")  # 在 4L 上微调时用的缩放（s = 4）
#: 图表里的中文名
METHOD_LABELS = {"rope/none": "RoPE 不缩放", "rope/linear": "RoPE + PI", "rope/ntk": "RoPE + NTK-aware",
                 "rope/yarn": "RoPE + YaRN", "alibi": "ALiBi",
                 "ft/none": "RoPE 在 256 上微调", "ft/linear": "PI + 微调", "ft/yarn": "YaRN + 微调"}
#: 汇总用的位置区间：训练见过的、2 倍、4 倍
RANGES = ((0, 64), (64, 128), (128, 256))

#: 从头训练的设置（每种模型、每个种子相同）：每步 32 × 64 = 2048 个词元
LONG_TRAINING = dict(steps=600, batch_size=32, lr=3e-3, warmup=60, min_lr_ratio=0.1, weight_decay=0.1, clip=1.0)
#: 在 256 长的块上微调：每步 8 × 256 = 2048 个词元
FINETUNE = dict(steps=100, batch_size=8, lr=1e-3, warmup=10, min_lr_ratio=0.1, weight_decay=0.1, clip=1.0)
MAX_LEN = max(EVAL_LENS)  # 模型的 max_len（RoPE 与 ALiBi 没有位置参数，它只限制位置编号）


def _config(base: str, vocab_size: int, scaling: RopeScaling | None = None):
    if base not in BASES:
        raise ValueError(f"base 应是 {BASES} 之一，收到 {base!r}")
    return poem_model_config(vocab_size, POEM_RECIPE, positional=base, max_len=MAX_LEN, rope_scaling=scaling)


def scaled_model(model, kind: str, factor: float, original_max_len: int = TRAIN_LEN):
    """同一组权重、换一种 RoPE 缩放的新模型（eval 模式，dtype 与设备同 ``model``）；``model`` 本身不变。

    ``kind`` 是 :data:`ZERO_SHOT` 之一（``"none"`` 不缩放）；``factor`` = s ≥ 1，s = 1 也是不缩放；
    ``original_max_len``：YaRN 要的训练长度 L（默认本实验的 :data:`TRAIN_LEN`）。
    """
    if model.config.positional != "rope":
        raise ValueError(f"只有 RoPE 模型能缩放，收到 positional={model.config.positional!r}")
    if kind not in ZERO_SHOT:
        raise ValueError(f"kind 应是 {ZERO_SHOT} 之一，收到 {kind!r}")
    if isinstance(factor, bool) or not isinstance(factor, (int, float)) or not math.isfinite(factor) or factor < 1:
        raise ValueError(f"factor 应是 ≥ 1 的有限数，收到 {factor!r}")
    scaling = None if kind == "none" or factor == 1 else RopeScaling(
        kind, factor, original_max_len=original_max_len if kind == "yarn" else None)
    weight = model.lm_head.weight
    twin = make_lm(dataclasses.replace(model.config, rope_scaling=scaling)).to(device=weight.device, dtype=weight.dtype)
    twin.load_state_dict(model.state_dict())
    return twin.eval()


@torch.no_grad()
def position_losses(model, blocks: torch.Tensor, batch_size: int = 16) -> list[float]:
    """``blocks`` ``(N, L+1)`` 上每个位置的平均交叉熵（长 L 的列表；目标是 PAD 或 BOS 的不计，一个都没有的位置是 NaN）。"""
    model.eval()
    total = count = None
    for i in range(0, len(blocks), batch_size):
        inputs, targets = loss_targets(blocks[i : i + batch_size])  # (b, L), (b, L)
        logits = model(inputs)  # (b, L, V)
        ce = F.cross_entropy(logits.transpose(1, 2), targets, ignore_index=PAD, reduction="none")  # (b, L)
        keep = targets != PAD  # (b, L)
        s, n = ce.double().sum(0), keep.sum(0).double()  # (L,), (L,)
        total, count = (s, n) if total is None else (total + s, count + n)
    return torch.where(count > 0, total / count.clamp(min=1), torch.nan).tolist()


def range_losses(losses, ranges=RANGES) -> dict[str, float]:
    """``position_losses`` 在每个位置区间 ``[a, b)`` 上的平均（NaN 的位置不计；区间超出长度的不列）。"""
    out = {}
    for a, b in ranges:
        if not 0 <= a < b:
            raise ValueError(f"ranges 里的区间应满足 0 ≤ a < b，收到 ({a}, {b})")
        if b <= len(losses):
            counted = [x for x in losses[a:b] if not math.isnan(x)]
            out[f"{a}-{b}"] = sum(counted) / len(counted) if counted else math.nan
    return out


def _trainer(model, blocks, t: dict, seed: int) -> LMTrainer:
    return LMTrainer(model, blocks, None, batch_size=t["batch_size"], lr=t["lr"], warmup=t["warmup"],
                     total_steps=t["steps"], min_lr_ratio=t["min_lr_ratio"], weight_decay=t["weight_decay"],
                     clip=t["clip"], seed=seed, progress=False)


def _train(model, blocks, t: dict, seed: int) -> list[float]:
    trainer = _trainer(model, blocks, t, seed)
    while trainer.step < t["steps"]:
        trainer.train_step()
    model.eval()
    return trainer.history["step_loss"]


def measure_long_context(seeds=(0, 1), steps: int | None = None, finetune_steps: int | None = None,
                         valid_blocks: int | None = None, verbose: bool = False) -> dict:
    """训练、微调并评测上面列的每一组；返回结果字典（不含机器记录）。``steps`` 等缩短实验（测试用）。"""
    t, ft = dict(LONG_TRAINING), dict(FINETUNE)
    if steps is not None:
        t.update(steps=steps, warmup=max(1, min(t["warmup"], steps // 10)))
    if finetune_steps is not None:
        ft.update(steps=finetune_steps, warmup=max(1, min(ft["warmup"], finetune_steps // 10)))
    tokenizer = poem_data()["tokenizer"]
    train_docs = encode_documents(split_documents("train"), tokenizer)
    valid_docs = encode_documents(split_documents("valid"), tokenizer)
    train = {n: stream_blocks(train_docs, n + 1, seed=0) for n in (TRAIN_LEN, MAX_LEN)}
    valid = {n: stream_blocks(valid_docs, n + 1, seed=0)[:valid_blocks] for n in EVAL_LENS}
    runs, evals = [], []

    def record(seed, method, length, model):
        losses = position_losses(model, valid[length])
        evals.append({"seed": seed, "method": method, "eval_len": length, "position_loss": losses,
                      "ranges": range_losses(losses)})
        if verbose:
            print(seed, method, length, {k: round(v, 3) for k, v in evals[-1]["ranges"].items()}, flush=True)

    for seed in seeds:
        models = {}
        for base in BASES:
            set_seed(seed)
            models[base] = make_lm(_config(base, tokenizer.vocab_size))
            runs.append({"seed": seed, "arm": base, "stage": "train", "step_loss": _train(models[base], train[TRAIN_LEN], t, seed)})
        for length in EVAL_LENS:
            record(seed, "alibi", length, models["alibi"])
            for kind in ZERO_SHOT:
                if length == TRAIN_LEN and kind != "none":
                    continue  # s = 1：与不缩放相同
                record(seed, f"rope/{kind}", length, scaled_model(models["rope"], kind, length / TRAIN_LEN))
        for kind in FINETUNED:
            tuned = scaled_model(models["rope"], kind, MAX_LEN / TRAIN_LEN)
            runs.append({"seed": seed, "arm": f"ft/{kind}", "stage": "finetune",
                         "step_loss": _train(tuned, train[MAX_LEN], ft, seed)})
            for length in EVAL_LENS:
                record(seed, f"ft/{kind}", length, tuned)
    return {"runs": runs, "evals": evals,
            "settings": {"train_len": TRAIN_LEN, "eval_lens": list(EVAL_LENS), "training": t, "finetune": ft,
                         "seeds": list(seeds), "valid_blocks": {str(n): len(b) for n, b in valid.items()},
                         "ranges": [list(r) for r in RANGES], "model": _config("rope", tokenizer.vocab_size).to_dict()}}


def summary(result: dict, eval_len: int = MAX_LEN) -> dict[str, dict[str, float]]:
    """每组在评测长度 ``eval_len`` 上各位置区间的困惑度（各种子的平均交叉熵取 exp）。"""
    if eval_len not in EVAL_LENS:
        raise ValueError(f"eval_len 应是 {EVAL_LENS} 之一，收到 {eval_len!r}")
    out: dict[str, dict[str, float]] = {}
    for e in result["evals"]:
        if e["eval_len"] != eval_len:
            continue
        for r, loss in e["ranges"].items():
            out.setdefault(e["method"], {}).setdefault(r, []).append(loss)
    ppl = lambda loss: math.exp(loss) if loss < 700 else math.inf  # noqa: E731  exp(>709) 在 float 里溢出
    return {m: {r: ppl(sum(v) / len(v)) for r, v in rs.items()} for m, rs in out.items()}


def main(argv=None) -> int:
    from ..measurement.benchmarking import machine_info, measurement_parser, measurement_record, parse_measurement_args, save_results

    p = measurement_parser("tformer_lib.experiments.long_context", "第 16 章：在 64 上训练的模型读 128 与 256 个词元")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    p.add_argument("--steps", type=int, default=None, help=f"训练步数（默认 {LONG_TRAINING['steps']}）")
    args = parse_measurement_args(p, argv)
    info = machine_info()
    start = time.perf_counter()
    result = measure_long_context(seeds=tuple(args.seeds), steps=args.steps, verbose=True)
    result = {**measurement_record("tformer_lib.experiments.long_context", argv, info, start), **result}
    for method, ranges in summary(result).items():
        print(f"{method:<12}", "  ".join(f"{r}: {v:8.2f}" for r, v in ranges.items()))
    if args.out:
        save_results(result, args.out)
        print(f"写入 {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
