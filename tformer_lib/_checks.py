"""输入检查：坏输入给出清楚的错误——点名参数、收到了什么、期望什么。"""

from collections.abc import Sequence

import torch


def positive_int(name: str, value) -> int:
    """要求 ``value`` 是正整数。"""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} 应是整数，收到 {type(value).__name__} {value!r}")
    if value <= 0:
        raise ValueError(f"{name} 应是正整数，收到 {value}")
    return value


def tensor_with_dim(name: str, x, dim: int, layout: str) -> torch.Tensor:
    """要求 ``x`` 是 ``dim`` 维张量，``layout`` 是期望形状的写法，如 ``"(B, T, d_model)"``。"""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} 应是形状为 {layout} 的 torch.Tensor，收到 {type(x).__name__}")
    if x.dim() != dim:
        raise ValueError(f"{name} 应是 {dim} 维张量 {layout}，收到形状 {tuple(x.shape)}")
    return x


def non_empty_sequence(name: str, x: torch.Tensor, seq_dim: int = -2) -> None:
    """要求序列维度长度至少为 1。"""
    if x.shape[seq_dim] == 0:
        raise ValueError(f"{name} 是空序列（形状 {tuple(x.shape)}）；序列长度至少应为 1")


def token_ids(name: str, tokens, vocab_size: int) -> torch.Tensor:
    """要求 ``tokens`` 是整数张量，且每个 id 都落在 ``[0, vocab_size)`` 内。"""
    if not isinstance(tokens, torch.Tensor):
        raise TypeError(f"{name} 应是由词元 id 组成的 torch.Tensor，收到 {type(tokens).__name__}")
    if tokens.dtype.is_floating_point or tokens.dtype == torch.bool or tokens.is_complex():
        raise TypeError(f"{name} 应是整数类型的词元 id，收到 dtype {tokens.dtype}")
    if tokens.numel() > 0:
        low, high = int(tokens.min()), int(tokens.max())
        if low < 0 or high >= vocab_size:
            raise ValueError(
                f"{name} 中的词元 id 落在 [{low}, {high}]，超出了词表范围 [0, {vocab_size - 1}]"
            )
    return tokens


def bool_mask(name: str, mask, target_shape: Sequence[int]) -> torch.Tensor:
    """要求 ``mask`` 是布尔张量（True = 可以关注），且能广播到 ``target_shape``。"""
    if not isinstance(mask, torch.Tensor):
        raise TypeError(f"{name} 应是布尔 torch.Tensor（True = 可以关注），收到 {type(mask).__name__}")
    if mask.dtype != torch.bool:
        raise TypeError(
            f"{name} 的 dtype 应是 torch.bool（True = 可以关注），收到 {mask.dtype}；"
            f"若用 1 标记要保留的位置，可用 `{name} = {name} != 0` 转换"
        )
    try:
        broadcast = torch.broadcast_shapes(tuple(mask.shape), tuple(target_shape))
    except RuntimeError:
        broadcast = None
    if broadcast != tuple(target_shape):
        raise ValueError(
            f"{name} 的形状 {tuple(mask.shape)} 无法广播到分数的形状 {tuple(target_shape)}"
        )
    return mask


def attention_inputs(q, k, v) -> None:
    """要求 ``q``/``k``/``v`` 形如 ``(..., T, d)``：q、k 的 d_k 相同，k、v 的长度 T_k 相同，且都非空。"""
    for name, x in (("q", q), ("k", k), ("v", v)):
        if not isinstance(x, torch.Tensor) or x.dim() < 2:
            raise ValueError(f"{name} 应是形状为 (..., T, d) 的张量，收到 {getattr(x, 'shape', type(x))}")
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(f"q 与 k 的最后一维 d_k 应相同，收到 q {tuple(q.shape)} 与 k {tuple(k.shape)}")
    if k.shape[-2] != v.shape[-2]:
        raise ValueError(f"k 与 v 的长度 T_k 应相同，收到 k {tuple(k.shape)} 与 v {tuple(v.shape)}")
    non_empty_sequence("q", q)
    non_empty_sequence("k", k)
