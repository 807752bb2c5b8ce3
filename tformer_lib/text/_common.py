"""三个分词器共用的小工具：输入检查、特殊词元的处理、原子地写 JSON。"""

from __future__ import annotations

import json
import numbers
import os
import tempfile
from pathlib import Path

from ..specials import BOS, EOS, SPECIAL_TOKENS, UNK

#: 解码时 UNK 显示成的文字
UNK_TEXT = SPECIAL_TOKENS[UNK]

__all__ = ["UNK_TEXT", "check_text", "check_texts", "id_list", "split_at_specials", "with_specials", "write_json", "write_text", "read_json"]


def check_text(name: str, text, utf8: bool = False) -> str:
    """要求 ``text`` 是字符串（不是词元列表、字节串或 None）。

    ``utf8=True``（字节级 BPE 用）：还要求它能编码成 UTF-8。唯一做不到的是不成对的代理码位（surrogate，
    U+D800–U+DFFF，如 ``"a\\ud800b"``——常见于按 UTF-16 切坏的字符串或 JSON 里落单的 ``\\ud83d``）：它不是
    合法的 Unicode 字符，没有 UTF-8 字节，所以报 ValueError，指出位置与码位，而不是悄悄替换成别的字符。
    """
    if not isinstance(text, str):
        hint = "；字节串请先 .decode('utf-8')" if isinstance(text, (bytes, bytearray)) else ""
        raise TypeError(f"{name} 应是字符串，收到 {type(text).__name__} {text!r:.60}{hint}")
    if utf8:
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as exc:
            ch = text[exc.start]
            raise ValueError(f"{name} 的第 {exc.start + 1} 个字符（下标 {exc.start}）{ch!r}（U+{ord(ch):04X}）是不成对的代理码位（surrogate），"
                             "不是合法的 Unicode 字符、无法编码成 UTF-8，字节级 BPE 不能处理它；请先修好文本"
                             "（如 text.encode('utf-8', 'replace').decode('utf-8') 把它换成 '?'）") from None
    return text


def check_texts(name: str, texts, utf8: bool = False) -> list[str]:
    """要求 ``texts`` 是若干字符串（列表、元组或生成器），且至少有一个非空；``utf8`` 见 :func:`check_text`。"""
    if isinstance(texts, (str, bytes)):
        raise TypeError(f"{name} 应是字符串的列表（每项一段文本），收到单个 {type(texts).__name__}；请写成 [{texts!r:.30}]")
    texts = list(texts)
    for i, t in enumerate(texts):
        check_text(f"{name}[{i}]", t, utf8)
    if not any(texts):
        raise ValueError(f"{name} 里没有任何文本（收到 {len(texts)} 个空串），无法训练")
    return texts


def id_list(ids, vocab_size: int) -> list[int]:
    """把 id 序列（list、元组、1 维张量或数组，元素为任意整数类型）变成 ``list[int]`` 并检查范围。"""
    if isinstance(ids, (str, bytes)):
        raise TypeError(f"ids 应是整数 id 的序列，收到 {type(ids).__name__} {ids!r:.40}；要编码文本请用 encode()")
    if hasattr(ids, "tolist"):
        ids = ids.tolist()
    out = []
    for i in ids:
        if isinstance(i, bool) or not isinstance(i, numbers.Integral):
            raise TypeError(f"ids 的每一项应是整数 id，收到 {i!r}（{type(i).__name__}）")
        if not 0 <= i < vocab_size:
            raise ValueError(f"id={i} 超出词表范围 [0, {vocab_size - 1}]")
        out.append(int(i))
    return out


def split_at_specials(ids: list[int], stop_at_eos: bool = True) -> list[int | list[int]]:
    """按特殊词元切开：普通 id 连成小段（list），PAD/BOS 丢掉，UNK 单独留下（int），遇 EOS 可停。"""
    pieces: list[int | list[int]] = []
    run: list[int] = []
    for i in ids:
        if i == EOS and stop_at_eos:
            break
        if i < len(SPECIAL_TOKENS):
            if run:
                pieces.append(run)
                run = []
            if i == UNK:
                pieces.append(UNK)
            continue  # PAD、BOS（以及不停下时的 EOS）不产生文字
        run.append(i)
    if run:
        pieces.append(run)
    return pieces


def with_specials(ids: list[int], add_bos: bool, add_eos: bool) -> list[int]:
    return ([BOS] if add_bos else []) + ids + ([EOS] if add_eos else [])


def write_text(path, text: str) -> Path:
    """原子地写 UTF-8 文本（先写临时文件再改名），中途失败不会留下半个文件。"""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise
    return path


def write_json(path, data: dict) -> Path:
    """原子地写 JSON 文件。"""
    return write_text(path, json.dumps(data, ensure_ascii=False, indent=1) + "\n")


def read_json(path, kind: str) -> dict:
    """读 :func:`write_json` 写的文件，并核对它是 ``kind`` 这种分词器存的。"""
    with open(path, encoding="utf-8") as f:
        data = json.load(f)
    if not isinstance(data, dict) or data.get("kind") != kind:
        got = data.get("kind") if isinstance(data, dict) else type(data).__name__
        raise ValueError(f"{path} 不是 {kind} 分词器存的文件（kind={got!r}）")
    if tuple(data.get("specials", ())) != SPECIAL_TOKENS:
        raise ValueError(f"{path} 的特殊词元 {data.get('specials')} 与本库的 {SPECIAL_TOKENS} 不一致")
    return data
