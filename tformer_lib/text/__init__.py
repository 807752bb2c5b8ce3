"""文本 → 词元 id：字符级分词器、教学用的字节级 BPE、以及 ``tokenizers`` 包上的快速 BPE。

三者接口相同：``encode(text, add_bos=False, add_eos=False) -> list[int]``、``decode(ids) -> str``、
``vocab_size``、``save(path)`` / ``load(path)``；id 0–3 都是 :mod:`tformer_lib.specials` 的 PAD/BOS/EOS/UNK。
"""

from .char import CharTokenizer

__all__ = ["CharTokenizer"]
