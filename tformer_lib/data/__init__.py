"""数据：词表、合成任务、玩具中→英语料与批处理（batching）。"""

from .vocab import Vocab
from .batching import Batch, batch_iterator, encode_pairs, make_batch, num_batches, pad_sequences
from .synthetic import make_copy_task, make_reverse_task, make_synthetic_splits, synthetic_vocab
from .toy_zh_en import (
    LEXICON,
    ToyCorpus,
    detokenize,
    make_toy_corpus,
    mirror_sentence,
    tokenize_en,
    tokenize_zh,
)

__all__ = [
    "Vocab",
    "Batch",
    "batch_iterator",
    "encode_pairs",
    "make_batch",
    "num_batches",
    "pad_sequences",
    "make_copy_task",
    "make_reverse_task",
    "make_synthetic_splits",
    "synthetic_vocab",
    "LEXICON",
    "ToyCorpus",
    "detokenize",
    "make_toy_corpus",
    "mirror_sentence",
    "tokenize_en",
    "tokenize_zh",
]
