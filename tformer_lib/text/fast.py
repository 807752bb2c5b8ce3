"""快速路径：PyPI 包 ``tokenizers``（Rust 实现）上的字节级 BPE，接口与 :class:`~tformer_lib.text.bpe.BPETokenizer` 相同。

用法与教学版一样：``FastBPETokenizer.train(texts, vocab_size)``。设置也对齐：同样的 GPT-2 式预分词
（``ByteLevel``，不在开头补空格）、全部 256 个字节都进初始字母表、同样的 4 个特殊词元放在 id 0–3、
同样的 ``min_frequency``，所以两者在同一份文本、同一词表大小下的压缩率应当几乎相同（测试要求差距 < 2 %）。
字节到 id 的编号、次数相同时先合并哪一对，两边各有各的约定，所以 id 本身不同。

``tokenizers`` 默认用多线程；这个模块导入时若没有设置 ``TOKENIZERS_PARALLELISM``，就把它设为 ``false``：
本书的机器只有 2 个核，而且多线程用过之后再 fork（如 DataLoader 的子进程）会让 ``tokenizers`` 打印警告。
"""

from __future__ import annotations

import os
from collections.abc import Iterable

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers  # noqa: E402

from .._checks import positive_int  # noqa: E402
from ..specials import SPECIAL_TOKENS, UNK  # noqa: E402
from ._common import UNK_TEXT, check_text, check_texts, id_list, split_at_specials, with_specials, write_text  # noqa: E402
from .bpe import FIRST_MERGE_ID  # noqa: E402

__all__ = ["FastBPETokenizer"]


class FastBPETokenizer:
    """``tokenizers.Tokenizer`` 的薄包装：``encode`` / ``decode`` / ``vocab_size`` / ``save`` / ``load``。"""

    kind = "fast_byte_bpe"

    def __init__(self, tokenizer: Tokenizer):
        if not isinstance(tokenizer, Tokenizer):
            raise TypeError(f"tokenizer 应是 tokenizers.Tokenizer，收到 {type(tokenizer).__name__}")
        got = [tokenizer.id_to_token(i) for i in range(len(SPECIAL_TOKENS))]
        if got != list(SPECIAL_TOKENS):
            raise ValueError(f"tokenizer 的 id 0–3 应是 {SPECIAL_TOKENS}，收到 {got}")
        # 文本里字面写着的 "<eos>" 等只是普通字符，按字节编码；特殊 id 只由 add_bos/add_eos 加入（与教学版相同）
        tokenizer.encode_special_tokens = True
        self.tokenizer = tokenizer

    @classmethod
    def train(cls, texts: Iterable[str], vocab_size: int, min_frequency: int = 2) -> "FastBPETokenizer":
        """在 ``texts`` 上训练字节级 BPE，词表 ``vocab_size``（含 4 个特殊词元和 256 个字节）。"""
        texts = check_texts("texts", texts, utf8=True)
        vocab_size = positive_int("vocab_size", vocab_size)
        if vocab_size < FIRST_MERGE_ID:
            raise ValueError(f"vocab_size 应是 ≥{FIRST_MERGE_ID} 的整数（4 个特殊词元 + 256 个字节），收到 {vocab_size!r}")
        min_frequency = positive_int("min_frequency", min_frequency)
        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(
            vocab_size=vocab_size,
            min_frequency=min_frequency,
            special_tokens=list(SPECIAL_TOKENS),
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
            show_progress=False,
        )
        tok.train_from_iterator(texts, trainer)
        return cls(tok)

    @property
    def vocab_size(self) -> int:
        return self.tokenizer.get_vocab_size()

    def __len__(self) -> int:
        return self.vocab_size

    def __repr__(self) -> str:
        return f"FastBPETokenizer(vocab_size={self.vocab_size})"

    def encode(self, text: str, add_bos: bool = False, add_eos: bool = False) -> list[int]:
        ids = self.tokenizer.encode(check_text("text", text, utf8=True), add_special_tokens=False).ids
        return with_specials(ids, add_bos, add_eos)

    def encode_batch(self, texts: Iterable[str]) -> list[list[int]]:
        """一次编码很多段文本（在 Rust 里循环，比逐段调用 :meth:`encode` 快）。"""
        texts = [check_text(f"texts[{i}]", t, utf8=True) for i, t in enumerate(texts)]
        return [e.ids for e in self.tokenizer.encode_batch(texts, add_special_tokens=False)]

    def decode(self, ids, stop_at_eos: bool = True) -> str:
        """id 序列 → 文本；PAD/BOS 不显示，UNK 显示为 ``<unk>``，默认遇 EOS 停（与教学版相同）。"""
        pieces = split_at_specials(id_list(ids, self.vocab_size), stop_at_eos)
        return "".join(UNK_TEXT if p == UNK else self.tokenizer.decode(p, skip_special_tokens=False) for p in pieces)

    def token_text(self, index: int) -> str:
        """一个 id 对应的文字（不完整的 UTF-8 显示为 U+FFFD）。"""
        (index,) = id_list([index], self.vocab_size)
        return SPECIAL_TOKENS[index] if index < len(SPECIAL_TOKENS) else self.tokenizer.decode([index])

    def save(self, path):
        """存成 ``tokenizers`` 自己的 JSON 格式（其他语言的 ``tokenizers`` 也能读），返回路径。"""
        return write_text(path, self.tokenizer.to_str())

    @classmethod
    def load(cls, path) -> "FastBPETokenizer":
        return cls(Tokenizer.from_file(str(path)))
