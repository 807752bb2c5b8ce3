"""参差批次（ragged batch）的贪心生成：长短不一的提示放进同一批，结果与逐条生成逐词元相同。

做法是**左侧填充**（left padding）：把每条提示右对齐，左边补 PAD，于是每一行的“下一个位置”都在最右端，
每步只需给整批接上一列新词元。要让填充完全不影响结果，两件事缺一不可：

- 位置编号（position ids）从每行真正的第一个词元数起：第 b 行第 j 列的位置是 ``j - pad_b``；
- 注意力掩码把填充列屏蔽掉：键 j 对第 b 行可见，当且仅当 ``j >= pad_b``（再与因果掩码取“与”）。
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import nn

from .._checks import check_suppress_ids, language_model, non_negative_int
from ..lm.generate import check_eos_id, greedy_tokens
from ..specials import BOS, PAD

__all__ = ["check_prompts", "left_pad", "greedy_batch"]


def check_prompts(model: nn.Module, prompts, max_new_tokens) -> list[list[int]]:
    """检查一批提示与生成长度，返回 ``list[list[int]]``；不合法时给出点名参数的错误。"""
    language_model("model", model)
    if isinstance(prompts, (str, bytes)) or not isinstance(prompts, Sequence) or len(prompts) == 0:
        raise ValueError(f"prompts 应是非空的提示列表（每条是 id 列表），收到 {type(prompts).__name__}")
    vocab, max_len = model.config.vocab_size, model.config.max_len
    lengths = max_new_tokens if isinstance(max_new_tokens, Sequence) else [max_new_tokens] * len(prompts)
    if len(lengths) != len(prompts):
        raise ValueError(f"max_new_tokens 有 {len(lengths)} 项，prompts 有 {len(prompts)} 条：两者必须一样多")
    out = []
    for i, (prompt, n_new) in enumerate(zip(prompts, lengths)):
        ids = prompt.tolist() if isinstance(prompt, torch.Tensor) else prompt
        if not isinstance(ids, (list, tuple)) or not ids or not all(
            isinstance(t, int) and not isinstance(t, bool) for t in ids
        ):
            raise ValueError(f"prompts[{i}] 应是非空的整数 id 列表，收到 {prompt!r:.60}")
        if min(ids) < 0 or max(ids) >= vocab:
            raise ValueError(f"prompts[{i}] 里的 id 应在 [0, {vocab}) 内，收到范围 [{min(ids)}, {max(ids)}]")
        n_new = non_negative_int(f"max_new_tokens（第 {i} 条）", n_new)
        if len(ids) + n_new > max_len:
            raise ValueError(
                f"prompts[{i}] 长度 {len(ids)} 加 max_new_tokens={n_new} 超过了上下文长度 max_len={max_len}"
            )
        out.append(list(ids))
    return out


def _check_left_pad(prompts, pad_id) -> list[list[int]]:
    """:func:`left_pad` 的参数检查：非空的提示列表、每条是非空的整数 id 列表，``pad_id`` 是非负整数 id。"""
    if isinstance(prompts, (str, bytes)) or not isinstance(prompts, Sequence) or len(prompts) == 0:
        raise ValueError(f"prompts 应是非空的提示列表（每条是 id 列表），收到 {prompts!r:.60}")
    for i, p in enumerate(prompts):
        if isinstance(p, (str, bytes)) or not isinstance(p, Sequence) or len(p) == 0 or not all(
            isinstance(t, int) and not isinstance(t, bool) for t in p
        ):
            raise ValueError(f"prompts[{i}] 应是非空的整数 id 列表，收到 {p!r:.60}")
    non_negative_int("pad_id", pad_id)
    return [list(p) for p in prompts]


def left_pad(prompts: list[list[int]], pad_id: int = PAD) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """左侧填充：返回 ``tokens (B, T)``、``positions (B, T)``、``key_mask (B, T)``（True = 真实词元）。"""
    prompts = _check_left_pad(prompts, pad_id)
    width = max(len(p) for p in prompts)
    pads = torch.tensor([width - len(p) for p in prompts])  # (B,)
    tokens = torch.tensor([[pad_id] * (width - len(p)) + p for p in prompts])  # (B, T)
    columns = torch.arange(width)[None, :]  # (1, T)
    key_mask = columns >= pads[:, None]  # (B, T)
    positions = (columns - pads[:, None]).clamp(min=0)  # (B, T)：填充处的位置无所谓，取 0
    return tokens, positions, key_mask


@torch.no_grad()
def greedy_batch(
    model: nn.Module,
    prompts,
    max_new_tokens: int | Sequence[int],
    *,
    eos_id: int | None = None,
    suppress_ids: Sequence[int] = (PAD, BOS),
    on_token: Callable[[int, int], None] | None = None,
) -> list[list[int]]:
    """一批长短不一的提示一起贪心生成，返回每条新生成的词元（不含提示；生成 ``eos_id`` 后停止，含 EOS）。

    ``max_new_tokens`` 可以是一个数，也可以每条一个；``on_token(b, token)`` 在第 b 条每得到一个词元时被调用
    （静态批处理的基准用它记时刻）。结果与对每条提示单独调用
    ``generate(model, prompt, n, method="greedy", eos_id=eos_id)`` 相同（测试核对）。
    """
    prompts = check_prompts(model, prompts, max_new_tokens)
    suppress_ids = check_suppress_ids(suppress_ids)
    check_eos_id(eos_id, model.config.vocab_size, suppress_ids)
    if on_token is not None and not callable(on_token):
        raise TypeError(f"on_token 应是可调用的 on_token(b, token) 或 None，收到 {type(on_token).__name__} {on_token!r:.40}")
    limits = list(max_new_tokens) if isinstance(max_new_tokens, Sequence) else [max_new_tokens] * len(prompts)
    device = next(model.parameters()).device
    tokens, positions, key_mask = (t.to(device) for t in left_pad(prompts))
    was_training = model.training
    model.eval()
    try:
        cache = model.new_cache()
        outputs: list[list[int]] = [[] for _ in prompts]
        active = [n > 0 for n in limits]
        step_tokens, step_positions = tokens, positions
        while any(active):
            attn_mask = key_mask[:, None, None, :]  # (B, 1, 1, T_k)：屏蔽每行左侧的填充
            logits = model(step_tokens, cache=cache, positions=step_positions, attn_mask=attn_mask)[:, -1]  # (B, V)
            nxt = greedy_tokens(logits, suppress_ids)  # (B,)
            for b, token in enumerate(nxt.tolist()):
                if active[b]:
                    outputs[b].append(token)
                    if on_token is not None:
                        on_token(b, token)
                    active[b] = len(outputs[b]) < limits[b] and token != eos_id
            step_tokens = nxt[:, None]  # (B, 1)
            # 已结束的行还在批里陪跑，它们的位置不再重要，截在上下文之内即可
            step_positions = (step_positions[:, -1:] + 1).clamp(max=model.config.max_len - 1)  # (B, 1)
            key_mask = torch.cat([key_mask, key_mask.new_ones(len(prompts), 1)], dim=1)  # (B, T_k + 1)
    finally:
        model.train(was_training)
    return outputs
