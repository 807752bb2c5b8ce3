"""玩具中→英翻译语料（toy zh→en corpus）：由一套小语法和小词典生成，无需下载。

设计要点
--------
* **语序承载意义。** 句子是「主语–谓语–宾语」（subject–verb–object, SVO）：
  ``狗 咬 人`` → ``the dog bites the person``，``人 咬 狗`` → ``the person bites the dog``。
  两句词元完全相同，只有顺序不同——这正是位置编码（positional encoding）要解决的问题。
* **语法现象：** 形容词（``大 狗`` → ``the big dog``；双字形容词带「的」：``聪明 的 学生``）、
  数词 + 量词（``两 只 狗`` → ``two dogs``，英语随之变复数、动词随之变形）、否定（不 / 没有）、
  时间词（今天 / 昨天 / 明天 → 现在时 / 过去时 / 将来时），以及文章 A、B 里的
  ``人工智能`` → ``artificial intelligence``、``人工智能 改变 世界`` →
  ``artificial intelligence changes the world``。
* **分词（tokenization）：中文按「词典词」切分，词与词之间用空格隔开**，如
  ``"人工智能 改变 世界"``，因此「人工智能」是一个词元而不是四个字；「的」、量词、「了」
  各自是独立词元。英文全部小写、按空格分词。没有空格的中文输入（``"狗咬人"``）可用
  :func:`tokenize_zh` 按最长匹配（maximum matching）切分。
* **划分（split）确定且不重叠：** 测试集（test）与验证集（valid）里的每一句都是某个训练句
  的「主宾互换」版本（mirror）：``狗 咬 人`` 在训练集，``人 咬 狗`` 只在测试集。
  所以测试考的是语序，而不是记忆。同一句（按中文判定）绝不出现在两个划分中。
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

__all__ = [
    "NOUNS",
    "ADJECTIVES",
    "VERBS",
    "NUMBERS",
    "TIME_WORDS",
    "LEXICON",
    "ToyCorpus",
    "make_toy_corpus",
    "translate_spec",
    "tokenize_zh",
    "tokenize_en",
    "detokenize",
    "mirror_sentence",
    "all_noun_phrases",
    "translate_np",
]

# ---- 词典（lexicon）----------------------------------------------------------------------
# 名词：中文, 英文单数, 英文复数, 量词（classifier）; 量词为 None 的是不可数/专名，不加修饰语
NOUNS: dict[str, tuple[str, str, str | None]] = {
    "狗": ("dog", "dogs", "只"),
    "猫": ("cat", "cats", "只"),
    "鸟": ("bird", "birds", "只"),
    "鱼": ("fish", "fish", "条"),
    "马": ("horse", "horses", "匹"),
    "人": ("person", "people", "个"),
    "老师": ("teacher", "teachers", "位"),
    "学生": ("student", "students", "个"),
    "孩子": ("child", "children", "个"),
    "医生": ("doctor", "doctors", "位"),
    "朋友": ("friend", "friends", "个"),
    "机器人": ("robot", "robots", "个"),
    "人工智能": ("artificial intelligence", "artificial intelligence", None),
    "世界": ("the world", "the world", None),
}
# 形容词：中文 → 英文；双字形容词修饰名词时要加「的」
ADJECTIVES: dict[str, str] = {
    "大": "big",
    "小": "small",
    "黑": "black",
    "白": "white",
    "老": "old",
    "聪明": "smart",
    "快乐": "happy",
}
# 动词：中文 → (原形, 第三人称单数, 过去式)
VERBS: dict[str, tuple[str, str, str]] = {
    "咬": ("bite", "bites", "bit"),
    "看见": ("see", "sees", "saw"),
    "喜欢": ("like", "likes", "liked"),
    "帮助": ("help", "helps", "helped"),
    "追": ("chase", "chases", "chased"),
    "改变": ("change", "changes", "changed"),
    "教": ("teach", "teaches", "taught"),
    "爱": ("love", "loves", "loved"),
    "找到": ("find", "finds", "found"),
}
NUMBERS: dict[str, str] = {"两": "two", "三": "three", "四": "four", "五": "five"}
# 时间词 → (英文, 时态)；None 表示不写时间词（一般现在时）
TIME_WORDS: dict[str, tuple[str, str]] = {
    "今天": ("today", "present"),
    "昨天": ("yesterday", "past"),
    "明天": ("tomorrow", "future"),
}
FUNCTION_WORDS = ("的", "不", "没有", "会", "了")

#: 词典词 → 英文释义（给术语表、可视化与练习用）
LEXICON: dict[str, str] = {
    **{zh: en for zh, (en, _, _) in NOUNS.items()},
    **ADJECTIVES,
    **{zh: forms[0] for zh, forms in VERBS.items()},
    **NUMBERS,
    **{zh: en for zh, (en, _) in TIME_WORDS.items()},
    "的": "(attributive particle)",
    "不": "not",
    "没有": "did not",
    "会": "will",
    "了": "(past particle)",
    **{cl: "(classifier)" for cl in sorted({c for *_, c in NOUNS.values() if c})},
}

# ---- 句子规格（spec）：一个句子的「意思」，中英文都由它生成 -------------------------------------
# 名词短语 NP = (名词, 形容词或 None, 数词或 None)
NP = tuple[str, "str | None", "str | None"]
# 句子 = (时间词或 None, 是否否定, 主语 NP, 动词, 宾语 NP)
Spec = tuple["str | None", bool, NP, str, NP]


def _np_zh(np_: NP) -> list[str]:
    noun, adj, num = np_
    out: list[str] = []
    if num is not None:
        out += [num, NOUNS[noun][2]]  # 数词 + 量词
    if adj is not None:
        out += [adj, "的"] if len(adj) > 1 else [adj]
    return out + [noun]


def _np_en(np_: NP) -> list[str]:
    noun, adj, num = np_
    sg, pl, cl = NOUNS[noun]
    if cl is None:  # 不可数 / 专名：原样
        return sg.split()
    adj_en = [ADJECTIVES[adj]] if adj is not None else []
    if num is not None:
        return [NUMBERS[num]] + adj_en + pl.split()
    return ["the"] + adj_en + sg.split()


def _verb_en(verb: str, tense: str, negative: bool, plural_subject: bool) -> list[str]:
    base, third, past = VERBS[verb]
    if tense == "present":
        if negative:
            return ["do" if plural_subject else "does", "not", base]
        return [base if plural_subject else third]
    if tense == "past":
        return ["did", "not", base] if negative else [past]
    return ["will", "not", base] if negative else ["will", base]


def _verb_zh(verb: str, tense: str, negative: bool) -> list[str]:
    if tense == "past":
        return ["没有", verb] if negative else [verb, "了"]
    if tense == "future":
        return ["不", "会", verb] if negative else ["会", verb]
    return ["不", verb] if negative else [verb]


def translate_spec(spec: Spec) -> tuple[str, str]:
    """把句子规格渲染成 (中文, 英文) 两个以空格分词的字符串。"""
    time, negative, subj, verb, obj = spec
    tense = TIME_WORDS[time][1] if time is not None else "present"
    zh: list[str] = ([time] if time else []) + _np_zh(subj) + _verb_zh(verb, tense, negative)
    zh += _np_zh(obj)
    plural = subj[2] is not None
    en: list[str] = ([TIME_WORDS[time][0]] if time else []) + _np_en(subj) + _verb_en(verb, tense, negative, plural)
    en += _np_en(obj)
    return " ".join(zh), " ".join(en)


def all_noun_phrases() -> list[NP]:
    """语法允许的全部名词短语（按固定顺序）：光杆名词、形容词 + 名词、数词 + 量词 (+ 形容词) + 名词。"""
    out: list[NP] = []
    for noun, (_, _, cl) in NOUNS.items():
        out.append((noun, None, None))
        if cl is None:
            continue
        out += [(noun, adj, None) for adj in ADJECTIVES]
        out += [(noun, adj, num) for num in NUMBERS for adj in (None, *ADJECTIVES)]
    return out


def translate_np(np_: NP) -> tuple[str, str]:
    """名词短语 → (中文, 英文)：``("狗", "大", "两")`` → ``("两 只 大 狗", "two big dogs")``。"""
    return " ".join(_np_zh(np_)), " ".join(_np_en(np_))


def mirror_spec(spec: Spec) -> Spec:
    """主宾互换：狗 咬 人 ↔ 人 咬 狗。"""
    time, negative, subj, verb, obj = spec
    return (time, negative, obj, verb, subj)


def _sample_np(rng: random.Random) -> NP:
    noun = rng.choice(_NOUN_POOL)
    if NOUNS[noun][2] is None:
        return (noun, None, None)
    r = rng.random()
    adj = rng.choice(_ADJ_POOL) if r < 0.25 or r >= 0.8 else None
    num = rng.choice(_NUM_POOL) if r >= 0.6 else None
    return (noun, adj, num)


_NOUN_POOL = [n for n in NOUNS if NOUNS[n][2] is not None] * 2 + [n for n in NOUNS if NOUNS[n][2] is None]
_ADJ_POOL = list(ADJECTIVES)
_NUM_POOL = list(NUMBERS)
_TIME_POOL: list[str | None] = [None, None, *TIME_WORDS]


def _sample_spec(rng: random.Random) -> Spec:
    while True:
        subj, obj = _sample_np(rng), _sample_np(rng)
        if subj[0] != obj[0]:  # 主宾中心词不同，互换后意思才不同
            break
    return (rng.choice(_TIME_POOL), rng.random() < 0.3, subj, rng.choice(list(VERBS)), obj)


# 书里要用到的固定例句：(训练句, 其镜像放进测试集)
_ANCHOR_SPECS: list[Spec] = [
    (None, False, ("狗", None, None), "咬", ("人", None, None)),  # 狗 咬 人 / 人 咬 狗
    (None, False, ("人工智能", None, None), "改变", ("世界", None, None)),  # 人工智能 改变 世界
]

Pair = tuple[str, str]

#: 每个光杆名词短语（``狗`` → ``the dog``）在训练集中出现的次数
BARE_NOUN_REPEATS = 10


@dataclass
class ToyCorpus:
    """三个划分，每项是 ``(中文, 英文)`` 字符串对（以空格分词）。"""

    train: list[Pair] = field(default_factory=list)
    valid: list[Pair] = field(default_factory=list)
    test: list[Pair] = field(default_factory=list)
    seed: int = 0

    def split(self, name: str) -> list[Pair]:
        """按名字取划分：``"train"`` / ``"valid"`` / ``"test"``。"""
        if name not in ("train", "valid", "test"):
            raise ValueError(f"split 应为 'train'、'valid' 或 'test'，收到 {name!r}")
        return getattr(self, name)

    def __len__(self) -> int:
        return len(self.train) + len(self.valid) + len(self.test)

    def __repr__(self) -> str:
        return f"ToyCorpus(train={len(self.train)}, valid={len(self.valid)}, test={len(self.test)}, seed={self.seed})"


def make_toy_corpus(n_train: int = 6000, n_valid: int = 300, n_test: int = 500, seed: int = 0) -> ToyCorpus:
    """生成玩具中→英语料。同样的参数永远得到同样的三个划分。

    * ``n_valid`` / ``n_test`` 句各是某个训练句的主宾互换镜像（镜像在训练集里）；
    * 训练集另含全部 482 个名词短语单独成句的短语对（``人工智能`` → ``artificial intelligence``，
      ``两 只 大 狗`` → ``two big dogs``），让模型学会「短语说完就输出 EOS」，也帮助学词义；
      14 个光杆名词各重复 ``BARE_NOUN_REPEATS`` 次（训练集中唯一的重复项）；
    * 默认共 6,800 条（去掉重复后 6,674 个不同句对）；验证集、测试集与训练集互不重叠。
    """
    for name, value in (("n_train", n_train), ("n_valid", n_valid), ("n_test", n_test)):
        if not isinstance(value, int) or value < 0:
            raise ValueError(f"{name} 应为 ≥0 的整数，收到 {value!r}")
    phrases = [translate_np(np_) for np_ in all_noun_phrases()]
    # 光杆名词（尤其是不带修饰语的「人工智能」「世界」）只有一种短语形式，重复几遍，
    # 模型才学得会「人工智能 → artificial intelligence <eos>」而不是接着续写动词
    phrases += [translate_np((noun, None, None)) for noun in NOUNS] * (BARE_NOUN_REPEATS - 1)
    n_phrases = len(phrases)
    if n_train < n_valid + n_test + len(_ANCHOR_SPECS) + n_phrases:
        raise ValueError(
            f"n_train={n_train} 太小：每个验证/测试句的镜像都要在训练集里，"
            f"需要 n_train ≥ n_valid + n_test + {len(_ANCHOR_SPECS) + n_phrases}"
        )
    rng = random.Random(seed)
    seen: set[Spec] = set()
    train: list[Spec] = []
    valid: list[Spec] = []
    test: list[Spec] = []

    def take_group(spec: Spec, held_out: list[Spec]) -> bool:
        m = mirror_spec(spec)
        if spec in seen or m in seen:
            return False
        seen.update((spec, m))
        train.append(spec)
        held_out.append(m)
        return True

    for spec in _ANCHOR_SPECS[: min(len(_ANCHOR_SPECS), n_test)]:
        take_group(spec, test)
    while len(test) < n_test:
        take_group(_sample_spec(rng), test)
    while len(valid) < n_valid:
        take_group(_sample_spec(rng), valid)
    while len(train) < n_train - n_phrases:
        spec = _sample_spec(rng)
        if spec not in seen:  # 镜像在不在训练集都行，但本句不能与验证/测试重合
            seen.add(spec)
            train.append(spec)
    train_pairs = [translate_spec(s) for s in train] + phrases
    rng.shuffle(train_pairs)
    return ToyCorpus(
        train=train_pairs,
        valid=[translate_spec(s) for s in valid],
        test=[translate_spec(s) for s in test],
        seed=seed,
    )


def mirror_sentence(zh: str) -> str | None:
    """把一个语料中的中文句子主宾互换（按语法重新解析）；无法解析时返回 None。

    例：``"狗 咬 人"`` → ``"人 咬 狗"``；``"昨天 两 只 狗 咬 了 老师"`` → ``"昨天 老师 咬 了 两 只 狗"``。
    """
    spec = _parse_zh(zh.split())
    return None if spec is None else translate_spec(mirror_spec(spec))[0]


def _parse_np(tokens: list[str]) -> NP | None:
    if not tokens or tokens[-1] not in NOUNS:
        return None
    noun, rest = tokens[-1], tokens[:-1]
    num = adj = None
    if rest and rest[0] in NUMBERS:
        if len(rest) < 2 or rest[1] != NOUNS[noun][2]:
            return None
        num, rest = rest[0], rest[2:]
    if rest:
        if rest[-1] == "的":
            rest = rest[:-1]
        if len(rest) != 1 or rest[0] not in ADJECTIVES:
            return None
        adj = rest[0]
    np_ = (noun, adj, num)
    return np_ if _np_zh(np_) == tokens else None


def _parse_zh(tokens: list[str]) -> Spec | None:
    time = tokens[0] if tokens and tokens[0] in TIME_WORDS else None
    body = tokens[1:] if time else tokens
    verb_idx = [i for i, t in enumerate(body) if t in VERBS]
    if len(verb_idx) != 1:
        return None
    v = verb_idx[0]
    for negative in (False, True):
        tense = TIME_WORDS[time][1] if time else "present"
        vz = _verb_zh(body[v], tense, negative)
        start = v - vz.index(body[v])
        if start < 0 or body[start : start + len(vz)] != vz:
            continue
        subj, obj = _parse_np(body[:start]), _parse_np(body[start + len(vz) :])
        if subj and obj:
            spec = (time, negative, subj, body[v], obj)
            if translate_spec(spec)[0].split() == tokens:
                return spec
    return None


# ---- 分词 -----------------------------------------------------------------------------
_ZH_WORDS = sorted(LEXICON, key=len, reverse=True)


def tokenize_zh(text: str) -> list[str]:
    """中文分词：先按空格切成若干段，每段再按词典最长匹配切词（未知字符单独成词）。

    所以带空格、不带空格、只带一部分空格的写法切出同样的词：

    >>> tokenize_zh("人工智能 改变 世界")
    ['人工智能', '改变', '世界']
    >>> tokenize_zh("狗咬人")
    ['狗', '咬', '人']
    >>> tokenize_zh("狗 咬人")
    ['狗', '咬', '人']

    一段里如果一个词典词都没有（如合成任务的 ``"w12"``、英文单词），整段保留为一个词元，不拆成单个字符。
    """
    if not isinstance(text, str):
        raise TypeError(f"text 应是 str，收到 {type(text).__name__}")
    out: list[str] = []
    for chunk in text.split():
        out += _segment(chunk)
    return out


def _segment(text: str) -> list[str]:
    """一段没有空格的文字按词典最长匹配切词；整段没有一个词典词时原样返回。"""
    if text in LEXICON:
        return [text]
    out: list[str] = []
    found = False
    i = 0
    while i < len(text):
        for w in _ZH_WORDS:
            if text.startswith(w, i):
                out.append(w)
                i += len(w)
                found = True
                break
        else:
            out.append(text[i])
            i += 1
    return out if found else [text]


def tokenize_en(text: str) -> list[str]:
    """英文分词：小写后按空格切。"""
    if not isinstance(text, str):
        raise TypeError(f"text 应是 str，收到 {type(text).__name__}")
    return text.lower().split()


def detokenize(tokens: list[str]) -> str:
    """词元列表 → 以空格连接的字符串（本语料中英文都用空格分词）。"""
    return " ".join(tokens)
