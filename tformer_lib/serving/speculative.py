"""推测解码（speculative decoding）：小的草稿模型（draft）先猜 k 个词元，大的目标模型（target）一次前向验证。

贪心版本的规则很简单：目标模型对“上一个词元 + k 个草稿词元”做**一次**前向，得到 k + 1 个位置各自的贪心选择
``t_1 … t_{k+1}``；草稿从头开始与之相同的最长前缀 ``d_1 … d_n`` 被接受，再接上目标自己的 ``t_{n+1}``
（第一个分歧处的改正，或全部接受时白得的一个词元）。所以每次验证至少前进 1 个词元、至多 k + 1 个，
而输出与只用目标模型逐个贪心生成**完全相同**——草稿只影响快慢，不影响结果（测试核对）。

若每个草稿词元被接受的概率都是 α（且相互独立），每次验证平均产出
:math:`\\frac{1-\\alpha^{k+1}}{1-\\alpha}` 个词元；草稿一步的开销是目标一步的 c 倍时，期望加速比为
:math:`\\frac{1-\\alpha^{k+1}}{(1-\\alpha)(k c + 1)}`（Leviathan et al., 2023）。
"""

from __future__ import annotations

import copy
import math
import numbers
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn

from ..lm.generate import check_eos_id, greedy_tokens
from .._checks import check_suppress_ids, language_model, non_negative_int, positive_int
from ..specials import BOS, PAD

__all__ = ["SpeculativeStats", "speculative_generate", "expected_tokens_per_pass", "expected_speedup",
           "layer_skip_draft"]


@dataclass
class SpeculativeStats:
    """一次推测解码的账：草稿提出与被接受的词元数、目标与草稿各做了几次前向。"""

    proposed: int = 0
    accepted: int = 0
    target_passes: int = 0
    draft_passes: int = 0
    rejected: int = 0  # 有多少次验证在某个草稿词元处被拒（其后的草稿词元根本没被检验）

    def __post_init__(self):
        for name in ("proposed", "accepted", "target_passes", "draft_passes", "rejected"):
            non_negative_int(name, getattr(self, name))
        self._check_counts()

    def _check_counts(self) -> None:
        if self.accepted > self.proposed:
            raise ValueError(f"accepted={self.accepted} 不能多于 proposed={self.proposed}：被接受的草稿词元都是提出过的")

    @property
    def acceptance_rate(self) -> float:
        """被接受的草稿词元 ÷ 提出的草稿词元。"""
        self._check_counts()
        return self.accepted / self.proposed if self.proposed else 0.0

    @property
    def alpha(self) -> float:
        """每个草稿词元被接受的概率 α 的估计：被检验过的词元里接受的比例 = 接受数 ÷（接受数 + 被拒次数）。

        第一个被拒的词元之后的草稿不再检验，把它们也算作“没被接受”会低估 α（k > 1 时）；期望公式里的 α 指的是这个。
        """
        tested = self.accepted + self.rejected
        return self.accepted / tested if tested else 0.0


def _probability(name: str, value) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not 0 <= value <= 1:
        raise ValueError(f"{name} 应是 [0, 1] 内的数（概率），收到 {value!r}")
    return float(value)


def expected_tokens_per_pass(alpha: float, k: int) -> float:
    """接受率为 α、每次猜 k 个时，每次目标前向平均产出的词元数 :math:`(1-α^{k+1})/(1-α)`。"""
    _probability("alpha", alpha)
    positive_int("k", k)
    return float(k + 1) if alpha == 1 else (1 - alpha ** (k + 1)) / (1 - alpha)


def expected_speedup(alpha: float, k: int, cost_ratio: float) -> float:
    """相对只用目标模型的期望加速比；``cost_ratio`` = 草稿一步的开销 ÷ 目标一步的开销（c）。"""
    if isinstance(cost_ratio, bool) or not isinstance(cost_ratio, numbers.Real) or not (
        math.isfinite(cost_ratio) and cost_ratio >= 0
    ):
        raise ValueError(f"cost_ratio 应是有限的非负数（草稿一步 ÷ 目标一步的开销），收到 {cost_ratio!r}")
    return expected_tokens_per_pass(alpha, k) / (k * cost_ratio + 1)


def layer_skip_draft(model: nn.Module, n_layers: int) -> nn.Module:
    """用目标模型的前 ``n_layers`` 个块（加上它的末层归一化与输出层）当草稿：不用另训模型，权重与目标共享。"""
    language_model("model", model)
    if not isinstance(getattr(model, "blocks", None), nn.ModuleList):
        raise TypeError(f"model 应是有 .blocks 的 DecoderOnlyLM，收到 {type(model).__name__}")
    total = len(model.blocks)
    if positive_int("n_layers", n_layers) >= total:
        raise ValueError(f"n_layers 应是 [1, {total - 1}] 内的整数（目标模型有 {total} 块），收到 {n_layers!r}")
    draft = copy.copy(model)  # 浅拷贝：子模块与目标共享
    draft._modules = dict(model._modules)
    draft.blocks = nn.ModuleList(list(model.blocks)[:n_layers])
    draft.config = copy.copy(model.config)
    draft.config.n_layers = n_layers
    return draft


def _draft_pick(logits: torch.Tensor, banned: list[int]) -> int:
    """草稿的猜测只影响快慢、不影响结果，所以不必走 :func:`~tformer_lib.lm.generate.greedy_tokens` 的完整检查：屏蔽特殊词后直接取最大者。"""
    logits[..., banned] = float("-inf")
    return int(logits.argmax(dim=-1))


@torch.no_grad()
def speculative_generate(
    target: nn.Module,
    draft: nn.Module,
    prompt: Sequence[int],
    max_new_tokens: int,
    *,
    k: int = 4,
    eos_id: int | None = None,
    suppress_ids: Sequence[int] = (PAD, BOS),
) -> tuple[list[int], SpeculativeStats]:
    """贪心推测解码一条提示，返回 ``(新词元, 统计)``；新词元与 ``generate(target, prompt, …, method="greedy")`` 相同。"""
    language_model("target", target)
    language_model("draft", draft)
    suppress_ids = check_suppress_ids(suppress_ids)
    k = positive_int("k", k)
    if target.config.vocab_size != draft.config.vocab_size:
        raise ValueError(
            f"draft 的词表大小 {draft.config.vocab_size} 与 target 的 {target.config.vocab_size} 不同：两者必须共用词表"
        )
    from .ragged import check_prompts  # 与其他服务部件用同一套检查

    (seq,) = check_prompts(target, [prompt], [max_new_tokens])
    check_eos_id(eos_id, target.config.vocab_size, suppress_ids)
    max_len = min(target.config.max_len, draft.config.max_len)
    if len(seq) + max_new_tokens > max_len:
        raise ValueError(f"提示长度 {len(seq)} 加 max_new_tokens={max_new_tokens} 超过了草稿模型的上下文 {max_len}")
    device = next(target.parameters()).device
    banned = sorted({int(t) for t in suppress_ids if 0 <= int(t) < draft.config.vocab_size})
    stats = SpeculativeStats()
    states = [(m, m.training) for m in (target, draft)]
    for m, _ in states:
        m.eval()
    try:
        t_cache, d_cache = target.new_cache(), draft.new_cache()
        prompt_len = len(seq)
        # 先让目标看完提示（最后一个词元留到验证时和草稿一起送入）
        if prompt_len > 1:
            target(torch.tensor([seq[:-1]], device=device), cache=t_cache)
        while len(seq) - prompt_len < max_new_tokens:
            remaining = max_new_tokens - (len(seq) - prompt_len)
            n_draft = min(k, remaining - 1)  # 验证一次至少产出 1 个：猜得再多也不超过剩余额度
            proposal: list[int] = []
            for _ in range(n_draft):  # 草稿逐个猜（它的缓存可能落后好几个词元，一次补齐）
                fresh = (seq + proposal)[d_cache.length:]
                logits = draft(torch.tensor([fresh], device=device), cache=d_cache)[0, -1]  # (V,)
                stats.draft_passes += 1
                proposal.append(_draft_pick(logits, banned))
                if proposal[-1] == eos_id:
                    break
            # 目标一次前向验证：输入是尚未进缓存的词元（上一个词元）+ 全部草稿
            fresh = (seq + proposal)[t_cache.length:]
            logits = target(torch.tensor([fresh], device=device), cache=t_cache)[0]  # (len(fresh), V)
            stats.target_passes += 1
            choices = greedy_tokens(logits[-(len(proposal) + 1):], suppress_ids).tolist()  # t_1 … t_{n_draft+1}
            n = 0
            while n < len(proposal) and proposal[n] == choices[n]:
                n += 1
            stats.proposed += len(proposal)
            stats.accepted += n
            stats.rejected += n < len(proposal)
            new = proposal[:n] + [choices[n]]
            seq += new
            # 缓存回退到已确认的前缀：最后一个新词元（目标的改正或奖励）还没进缓存，下一轮再送
            t_cache.crop(len(seq) - 1)
            d_cache.crop(min(d_cache.length, len(seq) - 1))
            if eos_id is not None and eos_id in new:
                break
        out = seq[prompt_len:]
        if eos_id is not None and eos_id in out:
            out = out[: out.index(eos_id) + 1]
        return out[:max_new_tokens], stats
    finally:
        for m, was_training in states:
            m.train(was_training)
