"""合成任务（synthetic tasks）：复制（copy）与反转（reverse）。

这是检验 Transformer 是否「能学会」的经典冒烟测试：输入一串随机符号，
复制任务要求原样输出，反转任务要求倒序输出。反转任务要求模型知道每个
符号的位置——没有位置编码（positional encoding）就做不到。

符号用字符串 ``"0"``、``"1"``……表示，这样它们和真实语料一样走 :class:`~tformer_lib.data.vocab.Vocab`。
"""

from __future__ import annotations

import random

from .vocab import Vocab

__all__ = ["synthetic_vocab", "make_copy_task", "make_reverse_task", "make_synthetic_splits"]

Pair = tuple[list[str], list[str]]


def synthetic_vocab(n_symbols: int = 10) -> Vocab:
    """符号 ``"0"`` … ``str(n_symbols-1)`` 组成的词表（特殊词元之后依次编号）。"""
    if not isinstance(n_symbols, int) or n_symbols < 2:
        raise ValueError(f"n_symbols 应为 ≥2 的整数，收到 {n_symbols!r}")
    return Vocab([str(i) for i in range(n_symbols)])


def _check(n: int, n_symbols: int, min_len: int, max_len: int) -> None:
    if not isinstance(n, int) or n < 0:
        raise ValueError(f"n 应为 ≥0 的整数，收到 {n!r}")
    if not isinstance(n_symbols, int) or n_symbols < 2:
        raise ValueError(f"n_symbols 应为 ≥2 的整数，收到 {n_symbols!r}")
    if not (isinstance(min_len, int) and isinstance(max_len, int) and 1 <= min_len <= max_len):
        raise ValueError(f"需要 1 ≤ min_len ≤ max_len，收到 min_len={min_len!r}, max_len={max_len!r}")


def _random_sequences(rng: random.Random, n: int, n_symbols: int, min_len: int, max_len: int) -> list[list[str]]:
    return [
        [str(rng.randrange(n_symbols)) for _ in range(rng.randint(min_len, max_len))] for _ in range(n)
    ]


def make_copy_task(n: int, n_symbols: int = 10, min_len: int = 3, max_len: int = 10, seed: int = 0) -> list[Pair]:
    """``n`` 个复制样本 ``(x, x)``；同一 ``seed`` 总得到同一批数据。"""
    _check(n, n_symbols, min_len, max_len)
    rng = random.Random(seed)
    return [(x, list(x)) for x in _random_sequences(rng, n, n_symbols, min_len, max_len)]


def make_reverse_task(n: int, n_symbols: int = 10, min_len: int = 3, max_len: int = 10, seed: int = 0) -> list[Pair]:
    """``n`` 个反转样本 ``(x, reversed(x))``。"""
    _check(n, n_symbols, min_len, max_len)
    rng = random.Random(seed)
    return [(x, x[::-1]) for x in _random_sequences(rng, n, n_symbols, min_len, max_len)]


def make_synthetic_splits(
    task: str = "copy",
    n_train: int = 2000,
    n_test: int = 200,
    n_symbols: int = 10,
    min_len: int = 3,
    max_len: int = 10,
    seed: int = 0,
) -> dict[str, list[Pair]]:
    """生成互不重叠的 ``{"train": …, "test": …}``：测试集（held-out）的每条输入都没在训练集出现过。"""
    if task not in ("copy", "reverse"):
        raise ValueError(f"task 应为 'copy' 或 'reverse'，收到 {task!r}")
    _check(n_train + n_test, n_symbols, min_len, max_len)
    rng = random.Random(seed)
    seen: set[tuple[str, ...]] = set()
    test: list[list[str]] = []
    attempts = 0
    while len(test) < n_test:  # 先抽测试集，保证互不相同
        attempts += 1
        if attempts > 100 * (n_test + 10):
            raise ValueError(f"可能的序列太少，凑不出 n_test={n_test} 条不重复的测试样本；请加大 n_symbols 或 max_len")
        x = _random_sequences(rng, 1, n_symbols, min_len, max_len)[0]
        if tuple(x) not in seen:
            seen.add(tuple(x))
            test.append(x)
    train: list[list[str]] = []
    attempts = 0
    while len(train) < n_train:  # 训练集可以有重复，但不能与测试集重合
        attempts += 1
        if attempts > 100 * (n_train + 10):
            raise ValueError("可能的序列太少，训练集无法避开测试集；请加大 n_symbols 或 max_len")
        x = _random_sequences(rng, 1, n_symbols, min_len, max_len)[0]
        if tuple(x) not in seen:
            train.append(x)
    target = (lambda x: list(x)) if task == "copy" else (lambda x: x[::-1])
    return {"train": [(x, target(x)) for x in train], "test": [(x, target(x)) for x in test]}
