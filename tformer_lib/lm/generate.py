"""语言模型的生成（generation）：贪心、温度、top-k 与 top-p（核采样 nucleus sampling）。

每一步只做三件事：算出下一个词元的 logits → 按策略改造分布 → 取一个词元接到末尾。
有 K/V 缓存时每步只把新词元送进模型，否则每步重算整个前缀；两者生成的词元相同（测试核对）。

返回的只是**新生成的部分**，不含提示（prompt）；生成了 ``eos_id`` 的行在它之后全是 PAD。
PAD 与 BOS 永远不会被生成（它们只是填充和开头的记号）。
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from .._checks import check_suppress_ids, non_negative_int, positive_int
from ..specials import BOS, PAD
from ..temperature import apply_temperature, check_temperature, is_greedy_temperature

__all__ = ["check_eos_id", "filter_top_k", "filter_top_p", "greedy_tokens", "next_token_distribution", "generate"]


def check_top_k(top_k) -> None:
    if top_k is not None:
        positive_int("top_k", top_k)


def check_top_p(top_p) -> None:
    if top_p is not None and (isinstance(top_p, bool) or not isinstance(top_p, (int, float)) or not 0 < top_p <= 1):
        raise ValueError(f"top_p 应是 (0, 1] 内的数或 None，收到 {top_p!r}")


def check_eos_id(eos_id, vocab_size: int, suppress_ids: Sequence[int] = (PAD, BOS)) -> None:
    """``eos_id`` 应是 None，或词表内、没有被 ``suppress_ids`` 屏蔽（否则永远生成不出来）的整数 id。"""
    if eos_id is None:
        return
    if non_negative_int("eos_id", eos_id) >= vocab_size:
        raise ValueError(f"eos_id 应是 [0, {vocab_size}) 内的整数 id 或 None，收到 {eos_id!r}")
    if eos_id in {int(t) for t in suppress_ids}:
        raise ValueError(f"eos_id={eos_id} 在 suppress_ids 里，永远不会被生成；请换一个 eos_id 或不屏蔽它")


def filter_top_k(logits: torch.Tensor, top_k: int | None) -> torch.Tensor:
    """只保留每行分数最高的 ``top_k`` 个词，其余置为 −∞。``logits`` ``(..., V)``。

    与第 k 名分数相同（并列）的词也都保留，所以保留下来的可能多于 ``top_k`` 个——与 Hugging Face
    ``TopKLogitsWarper`` 的做法相同：在并列的词之间任挑 k 个，结果就会依赖排序实现的细节。
    """
    check_top_k(top_k)
    if top_k is None or top_k >= logits.shape[-1]:
        return logits
    kth = logits.topk(top_k, dim=-1).values[..., -1:]  # (..., 1) 第 k 大的分数
    return logits.masked_fill(logits < kth, float("-inf"))


def filter_top_p(logits: torch.Tensor, top_p: float | None) -> torch.Tensor:
    """核采样：按概率从高到低累加，保留累计概率刚达到 ``top_p`` 的最小集合，其余置为 −∞。

    概率最高的词总会被保留（即使它一个就超过了 ``top_p``）。``logits`` ``(..., V)``。
    """
    check_top_p(top_p)
    if top_p is None or top_p >= 1:
        return logits
    sorted_logits, order = logits.sort(dim=-1, descending=True)  # (..., V)
    probs = sorted_logits.softmax(dim=-1)
    before = probs.cumsum(dim=-1) - probs  # 排在它前面的词的累计概率
    drop_sorted = before >= top_p  # 前面的词已经凑够 top_p：这个词不要
    drop = drop_sorted.scatter(-1, order, drop_sorted)  # 还原到原来的词表顺序
    return logits.masked_fill(drop, float("-inf"))


def banned_ids(suppress_ids: Sequence[int], vocab_size: int) -> list[int]:
    """``suppress_ids`` 检查后去重排序；每个 id 都要在词表 ``[0, vocab_size)`` 内。"""
    return sorted(set(check_suppress_ids(suppress_ids, vocab_size)))


def _check_logits(logits, layout: str) -> None:
    if not isinstance(logits, torch.Tensor) or not logits.is_floating_point() or logits.dim() < 1 or logits.shape[-1] == 0:
        got = f"{logits.dtype} {tuple(logits.shape)}" if isinstance(logits, torch.Tensor) else type(logits).__name__
        raise ValueError(f"logits 应是形状为 {layout}、V ≥ 1 的浮点张量，收到 {got}")


def _suppress(logits: torch.Tensor, suppress_ids: Sequence[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """屏蔽 ``suppress_ids``（置为 −∞，不改原张量），返回 ``(屏蔽后的 logits, 每行最大者的 id)``。

    某一行的最大值不是有限数就报错：整行被屏蔽，或有 NaN/+inf（``max`` 遇到 NaN 返回 NaN，所以一次检查就够）。
    """
    banned = banned_ids(suppress_ids, logits.shape[-1])
    if banned:
        logits = logits.clone()
        logits[..., banned] = float("-inf")
    best, index = logits.max(dim=-1)  # (...,), (...,)
    if not bool(torch.isfinite(best).all()):
        raise ValueError(
            "某一行的 logits 在屏蔽 suppress_ids 之后没有一个有限值（全被屏蔽，或模型输出了 NaN/inf），无词元可选；"
            f"suppress_ids 屏蔽了 {len(banned)} 个 id，词表大小 {logits.shape[-1]}"
        )
    return logits, index


def greedy_tokens(logits: torch.Tensor, suppress_ids: Sequence[int] = (PAD, BOS)) -> torch.Tensor:
    """贪心取词：屏蔽 ``suppress_ids`` 后每行分数最高的词，``logits`` ``(..., V)`` → ``(...)``（通常是 ``(B, V)`` → ``(B,)``）；
    并列时取 id 最小的。``suppress_ids`` 里的 id 都要在词表内。

    直接在 logits 上取最大者（与 Hugging Face ``generate`` 的贪心相同），不必先 softmax——softmax 不改变大小次序，
    多算一遍只是多花时间。某一行的最大值不是有限数（整行被屏蔽，或有 NaN/inf）时报错，而不是选出一个无意义的词。
    """
    _check_logits(logits, "(..., V)")
    return _suppress(logits, suppress_ids)[1]  # (...,)


def next_token_distribution(
    logits: torch.Tensor,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    suppress_ids: Sequence[int] = (PAD, BOS),
) -> torch.Tensor:
    """把最后一步的 logits ``(B, V)`` 变成采样用的概率 ``(B, V)``：屏蔽特殊词 → ÷温度 → top-k → top-p → softmax。

    ``temperature=0`` 是贪心的极限（独热分布）；很小的正温度也不会产生 NaN（见 :mod:`tformer_lib.temperature`）。
    """
    check_temperature("temperature", temperature)
    _check_logits(logits, "(B, V)")
    logits, _ = _suppress(logits.float(), suppress_ids)  # (B, V)
    logits = filter_top_p(filter_top_k(apply_temperature(logits, temperature), top_k), top_p)
    return logits.softmax(dim=-1)


def _as_prompt(prompt) -> tuple[torch.Tensor, bool]:
    """提示可以是 id 列表、1-D 张量（一条）或 2-D 张量 ``(B, T)``（等长的一批）。"""
    if isinstance(prompt, torch.Tensor):
        tokens = prompt
    elif isinstance(prompt, (list, tuple)) and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        tokens = torch.tensor(list(prompt), dtype=torch.long)
    else:
        raise TypeError(f"prompt 应是 id 列表或 LongTensor (T,) / (B, T)，收到 {type(prompt).__name__}")
    if tokens.dtype.is_floating_point or tokens.dtype == torch.bool:
        raise TypeError(f"prompt 应是整数 id，收到 dtype {tokens.dtype}")
    if tokens.dim() not in (1, 2) or tokens.shape[-1] == 0:
        raise ValueError(f"prompt 应是非空的 (T,) 或 (B, T)，收到形状 {tuple(tokens.shape)}；至少给一个词元（如 BOS）")
    single = tokens.dim() == 1
    return (tokens[None] if single else tokens).long(), single


@torch.no_grad()
def generate(
    model: nn.Module,
    prompt,
    max_new_tokens: int | None = None,
    *,
    method: str = "sample",
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    generator: torch.Generator | None = None,
    eos_id: int | None = None,
    suppress_ids: Sequence[int] = (PAD, BOS),
    use_cache: bool = True,
) -> torch.Tensor:
    """从 ``prompt`` 接着生成，返回新词元：``(B, L)``（prompt 是 1-D 时返回 ``(L,)``），不含提示本身。

    - ``method="greedy"`` 每步取最大者；``"sample"`` 按 :func:`next_token_distribution` 采样，
      ``generator``（``torch.Generator().manual_seed(…)``）让样本可复现；
    - ``temperature=0`` 表示贪心（OpenAI 风格客户端的约定）：与 ``method="greedy"`` 逐词元相同，不消耗随机数；
    - ``max_new_tokens`` 默认填满上下文：``config.max_len - T``；提示本身或提示加生成长度超过上下文时报错；
    - 所有行都生成了 ``eos_id`` 就提前停止。

    与 Hugging Face ``transformers`` 的 ``model.generate`` 的不同（从那边来的读者留意）：

    - 默认**采样**（``method="sample"``、``temperature=1``）；``generate`` 默认贪心（``do_sample=False``）；
    - 只返回**新生成的词元**；``generate`` 返回提示加新词元的整条序列；
    - 参数名：``eos_id``（``generate`` 叫 ``eos_token_id``）、``suppress_ids``（默认屏蔽 PAD 与 BOS；
      ``generate`` 的 ``suppress_tokens`` 默认什么也不屏蔽）、``method``（代替 ``do_sample``）；
      生成了 ``eos_id`` 的行之后填 PAD（``generate`` 填 ``pad_token_id``）。
    """
    if method not in ("greedy", "sample"):
        raise ValueError(f"method 应是 'greedy' 或 'sample'，收到 {method!r}")
    if method == "sample" and is_greedy_temperature(check_temperature("temperature", temperature)):
        method = "greedy"  # 温度 0（或小到 float32 里就是 0）：贪心
    check_temperature("temperature", temperature)
    check_top_k(top_k)
    check_top_p(top_p)
    tokens, single = _as_prompt(prompt)
    suppress_ids = check_suppress_ids(suppress_ids, model.config.vocab_size)
    check_eos_id(eos_id, model.config.vocab_size, suppress_ids)
    max_len = model.config.max_len
    batch, length = tokens.shape
    if length > max_len:
        raise ValueError(f"prompt 长度 {length} 超过了模型的上下文长度 max_len={max_len}；请截短提示")
    if max_new_tokens is None:
        max_new_tokens = max_len - length
    max_new_tokens = non_negative_int("max_new_tokens", max_new_tokens)
    if length + max_new_tokens > max_len:
        raise ValueError(
            f"prompt 长度 {length} 加 max_new_tokens={max_new_tokens} 超过了上下文长度 max_len={max_len}"
        )
    was_training = model.training
    model.eval()
    try:
        device = next(model.parameters()).device
        tokens = tokens.to(device)
        cache = model.new_cache() if use_cache else None
        out = torch.full((batch, max_new_tokens), PAD, dtype=torch.long, device=device)
        done = torch.zeros(batch, dtype=torch.bool, device=device)
        step_input = tokens
        for i in range(max_new_tokens):
            logits = model(step_input, cache=cache)[:, -1]  # (B, V)：只要最后一个位置
            if method == "greedy":
                nxt = greedy_tokens(logits, suppress_ids)  # (B,)
            else:
                probs = next_token_distribution(logits, temperature, top_k, top_p, suppress_ids)
                nxt = torch.multinomial(probs, 1, generator=generator).squeeze(-1)  # (B,)
            nxt = nxt.masked_fill(done, PAD)
            out[:, i] = nxt
            if eos_id is not None:
                done |= nxt == eos_id
                if bool(done.all()):
                    out = out[:, : i + 1]
                    break
            if use_cache:  # 有缓存：下一步只送入新词元
                step_input = nxt[:, None]  # (B, 1)
            else:  # 没有缓存：下一步重算整个前缀
                step_input = torch.cat([step_input, nxt[:, None]], dim=1)  # (B, T + i + 1)
    finally:
        model.train(was_training)
    return out[0] if single else out
