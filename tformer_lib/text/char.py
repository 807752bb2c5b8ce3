"""字符级分词器（character tokenizer）：一个汉字（或标点）就是一个词元（token）。

中文不用空格分词，最朴素的做法是把每个字当成一个词元。词表（vocabulary）从训练文本里统计：
前四个 id 是 :mod:`tformer_lib.specials` 里的特殊词元 PAD/BOS/EOS/UNK，普通字从 id 4 开始，
按「出现次数从多到少、同次数按字符顺序」排列，所以同一份语料永远得到同一张词表。
训练集里没见过的字编码成 UNK，解码时显示为 ``<unk>``；:meth:`CharTokenizer.encode` 默认为此发出一个
:class:`~tformer_lib.unknown_tokens.UnknownTokenWarning`，列出这些字（``on_unknown="error"`` 改为报错，
``"ignore"`` 不作声——与 ``translate`` 相同，见 :mod:`tformer_lib.unknown_tokens`）。
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

from .._checks import one_of, positive_int
from ..data.vocab import Vocab
from ..specials import SPECIAL_TOKENS, UNK
from ..unknown_tokens import ON_UNKNOWN, report_unknown
from ._common import UNK_TEXT, check_text, check_texts, id_list, read_json, split_at_specials, with_specials, write_json

__all__ = ["CharTokenizer"]


class CharTokenizer:
    """字符 ↔ id。

    >>> tok = CharTokenizer.build(["床前明月光，疑是地上霜。举头望明月，低头思故乡。"])
    >>> tok.vocab_size                     # 4 个特殊词元 + 19 个不同的字
    23
    >>> tok.encode("明月")                  # 出现两次的字排在前面：。头明月，……
    [6, 7]
    >>> tok.decode(tok.encode("明日", add_bos=True, add_eos=True, on_unknown="ignore"))   # 「日」没见过 → UNK
    '明<unk>'
    """

    kind = "char"

    def __init__(self, chars: Iterable[str]):
        chars = list(chars)
        for c in chars:
            if not isinstance(c, str) or len(c) != 1:
                raise ValueError(f"chars 的每一项应是单个字符，收到 {c!r}")
        self.vocab = Vocab(chars)  # 重复或与特殊词元同名时 Vocab 报错
        self._itos = self.vocab.itos
        self._stoi = {c: i for i, c in enumerate(self._itos)}

    @classmethod
    def build(cls, texts: Iterable[str], min_freq: int = 1) -> "CharTokenizer":
        """从训练文本统计字频建表；出现少于 ``min_freq`` 次的字不收录（之后编码为 UNK）。"""
        texts = check_texts("texts", texts)
        min_freq = positive_int("min_freq", min_freq)
        counts = Counter(c for t in texts for c in t)
        return cls(sorted((c for c, n in counts.items() if n >= min_freq), key=lambda c: (-counts[c], c)))

    # ---- 查询 ---------------------------------------------------------------------------
    @property
    def vocab_size(self) -> int:
        """词表大小（含 4 个特殊词元）。"""
        return len(self.vocab)

    def __len__(self) -> int:
        return len(self.vocab)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, CharTokenizer) and self.vocab == other.vocab

    def __repr__(self) -> str:
        return f"CharTokenizer(vocab_size={self.vocab_size})"

    def id_to_token(self, index: int) -> str:
        return self.vocab.token(index)

    def token_to_id(self, token: str) -> int:
        """字 → id；词表外的字返回 UNK。"""
        return self.vocab[check_text("token", token)]

    # ---- 编码 / 解码 ----------------------------------------------------------------------
    def encode(self, text: str, add_bos: bool = False, add_eos: bool = False, *, on_unknown: str = "warn") -> list[int]:
        """文本 → id 列表，一个字符一个 id；词表外的字 → UNK。

        有词表外的字（emoji、生僻字……）时按 ``on_unknown`` 处理：``"warn"``（默认）警告并列出它们，
        ``"error"`` 抛出 :class:`~tformer_lib.unknown_tokens.UnknownTokenError`，``"ignore"`` 不作声。
        """
        one_of("on_unknown", on_unknown, ON_UNKNOWN)
        ids = [self._stoi.get(c, UNK) for c in check_text("text", text)]
        if on_unknown != "ignore" and UNK in ids:
            report_unknown(f"text {text!r:.40} 里有词表外的字 {self.unknown_chars(text)}，它们只能当作 <unk>",
                           on_unknown, stacklevel=2)
        return with_specials(ids, add_bos, add_eos)

    def unknown_chars(self, text: str) -> list[str]:
        """``text`` 里不在词表中的字（按出现顺序、去重）。"""
        return list(dict.fromkeys(c for c in check_text("text", text) if c not in self._stoi))

    def decode(self, ids, stop_at_eos: bool = True) -> str:
        """id 序列（list、1 维张量……）→ 文本。PAD/BOS 不显示，UNK 显示为 ``<unk>``，默认遇 EOS 停。"""
        pieces = split_at_specials(id_list(ids, self.vocab_size), stop_at_eos)
        return "".join(UNK_TEXT if p == UNK else "".join(self._itos[i] for i in p) for p in pieces)

    def count_unknown(self, text: str) -> int:
        """``text`` 里有多少个字不在词表中（会被编码成 UNK）。"""
        return sum(1 for c in check_text("text", text) if c not in self._stoi)

    # ---- 存取：只用普通类型（JSON、检查点里的字典）---------------------------------------------
    def to_dict(self) -> dict:
        return {"kind": self.kind, "specials": list(SPECIAL_TOKENS), "tokens": self.vocab.itos[len(SPECIAL_TOKENS):]}

    @classmethod
    def from_dict(cls, data: dict) -> "CharTokenizer":
        if not isinstance(data, dict) or data.get("kind") != cls.kind or "tokens" not in data:
            raise ValueError(f"data 应是 CharTokenizer.to_dict() 的结果（kind='char'，含 'tokens'），收到 {data!r:.80}")
        if tuple(data.get("specials", ())) != SPECIAL_TOKENS:
            raise ValueError(f"data 的特殊词元 {data.get('specials')} 与本库的 {SPECIAL_TOKENS} 不一致")
        return cls(data["tokens"])

    def save(self, path):
        """存成 UTF-8 的 JSON 文件（原子写入），返回路径。"""
        return write_json(path, self.to_dict())

    @classmethod
    def load(cls, path) -> "CharTokenizer":
        return cls.from_dict(read_json(path, cls.kind))
