"""字节级 BPE（byte-level byte-pair encoding）：教学版，从 UTF-8 字节开始学合并规则。

GPT-2 以来许多大模型（GPT 系列、Llama 3 等）都用它。思路只有一句话：**从 256 个字节出发，反复把语料里最常见的相邻
一对词元合并成一个新词元**，直到词表达到想要的大小。

* 起点是字节，不是字：任何文本都能编码（不会有 UNK），解码把字节拼回去再按 UTF-8 解读，往返精确。
* 一个汉字在 UTF-8 里占 3 个字节（如「月」= ``E6 9C 88``）。最早的合并先把常见的字节对并起来，
  再拼成整字，常见的字先成词元；词表更大时，常在一起出现的字（「不知」「万里」）并成多字词元。
* 合并只发生在预分词（pre-tokenization）切出的小块内部：这里与 GPT-2 / ``tokenizers`` 的
  ByteLevel 一样，按「字母（含汉字）连成的串 / 数字串 / 标点串 / 空白」切，所以一句诗是一块，
  「，」「。」各是一块，词元不会跨过标点。

id 的布局：0–3 是特殊词元 PAD/BOS/EOS/UNK，4–259 是 256 个字节（字节 b 的 id 是 ``4 + b``），
之后第 k 条合并规则产生的新词元 id 是 ``260 + k``。

>>> bpe = train_bpe(["床前明月光，疑是地上霜。举头望明月，低头思故乡。"], vocab_size=300)
>>> bpe.vocab_size          # 出现不到 2 次的相邻对不合并，所以只学到 12 条规则
272
>>> [bpe.token_text(i) for i in range(260, 272)]   # 先是字节对（甚至跨字），再拼成整字、整词
['<E6><98>', '<E6><9C>', '<80><82>', '<8E><E6><9C>', '<A4><B4>', '<BC><8C>', '。', '<E4><B8>', '头', '，', '明<E6><9C>', '明月']
>>> [bpe.token_text(i) for i in bpe.encode("明月光")]  # 「光」只出现一次，仍是 3 个字节
['明月', '<E5>', '<85>', '<89>']
>>> bpe.decode(bpe.encode("明月光")) == "明月光"
True
"""

from __future__ import annotations

import heapq
import re
from collections import Counter, defaultdict
from collections.abc import Iterable

from .._checks import positive_int
from ..specials import SPECIAL_TOKENS, UNK
from ._common import UNK_TEXT, check_text, check_texts, id_list, read_json, split_at_specials, with_specials, write_json

__all__ = ["BPETokenizer", "train_bpe", "pretokenize", "BYTE_OFFSET", "display_bytes"]

#: 字节 b 的 id 是 BYTE_OFFSET + b（前面是 4 个特殊词元）
BYTE_OFFSET = len(SPECIAL_TOKENS)
#: 第一条合并规则得到的 id
FIRST_MERGE_ID = BYTE_OFFSET + 256

# GPT-2 的预分词规则，用标准库 re 写：[^\W\d_] 是「字母」（含汉字），\d 是数字
_PRETOKENIZE = re.compile(r"""'(?:[sdmt]|ll|ve|re)| ?[^\W\d_]+| ?\d+| ?[^\s\w]+|\s+(?!\S)|\s+""")


def pretokenize(text: str) -> list[str]:
    """把文本切成合并不会跨越的小块：``"白日依山尽，黄河入海流。"`` → ``["白日依山尽", "，", "黄河入海流", "。"]``。"""
    return _PRETOKENIZE.findall(text)


def display_bytes(b: bytes) -> str:
    """把一个词元的字节写成人能读的样子：完整的 UTF-8 字符照常显示，落单的字节写成 ``<E6>``。"""
    out, i = [], 0
    while i < len(b):
        for n in (1, 2, 3, 4):  # 从 i 起试着解出一个完整的字符
            try:
                out.append(b[i:i + n].decode("utf-8"))
                i += n
                break
            except UnicodeDecodeError:
                continue
        else:
            out.append(f"<{b[i]:02X}>")
            i += 1
    return "".join(out)


def _merge(word: list[int], pair: tuple[int, int], new_id: int) -> list[int]:
    """把 ``word`` 里从左到右每一处相邻的 ``pair`` 换成 ``new_id``。"""
    out, i = [], 0
    while i < len(word):
        if i + 1 < len(word) and (word[i], word[i + 1]) == pair:
            out.append(new_id)
            i += 2
        else:
            out.append(word[i])
            i += 1
    return out


def train_bpe(texts: Iterable[str], vocab_size: int, min_frequency: int = 2) -> "BPETokenizer":
    """在 ``texts`` 上学合并规则，直到词表有 ``vocab_size`` 个词元（含 4 个特殊词元和 256 个字节）。

    最常见的相邻对出现次数低于 ``min_frequency`` 时提前停下（词表会小于 ``vocab_size``）。
    次数相同时取 id 较小的那一对，所以结果只取决于文本，不取决于运行环境。
    """
    texts = check_texts("texts", texts, utf8=True)
    vocab_size = positive_int("vocab_size（4 个特殊词元 + 256 个字节 + 合并）", vocab_size, minimum=FIRST_MERGE_ID)
    min_frequency = positive_int("min_frequency", min_frequency)

    # 1) 预分词并数每个小块出现几次；每个不同的小块只存一份，是一串字节 id
    chunk_counts = Counter(chunk for text in texts for chunk in pretokenize(text))
    words = [[BYTE_OFFSET + b for b in chunk.encode("utf-8")] for chunk in chunk_counts]
    freq = list(chunk_counts.values())

    # 2) 每个相邻对出现的总次数，以及它出现在哪些小块里
    pair_count: Counter = Counter()
    where: defaultdict = defaultdict(set)
    for w, word in enumerate(words):
        for pair in zip(word, word[1:]):
            pair_count[pair] += freq[w]
            where[pair].add(w)
    # 最大堆（存负的次数）：弹出时若次数已过时就丢掉，再弹下一个
    heap = [(-n, pair) for pair, n in pair_count.items()]
    heapq.heapify(heap)

    # 3) 反复合并最常见的一对；每次只改动含这一对的小块，只重算这些小块里的相邻对
    merges: list[tuple[int, int]] = []
    while len(merges) < vocab_size - FIRST_MERGE_ID and heap:
        neg, pair = heapq.heappop(heap)
        if pair_count.get(pair) != -neg:
            continue  # 过时的堆项（这一对的次数后来变了）
        if -neg < min_frequency:
            break
        new_id = FIRST_MERGE_ID + len(merges)
        merges.append(pair)
        delta: Counter = Counter()
        for w in where.pop(pair):
            old = words[w]
            new = _merge(old, pair, new_id)
            if len(new) == len(old):
                continue  # 这个小块里的这一对早被别的合并吃掉了
            words[w] = new
            for p in zip(old, old[1:]):
                delta[p] -= freq[w]
            for p in zip(new, new[1:]):
                delta[p] += freq[w]
                if new_id in p:
                    where[p].add(w)
        for p, d in delta.items():
            if d:
                pair_count[p] += d
                if pair_count[p] > 0 and p != pair:
                    heapq.heappush(heap, (-pair_count[p], p))
        del pair_count[pair]  # 所有出现处都已合并
    return BPETokenizer(merges)


class BPETokenizer:
    """按合并规则编码 / 解码。``merges[k] = (a, b)`` 表示第 k 条规则把相邻的 a、b 合成 id ``260 + k``。"""

    kind = "byte_bpe"

    def __init__(self, merges: Iterable[tuple[int, int]]):
        self.merges = [tuple(int(x) for x in m) for m in merges]
        self.token_bytes = [b""] * BYTE_OFFSET + [bytes([b]) for b in range(256)]
        self.rank: dict[tuple[int, int], int] = {}
        for k, (a, b) in enumerate(self.merges):
            if not (BYTE_OFFSET <= a < FIRST_MERGE_ID + k and BYTE_OFFSET <= b < FIRST_MERGE_ID + k):
                raise ValueError(f"merges[{k}]={(a, b)} 引用了还不存在的词元（应在 [{BYTE_OFFSET}, {FIRST_MERGE_ID + k})）")
            self.rank[(a, b)] = k
            self.token_bytes.append(self.token_bytes[a] + self.token_bytes[b])
        self._cache: dict[str, list[int]] = {}

    @property
    def vocab_size(self) -> int:
        """词表大小：4 个特殊词元 + 256 个字节 + 合并规则条数。"""
        return len(self.token_bytes)

    def __len__(self) -> int:
        return self.vocab_size

    def __eq__(self, other: object) -> bool:
        return isinstance(other, BPETokenizer) and self.merges == other.merges

    def __repr__(self) -> str:
        return f"BPETokenizer(vocab_size={self.vocab_size}, merges={len(self.merges)})"

    def token_text(self, index: int) -> str:
        """一个 id 对应的文字（特殊词元写名字，不完整的 UTF-8 字节写成 ``<E6>``）。"""
        (index,) = id_list([index], self.vocab_size)
        return SPECIAL_TOKENS[index] if index < BYTE_OFFSET else display_bytes(self.token_bytes[index])

    # ---- 编码 -----------------------------------------------------------------------------
    def _encode_chunk(self, chunk: str) -> list[int]:
        """一个小块：从字节开始，每次合并排名最靠前（最早学到）的相邻对，直到没有可合并的。"""
        word = [BYTE_OFFSET + b for b in chunk.encode("utf-8")]
        while len(word) > 1:
            known = [(self.rank[p], p) for p in zip(word, word[1:]) if p in self.rank]
            if not known:
                break
            k, pair = min(known)
            word = _merge(word, pair, FIRST_MERGE_ID + k)
        return word

    def encode(self, text: str, add_bos: bool = False, add_eos: bool = False) -> list[int]:
        """文本 → id 列表。任何合法的字符串都能编码（起点是字节），不会产生 UNK；不成对的代理码位没有 UTF-8 字节，报 ValueError。"""
        ids: list[int] = []
        for chunk in pretokenize(check_text("text", text, utf8=True)):
            if chunk not in self._cache:
                self._cache[chunk] = self._encode_chunk(chunk)
            ids.extend(self._cache[chunk])
        return with_specials(ids, add_bos, add_eos)

    def decode(self, ids, stop_at_eos: bool = True, errors: str = "replace") -> str:
        """id 序列 → 文本：把各词元的字节拼起来再按 UTF-8 解读。

        模型生成的 id 可能停在半个字上，默认把坏字节显示成 U+FFFD（``errors="strict"`` 则报错）。
        """
        pieces = split_at_specials(id_list(ids, self.vocab_size), stop_at_eos)
        return "".join(
            UNK_TEXT if p == UNK else b"".join(self.token_bytes[i] for i in p).decode("utf-8", errors=errors)
            for p in pieces
        )

    # ---- 存取 -----------------------------------------------------------------------------
    def to_dict(self) -> dict:
        return {"kind": self.kind, "specials": list(SPECIAL_TOKENS), "merges": [list(m) for m in self.merges]}

    @classmethod
    def from_dict(cls, data: dict) -> "BPETokenizer":
        if not isinstance(data, dict) or data.get("kind") != cls.kind or "merges" not in data:
            raise ValueError(f"data 应是 BPETokenizer.to_dict() 的结果（kind='byte_bpe'，含 'merges'），收到 {data!r:.80}")
        if tuple(data.get("specials", ())) != SPECIAL_TOKENS:
            raise ValueError(f"data 的特殊词元 {data.get('specials')} 与本库的 {SPECIAL_TOKENS} 不一致")
        return cls(data["merges"])

    def save(self, path):
        """存成 JSON（合并规则列表，原子写入），返回路径。"""
        return write_json(path, self.to_dict())

    @classmethod
    def load(cls, path) -> "BPETokenizer":
        return cls.from_dict(read_json(path, cls.kind))
