"""编译路径上的贪心推测解码：草稿与目标都用静态缓存与编译过的固定形状步。

规则同 :mod:`tformer_lib.serving.speculative`（草稿猜 k 个，目标一次前向验证 k + 1 个位置，接受最长的相同前缀，
再接上目标自己的一个词），输出与只用目标贪心生成逐词元相同（测试核对）。静态缓存让“回退”不花任何代价：
被拒的草稿写过的槽位不必清掉——下一次写入会覆盖它们，之前因果掩码也不让任何查询看见它们（它们在查询之后）。

目标的验证步是另一张固定形状的图（``tokens (1, k+1)``），所以每个 k 编译一次。
期望加速比 :math:`\\frac{1-α^{k+1}}{(1-α)(k c + r)}`：c = 草稿一步 ÷ 目标一步，r = 验证一次 ÷ 目标一步
（:func:`~tformer_lib.serving.speculative.expected_speedup` 取 r = 1）。
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from .._checks import check_suppress_ids, language_model, positive_int
from ..lm.generate import check_eos_id
from ..serving.speculative import SpeculativeStats
from ..specials import BOS, PAD
from .compiled import StaticDecoder, inductor_options
from .step import static_forward

__all__ = ["CompiledSpeculative"]


class CompiledSpeculative:
    """``target`` 与 ``draft`` 各一个 :class:`StaticDecoder`（批大小 1），外加目标的 k + 1 词验证步。

    ``compile``、``freeze``、``skip_guards``、``cpp_wrapper`` 的含义同 :class:`StaticDecoder`；``compile=False`` 时全是 eager（测试用）。
    """

    def __init__(self, target, draft, k: int = 2, *, compile: bool = True, freeze: bool = False,
                 skip_guards: bool = False, cpp_wrapper: bool = False):
        language_model("target", target)
        language_model("draft", draft)
        self.k = positive_int("k", k)
        if target.config.vocab_size != draft.config.vocab_size:
            raise ValueError(f"draft 的词表大小 {draft.config.vocab_size} 与 target 的 {target.config.vocab_size} 不同")
        options = dict(compile=compile, freeze=freeze, skip_guards=skip_guards, cpp_wrapper=cpp_wrapper)
        self.target, self.draft = StaticDecoder(target, **options), StaticDecoder(draft, **options)
        verify = self._verify_step
        self._verify = torch.compile(verify, fullgraph=True, dynamic=False,
                                     options=inductor_options(freeze, cpp_wrapper)) if compile else verify

    def _verify_step(self, cache, tokens: torch.Tensor, slots: torch.Tensor, pads: torch.Tensor,
                     banned: torch.Tensor) -> torch.Tensor:
        """目标对 ``tokens (1, k+1)``（上一个词 + k 个草稿）做一次前向，返回每个位置的贪心选择 ``(k+1,)``。"""
        logits = static_forward(self.target.model, cache, tokens, slots, pads)[0]  # (k+1, V)
        return logits.masked_fill(banned, float("-inf")).argmax(dim=-1)  # (k+1,)

    @torch.no_grad()
    def generate(self, prompt: Sequence[int], max_new_tokens: int, *, eos_id: int | None = None,
                 suppress_ids: Sequence[int] = (PAD, BOS)) -> tuple[list[int], SpeculativeStats]:
        """贪心推测解码一条提示，返回 ``(新词元, 统计)``；与 ``generate(target, prompt, n, method="greedy")`` 相同。"""
        target, draft, k = self.target.model, self.draft.model, self.k
        suppress_ids = check_suppress_ids(suppress_ids)
        check_eos_id(eos_id, target.config.vocab_size, suppress_ids)
        if isinstance(prompt, torch.Tensor):
            prompt = prompt.tolist()
        if not isinstance(prompt, (list, tuple)) or not prompt or not all(isinstance(t, int) for t in prompt):
            raise ValueError(f"prompt 应是非空的整数 id 列表，收到 {prompt!r:.60}")
        positive_int("max_new_tokens", max_new_tokens)
        limit = min(self.target.max_len, self.draft.max_len)
        if len(prompt) + max_new_tokens + k > limit:
            raise ValueError(f"提示长度 {len(prompt)} + max_new_tokens={max_new_tokens} + k={k} 超过了缓存的槽位数 {limit}"
                             "（验证一次最多多写 k 个槽位）")
        device = target.lm_head.weight.device
        banned = torch.zeros(target.config.vocab_size, dtype=torch.bool, device=device)  # (V,)
        banned[list(suppress_ids)] = True
        pads = torch.zeros(1, dtype=torch.long, device=device)
        stats = SpeculativeStats()
        states = [(m, m.training) for m in (target, draft)]
        for m, _ in states:
            m.eval()
        try:
            t_cache, d_cache = self.target.cache(1), self.draft.cache(1)
            tokens = torch.tensor([list(prompt)], device=device)  # (1, P)
            first = self.target.prefill(t_cache, tokens, pads).masked_fill(banned, float("-inf")).argmax(dim=-1)
            self.draft.prefill(d_cache, tokens, pads)
            seq = list(prompt) + [int(first)]
            d_len = len(prompt)  # 草稿缓存里已确认正确的槽位数
            while len(seq) - len(prompt) < max_new_tokens and not (eos_id is not None and eos_id in seq[len(prompt):]):
                # 1) 草稿：先补上它还没见过的已确认词元，再逐个猜 k 个
                proposal = []
                behind = len(seq) - d_len  # 草稿落后的词元数（通常 1 或 2）
                for j in range(behind + k - 1):
                    # 每步一个新建的 (1, 1) 张量：切片视图的步长不同，会让编译器重新编译
                    token = torch.tensor([[seq[d_len + j]]], device=device) if j < behind else proposal[-1][:, None]
                    _, guess = self.draft.decode_step(d_cache, token, torch.tensor([d_len + j], device=device), pads, banned)
                    stats.draft_passes += 1
                    if j >= behind - 1:
                        proposal.append(guess)  # (1,)
                d_len = len(seq)
                # 2) 目标：一次验证“上一个词 + k 个草稿”
                guesses = torch.cat(proposal)  # (k,)
                verify_in = torch.cat([torch.tensor([seq[-1]], device=device), guesses])[None]  # (1, k+1)
                slots = torch.arange(len(seq) - 1, len(seq) + k, device=device)  # (k+1,)
                choices = self._verify(t_cache, verify_in, slots, pads, banned).tolist()  # (k+1,)
                stats.target_passes += 1
                drafted = guesses.tolist()
                n = 0
                while n < k and drafted[n] == choices[n]:
                    n += 1
                stats.proposed += k
                stats.accepted += n
                stats.rejected += n < k
                d_len += min(n, k - 1)  # 被接受、且草稿自己已经写进缓存的那几个
                seq += drafted[:n] + [choices[n]]
            out = seq[len(prompt):]
            if eos_id is not None and eos_id in out:
                out = out[: out.index(eos_id) + 1]
            return out[:max_new_tokens], stats
        finally:
            for m, was_training in states:
                m.train(was_training)
