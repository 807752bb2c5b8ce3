r"""一个小小的缩放实验（scaling study）：几种大小的唐诗模型 × 几种训练词元数，验证损失随算力怎么降（第 9 章）。

每次运行都从头训练（与随书模型同一个配方：AdamW、预热后余弦退火、批 16 × 128 个词元），只是模型更小或更大、
训练的词元更少：学习率调度的长度就是这次的步数，所以每个点都是“按这个预算训完”的模型，而不是大预算训到一半。

算力 C 用第 11 章与 ``FlopCounterMode`` 逐项相等的 :func:`~tformer_lib.measurement.profiling.lm_training_flops` 数
（含注意力与输出层），旁边记着常用近似 6·N·D。把每个算力上最好的点（下包络）拟合成幂律
:math:`L = a\,C^{-\alpha}`（:func:`fit_power_law`，对数坐标下的最小二乘）。

在 2 核 CPU 上能看到的：同样的算力下，大模型训得少与小模型训得多之间有取舍，下包络近似一条直线（对数坐标）。
看不到的：这里的算力（:math:`10^{11}`–:math:`10^{13}` FLOPs）比 Chinchilla 的等算力扫描（:math:`10^{18}` 以上）小六七个数量级，模型远没训到头，拟合出的指数只描述这一小段，不能外推到真实模型；
Chinchilla 的“每个参数约 20 个词元”是在等算力的扫描上拟合出来的，这里的网格只是它的粗略影子。

``python -m tformer_lib.scale.scaling --out tformer_lib/results/scaling.json`` 重新生成随书的结果文件。
"""

from __future__ import annotations

import math
import numbers
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path


from .._checks import positive_int
from ..lm.config import LMConfig
from ..lm.meta import parameter_breakdown
from ..measurement.profiling import lm_training_flops

__all__ = ["SCALING_SIZES", "SCALING_TOKENS", "scaling_config", "non_embedding_parameters", "train_for_tokens",
           "scaling_study", "compute_frontier", "fit_power_law", "RESULTS_PATH", "main"]

#: 五种大小 (d_model, n_layers)：非嵌入参数从几万到一百多万；头数 4、d_ff = 4·d_model，其余同随书模型
SCALING_SIZES = ((48, 2), (64, 2), (96, 3), (128, 4), (160, 4))
#: 三种训练预算（64、128、256 步 × 每步 16 × 128 个目标位置；去掉填充后实际的词元约少一成）
SCALING_TOKENS = (131_072, 262_144, 524_288)
#: 随书的结果文件
RESULTS_PATH = Path(__file__).resolve().parent.parent / "results" / "scaling.json"


def scaling_config(vocab_size: int, d_model: int, n_layers: int) -> LMConfig:
    """随书唐诗模型的配置（:data:`~tformer_lib.lm.POEM_RECIPE`），换成这个宽度与层数（``d_ff = 4·d_model``）。"""
    from ..lm.pretrained import poem_model_config

    positive_int("d_model", d_model)
    positive_int("n_layers", n_layers)
    return poem_model_config(vocab_size, d_model=d_model, n_layers=n_layers, d_ff=4 * d_model)


def non_embedding_parameters(config: LMConfig) -> int:
    """不含词嵌入、位置嵌入与（不共享时的）输出层的参数个数：Kaplan et al.（2020）拟合缩放律用的 N。"""
    parts = parameter_breakdown(config)
    return parts["total"] - parts["embedding"] - parts["positional"] - parts["head"]


def train_for_tokens(config: LMConfig, data: Mapping, tokens: int, *, seed: int = 0) -> dict:
    """按随书配方从头训练 ``config``，训完在验证集上评估一次。返回一行：参数、训练的词元、两种算力、验证损失。

    步数 = ``tokens // (批大小 × 块长)``：``tokens`` 按**目标位置**数（含块里的填充），学习率调度的长度就是这些步。
    返回的 ``tokens`` 是其中**非填充**的目标词元（比预算少约一成）；``flops`` 按全部位置数（填充位置的矩阵乘法也要算），
    ``flops_6nd`` 用非填充的词元数，所以两者之比里有一部分是填充。"""
    from ..lm.model import make_lm
    from ..lm.pretrained import POEM_RECIPE
    from ..lm.training import LMTrainer
    from ..seed import set_seed

    steps, length = _steps_for(data, tokens)
    recipe = POEM_RECIPE
    set_seed(seed)
    model = make_lm(config)
    trainer = LMTrainer(model, data["train_blocks"], data["valid"], batch_size=recipe["batch_size"], lr=recipe["lr"],
                        warmup=max(1, steps // 10), total_steps=steps, min_lr_ratio=recipe["min_lr_ratio"],
                        weight_decay=recipe["weight_decay"], clip=recipe["clip"], seed=seed, eval_every=steps,
                        progress=False)
    final = trainer.fit()
    n_total = parameter_breakdown(config)["total"]
    n = non_embedding_parameters(config)
    return {
        "d_model": config.d_model, "n_layers": config.n_layers, "params": n_total, "non_embedding_params": n,
        "steps": steps, "tokens": trainer.tokens_seen, "tokens_per_param": trainer.tokens_seen / n_total,
        "flops": steps * lm_training_flops(config, recipe["batch_size"], length)["total"],
        "flops_6nd": 6 * n_total * trainer.tokens_seen,
        "valid_loss": final["valid_loss"], "final_train_loss": trainer.history["step_loss"][-1],
        "seconds": trainer.seconds,
    }


def _check_data(data) -> None:
    if not isinstance(data, Mapping) or not all(k in data for k in ("train_blocks", "valid", "tokenizer")):
        raise TypeError("data 应是 poem_data() 返回的字典（含 'train_blocks'、'valid'、'tokenizer'），"
                        f"收到 {type(data).__name__}")


def _steps_for(data, tokens: int) -> tuple[int, int]:
    """``(步数, 块长)``；预算不够 10 步时报错。"""
    from ..lm.pretrained import POEM_RECIPE

    _check_data(data)
    positive_int("tokens", tokens)
    length = data["train_blocks"].shape[1] - 1
    per_step = POEM_RECIPE["batch_size"] * length
    if tokens // per_step < 10:
        raise ValueError(f"tokens 至少要 {10 * per_step}（10 步 × 每步 {per_step} 个目标位置），收到 {tokens}")
    return tokens // per_step, length


def scaling_study(sizes: Sequence[tuple[int, int]] = SCALING_SIZES, token_budgets: Sequence[int] = SCALING_TOKENS,
                  *, seed: int = 0, data: Mapping | None = None) -> list[dict]:
    """``sizes``（``(d_model, n_layers)`` 的列表）× ``token_budgets`` 的每一格训练一次（:func:`train_for_tokens`），
    返回各行。训练之前先检查完每一格（一个坏的格子不会在训完前面几格之后才报错）。"""
    from ..lm.pretrained import poem_data

    if not isinstance(sizes, (list, tuple)) or not sizes or not all(
            isinstance(s, (list, tuple)) and len(s) == 2 for s in sizes):
        raise TypeError(f"sizes 应是非空的 (d_model, n_layers) 列表，收到 {sizes!r}")
    if not isinstance(token_budgets, (list, tuple)) or not token_budgets:
        raise TypeError(f"token_budgets 应是非空的词元数列表，收到 {token_budgets!r}")
    data = poem_data() if data is None else data
    _check_data(data)
    vocab = data["tokenizer"].vocab_size
    configs = [scaling_config(vocab, d, n) for d, n in sizes]  # 先全部检查
    for tokens in token_budgets:
        _steps_for(data, tokens)
    return [train_for_tokens(c, data, tokens, seed=seed) for c in configs for tokens in token_budgets]


def compute_frontier(rows: Sequence[Mapping], x: str = "flops", y: str = "valid_loss") -> list[Mapping]:
    """下包络：按 ``x`` 从小到大，只留下比所有更便宜的点都更好（``y`` 更低）的行。``x``、``y`` 都应是有限的数。"""
    if not isinstance(rows, Sequence) or isinstance(rows, (str, bytes)) or not rows:
        raise ValueError(f"rows 应是非空的结果行列表，收到 {type(rows).__name__}")
    for i, row in enumerate(rows):
        for key in (x, y):
            value = row.get(key) if isinstance(row, Mapping) else None
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                raise ValueError(f"rows[{i}][{key!r}] 应是有限的数，收到 {value!r}")
    best, out = math.inf, []
    for row in sorted(rows, key=lambda r: (r[x], r[y])):
        if row[y] < best:
            best = row[y]
            out.append(row)
    return out


def fit_power_law(xs: Sequence[float], ys: Sequence[float]) -> dict[str, float]:
    r"""最小二乘拟合 :math:`y = a\,x^{-\alpha}`（即 :math:`\log y = \log a - \alpha \log x`）：返回 ``a``、``alpha``
    与对数坐标下的决定系数 ``r2``。要至少两个不同的 x，而且全部为正。"""
    checked = []
    for name, values in (("xs", xs), ("ys", ys)):
        if isinstance(values, (str, bytes, Mapping)) or not hasattr(values, "__iter__"):
            raise ValueError(f"{name} 应是数的列表，收到 {type(values).__name__}")
        values = list(values)
        bad = [v for v in values if isinstance(v, bool) or not isinstance(v, numbers.Real)
               or not (math.isfinite(v) and v > 0)]
        if bad:
            raise ValueError(f"{name} 都应是有限的正数（要取对数），收到 {bad[0]!r}")
        checked.append([float(v) for v in values])
    xs, ys = checked
    if len(xs) != len(ys):
        raise ValueError(f"xs 与 ys 应等长，收到 {len(xs)} 与 {len(ys)} 个")
    lx, ly = [math.log(v) for v in xs], [math.log(v) for v in ys]
    mx, my = sum(lx) / len(lx), sum(ly) / len(ly)
    sxx = sum((u - mx) ** 2 for u in lx)
    if len(set(lx)) < 2 or sxx == 0:
        raise ValueError(f"xs 至少要有两个不同的值才能拟合斜率，收到 {sorted(set(xs))[:3]}")
    slope = sum((u - mx) * (w - my) for u, w in zip(lx, ly)) / sxx
    intercept = my - slope * mx
    residual = sum((w - (intercept + slope * u)) ** 2 for u, w in zip(lx, ly))
    total = sum((w - my) ** 2 for w in ly)
    return {"a": math.exp(intercept), "alpha": -slope, "r2": 1.0 - residual / total if total > 0 else 1.0}


def main(argv=None) -> int:
    from ..measurement.benchmarking import machine_info, measurement_parser, measurement_record, parse_measurement_args, save_results

    p = measurement_parser("tformer_lib.scale.scaling", "第 9 章：唐诗模型的缩放实验（5 种大小 × 3 种训练词元数）")
    p.add_argument("--seed", type=int, default=0, help="每一格的随机种子（默认 0）")
    args = parse_measurement_args(p, argv)  # 训练十几分钟之前就确认 --out 能写
    info = machine_info()
    start = time.perf_counter()
    rows = scaling_study(seed=args.seed)
    frontier = compute_frontier(rows)
    fit = fit_power_law([r["flops"] for r in frontier], [r["valid_loss"] for r in frontier])
    result = {**measurement_record("tformer_lib.scale.scaling", argv, info, start), "seed": args.seed,
              "sizes": [list(s) for s in SCALING_SIZES], "token_budgets": list(SCALING_TOKENS),
              "rows": rows, "frontier_fit": fit}
    print(f"{'d_model':>8}{'层':>4}{'非嵌入参数':>11}{'词元':>10}{'FLOPs':>11}{'验证损失':>9}")
    for r in rows:
        print(f"{r['d_model']:>8}{r['n_layers']:>4}{r['non_embedding_params']:>11,}{r['tokens']:>10,}"
              f"{r['flops']:>11.3g}{r['valid_loss']:>9.3f}")
    print(f"下包络的幂律：L ≈ {fit['a']:.3g} · C^(-{fit['alpha']:.3f})（R² = {fit['r2']:.3f}）")
    if args.out:
        save_results(result, args.out)
        print(f"写入 {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
