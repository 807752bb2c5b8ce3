"""批处理（batching）：把长短不一的句子对补齐（padding）成张量，并备好教师强制（teacher forcing）所需的输入/输出。

对一条目标句 ``y = [y1, …, yn]``：

* 解码器输入 ``tgt_in  = [BOS, y1, …, yn]``
* 解码器要预测的 ``tgt_out = [y1, …, yn, EOS]``

两者错开一位，所以第 t 个位置的输出要预测「下一个词」。每个批次只补齐到本批最长的句子，
不浪费计算在整份语料最长的句子上。
"""

from __future__ import annotations

import random
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch

from ..parts.masks import causal_mask, padding_mask
from ..specials import BOS, EOS, PAD
from .vocab import Vocab

__all__ = ["Batch", "make_batch", "encode_pairs", "batch_iterator", "pad_sequences", "num_batches"]

IdPair = tuple[list[int], list[int]]


@dataclass
class Batch:
    """一个训练批次。形状记号：B 批大小，S 源句长度，T 目标长度（含 BOS 或 EOS）。"""

    src: torch.Tensor  # (B, S) 源句 id，PAD 补齐
    tgt_in: torch.Tensor  # (B, T) BOS + y
    tgt_out: torch.Tensor  # (B, T) y + EOS
    src_mask: torch.Tensor  # (B, 1, 1, S) bool，True = 可以关注（非填充）
    tgt_mask: torch.Tensor  # (B, 1, T, T) bool，因果掩码 ∧ 填充掩码
    n_tokens: int  # tgt_out 中真实（非 PAD）词元的个数，用来按词元平均损失

    def to(self, device: torch.device | str) -> "Batch":
        """把所有张量搬到 ``device``。"""
        return Batch(
            src=self.src.to(device),
            tgt_in=self.tgt_in.to(device),
            tgt_out=self.tgt_out.to(device),
            src_mask=self.src_mask.to(device),
            tgt_mask=self.tgt_mask.to(device),
            n_tokens=self.n_tokens,
        )

    def __len__(self) -> int:
        return self.src.shape[0]


def pad_sequences(seqs: Sequence[Sequence[int]], pad_id: int = PAD) -> torch.Tensor:
    """把若干 id 列表右侧补齐到其中最长者，返回 ``(B, T_max)`` 的 LongTensor。"""
    if len(seqs) == 0:
        raise ValueError("seqs 为空：至少需要一个序列才能组成批次")
    t_max = max(len(s) for s in seqs)
    out = torch.full((len(seqs), max(t_max, 1)), pad_id, dtype=torch.long)  # (B, T_max)
    for i, s in enumerate(seqs):
        if len(s):
            out[i, : len(s)] = torch.as_tensor(list(s), dtype=torch.long)
    return out


def make_batch(pairs: Sequence[IdPair], pad_id: int = PAD) -> Batch:
    """由若干 ``(源 id 列表, 目标 id 列表)``（都不含 BOS/EOS）组成一个 :class:`Batch`。"""
    if len(pairs) == 0:
        raise ValueError("pairs 为空：至少需要一个句子对才能组成批次")
    for i, (x, _) in enumerate(pairs):
        if len(x) == 0:
            raise ValueError(f"pairs[{i}] 的源句为空；每个源句至少要有一个词元")
    src = pad_sequences([x for x, _ in pairs], pad_id)  # (B, S)
    tgt_in = pad_sequences([[BOS] + list(y) for _, y in pairs], pad_id)  # (B, T)
    tgt_out = pad_sequences([list(y) + [EOS] for _, y in pairs], pad_id)  # (B, T)
    src_mask = padding_mask(src, pad_id)  # (B, 1, 1, S)
    T = tgt_in.shape[1]
    # 解码器掩码：位置 t 只能看 ≤ t 的位置（因果），且不能看填充位
    tgt_mask = causal_mask(T).to(src.device) & padding_mask(tgt_in, pad_id)  # (T, T) & (B, 1, 1, T) → (B, 1, T, T)
    n_tokens = int((tgt_out != pad_id).sum())
    return Batch(src, tgt_in, tgt_out, src_mask, tgt_mask, n_tokens)


def encode_pairs(
    pairs: Sequence[tuple[Sequence[str], Sequence[str]]] | Sequence[tuple[str, str]],
    src_vocab: Vocab,
    tgt_vocab: Vocab,
) -> list[IdPair]:
    """把词元对（或以空格分词的字符串对）编码成 id 对（不加 BOS/EOS，:func:`make_batch` 会加）。"""
    out: list[IdPair] = []
    for x, y in pairs:
        xs = x.split() if isinstance(x, str) else x
        ys = y.split() if isinstance(y, str) else y
        out.append((src_vocab.encode(xs), tgt_vocab.encode(ys)))
    return out


def batch_iterator(
    data: Sequence[IdPair],
    batch_size: int,
    shuffle: bool = False,
    seed: int = 0,
    pad_id: int = PAD,
    drop_last: bool = False,
) -> Iterator[Batch]:
    """按 ``batch_size`` 依次产出 :class:`Batch`。

    ``shuffle=True`` 时用 ``random.Random(seed)`` 打乱顺序——只由 ``seed`` 决定、
    不读写全局随机状态，所以从检查点续训时每个 epoch 的批次顺序完全一样
    （训练器用 ``seed + epoch`` 作种子）。
    """
    if not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size 应为 ≥1 的整数，收到 {batch_size!r}")
    order = list(range(len(data)))
    if shuffle:
        random.Random(seed).shuffle(order)
    for start in range(0, len(order), batch_size):
        idx = order[start : start + batch_size]
        if drop_last and len(idx) < batch_size:
            break
        yield make_batch([data[i] for i in idx], pad_id)


def num_batches(n_items: int, batch_size: int, drop_last: bool = False) -> int:
    """``batch_iterator`` 会产出多少个批次。"""
    return n_items // batch_size if drop_last else -(-n_items // batch_size)
