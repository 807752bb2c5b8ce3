"""基准测试（benchmark）：我们的模型与 ``torch.nn.Transformer`` 训练一步的耗时，显式注意力与 SDPA 的耗时。

第 8 章和仓库里的 ``benchmarks/train_step.py`` 都用这里的代码（脚本只是命令行外壳），所以从 pip 安装的库里
打开第 8 章也能运行。计时的两条规矩：

- **A/B 交替**（interleaved）：每一轮依次把每个候选各测一次，机器负载的慢变化对两边的影响差不多，
  每一轮都得到一个比值；报告比值的中位数和四分位范围（噪声有多大），而不只是一个数；
- **说清在哪测的**：结果里记下 CPU、线程数、torch 版本和日期（:func:`machine_info`）。

``run_benchmarks`` 的结果可以写成 JSON（:func:`save_results`）；随包附带一份（:data:`RESULTS_PATH`），
第 8 章读它画图、列表，而不是手抄数字。
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import math
import os
import platform
import shlex
import statistics
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from .._checks import flag, positive_int
from ..parts.attention import MultiHeadAttention
from ..parts.masks import causal_mask, padding_mask
from ..parts.positional import sinusoidal_positional_encoding
from ..seed import cpu_fingerprint
from ..specials import PAD
from ..translation.config import TransformerConfig
from ..translation.model import make_model

__all__ = [
    "RESULTS_PATH",
    "TorchTransformerModel",
    "make_train_step",
    "interleaved_samples",
    "interleaved",
    "ratio_summary",
    "machine_info",
    "measurement_record",
    "measurement_parser",
    "parse_measurement_args",
    "benchmark_train_step",
    "benchmark_attention_paths",
    "run_benchmarks",
    "save_results",
    "read_results",
    "load_results",
]

#: 随包附带的基准结果（由 ``python benchmarks/train_step.py --out …`` 写出）
RESULTS_PATH = Path(__file__).resolve().parent.parent / "results" / "train_step.json"
#: 重新生成随包结果文件的命令（写进文件里；scripts/regenerate_results.py 运行的也是它）
COMMAND = "python benchmarks/train_step.py --threads 1 --out tformer_lib/results/train_step.json"


class TorchTransformerModel(nn.Module):
    """把 ``torch.nn.Transformer`` 配上与我们相同的词嵌入（×√d_model）、正弦位置编码、dropout 和输出层。"""

    def __init__(self, c: TransformerConfig):
        super().__init__()
        self.d_model = c.d_model
        self.src_embed = nn.Embedding(c.src_vocab_size, c.d_model)
        self.tgt_embed = nn.Embedding(c.tgt_vocab_size, c.d_model)
        self.register_buffer("pe", sinusoidal_positional_encoding(c.max_len, c.d_model))
        self.dropout = nn.Dropout(c.dropout)
        self.core = nn.Transformer(
            c.d_model, c.n_heads, c.n_encoder_layers, c.n_decoder_layers, c.d_ff, c.dropout, batch_first=True
        )
        self.generator = nn.Linear(c.d_model, c.tgt_vocab_size)

    def embed(self, lut: nn.Embedding, tokens: torch.Tensor) -> torch.Tensor:
        x = lut(tokens) * math.sqrt(self.d_model)  # (B, T, d_model)
        return self.dropout(x + self.pe[: tokens.shape[1]])

    def forward(self, src: torch.Tensor, tgt_in: torch.Tensor) -> torch.Tensor:
        t = tgt_in.shape[1]
        # PyTorch 的掩码极性与我们相反：True = 屏蔽
        out = self.core(
            self.embed(self.src_embed, src),
            self.embed(self.tgt_embed, tgt_in),
            tgt_mask=~causal_mask(t, device=tgt_in.device),
            src_key_padding_mask=src == PAD,
            tgt_key_padding_mask=tgt_in == PAD,
            memory_key_padding_mask=src == PAD,
        )
        return self.generator(out)  # (B, T, V)


def make_train_step(model: nn.Module, src: torch.Tensor, tgt_in: torch.Tensor,
                    tgt_out: torch.Tensor) -> Callable[[], None]:
    """返回一个无参函数：对固定的一批数据做一次前向 + 交叉熵 + 反向 + Adam 更新。"""
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-4, betas=(0.9, 0.98), eps=1e-9)
    model.train()

    def step() -> None:
        logits = model(src, tgt_in)  # (B, T, V)
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tgt_out.reshape(-1), ignore_index=PAD)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()

    return step


def _time_once(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def interleaved_samples(fns: Mapping[str, Callable[[], object]], rounds: int,
                        warmup: int = 2, *, alternate: bool = False) -> dict[str, list[float]]:
    """A/B 交替计时：先把每个函数各热身 ``warmup`` 次，再测 ``rounds`` 轮，每轮依次测每个函数一次。

    返回 ``{名字: 每轮的秒数列表}``。第 i 轮的各个样本是紧挨着测的，可以两两相除得到第 i 轮的比值。
    ``alternate=True`` 时奇数轮倒过来测（A B、B A、A B……）：谁先谁后带来的偏差（分配器、缓存里留着的是上一个
    函数的东西）两边各摊一半。
    """
    rounds = positive_int("rounds", rounds)
    flag("alternate", alternate)
    for _ in range(warmup):
        for fn in fns.values():
            fn()
    samples: dict[str, list[float]] = {name: [] for name in fns}
    order = list(fns.items())
    for i in range(rounds):
        for name, fn in (order[::-1] if alternate and i % 2 else order):
            samples[name].append(_time_once(fn))
    return samples


def interleaved(fns: Mapping[str, Callable[[], object]], rounds: int, warmup: int = 2) -> dict[str, float]:
    """同 :func:`interleaved_samples`，但只返回每个函数耗时的中位数（秒）。"""
    return {name: statistics.median(s) for name, s in interleaved_samples(fns, rounds, warmup).items()}


def _quantiles(values: Sequence[float]) -> tuple[float, float, float]:
    """(下四分位, 中位数, 上四分位)；只有一个值时三者相同。"""
    v = sorted(values)
    if len(v) == 1:
        return v[0], v[0], v[0]
    q1, q2, q3 = statistics.quantiles(v, n=4, method="inclusive")
    return q1, q2, q3


def ratio_summary(numerator: Sequence[float], denominator: Sequence[float]) -> dict[str, Any]:
    """逐轮比值 ``numerator[i] / denominator[i]`` 的中位数与四分位范围（interquartile range）。"""
    if len(numerator) != len(denominator) or not numerator:
        raise ValueError(f"两组样本应一样多且非空，收到 {len(numerator)} 与 {len(denominator)} 个")
    ratios = [a / b for a, b in zip(numerator, denominator)]
    q1, med, q3 = _quantiles(ratios)
    return {"ratios": ratios, "median": med, "q1": q1, "q3": q3}


def machine_info() -> dict[str, Any]:
    """在哪里测的：CPU 型号与指令集、逻辑核数、平台、Python 与 torch 版本、torch 线程数、当时的平均负载、UTC 日期时间。"""
    return {
        "cpu": cpu_fingerprint(),
        "cpu_count": os.cpu_count(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        # 开始测量时的 1 分钟平均负载（可运行的进程数）：大于核数说明有别的任务在抢 CPU
        "load_average": round(os.getloadavg()[0], 2) if hasattr(os, "getloadavg") else None,
        "date": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
    }


def measurement_record(module: str, argv: Sequence[str] | None, machine: Mapping[str, Any],
                       start: float) -> dict[str, Any]:
    """结果文件的开头几项：在哪里测的（``machine``，测量开始时取的 :func:`machine_info`）、结束时的平均负载、
    复现它的命令（``python -m module`` 加上参数；``argv`` 为 ``None`` 时取命令行）、从 ``start``
    （``time.perf_counter()``）起的总秒数。"""
    if not isinstance(module, str) or not module:
        raise TypeError(f"module 应是模块名（如 'tformer_lib.quant.measure'），收到 {module!r}")
    if argv is not None and (isinstance(argv, (str, bytes)) or not all(isinstance(a, str) for a in argv)):
        raise TypeError(f"argv 应是字符串的列表（或 None = 命令行），收到 {argv!r}")
    if not isinstance(machine, Mapping):
        raise TypeError(f"machine 应是 machine_info() 返回的字典，收到 {type(machine).__name__}")
    elapsed = time.perf_counter() - start if isinstance(start, (int, float)) and not isinstance(start, bool) else math.nan
    if not (math.isfinite(elapsed) and elapsed >= 0):
        raise ValueError(f"start 应是测量开始时的 time.perf_counter()，收到 {start!r}")
    args = sys.argv[1:] if argv is None else list(argv)
    return {
        "machine": dict(machine),
        "load_average_end": round(os.getloadavg()[0], 2) if hasattr(os, "getloadavg") else None,
        "command": shlex.join(["python", "-m", module, *args]),  # 带空格的参数加上引号：复制下来就能重跑
        "wall_seconds": elapsed,
    }


def measurement_parser(module: str, description: str) -> argparse.ArgumentParser:
    """``python -m module`` 这类测量脚本的命令行：``--out``（结果 JSON）与 ``--threads``；各脚本再加自己的参数，
    然后用 :func:`parse_measurement_args` 解析。"""
    p = argparse.ArgumentParser(prog=f"python -m {module}", description=description)
    p.add_argument("--out", default=None, help="结果 JSON 的路径（原子写入）；不给就只打印表格")
    p.add_argument("--threads", type=int, default=1, help="torch 的线程数（默认 1：结果文件记着它）")
    return p


def parse_measurement_args(parser: argparse.ArgumentParser, argv: Sequence[str] | None) -> argparse.Namespace:
    """解析参数，并在花几十分钟测量**之前**确认 ``--threads`` 为正、``--out`` 能写成文件（不行时像 argparse 一样
    报错退出）；然后设好 torch 的线程数。"""
    from ..training.checkpoint import check_checkpoint_path

    args = parser.parse_args(argv)
    if args.threads < 1:
        parser.error(f"--threads 应为正整数，收到 {args.threads}")
    if args.out is not None:
        try:
            check_checkpoint_path(args.out, "--out")
        except ValueError as exc:
            parser.error(str(exc))
    torch.set_num_threads(args.threads)
    return args


def benchmark_train_step(config: TransformerConfig, batch: int, length: int, rounds: int, *,
                         warmup: int = 2, seed: int = 0) -> dict[str, Any]:
    """训练一步：我们的模型（``config`` 原样，通常 ``fast_attention=True``）vs :class:`TorchTransformerModel`。

    一批随机词元（四分之一的源句末尾带 3 个填充，让掩码真的起作用）。返回两边每轮的秒数、
    逐轮比值 ours / torch 的中位数与四分位，以及两边的参数量。
    """
    gen = torch.Generator().manual_seed(seed)
    src = torch.randint(4, config.src_vocab_size, (batch, length), generator=gen)  # (B, S)
    tgt = torch.randint(4, config.tgt_vocab_size, (batch, length + 1), generator=gen)  # (B, T + 1)
    src[: batch // 4, -3:] = PAD
    tgt_in, tgt_out = tgt[:, :-1], tgt[:, 1:]  # (B, T)
    torch.manual_seed(seed)
    ours, theirs = make_model(config), TorchTransformerModel(config)
    samples = interleaved_samples({"ours": make_train_step(ours, src, tgt_in, tgt_out),
                                   "torch": make_train_step(theirs, src, tgt_in, tgt_out)}, rounds, warmup)
    return {
        "config": config.to_dict(), "batch": batch, "length": length, "rounds": rounds,
        "params": {"ours": sum(p.numel() for p in ours.parameters()),
                   "torch": sum(p.numel() for p in theirs.parameters())},
        "seconds": samples,
        "ratio": ratio_summary(samples["ours"], samples["torch"]),
    }


def benchmark_attention_paths(lengths: Sequence[int], rounds: int, *, batch: int = 4, d_model: int = 256,
                              n_heads: int = 8, warmup: int = 2, seed: int = 0) -> list[dict[str, Any]]:
    """多头注意力前向 + 反向：显式路径 vs 快速路径（``F.scaled_dot_product_attention``），每个长度一项。

    比值是 fast / explicit（小于 1 表示融合内核更快）。输入带填充掩码（第一句末尾四分之一是填充）。
    """
    out = []
    for length in lengths:
        gen = torch.Generator().manual_seed(seed)
        x = torch.randn(batch, length, d_model, generator=gen)  # (B, T, d_model)
        tokens = torch.randint(4, 10, (batch, length), generator=gen)  # (B, T)
        tokens[0, -length // 4:] = PAD
        mask = padding_mask(tokens)  # (B, 1, 1, T)
        fns = {}
        for fast in (False, True):
            torch.manual_seed(seed)
            mha = MultiHeadAttention(d_model, n_heads, fast=fast)

            def fwd_bwd(mha: MultiHeadAttention = mha) -> None:
                mha(x, x, x, mask).sum().backward()

            fns["fast" if fast else "explicit"] = fwd_bwd
        samples = interleaved_samples(fns, rounds, warmup)
        out.append({"length": length, "batch": batch, "d_model": d_model, "n_heads": n_heads, "rounds": rounds,
                    "seconds": samples, "ratio": ratio_summary(samples["fast"], samples["explicit"])})
    return out


def run_benchmarks(*, rounds: int = 15, threads: int = 1, include_base: bool = False,
                   attention_lengths: Sequence[int] = (64, 128, 256, 512), log: Callable[[str], None] | None = print
                   ) -> dict[str, Any]:
    """整套基准：小配置训练一步（可选论文 base 配置）+ 各长度的注意力两条路径；返回可写成 JSON 的字典。"""
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        result: dict[str, Any] = {"machine": machine_info(), "command": COMMAND, "train_step": {}, "attention": []}
        small = TransformerConfig(1000, 1000, d_model=128, n_heads=4, d_ff=512, n_encoder_layers=2,
                                  n_decoder_layers=2, fast_attention=True)
        cases = [("small", small, 64, 20, rounds)]
        if include_base:
            cases.append(("base", TransformerConfig(8000, 8000, fast_attention=True), 8, 32, max(3, rounds // 3)))
        for name, cfg, b, t, r in cases:
            res = benchmark_train_step(cfg, b, t, r)
            result["train_step"][name] = res
            if log is not None:
                med = {k: statistics.median(v) * 1e3 for k, v in res["seconds"].items()}
                log(f"train_step {name:<6} (B={b}, T={t}): ours {med['ours']:.1f} ms, "
                    f"torch.nn.Transformer {med['torch']:.1f} ms, ours/torch 中位数 {res['ratio']['median']:.2f} "
                    f"[{res['ratio']['q1']:.2f}, {res['ratio']['q3']:.2f}]")
        result["attention"] = benchmark_attention_paths(list(attention_lengths), rounds)
        if log is not None:
            for a in result["attention"]:
                log(f"attention T={a['length']:<4}: fast/explicit 中位数 {a['ratio']['median']:.2f} "
                    f"[{a['ratio']['q1']:.2f}, {a['ratio']['q3']:.2f}]")
        return result
    finally:
        torch.set_num_threads(previous)


def save_results(result: Mapping[str, Any], path: str | os.PathLike,
                 layout: Callable[[str], str] | None = None) -> Path:
    """全库唯一的结果文件写法：把 ``result`` 原子地写成 JSON（同一目录下的临时文件写完再改名），返回路径。

    ``layout``（可选）在写出前改排版，如把长的数字列表排在一行（:mod:`tformer_lib.serving.benchmark`）。
    """
    text = json.dumps(result, ensure_ascii=False, indent=1)
    if layout is not None:
        text = layout(text)
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = p.with_name(f".{p.name}.tmp")  # 隐藏的临时文件：即使目标本身以 .tmp 结尾也不冲突
    tmp.write_text(text + "\n", encoding="utf-8")
    tmp.replace(p)
    return p


def read_results(path: str | os.PathLike, command: str) -> dict[str, Any]:
    """全库唯一的结果文件读法：读 ``path`` 的 JSON；文件不在时报错，并说出生成它的命令 ``command``。"""
    p = Path(path)
    if not p.exists():
        raise FileNotFoundError(f"找不到结果文件 {p}；用 {command} 生成")
    return json.loads(p.read_text(encoding="utf-8"))


def load_results(path: str | os.PathLike | None = None) -> dict[str, Any]:
    """读取基准结果 JSON，默认随包附带的 :data:`RESULTS_PATH`。"""
    p = Path(path) if path is not None else RESULTS_PATH
    return read_results(p, f"python benchmarks/train_step.py --out {p}")
