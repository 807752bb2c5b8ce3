"""词表（vocabulary）：词元（token）与整数 id 之间的双向映射。

前四个 id 固定留给具名的特殊词元（special tokens，见 :mod:`tformer_lib.specials`）：
``PAD=0``（填充）、``BOS=1``（句首）、``EOS=2``（句尾）、``UNK=3``（未登录词）。
普通词元从 id 4 开始，按「出现次数从多到少、同次数按字典序」排列，所以同一份语料
永远得到同一张词表。
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence

from ..specials import BOS, EOS, PAD, SPECIAL_TOKENS, UNK

__all__ = ["Vocab"]


class Vocab:
    """词元 ↔ id 的映射，带具名特殊词元。

    参数
    ----
    tokens:
        普通词元列表（不含特殊词元），按给定顺序编号为 4, 5, 6, …。重复项或与特殊词元同名会报错。

    例子
    ----
    >>> v = Vocab(["狗", "咬", "人"])
    >>> v.encode(["狗", "咬", "猫"])       # 未登录词 → UNK(3)
    [4, 5, 3]
    >>> v.decode([4, 5, 6, 2, 0])          # 遇到 EOS 停止
    ['狗', '咬', '人']
    """

    def __init__(self, tokens: Iterable[str] = ()):
        tokens = list(tokens)
        for t in tokens:
            if not isinstance(t, str):
                raise TypeError(f"tokens 里的每一项都应是 str，收到 {t!r}（{type(t).__name__}）")
        itos = list(SPECIAL_TOKENS) + tokens
        stoi: dict[str, int] = {}
        for i, t in enumerate(itos):
            if t in stoi:
                raise ValueError(f"tokens 中有重复词元或与特殊词元同名：{t!r}（特殊词元为 {SPECIAL_TOKENS}）")
            stoi[t] = i
        self._itos = itos
        self._stoi = stoi

    # ---- 构建 -------------------------------------------------------------------------
    @classmethod
    def build(cls, sequences: Iterable[Sequence[str]], min_freq: int = 1) -> "Vocab":
        """从若干词元序列统计词频建表；出现次数 < ``min_freq`` 的词元不收录（之后编码为 UNK）。"""
        if not isinstance(min_freq, int) or min_freq < 1:
            raise ValueError(f"min_freq 应为 ≥1 的整数，收到 {min_freq!r}")
        counts: Counter[str] = Counter()
        for seq in sequences:
            if isinstance(seq, str):
                raise TypeError(
                    f"sequences 的每一项应是词元列表（如 ['狗', '咬', '人']），收到字符串 {seq!r}；"
                    "请先分词（tokenize）"
                )
            counts.update(seq)
        for s in SPECIAL_TOKENS:
            counts.pop(s, None)
        ordered = sorted((t for t, c in counts.items() if c >= min_freq), key=lambda t: (-counts[t], t))
        return cls(ordered)

    # ---- 查询 -------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self._itos)

    def __contains__(self, token: object) -> bool:
        return token in self._stoi

    def __getitem__(self, token: str) -> int:
        """词元 → id；未登录词返回 UNK。"""
        return self._stoi.get(token, UNK)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Vocab) and self._itos == other._itos

    def __repr__(self) -> str:
        preview = ", ".join(self._itos[4:10])
        more = " …" if len(self._itos) > 10 else ""
        return f"Vocab(size={len(self)}, tokens=[{preview}{more}])"

    @property
    def itos(self) -> list[str]:
        """id → 词元 的列表（副本）。"""
        return list(self._itos)

    def token(self, index: int) -> str:
        """id → 词元；越界报错。"""
        if not 0 <= int(index) < len(self._itos):
            raise ValueError(f"index={index} 超出词表范围 [0, {len(self._itos) - 1}]")
        return self._itos[int(index)]

    # ---- 编码 / 解码 --------------------------------------------------------------------
    def encode(self, tokens: Sequence[str], add_bos: bool = False, add_eos: bool = False) -> list[int]:
        """词元列表 → id 列表；未登录词映射为 UNK，可选在首尾加 BOS / EOS。"""
        if isinstance(tokens, str):
            raise TypeError(
                f"tokens 应是词元列表（如 ['狗', '咬', '人']），收到字符串 {tokens!r}；请先分词（tokenize）"
            )
        ids = [self._stoi.get(t, UNK) for t in tokens]
        if add_bos:
            ids = [BOS] + ids
        if add_eos:
            ids = ids + [EOS]
        return ids

    def decode(self, ids: Iterable[int], strip_specials: bool = True, stop_at_eos: bool = True) -> list[str]:
        """id 序列（list 或 1 维张量）→ 词元列表。

        默认遇到 EOS 即停，并去掉 PAD/BOS/EOS（UNK 保留为 ``<unk>``，好让读者看见它）。
        """
        if hasattr(ids, "tolist"):
            ids = ids.tolist()
        out: list[str] = []
        for i in ids:
            if not isinstance(i, int):
                raise TypeError(f"ids 的每一项应是整数 id，收到 {i!r}（{type(i).__name__}）")
            if stop_at_eos and i == EOS:
                break
            if strip_specials and i in (PAD, BOS, EOS):
                continue
            out.append(self.token(i))
        return out

    # ---- 存取（只用普通类型，便于 torch.load(weights_only=True)）------------------------------
    def to_dict(self) -> dict:
        """转成只含 str/list 的普通字典，可直接放进检查点（checkpoint）。"""
        return {"specials": list(SPECIAL_TOKENS), "tokens": self._itos[len(SPECIAL_TOKENS):]}

    @classmethod
    def from_dict(cls, data: dict) -> "Vocab":
        """:meth:`to_dict` 的逆操作；特殊词元不一致时报错（说明检查点来自不兼容的版本）。"""
        if not isinstance(data, dict) or "tokens" not in data:
            raise ValueError(f"data 应是 Vocab.to_dict() 生成的字典（含键 'tokens'），收到 {type(data).__name__}")
        specials = tuple(data.get("specials", SPECIAL_TOKENS))
        if specials != tuple(SPECIAL_TOKENS):
            raise ValueError(f"词表的特殊词元 {specials} 与本库的 {tuple(SPECIAL_TOKENS)} 不一致")
        return cls(data["tokens"])
