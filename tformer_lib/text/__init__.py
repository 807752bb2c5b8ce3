"""文本 → 词元 id：字符级分词器、教学用的字节级 BPE、以及 ``tokenizers`` 包上的快速 BPE。

四者接口相同：``encode(text, add_bos=False, add_eos=False) -> list[int]``、``decode(ids) -> str``、
``vocab_size``、``save(path)`` / ``load(path)``；id 0–3 都是 :mod:`tformer_lib.specials` 的 PAD/BOS/EOS/UNK。

* :class:`CharTokenizer` —— 一个字一个词元，词表从训练文本统计，没见过的字是 UNK；
* :func:`train_bpe` / :class:`BPETokenizer` —— 教学版字节级 BPE（纯 Python，第 9 章展示它的源码）；
* :class:`FastBPETokenizer` —— 同样设置的 ``tokenizers``（Rust）版，训练和编码快得多；
* :class:`SentencePieceBPETokenizer` —— SentencePiece 的 BPE：在字符上合并，罕见字退回到 UTF-8 字节（LLaMA-1/2 的做法）；
* :mod:`tformer_lib.text.explain` —— BPE 对中文字节做了什么、压缩率表。
"""

from .bpe import BPETokenizer, display_bytes, pretokenize, train_bpe
from .char import CharTokenizer
from .explain import (
    TOKEN_KINDS,
    MergeRow,
    compression_table,
    describe_merges,
    fallback_rate,
    merge_kind_counts,
    token_kind,
    tokens_of,
    tokens_per_char,
    unk_rate,
    utf8_bytes,
)
from .fast import FastBPETokenizer
from .sentencepiece_bpe import SentencePieceBPETokenizer, min_vocab_size

__all__ = [
    "BPETokenizer",
    "CharTokenizer",
    "FastBPETokenizer",
    "SentencePieceBPETokenizer",
    "MergeRow",
    "TOKEN_KINDS",
    "compression_table",
    "describe_merges",
    "display_bytes",
    "fallback_rate",
    "merge_kind_counts",
    "min_vocab_size",
    "pretokenize",
    "token_kind",
    "tokens_of",
    "tokens_per_char",
    "train_bpe",
    "unk_rate",
    "utf8_bytes",
]
