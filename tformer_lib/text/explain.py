"""看 BPE 对中文做了什么：UTF-8 字节 → 整字 → 常见的多字词；以及压缩率（每个字符几个词元）。

这里只产出数据（列表、字典），画图交给 ``plotting``，表格交给笔记本。

>>> utf8_bytes("月。")
[('月', 'E6 9C 88'), ('。', 'E3 80 82')]
>>> token_kind("月".encode()), token_kind("月".encode()[:2]), token_kind("明月".encode())
('单字', '字节片段', '多字词')
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from typing import NamedTuple

from ..specials import UNK
from ._common import check_text, check_texts
from .bpe import FIRST_MERGE_ID, BPETokenizer, display_bytes
from .char import CharTokenizer

__all__ = [
    "TOKEN_KINDS",
    "MergeRow",
    "compression_table",
    "describe_merges",
    "fallback_rate",
    "merge_kind_counts",
    "token_kind",
    "tokens_per_char",
    "tokens_of",
    "unk_rate",
    "utf8_bytes",
]

#: 一个 BPE 词元是什么：不完整的 UTF-8 字节、恰好一个字符、还是几个字符
TOKEN_KINDS = ("字节片段", "单字", "多字词")


def utf8_bytes(text: str) -> list[tuple[str, str]]:
    """每个字符和它的 UTF-8 字节（十六进制）：汉字 3 个字节，ASCII 1 个。"""
    return [(c, c.encode("utf-8").hex(" ").upper()) for c in check_text("text", text, utf8=True)]


def token_kind(b: bytes) -> str:
    """``TOKEN_KINDS`` 之一：解不出完整 UTF-8 的是「字节片段」，否则按字符数分「单字」「多字词」。"""
    try:
        n = len(b.decode("utf-8"))
    except UnicodeDecodeError:
        return TOKEN_KINDS[0]
    return TOKEN_KINDS[1] if n == 1 else TOKEN_KINDS[2]


class MergeRow(NamedTuple):
    """一条合并规则：第 ``rank`` 条，把 ``left`` 和 ``right`` 合成 id 为 ``id`` 的 ``token``。"""

    rank: int
    id: int
    left: str
    right: str
    token: str
    kind: str


def _bpe(tokenizer) -> BPETokenizer:
    if not isinstance(tokenizer, BPETokenizer):
        raise TypeError(f"tokenizer 应是教学版 BPETokenizer（由 train_bpe 得到），收到 {type(tokenizer).__name__}")
    return tokenizer


def describe_merges(tokenizer: BPETokenizer, start: int = 0, stop: int | None = None) -> list[MergeRow]:
    """第 ``start`` 到 ``stop`` 条合并规则（按学到的先后），每条写成人能读的文字和种类。"""
    tb = _bpe(tokenizer).token_bytes
    rows = []
    for k, (a, b) in enumerate(tokenizer.merges[start:stop], start=start):
        new = FIRST_MERGE_ID + k
        rows.append(MergeRow(k, new, display_bytes(tb[a]), display_bytes(tb[b]), display_bytes(tb[new]),
                             token_kind(tb[new])))
    return rows


def merge_kind_counts(tokenizer: BPETokenizer) -> dict[str, list[int]]:
    """学了前 k 条合并规则时，三种词元各有多少个（k = 1, 2, …）；画「字节 → 字 → 词」的曲线用。"""
    tb = _bpe(tokenizer).token_bytes
    counts = {kind: [] for kind in TOKEN_KINDS}
    running = dict.fromkeys(TOKEN_KINDS, 0)
    for k in range(len(tokenizer.merges)):
        running[token_kind(tb[FIRST_MERGE_ID + k])] += 1
        for kind in TOKEN_KINDS:
            counts[kind].append(running[kind])
    return counts


def tokens_of(tokenizer: BPETokenizer, text: str) -> list[tuple[str, str]]:
    """``text`` 被切成的每个词元：（可读的文字, 十六进制字节），如 ``[("白日", "E7 99 BD E6 97 A5"), …]``。"""
    tb = _bpe(tokenizer).token_bytes
    return [(display_bytes(tb[i]), tb[i].hex(" ").upper()) for i in tokenizer.encode(text)]


def tokens_per_char(tokenizer, texts: Iterable[str]) -> float:
    """压缩率：编码 ``texts`` 得到的词元总数 ÷ 字符总数（字符级分词器恰好是 1，越小越省）。"""
    texts = check_texts("texts", texts)
    if hasattr(tokenizer, "encode_batch"):
        n_tokens = sum(map(len, tokenizer.encode_batch(texts)))
    elif isinstance(tokenizer, CharTokenizer):  # 低频字记作 UNK 也是一个词元：只数个数，不为它们警告
        n_tokens = sum(len(tokenizer.encode(t, on_unknown="ignore")) for t in texts)
    else:
        n_tokens = sum(len(tokenizer.encode(t)) for t in texts)
    return n_tokens / sum(map(len, texts))


def unk_rate(tokenizer, texts: Iterable[str]) -> float:
    """未登录率：编码 ``texts`` 后 UNK 词元的个数 ÷ 字符总数（字符级分词器里就是没进词表的字所占的比例；
    字节级 BPE 与带字节回退的 SentencePiece 恰好是 0）。"""
    if not callable(getattr(tokenizer, "encode", None)):
        raise TypeError(f"tokenizer 应是本库的分词器（有 encode 方法），收到 {type(tokenizer).__name__}")
    texts = check_texts("texts", texts)
    if hasattr(tokenizer, "encode_batch"):
        ids = tokenizer.encode_batch(texts)
    elif isinstance(tokenizer, CharTokenizer):
        ids = [tokenizer.encode(t, on_unknown="ignore") for t in texts]
    else:
        ids = [tokenizer.encode(t) for t in texts]
    return sum(row.count(UNK) for row in ids) / sum(map(len, texts))


def fallback_rate(tokenizer, texts: Iterable[str]) -> float:
    """字节回退率：``texts`` 里不在 SentencePiece 词表中、只能拆成 UTF-8 字节词元的字符所占的比例
    （空格按 SentencePiece 的约定看作 “▁”）。"""
    from .sentencepiece_bpe import SPACE, SentencePieceBPETokenizer

    if not isinstance(tokenizer, SentencePieceBPETokenizer):
        raise TypeError(f"tokenizer 应是 SentencePieceBPETokenizer（只有它会退回到字节），收到 {type(tokenizer).__name__}")
    texts = check_texts("texts", texts)
    counts = Counter("".join(texts).replace(" ", SPACE))
    missing = sum(n for ch, n in counts.items() if tokenizer.processor.piece_to_id(ch) == UNK)
    return missing / sum(counts.values())


def compression_table(train_texts: Sequence[str], eval_texts: Sequence[str], vocab_sizes: Iterable[int],
                      fast: bool = True, sentencepiece_sizes: Iterable[int] = ()) -> list[dict]:
    """字符级 vs 各种词表大小的字节级 BPE（与 SentencePiece BPE）：在 ``train_texts`` 上建词表/学合并，
    在 ``eval_texts`` 上量压缩率与未登录率。

    每行一个字典：``tokenizer``、``vocab_size``、``tokens_per_char``、``tokens_per_poem``（每段文本平均几个词元）、
    ``unk_rate``（:func:`unk_rate`）与 ``fallback_rate``（只有 SentencePiece 的行有，:func:`fallback_rate`；其余为 None）。
    字符级的词表收下 ``train_texts`` 里出现过的每个字。``fast=True`` 用 ``tokenizers`` 训练字节级 BPE（几秒）；
    ``False`` 用教学版（全量语料要几分钟）。``sentencepiece_sizes`` 给出时再加带字节回退的 SentencePiece BPE
    （覆盖率取默认的 ``DEFAULT_COVERAGE`` = 0.995，见 :class:`~tformer_lib.text.SentencePieceBPETokenizer`）。
    """
    from .bpe import train_bpe
    from .fast import FastBPETokenizer
    from .sentencepiece_bpe import SentencePieceBPETokenizer

    train_texts, eval_texts = check_texts("train_texts", train_texts), check_texts("eval_texts", eval_texts)
    for name, sizes in (("vocab_sizes", vocab_sizes), ("sentencepiece_sizes", sentencepiece_sizes)):
        if isinstance(sizes, (str, bytes)) or not isinstance(sizes, Iterable):
            raise TypeError(f"{name} 应是词表大小（整数）的列表，收到 {type(sizes).__name__} {sizes!r:.40}")
    tokenizers = [("字符", CharTokenizer.build(train_texts))]
    for v in vocab_sizes:
        tok = FastBPETokenizer.train(train_texts, v) if fast else train_bpe(train_texts, v)
        tokenizers.append(("字节级 BPE", tok))
    for v in sentencepiece_sizes:
        tokenizers.append(("SentencePiece BPE", SentencePieceBPETokenizer.train(train_texts, v)))
    rows = []
    for name, tok in tokenizers:
        tpc = tokens_per_char(tok, eval_texts)
        rows.append({"tokenizer": name, "vocab_size": tok.vocab_size, "tokens_per_char": tpc,
                     "tokens_per_poem": tpc * sum(map(len, eval_texts)) / len(eval_texts),
                     "unk_rate": unk_rate(tok, eval_texts),
                     "fallback_rate": fallback_rate(tok, eval_texts) if name == "SentencePiece BPE" else None})
    return rows
