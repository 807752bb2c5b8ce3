"""SentencePiece 的 BPE（带字节回退）：LLaMA-1/2、ChatGLM2/3、百川走的另一条路，接口与另外两种分词器相同。

字节级 BPE（:class:`~tformer_lib.text.FastBPETokenizer`）从 UTF-8 的 256 个字节出发合并；SentencePiece 的 BPE 从
**字符**（Unicode 码位）出发：训练时先按出现次数留下覆盖 ``character_coverage`` 的那些字符，它们本身就是词元，再在
字符上合并。覆盖之外的罕见字符不记作 UNK，而是**退回到它的 UTF-8 字节**（字节回退，byte fallback）——词表里
另有 256 个 ``<0x00>``…``<0xFF>`` 词元，所以同样不存在未登录词。

代价是词表的下限：SentencePiece 要求 ``character_coverage`` ≥ 0.98（它的训练器直接拒绝更小的值），留下的字符
都得进词表。中文的字符多，这个下限就高（唐诗上要两千多个字，见 :func:`min_vocab_size`）；字节级 BPE 没有这个下限。

设置（与本书另外两种分词器对齐）：id 0–3 是 :mod:`tformer_lib.specials` 的 PAD/BOS/EOS/UNK；不做 Unicode 规范化
（``identity``：全角的“，”不会被改成半角）；不在文本开头补 “▁”；训练用 1 个线程，同样的文本得到同样的词表；
再长的文本也整段参加训练（SentencePiece 默认悄悄丢掉长于 4192 字节的句子）。

空格：SentencePiece 先把空格换成 “▁”（U+2581）再切分，这是它的约定（LLaMA 的分词器也这样）。这里总让 “▁” 进词表
（训练文本里没有空格时词表因此多一个词元），所以含空格的文本也能无损往返；代价是文本里原本就写着的 “▁” 解码出来是空格。
``sentencepiece`` 包只在这个模块里用到，按需导入。
"""

from __future__ import annotations

import base64
import io
from collections.abc import Iterable

from .._checks import positive_int
from ..specials import SPECIAL_TOKENS, UNK
from ._common import UNK_TEXT, check_text, check_texts, id_list, read_json, split_at_specials, with_specials, write_json

__all__ = ["SentencePieceBPETokenizer", "min_vocab_size", "SPM_MIN_COVERAGE", "DEFAULT_COVERAGE"]

#: SentencePiece 的训练器接受的最小字符覆盖率
SPM_MIN_COVERAGE = 0.98
#: 本书默认的字符覆盖率（:meth:`SentencePieceBPETokenizer.train` 与 :func:`min_vocab_size` 共用）
DEFAULT_COVERAGE = 0.995
#: SentencePiece 表示空格的字符（U+2581）
SPACE = "\u2581"
#: sentencepiece 的 vocab_size 是 C++ 的 int
_MAX_VOCAB = 2**31 - 1
#: 256 个字节词元 + 4 个特殊词元：字节回退的词表至少要有这些
_BYTE_AND_SPECIALS = 256 + len(SPECIAL_TOKENS)


def _import_spm():
    try:
        import sentencepiece
    except ImportError as exc:  # pragma: no cover - 安装了 book/test 依赖时总有
        raise ImportError("SentencePieceBPETokenizer 需要 sentencepiece 包：pip install 'tformer-lib[book]'"
                          "（或 pip install sentencepiece）") from exc
    return sentencepiece


def _coverage(value) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not SPM_MIN_COVERAGE <= value <= 1:
        raise ValueError(f"character_coverage 应是 [{SPM_MIN_COVERAGE}, 1] 之间的数（SentencePiece 的训练器不收更小的），"
                         f"收到 {value!r}")
    return float(value)


def required_characters(texts: Iterable[str], character_coverage: float) -> int:
    """按出现次数从多到少数字符，累计到覆盖 ``character_coverage`` 的字符所需的个数（SentencePiece 的规则）。"""
    from collections import Counter

    coverage = _coverage(character_coverage)
    counts = Counter("".join(check_texts("texts", texts)).replace(" ", SPACE))  # SentencePiece 数的是换成 ▁ 之后的字符
    total, running, kept = sum(counts.values()), 0, set()
    for ch, c in counts.most_common():
        if running >= coverage * total:
            break
        running += c
        kept.add(ch)
    return len(kept | {SPACE})  # ▁ 总进词表（见模块说明）


def min_vocab_size(texts: Iterable[str], character_coverage: float = DEFAULT_COVERAGE) -> int:
    """在 ``texts`` 上训练、覆盖率 ``character_coverage`` 时，SentencePiece BPE 词表的下限：
    留下的字符数（含总要进词表的 “▁”）+ 256 个字节词元 + 4 个特殊词元。"""
    return required_characters(texts, character_coverage) + _BYTE_AND_SPECIALS


class SentencePieceBPETokenizer:
    """``sentencepiece.SentencePieceProcessor`` 的薄包装：``encode`` / ``decode`` / ``vocab_size`` / ``save`` / ``load``。"""

    kind = "sentencepiece_bpe"

    def __init__(self, model_proto: bytes):
        if not isinstance(model_proto, (bytes, bytearray)):
            raise TypeError(f"model_proto 应是 SentencePiece 模型的字节串，收到 {type(model_proto).__name__}")
        self.model_proto = bytes(model_proto)
        if not self.model_proto:
            raise ValueError("model_proto 是空的字节串：应是 SentencePiece 训练出的模型")
        try:
            self.processor = _import_spm().SentencePieceProcessor(model_proto=self.model_proto)
        except RuntimeError as exc:
            raise ValueError(f"model_proto 不是能读的 SentencePiece 模型：{str(exc).strip()[:200]}") from None
        got = [self.processor.id_to_piece(i) for i in range(len(SPECIAL_TOKENS))]
        if got != list(SPECIAL_TOKENS):
            raise ValueError(f"模型的 id 0–3 应是 {SPECIAL_TOKENS}，收到 {got}")

    @classmethod
    def train(cls, texts: Iterable[str], vocab_size: int,
              character_coverage: float = DEFAULT_COVERAGE) -> "SentencePieceBPETokenizer":
        """在 ``texts`` 上训练带字节回退的 SentencePiece BPE，词表 ``vocab_size``（含 4 个特殊词元与 256 个字节词元）。

        ``vocab_size`` 小于 :func:`min_vocab_size` 时报 ValueError，说出这份文本在这个覆盖率下的下限。
        """
        texts = check_texts("texts", texts, utf8=True)
        positive_int("vocab_size", vocab_size)
        if vocab_size > _MAX_VOCAB:
            raise ValueError(f"vocab_size 应不超过 {_MAX_VOCAB}（sentencepiece 用 32 位整数），收到 {vocab_size}")
        coverage = _coverage(character_coverage)
        floor = min_vocab_size(texts, coverage)
        if vocab_size < floor:
            raise ValueError(f"vocab_size={vocab_size} 太小：覆盖率 {coverage:g} 要留下 {floor - _BYTE_AND_SPECIALS} 个字符，"
                             f"加上 256 个字节词元与 4 个特殊词元，词表至少要 {floor}")
        model = io.BytesIO()
        try:
            _import_spm().SentencePieceTrainer.train(
                sentence_iterator=iter(texts), model_writer=model, model_type="bpe", vocab_size=vocab_size,
                byte_fallback=True, character_coverage=coverage, pad_id=0, bos_id=1, eos_id=2, unk_id=UNK,
                pad_piece=SPECIAL_TOKENS[0], bos_piece=SPECIAL_TOKENS[1], eos_piece=SPECIAL_TOKENS[2],
                unk_piece=SPECIAL_TOKENS[UNK], add_dummy_prefix=False, normalization_rule_name="identity",
                remove_extra_whitespaces=False, required_chars=SPACE, num_threads=1, minloglevel=2,
                max_sentence_length=max(4192, *(len(t.encode("utf-8")) + 1 for t in texts)))
        except RuntimeError as exc:  # SentencePiece 自己的检查（如词表比文本能学出的还大）：换成点名参数的错误
            raise ValueError(f"SentencePiece 拒绝了 vocab_size={vocab_size}、character_coverage={coverage:g}："
                             f"{str(exc).strip()[:300]}") from None
        return cls(model.getvalue())

    @property
    def vocab_size(self) -> int:
        return self.processor.get_piece_size()

    def __len__(self) -> int:
        return self.vocab_size

    def __repr__(self) -> str:
        return f"SentencePieceBPETokenizer(vocab_size={self.vocab_size})"

    def encode(self, text: str, add_bos: bool = False, add_eos: bool = False) -> list[int]:
        return with_specials(self.processor.encode(check_text("text", text, utf8=True)), add_bos, add_eos)

    def encode_batch(self, texts: Iterable[str]) -> list[list[int]]:
        """一次编码很多段文本（在 C++ 里循环）；``texts`` 是字符串的列表（可以有空串）。"""
        if isinstance(texts, (str, bytes)) or not isinstance(texts, Iterable):
            raise TypeError(f"texts 应是字符串的列表，收到 {type(texts).__name__}；单段文本请用 encode()")
        return self.processor.encode([check_text(f"texts[{i}]", t, utf8=True) for i, t in enumerate(texts)])

    def decode(self, ids, stop_at_eos: bool = True) -> str:
        """id 序列 → 文本；PAD/BOS 不显示，UNK 显示为 ``<unk>``，默认遇 EOS 停（与另外两种分词器相同）。"""
        pieces = split_at_specials(id_list(ids, self.vocab_size), stop_at_eos)
        return "".join(UNK_TEXT if p == UNK else self.processor.decode(p) for p in pieces)

    def is_byte(self, index: int) -> bool:
        """这个 id 是不是 256 个字节词元之一（字节回退时用到的那些）。"""
        (index,) = id_list([index], self.vocab_size)
        return self.processor.is_byte(index)

    def token_text(self, index: int) -> str:
        """一个 id 对应的词元，如 ``"白日"``、``"<0xE4>"``。"""
        (index,) = id_list([index], self.vocab_size)
        return self.processor.id_to_piece(index)

    def save(self, path):
        """存成 JSON（SentencePiece 模型的字节串用 base64 写在里面），原子写入，返回路径。"""
        return write_json(path, {"kind": self.kind, "specials": list(SPECIAL_TOKENS),
                                 "model_proto": base64.b64encode(self.model_proto).decode("ascii")})

    @classmethod
    def load(cls, path) -> "SentencePieceBPETokenizer":
        """读 :meth:`save` 写的文件；文件不是它写的或已损坏时报 ValueError，点出路径。"""
        try:
            data = read_json(path, cls.kind)
            return cls(base64.b64decode(data["model_proto"], validate=True))
        except (ValueError, TypeError, KeyError, RuntimeError, IndexError, UnicodeDecodeError) as exc:
            raise ValueError(f"{path} 不是完好的 SentencePieceBPETokenizer 文件：{type(exc).__name__}: {str(exc)[:200]}") from None
