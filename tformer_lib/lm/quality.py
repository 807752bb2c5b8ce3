"""语言模型好不好：第 9 章用的三把尺子。

1. 困惑度（perplexity）与平滑字二元模型（character bigram）基线的比较：:class:`BigramLM`、:func:`lm_perplexity`；
2. 体裁是否正确：:func:`poem_form` 解析生成的文本，:func:`form_accuracy` 统计“点播的体裁”被满足的比例；
3. 是否在背书：:func:`verbatim_line_rate` 统计生成的诗句有多少原样出现在训练集里。
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Sequence

import torch
import torch.nn.functional as F

from .._checks import one_of
from ..data.poems import FORMS
from ..specials import PAD

__all__ = ["BigramLM", "lm_perplexity", "poem_form", "poem_lines", "form_accuracy", "verbatim_line_rate"]

_HAN = re.compile(r"^[\u3400-\u4dbf\u4e00-\u9fff]+$")


class BigramLM:
    r"""平滑的字二元模型：:math:`P(c\mid p) = \lambda\,\frac{n(p,c)}{n(p)} + (1-\lambda)\,P_1(c)`。

    :math:`P_1` 是加一平滑（add-one）的一元频率；插值系数 λ 由 :meth:`fit` 在验证块上从网格里挑最好的，
    所以这是一个尽力调好的基线，而不是故意做弱的靶子。统计的 (前一个词元, 这个词元) 对与
    :func:`lm_perplexity` 对神经网络计分的位置完全一样（目标为 PAD 的位置不计）。
    """

    def __init__(self, vocab_size: int, counts: torch.Tensor, lam: float):
        self.vocab_size, self.counts, self.lam = vocab_size, counts, float(lam)
        unigram = counts.sum(0) + 1.0  # (V,) 加一平滑
        self.unigram = unigram / unigram.sum()
        self.row_totals = counts.sum(1, keepdim=True)  # (V, 1)

    @staticmethod
    def _pairs(inputs: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        keep = targets != PAD
        return inputs[keep], targets[keep]

    @classmethod
    def fit(cls, train: tuple[torch.Tensor, torch.Tensor], valid: tuple[torch.Tensor, torch.Tensor], vocab_size: int,
            grid: Sequence[float] = (0.5, 0.6, 0.7, 0.8, 0.85, 0.9, 0.95, 0.98)) -> "BigramLM":
        """在训练的 ``(inputs, targets)`` 上计数，在验证的 ``(inputs, targets)`` 上选 λ。"""
        prev, nxt = cls._pairs(*train)
        counts = torch.zeros(vocab_size * vocab_size, dtype=torch.float64)
        counts.index_add_(0, prev * vocab_size + nxt, torch.ones(prev.numel(), dtype=torch.float64))
        counts = counts.view(vocab_size, vocab_size)  # (V_prev, V_next)
        best = min(grid, key=lambda lam: cls(vocab_size, counts, lam).perplexity(*valid))
        return cls(vocab_size, counts, best)

    def log_prob(self, prev: torch.Tensor, nxt: torch.Tensor) -> torch.Tensor:
        """每对 (prev, next) 的 :math:`\\log P(next\\mid prev)`。"""
        totals = self.row_totals[prev, 0]
        cond = torch.where(totals > 0, self.counts[prev, nxt] / totals.clamp(min=1), torch.zeros_like(totals))
        return torch.log(self.lam * cond + (1 - self.lam) * self.unigram[nxt])

    def perplexity(self, inputs: torch.Tensor, targets: torch.Tensor) -> float:
        """``exp(平均负对数似然)``，只计目标不是 PAD 的位置。"""
        prev, nxt = self._pairs(inputs, targets)
        return math.exp(-float(self.log_prob(prev, nxt).mean()))


@torch.no_grad()
def lm_perplexity(model, inputs: torch.Tensor, targets: torch.Tensor, batch_size: int = 64) -> tuple[float, float]:
    """模型在 ``(inputs, targets)``（形状都是 ``(N, L)``）上的 ``(平均交叉熵, 困惑度)``；PAD 目标不计。"""
    was_training = model.training
    model.eval()
    total, count = 0.0, 0
    device = next(model.parameters()).device
    try:
        for i in range(0, inputs.shape[0], batch_size):
            logits = model(inputs[i : i + batch_size].to(device))  # (b, L, V)
            t = targets[i : i + batch_size].to(device)
            total += float(F.cross_entropy(logits.flatten(0, 1), t.flatten(), ignore_index=PAD, reduction="sum"))
            count += int((t != PAD).sum())
    finally:
        model.train(was_training)
    loss = total / max(count, 1)
    return loss, math.exp(loss)


def poem_lines(text: str) -> list[str] | None:
    """把正文 ``"白日依山尽，黄河入海流。…"`` 切成句；标点不在原位（奇数句“，”、偶数句“。”）时返回 None。"""
    parts = re.split(r"([，。])", text)
    if len(parts) < 3 or parts[-1] != "":
        return None
    lines, marks = parts[0:-1:2], parts[1::2]
    if any(m != ("，" if i % 2 == 0 else "。") for i, m in enumerate(marks)):
        return None
    return lines


def poem_form(text: str) -> str | None:
    """正文的体裁（五言绝句、七言绝句、五言律诗、七言律诗），不是规整的绝句或律诗时返回 None。

    要求：4 或 8 句、每句都是 5 个或都是 7 个汉字、“，”与“。”交替且以“。”结束。
    """
    lines = poem_lines(text)
    if not lines or not all(_HAN.match(line) for line in lines):
        return None
    n = len(lines[0])
    if any(len(line) != n for line in lines):
        return None
    return FORMS.get((n, len(lines)))


def form_accuracy(texts: Iterable[str], requested: Iterable[str]) -> float:
    """生成的正文里体裁恰好是所点播体裁的比例。"""
    pairs = list(zip(texts, requested, strict=True))
    return sum(poem_form(t) == r for t, r in pairs) / max(len(pairs), 1)


def verbatim_line_rate(texts: Iterable[str], train_lines: set[str]) -> float:
    """生成的诗句（按“，”“。”切开、不计空句）里，原样出现在训练集诗句集合 ``train_lines`` 中的比例。"""
    lines = [line for t in texts for line in re.split(r"[，。]", t) if line]
    return sum(line in train_lines for line in lines) / max(len(lines), 1)


# ---- 作诗与一次性评估 ------------------------------------------------------------------------------


def quality_prompts(split: str = "test", n: int = 200, seed: int = 0) -> list[tuple[str, str, str]]:
    """从留出的诗里抽 ``n`` 个提示 ``(体裁, 题目, 首字)``：一半给题目（首字为空），一半只给首字（题目为空）。"""
    import random

    from ..data.poems import load_poems
    from .data import MAX_TITLE

    poems = [p for p in load_poems(split) if 0 < len(p.title) <= MAX_TITLE]
    chosen = random.Random(seed).sample(poems, n)
    return [(p.form, p.title, "") if i % 2 == 0 else (p.form, "", p.lines[0][0]) for i, p in enumerate(chosen)]


@torch.no_grad()
def sample_poems(model, tokenizer, prompts: Sequence[tuple[str, str, str]], *, temperature: float = 0.8,
                 top_k: int | None = None, top_p: float | None = None, seed: int = 0,
                 on_unknown: str = "warn") -> list[str]:
    """按提示 ``(体裁, 题目, 首字)`` 作诗，返回每首的正文（含首字，不含体裁与题目）。

    提示按词元数分组成批生成（同一组长度相同，不需要填充）；``seed`` 决定全部样本。PAD、BOS、UNK 不会被生成。
    题目或首字里有词表外的字（只能当作 ``<unk>``）时按 ``on_unknown`` 处理：``"warn"``（默认）警告一次、列出
    这些字，``"error"`` 抛出 :class:`~tformer_lib.unknown_tokens.UnknownTokenError`，``"ignore"`` 不作声。
    """
    import warnings

    from ..specials import BOS, EOS, UNK
    from ..unknown_tokens import ON_UNKNOWN, UnknownTokenWarning, report_unknown
    from .data import poem_prompt
    from .generate import generate

    one_of("on_unknown", on_unknown, ON_UNKNOWN)
    texts = [poem_prompt(*p) for p in prompts]
    find = getattr(tokenizer, "unknown_chars", None)  # 字符词表才有词表外的字；字节级 BPE 什么都能编码
    if find is not None and on_unknown != "ignore":
        missing = {t: find(t) for t in texts if find(t)}
        if missing:
            chars = list(dict.fromkeys(c for cs in missing.values() for c in cs))
            first = next(iter(missing))
            report_unknown(f"prompts 里有词表外的字 {chars}（{len(missing)}/{len(texts)} 个提示，如 {first!r}），"
                           "它们只能当作 <unk>，作出的诗多半不切题", on_unknown, stacklevel=2)
    with warnings.catch_warnings():  # 上面已经一次报告过，不再逐条警告
        warnings.simplefilter("ignore", UnknownTokenWarning)
        encoded = [[BOS] + tokenizer.encode(t) for t in texts]
    out: list[str | None] = [None] * len(prompts)
    generator = torch.Generator().manual_seed(seed)
    by_length: dict[int, list[int]] = {}
    for i, ids in enumerate(encoded):
        by_length.setdefault(len(ids), []).append(i)
    for length in sorted(by_length):
        rows = by_length[length]
        new = generate(model, torch.tensor([encoded[i] for i in rows]), min(96, model.config.max_len - length),
                       temperature=temperature, top_k=top_k, top_p=top_p, generator=generator, eos_id=EOS,
                       suppress_ids=(PAD, BOS, UNK))
        for i, ids in zip(rows, new.tolist()):
            out[i] = prompts[i][2] + tokenizer.decode(ids)
    return out  # type: ignore[return-value]


def train_line_set(split: str = "train") -> set[str]:
    """训练划分里所有诗句的集合（判断“背书”用）。"""
    from ..data.poems import load_poems

    return {line for p in load_poems(split) for line in p.lines}


def evaluate_poem_model(model, tokenizer, data: dict, *, n_samples: int = 200, temperature: float = 0.8,
                        top_k: int | None = None, top_p: float | None = None, seed: int = 0,
                        split: str = "test") -> dict:
    """第 9 章的三把尺子一次量完：困惑度对比二元基线、体裁正确率、背书率。

    ``data`` 是 :func:`~tformer_lib.lm.pretrained.poem_data` 的结果（训练块用来拟合二元模型，``valid`` 选 λ）。
    """
    from .data import loss_targets

    if split not in ("valid", "test") or split not in data:
        raise ValueError(f"split 应是 'valid' 或 'test'（data 里逐首诗的划分），收到 {split!r}")
    bigram = BigramLM.fit(loss_targets(data["train_blocks"]), data["valid"], tokenizer.vocab_size)
    _, ppl = lm_perplexity(model, *data[split])
    bigram_ppl = bigram.perplexity(*data[split])
    prompts = quality_prompts(split, n_samples, seed)
    # 留出诗的题目里偶有低频字（按设计记作 UNK）：度量照常进行，不为它们警告
    texts = sample_poems(model, tokenizer, prompts, temperature=temperature, top_k=top_k, top_p=top_p, seed=seed,
                         on_unknown="ignore")
    return {
        "perplexity": ppl,
        "bigram_perplexity": bigram_ppl,
        "bigram_lambda": bigram.lam,
        "perplexity_reduction": 1 - ppl / bigram_ppl,
        "form_accuracy": form_accuracy(texts, [p[0] for p in prompts]),
        "verbatim_line_rate": verbatim_line_rate(texts, train_line_set()),
        "samples": texts,
        "prompts": prompts,
    }


__all__ += ["quality_prompts", "sample_poems", "train_line_set", "evaluate_poem_model"]
