"""第 10 章的对比实验：现代大模型的结构改动，逐项换进同一个唐诗小模型里训练、计时、数参数。

每一组（arm）只改 :data:`~tformer_lib.lm.pretrained.POEM_RECIPE` 的一项（见 :data:`VARIANT_ARMS`），
其余完全相同：同一批数据、同一个学习率调度、同样的步数；每组 2 个种子。为了在 2 核 CPU 上几分钟内
跑完，模型比随书检查点小（:data:`VARIANT_MODEL`：d_model 64、2 层），步数也少——它能说明“训练是否
稳定、参数和 K/V 缓存省了多少、速度差多少”，说明不了“在大模型上谁的最终效果更好”（第 10 章的正文照此措辞）。

:func:`run_variant_comparison` 训练并返回结果；:func:`write_variant_results` 单线程运行它，把结果连同命令、
机器、线程数、torch 版本与日期写进 JSON；随包附带的 ``results/lm_variants.json`` 就是这样生成的::

    .venv/bin/python -m tformer_lib.experiments.modern_variants

只重测吞吐（训练记录不变，几十秒）加 ``--speed-only``；只重做预热消融（:data:`WARMUP_ARMS`，几分钟）加 ``--warmup-only``。
:func:`load_variant_results` 读回它（第 10 章用它画图，笔记本里不必再训练 16 个模型）。
"""

from __future__ import annotations

import contextlib
import os
import statistics
import time
from pathlib import Path

import torch

from ..lm.model import make_lm
from ..lm.pretrained import POEM_RECIPE, poem_data, poem_model_config
from ..lm.training import LMTrainer
from ..measurement.benchmarking import machine_info, read_results, save_results
from ..seed import set_seed
from ..training.trainer import TrainingDivergedError
from ..translation.model import count_parameters

__all__ = [
    "SPEED_ROUNDS",
    "VARIANT_ARMS",
    "VARIANT_LABELS",
    "VARIANT_MODEL",
    "VARIANT_TRAINING",
    "VARIANT_RESULTS",
    "variant_config",
    "kv_cache_bytes_per_token",
    "run_variant_comparison",
    "write_variant_results",
    "remeasure_variant_speed",
    "WARMUP_ARMS",
    "run_warmup_ablation",
    "add_warmup_runs",
    "load_variant_results",
]

#: 随包附带的结果文件
VARIANT_RESULTS = Path(__file__).resolve().parent.parent / "results" / "lm_variants.json"

#: 对比用的小模型：在随书配方的模型配置上再覆盖这几项
VARIANT_MODEL = dict(d_model=64, n_heads=4, n_layers=2, d_ff=256)

#: 计时的轮数：每轮每组跑 3 步，吞吐取各轮的中位数，图上的误差线是各轮的最小到最大
SPEED_ROUNDS = 9

#: 训练设置（每组、每个种子相同）
VARIANT_TRAINING = dict(steps=200, batch_size=8, lr=3e-3, warmup=20, min_lr_ratio=0.1, weight_decay=0.1, clip=1.0,
                        eval_every=50, valid_poems=300)

#: 组名 → 相对基线改动的配置项。SwiGLU 的 d_ff 取 2/3，使 FFN 参数量与 GELU 的基本相同（LLaMA 的做法）
VARIANT_ARMS: dict[str, dict] = {
    "baseline": {},
    "post_ln": {"norm_first": False},
    "rmsnorm": {"norm": "rms"},
    "swiglu": {"activation": "swiglu", "d_ff": VARIANT_MODEL["d_ff"] * 2 // 3},
    "rope": {"positional": "rope"},
    "gqa": {"n_kv_heads": 2},
    "mqa": {"n_kv_heads": 1},
    "untied": {"tie_embeddings": False},
}

#: 图里用的中文名
VARIANT_LABELS = {
    "baseline": "基线（pre-LN）",
    "post_ln": "post-LN",
    "rmsnorm": "RMSNorm",
    "swiglu": "SwiGLU",
    "rope": "RoPE",
    "gqa": "GQA（2 组 K/V）",
    "mqa": "MQA（1 组 K/V）",
    "untied": "不共享输出层",
    "baseline_no_warmup": "基线，不预热",
    "post_ln_no_warmup": "post-LN，不预热",
}

#: 预热消融：组名 → (结构组名, 训练设置的改动)。warmup=1 即第一步就用峰值学习率（不预热）
WARMUP_ARMS: dict[str, tuple[str, dict]] = {
    "baseline_no_warmup": ("baseline", {"warmup": 1}),
    "post_ln_no_warmup": ("post_ln", {"warmup": 1}),
}


def variant_config(arm: str, vocab_size: int):
    """组 ``arm`` 的 :class:`~tformer_lib.lm.LMConfig`：随书配方 + :data:`VARIANT_MODEL` + 这一组的改动。"""
    if arm not in VARIANT_ARMS:
        raise ValueError(f"arm 应是 {tuple(VARIANT_ARMS)} 之一，收到 {arm!r}")
    return poem_model_config(vocab_size, POEM_RECIPE, **{**VARIANT_MODEL, **VARIANT_ARMS[arm]})


@torch.no_grad()
def kv_cache_bytes_per_token(model, length: int = 8) -> float:
    """真的用模型的 K/V 缓存（:class:`~tformer_lib.lm.LMCache`）走 ``length`` 个词元，量出每个词元占多少字节。"""
    was_training = model.training
    model.eval()
    try:
        cache = model.new_cache()
        model(torch.full((1, length), 4, dtype=torch.long), cache=cache)
        return cache.nbytes() / length
    finally:
        model.train(was_training)


def _speed(models: dict, blocks: torch.Tensor, batch_size: int, rounds: int = SPEED_ROUNDS,
           steps: int = 3) -> dict[str, list[float]]:
    """交替（interleaved）计时各组的训练步（前向 + 反向 + AdamW）：每组每轮跑 ``steps`` 步，返回各轮的 tokens/s。"""
    from ..lm.data import loss_targets
    from ..specials import PAD

    out: dict[str, list[float]] = {arm: [] for arm in models}
    trainers = {arm: LMTrainer(m, blocks, None, batch_size=batch_size, total_steps=10_000) for arm, m in models.items()}
    for tr in trainers.values():
        tr.train_step()  # 热身
    for _ in range(rounds):
        for arm, tr in trainers.items():
            start = time.perf_counter()
            tokens = 0
            for _ in range(steps):
                tokens += int((loss_targets(tr.batch(tr.step))[1] != PAD).sum())
                tr.train_step()
            out[arm].append(tokens / (time.perf_counter() - start))
    return out


def _cost_rows(arms, vocab: int, blocks: torch.Tensor, batch_size: int) -> dict[str, dict]:
    """每组的代价：参数量、每个词元的 K/V 缓存字节数（float32）、训练吞吐（各轮的 tokens/s 及其中位数）。"""
    models, info = {}, {}
    for arm in arms:
        set_seed(0)
        models[arm] = make_lm(variant_config(arm, vocab))
        info[arm] = {"parameters": count_parameters(models[arm]),
                     "kv_bytes_per_token": kv_cache_bytes_per_token(models[arm]),
                     "config": models[arm].config.to_dict()}
    speed = _speed(models, blocks, batch_size)
    for arm in arms:
        info[arm]["tokens_per_second"] = statistics.median(speed[arm])
        info[arm]["tokens_per_second_rounds"] = speed[arm]
    return info


def _train_runs(specs: dict[str, tuple[str, dict]], seeds, data: dict, verbose: bool = False) -> list[dict]:
    """``specs``：组名 → (结构组名, 训练设置)。每组、每个种子训练一个模型，返回评估记录。"""
    runs = []
    vocab = data["tokenizer"].vocab_size
    for arm, (structure, t) in specs.items():
        valid = tuple(x[: t["valid_poems"]] for x in data["valid"])
        for seed in seeds:
            set_seed(seed)
            model = make_lm(variant_config(structure, vocab))
            trainer = LMTrainer(model, data["train_blocks"], valid, batch_size=t["batch_size"], lr=t["lr"],
                                warmup=t["warmup"], total_steps=t["steps"], min_lr_ratio=t["min_lr_ratio"],
                                weight_decay=t["weight_decay"], clip=t["clip"], seed=seed,
                                eval_every=t["eval_every"], progress=False)
            diverged = None
            evals = [{"step": 0, "valid_loss": trainer.evaluate()["valid_loss"]}]  # 未训练：约 ln V
            try:
                trainer.fit()
            except TrainingDivergedError:
                diverged = trainer.step + 1
            evals += [{"step": e["step"], "valid_loss": e["valid_loss"]} for e in trainer.history["evals"]]
            runs.append({"arm": arm, "seed": seed, "evals": evals, "diverged_at": diverged,
                         "train_loss": trainer.history["step_loss"]})
            if verbose:
                print(arm, seed, evals[-1] if evals else None, diverged, flush=True)
    return runs


def run_warmup_ablation(seeds=(0, 1), verbose: bool = False) -> dict:
    """预热消融：pre-LN 基线与 post-LN 各用 :data:`WARMUP_ARMS` 的训练设置（不预热）再训练一遍。

    返回 ``{"runs": [...], "warmup_arms": {...}}``；与结果文件里预热 20 步的同名结构组对照。
    """
    seeds = list(seeds) if isinstance(seeds, (list, tuple)) else seeds
    if not isinstance(seeds, list) or not seeds or any(isinstance(x, bool) or not isinstance(x, int) for x in seeds):
        raise ValueError(f"seeds 应是非空的整数列表或元组，收到 {seeds!r}")
    data = poem_data()
    specs = {arm: (structure, {**VARIANT_TRAINING, **change}) for arm, (structure, change) in WARMUP_ARMS.items()}
    runs = _train_runs(specs, seeds, data, verbose)
    return {"runs": runs, "warmup_arms": {arm: {"structure": st, "training": change}
                                          for arm, (st, change) in WARMUP_ARMS.items()}}


def run_variant_comparison(arms=tuple(VARIANT_ARMS), seeds=(0, 1), steps: int | None = None,
                           verbose: bool = False) -> dict:
    """每组、每个种子训练一个模型；返回 ``{"runs": [...], "arms": {...}, "settings": {...}}``。

    ``runs`` 的每项：组名、种子、评估记录（step、valid_loss）、是否发散；``arms`` 的每项：参数量、
    每个词元的 K/V 缓存字节数（float32）、训练吞吐（tokens/s：交替计时的各轮 ``tokens_per_second_rounds`` 与中位数）。
    """
    t = dict(VARIANT_TRAINING)
    if steps is not None:  # 短跑（测试用）：预热与评估间隔按比例缩短
        t.update(steps=steps, warmup=max(1, min(t["warmup"], steps // 10)), eval_every=max(1, steps // 2))
    data = poem_data()
    vocab = data["tokenizer"].vocab_size
    runs = _train_runs({arm: (arm, t) for arm in arms}, seeds, data, verbose)
    info = _cost_rows(arms, vocab, data["train_blocks"], t["batch_size"])
    return {"runs": runs, "arms": info, "settings": {"training": t, "model": dict(VARIANT_MODEL), "seeds": list(seeds),
                                                      "arms": list(arms)}}


@contextlib.contextmanager
def _one_thread():
    """在单线程下运行（结果文件里的训练与计时都是单线程），结束后恢复原来的线程数。"""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


def _machine_record(command: str, machine: dict, start: float) -> dict:
    """结果文件的 ``produced_by``：命令、开始时在单线程之内取的 :func:`machine_info` 与从 ``start`` 起的秒数。"""
    return {"command": command, **machine, "seconds": time.perf_counter() - start}


def _command(flag: str, path: Path) -> str:
    """写进结果文件的生成命令：写到随包的结果文件时就是模块的命令行，写到别处时注明路径。"""
    command = f"python -m tformer_lib.experiments.modern_variants {flag}"
    return command if Path(path).resolve() == VARIANT_RESULTS else f"{command}（结果文件 {path}）"


def write_variant_results(path: str | os.PathLike = VARIANT_RESULTS, **kwargs) -> Path:
    """（维护者用）单线程运行 :func:`run_variant_comparison`，连同机器信息写成 JSON（先写临时文件再改名）。"""
    start = time.perf_counter()
    with _one_thread():
        machine = machine_info()
        result = run_variant_comparison(**kwargs)
    result["produced_by"] = _machine_record("python -m tformer_lib.experiments.modern_variants", machine, start)
    result["speed_produced_by"] = result["produced_by"]
    return save_results(result, path)


def remeasure_variant_speed(path: str | os.PathLike = VARIANT_RESULTS) -> Path:
    """（维护者用）只重测结果文件里各组的代价与训练吞吐（单线程，几十秒），训练记录原样保留；
    吞吐的机器信息单独记在 ``speed_produced_by``。"""
    path = Path(path)
    result = load_variant_results(path)
    start = time.perf_counter()
    with _one_thread():
        machine = machine_info()
        data = poem_data()
        result["arms"] = _cost_rows(result["settings"]["arms"], data["tokenizer"].vocab_size, data["train_blocks"],
                                    result["settings"]["training"]["batch_size"])
    result["speed_produced_by"] = _machine_record(_command("--speed-only", path), machine, start)
    return save_results(result, path)


def add_warmup_runs(path: str | os.PathLike = VARIANT_RESULTS) -> Path:
    """（维护者用）单线程运行 :func:`run_warmup_ablation`，把它的训练记录加进结果文件（替换旧的同名组），
    其余内容原样保留；机器信息记在 ``warmup_produced_by``。"""
    path = Path(path)
    result = load_variant_results(path)
    start = time.perf_counter()
    with _one_thread():
        machine = machine_info()
        ablation = run_warmup_ablation(seeds=result["settings"]["seeds"], verbose=True)
    result["runs"] = [r for r in result["runs"] if r["arm"] not in WARMUP_ARMS] + ablation["runs"]
    result["settings"]["warmup_arms"] = ablation["warmup_arms"]
    result["warmup_produced_by"] = _machine_record(_command("--warmup-only", path), machine, start)
    return save_results(result, path)


def load_variant_results(path: str | os.PathLike = VARIANT_RESULTS) -> dict:
    """读回 :func:`write_variant_results` 写的 JSON。"""
    result = read_results(path, "python -m tformer_lib.experiments.modern_variants")
    missing = [k for k in ("runs", "arms", "settings") if not isinstance(result, dict) or k not in result]
    if missing:
        raise ValueError(f"{path} 不是 python -m tformer_lib.experiments.modern_variants 写的结果文件：缺 {missing}")
    return result


if __name__ == "__main__":  # pragma: no cover - 维护者脚本
    import sys

    if "--speed-only" in sys.argv[1:]:
        print(remeasure_variant_speed())
    elif "--warmup-only" in sys.argv[1:]:
        print(add_warmup_runs())
    else:  # 全部重做：16 个模型、预热消融、吞吐
        print(write_variant_results(verbose=True))
        print(add_warmup_runs())
