"""唐诗语料（Tang poems）：随库附带的真实中文文本，第三部分的语言模型在它上面训练。

来源是 npm 包 ``chinese-poetry`` 2.0.1（MIT 许可，许可证原文在 ``data/poems/LICENSE``）里的全唐诗
（57,607 首），由 ``scripts/prepare_poems.py`` 用 OpenCC 转成简体、清洗、去重、按诗划分：

* 只留规整的五言/七言绝句与律诗：4 或 8 句，每句 5 或 7 个汉字，句末标点在原位（奇数句「，」、偶数句「。」）；
  缺字（□、？）、注释括号、生僻字（基本多文种平面以外）或格式不齐的诗整首丢弃（21,702 首），
  重复的正文只留第一次出现的（609 首）；
* 留下 35,296 首，按正文的 sha256 划分为 train 31,768 首 / valid 1,797 首 / test 1,731 首；
* train 共 1,205,780 个汉字（不计标点），6,297 个不同的字；三个划分合起来 6,380 个不同的字；
* train 里五言律诗 12,539 首、七言绝句 9,121 首、七言律诗 6,852 首、五言绝句 3,256 首。

文件是 gzip 压缩的 JSON Lines（一行一首：``title``、``author``、``lines``），共约 3.1 MB；
``manifest.json`` 记着每个划分解压后文本的 sha256，:func:`load_poems` 每次读文件都核对，
文件被改动或损坏就报错，不会悄悄训练在坏数据上。运行时不联网，也不需要 opencc。

>>> poems = load_poems("valid")
>>> len(poems)
1797
>>> poems[0].form in FORMS.values()
True
"""

from __future__ import annotations

import copy
import gzip
import hashlib
import json
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources

__all__ = ["FORMS", "POEM_SPLITS", "Poem", "PoemDataError", "load_poems", "poems_manifest", "poem_texts"]

#: 语料的三个划分
POEM_SPLITS = ("train", "valid", "test")

#: （每句字数, 句数）→ 体裁名
FORMS = {(5, 4): "五言绝句", (7, 4): "七言绝句", (5, 8): "五言律诗", (7, 8): "七言律诗"}


class PoemDataError(RuntimeError):
    """随库附带的语料文件缺失、被改动或损坏。"""


@dataclass(frozen=True)
class Poem:
    """一首诗。``lines`` 是不带标点的各句，如 ``("白日依山尽", "黄河入海流", …)``。"""

    title: str
    author: str
    lines: tuple[str, ...]

    @property
    def text(self) -> str:
        """正文连成一串，标点在原位：``"白日依山尽，黄河入海流。欲穷千里目，更上一层楼。"``。"""
        return "".join(line + ("，" if i % 2 == 0 else "。") for i, line in enumerate(self.lines))

    @property
    def chars_per_line(self) -> int:
        """每句字数（5 或 7）。"""
        return len(self.lines[0])

    @property
    def form(self) -> str:
        """体裁：五言绝句、七言绝句、五言律诗或七言律诗。"""
        return FORMS[(self.chars_per_line, len(self.lines))]

    def __str__(self) -> str:
        couplets = [self.lines[i] + "，" + self.lines[i + 1] + "。" for i in range(0, len(self.lines), 2)]
        return "\n".join([f"{self.title}（{self.author}）", *couplets])


def _data_dir():
    return resources.files("tformer_lib.data").joinpath("poems")


def poems_manifest() -> dict:
    """``manifest.json`` 的内容（副本）：来源、清洗规则、每个划分的诗数、字数、不同字数与 sha256。"""
    return copy.deepcopy(_manifest())


@lru_cache(maxsize=1)
def _manifest() -> dict:
    path = _data_dir().joinpath("manifest.json")
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise PoemDataError(f"读不出语料清单 {path}：{exc}；请重新安装 tformer_lib") from exc


def _check_split(split) -> str:
    if not isinstance(split, str):
        raise TypeError(f"split 应是字符串 {POEM_SPLITS} 之一，收到 {type(split).__name__} {split!r}")
    if split not in POEM_SPLITS:
        raise ValueError(f"split={split!r} 不是语料的划分：应为 {', '.join(map(repr, POEM_SPLITS))} 之一")
    return split


@lru_cache(maxsize=None)
def _load(split: str) -> tuple[Poem, ...]:
    info = _manifest()["splits"][split]
    path = _data_dir().joinpath(info["file"])
    try:
        raw = gzip.decompress(path.read_bytes())
    except (OSError, EOFError, gzip.BadGzipFile) as exc:
        raise PoemDataError(f"读不出语料文件 {path}：{exc}；请重新安装 tformer_lib") from exc
    digest = hashlib.sha256(raw).hexdigest()
    if digest != info["sha256"]:
        raise PoemDataError(
            f"语料文件 {path} 解压后的 sha256 是 {digest}，manifest.json 记的是 {info['sha256']}："
            "文件被改动或损坏。请重新安装 tformer_lib，或用 scripts/prepare_poems.py 重建"
        )
    poems = []
    for row in raw.decode("utf-8").splitlines():
        d = json.loads(row)
        poems.append(Poem(title=d["title"], author=d["author"], lines=tuple(d["lines"])))
    return tuple(poems)


def load_poems(split: str = "train") -> list[Poem]:
    """读出一个划分（``"train"``、``"valid"`` 或 ``"test"``）的全部诗，顺序固定（全唐诗里的先后）。

    第一次读时核对 sha256，之后走缓存；返回新的列表，调用方可以随意打乱、切片。
    """
    return list(_load(_check_split(split)))


def poem_texts(split: str = "train") -> list[str]:
    """一个划分里每首诗的正文（:attr:`Poem.text`），分词器（tokenizer）的训练与评测都用它。"""
    return [p.text for p in load_poems(split)]
