"""Hugging Face 的 ``tokenizer.json`` 与本书分词器之间的转换（``tokenizers`` 包，用到时才导入）。

- 写：本书的字符分词器 :class:`~tformer_lib.text.CharTokenizer` → 一个词级模型（word-level model）：
  词表原样（PAD/BOS/EOS/UNK 占 id 0–3，名字用本库的 ``<pad>``、``<bos>``、``<eos>``、``<unk>``），
  预分词（pre-tokenizer）把文本切成单个字符，解码器（decoder）把字符直接拼起来（``Fuse``）。
  ``tokenizers.Tokenizer.from_file`` 与 ``transformers.PreTrainedTokenizerFast(tokenizer_file=…)`` 都能读。
- 读：这样写出的文件还原成同一个 :class:`~tformer_lib.text.CharTokenizer`（词表逐项相同）；
  别的 ``tokenizer.json``（GPT-2、LLaMA 的 BPE……）包成 :class:`HFTokenizer`，接口与本书的分词器相同。
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from ..specials import SPECIAL_TOKENS
from ..text import CharTokenizer
from ..text._common import check_text, id_list

__all__ = ["HFTokenizer", "char_tokenizer_json", "read_tokenizer_dir", "special_token_ids", "tokenizer_json_text"]

#: 我们写出的字符分词器用的预分词正则：每个字符（含换行）单独成一个“词”
CHAR_PATTERN = r"[\s\S]"


def _tokenizers():
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")  # 与 text/fast.py 相同：2 核机器上不开多线程
    import tokenizers

    return tokenizers


class HFTokenizer:
    """``tokenizers.Tokenizer`` 的薄包装，接口与本书的分词器相同：``encode`` / ``decode`` / ``vocab_size``。

    ``bos_id``、``eos_id``、``pad_id`` 来自模型目录里的 ``generation_config.json``，没有时取 ``config.json``
    （与 transformers 的 ``generate`` 读的是同一份；都没有时为 None）。``eos_ids`` 是列出的全部结束词元
    （LLaMA-3 等写成列表，transformers 遇到其中任何一个都停），``eos_id`` 是其中第一个；:meth:`decode` 遇到
    ``eos_ids`` 里任何一个都停。:func:`~tformer_lib.lm.generate` 只认一个 ``eos_id``：对话模型要停在哪个词元
    （如 LLaMA-3-Instruct 的 ``<|eot_id|>``），就从 ``eos_ids`` 里挑那一个传给它。
    """

    kind = "hf"

    def __init__(self, tokenizer, bos_id: int | None = None, eos_id: int | None = None, pad_id: int | None = None,
                 eos_ids: tuple[int, ...] | None = None):
        tk = _tokenizers()
        if not isinstance(tokenizer, tk.Tokenizer):
            raise TypeError(f"tokenizer 应是 tokenizers.Tokenizer，收到 {type(tokenizer).__name__}")
        self.tokenizer = tokenizer
        self.bos_id, self.eos_id, self.pad_id = bos_id, eos_id, pad_id
        self.eos_ids = tuple(eos_ids) if eos_ids is not None else (() if eos_id is None else (eos_id,))
        if eos_id is not None and eos_id not in self.eos_ids:
            raise ValueError(f"eos_id={eos_id} 应在 eos_ids={self.eos_ids} 里")

    @property
    def vocab_size(self) -> int:
        return self.tokenizer.get_vocab_size(with_added_tokens=True)

    def __len__(self) -> int:
        return self.vocab_size

    def __repr__(self) -> str:
        return f"HFTokenizer(vocab_size={self.vocab_size}, bos_id={self.bos_id}, eos_id={self.eos_id})"

    def encode(self, text: str, add_bos: bool = False, add_eos: bool = False) -> list[int]:
        """文本 → id；``add_bos``/``add_eos`` 只在模型有 BOS/EOS 时可用。"""
        for name, wanted, token_id in (("add_bos", add_bos, self.bos_id), ("add_eos", add_eos, self.eos_id)):
            if wanted and token_id is None:
                raise ValueError(f"{name}=True，但这个模型目录没有给出 {name[4:]}_token_id")
        ids = self.tokenizer.encode(check_text("text", text), add_special_tokens=False).ids
        return ([self.bos_id] if add_bos else []) + ids + ([self.eos_id] if add_eos else [])

    def decode(self, ids, stop_at_eos: bool = True) -> str:
        """id → 文本；默认遇 ``eos_id`` 停；BOS、PAD 与标成特殊的词元不显示（与本书的分词器相同）。"""
        ids = id_list(ids, self.vocab_size)
        if stop_at_eos:
            ends = [i for i, t in enumerate(ids) if t in self.eos_ids]
            ids = ids[: ends[0]] if ends else ids
        hidden = {self.bos_id, self.pad_id} - {None}
        return self.tokenizer.decode([i for i in ids if i not in hidden], skip_special_tokens=True)

    def to_json(self) -> str:
        return self.tokenizer.to_str()


def char_tokenizer_json(tokenizer: CharTokenizer) -> str:
    """本书的字符分词器 → ``tokenizer.json`` 的文本（词级模型 + 逐字符预分词 + 直接拼接的解码器）。"""
    tk = _tokenizers()
    vocab = {tokenizer.id_to_token(i): i for i in range(tokenizer.vocab_size)}
    out = tk.Tokenizer(tk.models.WordLevel(vocab, unk_token=SPECIAL_TOKENS[3]))
    out.pre_tokenizer = tk.pre_tokenizers.Split(tk.Regex(CHAR_PATTERN), behavior="isolated")
    out.decoder = tk.decoders.Fuse()
    out.add_special_tokens([tk.AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS])
    return out.to_str()


def tokenizer_json_text(tokenizer) -> str:
    """任一可导出的分词器 → ``tokenizer.json`` 的文本：字符分词器、:class:`HFTokenizer`，
    或带 ``tokenizers.Tokenizer`` 属性 ``tokenizer`` 的包装（如 :class:`~tformer_lib.text.FastBPETokenizer`）。"""
    if isinstance(tokenizer, CharTokenizer):
        return char_tokenizer_json(tokenizer)
    inner = getattr(tokenizer, "tokenizer", None)
    if inner is not None and isinstance(inner, _tokenizers().Tokenizer):
        return inner.to_str()
    raise TypeError(
        f"tokenizer 应是 CharTokenizer、HFTokenizer 或包着 tokenizers.Tokenizer 的分词器，收到 {type(tokenizer).__name__}"
    )


def _as_char_tokenizer(data: dict) -> CharTokenizer | None:
    """若 ``tokenizer.json`` 恰好是 :func:`char_tokenizer_json` 写出的格式，还原成 :class:`CharTokenizer`；否则 None。

    “恰好”是整份文件：同一个词表用 :func:`char_tokenizer_json` 重写一遍，与读到的逐项相同——加了归一化
    （normalizer）、后处理、别的特殊词元或截断设置的文件都不算，照原样包成 :class:`HFTokenizer`。
    """
    model, pre = data.get("model") or {}, data.get("pre_tokenizer") or {}
    if model.get("type") != "WordLevel" or pre.get("type") != "Split" or (pre.get("pattern") or {}).get("Regex") != CHAR_PATTERN:
        return None
    vocab = model.get("vocab") or {}
    itos = sorted(vocab, key=vocab.get)
    if [vocab[t] for t in itos] != list(range(len(itos))) or tuple(itos[: len(SPECIAL_TOKENS)]) != SPECIAL_TOKENS:
        return None
    if not all(len(t) == 1 for t in itos[len(SPECIAL_TOKENS):]):
        return None
    char = CharTokenizer(itos[len(SPECIAL_TOKENS):])
    return char if json.loads(char_tokenizer_json(char)) == data else None


def read_tokenizer_dir(path: Path, config: dict) -> CharTokenizer | HFTokenizer | None:
    """读模型目录里的 ``tokenizer.json``；没有这个文件时返回 None。"""
    file = Path(path) / "tokenizer.json"
    if not file.is_file():
        return None
    text = file.read_text(encoding="utf-8")
    char = _as_char_tokenizer(json.loads(text))
    if char is not None:
        return char
    ids = special_token_ids(path, config)
    eos = ids["eos_token_id"]
    return HFTokenizer(_tokenizers().Tokenizer.from_str(text), _first(ids["bos_token_id"]), _first(eos),
                       _first(ids["pad_token_id"]), eos)


def _first(ids: tuple[int, ...]) -> int | None:
    return ids[0] if ids else None


SPECIAL_ID_FIELDS = ("bos_token_id", "eos_token_id", "pad_token_id")


def special_token_ids(path, config: dict | None = None) -> dict[str, tuple[int, ...]]:
    """模型目录里的特殊词元 id：``{"bos_token_id": (…), "eos_token_id": (…), "pad_token_id": (…)}``。

    每项取 ``generation_config.json``（transformers 的 ``generate`` 用它），那里没有或不是整数 id 时取 ``config.json``
    （已读好的可由 ``config`` 给出）；一个 id 或一列 id（LLaMA-3 的几个结束词元），原样保留次序；都没有时为空元组。
    """
    path = Path(path)
    sources = []
    for file in ("generation_config.json", "config.json"):
        if file == "config.json" and config is not None:
            sources.append(config)
        elif (path / file).is_file():
            sources.append(json.loads((path / file).read_text(encoding="utf-8")))
    out = {}
    for name in SPECIAL_ID_FIELDS:
        out[name] = ()
        for data in sources:
            value = data.get(name) if isinstance(data, dict) else None
            ids = [value] if isinstance(value, int) else value
            if isinstance(ids, list) and ids and all(isinstance(t, int) and not isinstance(t, bool) for t in ids):
                out[name] = tuple(ids)
                break
    return out
