"""分词器：字符级词表在真实唐诗上的往返、确定性、存取与坏输入。"""

import random

import numpy as np
import pytest
import torch

from tformer_lib.data.poems import poem_texts
from tformer_lib.specials import BOS, EOS, PAD, UNK
from tformer_lib.text import CharTokenizer


@pytest.fixture(scope="module")
def train_texts():
    return poem_texts("train")


@pytest.fixture(scope="module")
def char_tok(train_texts):
    return CharTokenizer.build(train_texts)


# ---- 字符级 -------------------------------------------------------------------------------
def test_char_vocab_is_the_train_characters_plus_specials(char_tok, train_texts):
    distinct = {c for t in train_texts for c in t}
    assert char_tok.vocab_size == 4 + len(distinct)
    assert [char_tok.id_to_token(i) for i in (PAD, BOS, EOS, UNK)] == ["<pad>", "<bos>", "<eos>", "<unk>"]
    # 最常见的是两个标点（每句一个），然后是最常见的字
    assert {char_tok.id_to_token(4), char_tok.id_to_token(5)} == {"，", "。"}


def test_char_round_trip_on_every_train_poem(char_tok, train_texts):
    for text in train_texts:
        ids = char_tok.encode(text)
        assert len(ids) == len(text) and UNK not in ids
        assert char_tok.decode(ids) == text


def test_char_unknown_characters_in_held_out_poems(char_tok):
    valid = poem_texts("valid")
    unknown = sum(char_tok.count_unknown(t) for t in valid)
    assert 0 < unknown < 0.001 * sum(map(len, valid))  # 少见但存在
    text = next(t for t in valid if char_tok.count_unknown(t))
    decoded = char_tok.decode(char_tok.encode(text, on_unknown="ignore"))  # 留出诗里的生僻字：有意编码成 UNK
    assert "<unk>" in decoded and decoded.replace("<unk>", "") == "".join(c for c in text if c in char_tok._stoi)


def test_char_specials_and_id_types(char_tok):
    ids = char_tok.encode("白日依山尽", add_bos=True, add_eos=True)
    assert ids[0] == BOS and ids[-1] == EOS
    assert char_tok.decode(ids + char_tok.encode("黄河")) == "白日依山尽"  # 遇 EOS 停
    assert char_tok.decode(ids + char_tok.encode("黄河"), stop_at_eos=False) == "白日依山尽黄河"
    assert char_tok.decode([PAD, PAD] + ids[1:]) == "白日依山尽"
    assert char_tok.decode(torch.tensor(ids)) == char_tok.decode(np.array(ids)) == "白日依山尽"


def test_char_vocab_is_deterministic_and_order_free(char_tok, train_texts):
    shuffled = list(train_texts[:3000])
    random.Random(0).shuffle(shuffled)
    assert CharTokenizer.build(shuffled) == CharTokenizer.build(train_texts[:3000])
    assert CharTokenizer.build(train_texts) == char_tok


def test_char_min_freq(train_texts):
    small = CharTokenizer.build(train_texts, min_freq=50)
    assert small.vocab_size < 4 + len({c for t in train_texts for c in t})
    assert UNK in small.encode("".join(train_texts[:200]), on_unknown="ignore")


def test_char_save_load_plain_data(char_tok, tmp_path):
    data = char_tok.to_dict()
    assert set(map(type, data["tokens"])) == {str}
    path = char_tok.save(tmp_path / "sub" / "char.json")
    assert CharTokenizer.load(path) == char_tok
    assert CharTokenizer.from_dict(data) == char_tok


@pytest.mark.parametrize(
    "call, error, match",
    [
        (lambda t: t.encode(["白", "日"]), TypeError, "text 应是字符串"),
        (lambda t: t.encode("白日".encode()), TypeError, "decode"),
        (lambda t: t.encode(None), TypeError, "text"),
        (lambda t: t.decode("白日"), TypeError, "encode"),
        (lambda t: t.decode([1.5]), TypeError, "整数"),
        (lambda t: t.decode([True]), TypeError, "整数"),
        (lambda t: t.decode([10**6]), ValueError, "超出词表范围"),
        (lambda t: t.decode([-1]), ValueError, "超出词表范围"),
        (lambda t: CharTokenizer.build("白日依山尽"), TypeError, "列表"),
        (lambda t: CharTokenizer.build([]), ValueError, "没有任何文本"),
        (lambda t: CharTokenizer.build(["白日", 3]), TypeError, r"texts\[1\]"),
        (lambda t: CharTokenizer.build(["白日"], min_freq=0), ValueError, "min_freq"),
        (lambda t: CharTokenizer(["白日"]), ValueError, "单个字符"),
        (lambda t: CharTokenizer(["白", "白"]), ValueError, "重复"),
        (lambda t: CharTokenizer.from_dict({"kind": "bpe"}), ValueError, "CharTokenizer"),
    ],
)
def test_char_bad_inputs(char_tok, call, error, match):
    with pytest.raises(error, match=match):
        call(char_tok)


def test_char_load_refuses_other_files(tmp_path):
    path = tmp_path / "x.json"
    path.write_text('{"kind": "bpe", "specials": ["<pad>", "<bos>", "<eos>", "<unk>"]}', encoding="utf-8")
    with pytest.raises(ValueError, match="不是 char 分词器"):
        CharTokenizer.load(path)


# ---- 字节级 BPE：教学版与 tokenizers 版 ---------------------------------------------------------
from tformer_lib.text import (  # noqa: E402
    TOKEN_KINDS,
    BPETokenizer,
    FastBPETokenizer,
    compression_table,
    describe_merges,
    merge_kind_counts,
    pretokenize,
    tokens_of,
    tokens_per_char,
    train_bpe,
    utf8_bytes,
)
from tformer_lib.text.bpe import BYTE_OFFSET, FIRST_MERGE_ID, _merge  # noqa: E402

VOCAB = 1500
ODD_TEXTS = ["", "a", "Hello, world!  \n\tx", "混合 text 与 123，还有emoji🙂。", "\u3000全角空格", "'s 're don't", "𠀀𪚥"]


@pytest.fixture(scope="module")
def subset(train_texts):
    return train_texts[:2000]


@pytest.fixture(scope="module")
def ours(subset):
    return train_bpe(subset, VOCAB)


@pytest.fixture(scope="module")
def fast(subset):
    return FastBPETokenizer.train(subset, VOCAB)


def test_bpe_vocab_layout(ours, fast):
    assert ours.vocab_size == fast.vocab_size == VOCAB
    assert [ours.token_text(i) for i in range(4)] == [fast.token_text(i) for i in range(4)] == list(
        ("<pad>", "<bos>", "<eos>", "<unk>"))
    assert ours.token_bytes[BYTE_OFFSET + 0xE6] == b"\xe6"
    assert len(set(ours.token_bytes[BYTE_OFFSET:])) == VOCAB - BYTE_OFFSET  # 每个词元的字节串都不同


@pytest.mark.slow
def test_bpe_round_trip_on_every_poem(ours, fast):
    for text in poem_texts("valid"):  # 教学版：留出的一个划分里的每一首
        assert ours.decode(ours.encode(text), errors="strict") == text
    for split in ("train", "valid", "test"):  # tokenizers 版：全部 35 千首
        texts = poem_texts(split)
        for text, ids in zip(texts, fast.encode_batch(texts)):
            assert fast.decode(ids) == text
    for text in ODD_TEXTS:  # 字节级：任何字符串都能往返，没有 UNK
        assert ours.decode(ours.encode(text), errors="strict") == text
        assert fast.decode(fast.encode(text)) == text
        assert 3 not in ours.encode(text)


def test_bpe_compression_matches_tokenizers_within_2_percent(ours, fast):
    valid = poem_texts("valid")
    a, b = tokens_per_char(ours, valid), tokens_per_char(fast, valid)
    assert abs(a / b - 1) < 0.02, (a, b)
    # 同样的文本、同样的设置，两边学到的词元（按字节串比）几乎是同一批
    fast_vocab = {fast.tokenizer.decode([i]).encode() for i in range(FIRST_MERGE_ID, VOCAB)}
    ours_whole = {b for b in ours.token_bytes[FIRST_MERGE_ID:] if b.decode("utf-8", "replace").encode() == b}
    assert len(ours_whole & fast_vocab) > 0.95 * len(ours_whole)


def test_bpe_training_is_deterministic_and_prefix_consistent(subset):
    small = subset[:300]
    a = train_bpe(small, 700)
    assert a == train_bpe(list(small), 700)
    # 学到的规则是按先后排的：前 k 条就是 vocab_size = 260 + k 时会学到的规则
    assert train_bpe(small, 500).merges == a.merges[:240]
    f1, f2 = FastBPETokenizer.train(small, 700), FastBPETokenizer.train(small, 700)
    assert f1.tokenizer.to_str() == f2.tokenizer.to_str()


def test_bpe_encode_equals_applying_the_merges_in_order(ours, subset):
    for text in subset[:50]:
        ids = []
        for chunk in pretokenize(text):
            word = [BYTE_OFFSET + b for b in chunk.encode()]
            for k, pair in enumerate(ours.merges):
                word = _merge(word, pair, FIRST_MERGE_ID + k)
            ids.extend(word)
        assert ours.encode(text) == ids


def test_pretokenize_keeps_lines_and_punctuation_apart():
    assert pretokenize("白日依山尽，黄河入海流。") == ["白日依山尽", "，", "黄河入海流", "。"]
    assert "".join(pretokenize(ODD_TEXTS[3])) == ODD_TEXTS[3]


def test_bpe_specials_and_partial_characters(ours, fast):
    for tok in (ours, fast):
        ids = tok.encode("白日", add_bos=True, add_eos=True)
        assert ids[0] == BOS and ids[-1] == EOS
        assert tok.decode([PAD] + ids + tok.encode("黄河")) == "白日"
        assert tok.decode(ids + tok.encode("黄河"), stop_at_eos=False) == "白日黄河"
        assert tok.decode([UNK]) == "<unk>"
        assert tok.decode(torch.tensor(ids)) == tok.decode(np.array(ids, dtype=np.int64)) == "白日"
        literal = "白<eos>日<pad><unk><bos>"  # 文本里字面的特殊词元写法只是普通字符
        assert not set(tok.encode(literal)) & {PAD, BOS, EOS, UNK}
        assert tok.decode(tok.encode(literal)) == literal
    assert fast.encode_batch(["白<eos>日"]) == [fast.encode("白<eos>日")]
    half = [BYTE_OFFSET + b for b in "月".encode()[:2]]
    assert ours.decode(half) == "\ufffd"
    with pytest.raises(UnicodeDecodeError):
        ours.decode(half, errors="strict")


def test_bpe_save_load(ours, fast, tmp_path):
    assert BPETokenizer.load(ours.save(tmp_path / "ours.json")) == ours
    assert BPETokenizer.from_dict(ours.to_dict()) == ours
    again = FastBPETokenizer.load(fast.save(tmp_path / "fast.json"))
    text = poem_texts("test")[0]
    assert again.encode(text) == fast.encode(text) and again.vocab_size == VOCAB


@pytest.mark.parametrize(
    "call, error, match",
    [
        (lambda: train_bpe(["白日"], 259), ValueError, "vocab_size"),
        (lambda: train_bpe(["白日"], 300.0), ValueError, "vocab_size"),
        (lambda: train_bpe(["白日"], 300, min_frequency=0), ValueError, "min_frequency"),
        (lambda: train_bpe("白日依山尽", 300), TypeError, "列表"),
        (lambda: train_bpe([b"x"], 300), TypeError, r"texts\[0\]"),
        (lambda: FastBPETokenizer.train(["白日"], 10), ValueError, "vocab_size"),
        (lambda: FastBPETokenizer.train([""], 300), ValueError, "没有任何文本"),
        (lambda: FastBPETokenizer("not a tokenizer"), TypeError, "tokenizers.Tokenizer"),
        (lambda: BPETokenizer([(4, 300)]), ValueError, r"merges\[0\]"),
        (lambda: BPETokenizer.from_dict({"kind": "char", "tokens": []}), ValueError, "BPETokenizer"),
        (lambda: describe_merges(CharTokenizer(["白"])), TypeError, "BPETokenizer"),
    ],
)
def test_bpe_bad_inputs(call, error, match):
    with pytest.raises(error, match=match):
        call()


@pytest.mark.parametrize("which", ["ours", "fast"])
def test_bpe_bad_encode_decode(which, request):
    tok = request.getfixturevalue(which)
    with pytest.raises(TypeError, match="text 应是字符串"):
        tok.encode(["白"])
    with pytest.raises(ValueError, match="超出词表范围"):
        tok.decode([VOCAB])
    with pytest.raises(TypeError, match="整数"):
        tok.decode([2.0])


@pytest.mark.parametrize("which", ["ours", "fast"])
def test_bpe_unpaired_surrogate_is_a_clear_value_error(which, request):
    # 不成对的代理码位没有 UTF-8 字节：两个字节级 BPE 都报 ValueError，说出参数、位置与码位（不是 tokenizers 的 TypeError）
    tok = request.getfixturevalue(which)
    with pytest.raises(ValueError, match=r"text 的第 2 个字符（下标 1）'\\ud800'（U\+D800）是不成对的代理码位"):
        tok.encode("a\ud800b")
    with pytest.raises(ValueError, match=r"第 3 个字符（下标 2）'\\udfff'（U\+DFFF）"):
        tok.encode("白日\udfff")
    if which == "fast":
        with pytest.raises(ValueError, match=r"texts\[1\] 的第 1 个字符（下标 0）"):
            tok.encode_batch(["白日", "\udc00"])
    train = train_bpe if which == "ours" else FastBPETokenizer.train
    with pytest.raises(ValueError, match=r"texts\[0\] 的第 4 个字符（下标 3）'\\ud83d'"):
        train(["abc\ud83d", "def"], 300)
    assert tok.decode(tok.encode("a\U0001F600b")) == "a\U0001F600b"  # 成对的（真正的 emoji）照常往返


# ---- BPE 对中文字节做了什么 ----------------------------------------------------------------------
def test_merges_go_from_bytes_to_characters_to_words(ours):
    rows = describe_merges(ours)
    assert len(rows) == VOCAB - FIRST_MERGE_ID and rows[0].rank == 0 and rows[0].id == FIRST_MERGE_ID
    assert all(r.kind in TOKEN_KINDS for r in rows)
    first = [r.kind for r in rows[:20]]
    assert first.count("字节片段") > 10  # 最早的合并是把字节对并起来
    counts = merge_kind_counts(ours)
    assert [sum(c[k] for c in counts.values()) for k in range(len(rows))] == list(range(1, len(rows) + 1))
    assert counts["单字"][-1] > counts["多字词"][-1] > 0  # 词表 1500 时：主要是整字，也有多字词
    word = next(r for r in rows if r.kind == "多字词")
    assert ours.encode(word.token) == [word.id]


def test_tokens_of_and_utf8_bytes(ours):
    assert utf8_bytes("月") == [("月", "E6 9C 88")]
    pieces = tokens_of(ours, "白日依山尽，黄河入海流。")
    assert "".join(h for _, h in pieces).replace(" ", "") == "白日依山尽，黄河入海流。".encode().hex().upper()


def test_compression_table_rows(subset):
    rows = compression_table(subset[:500], poem_texts("valid")[:200], [300, 800])
    assert [r["tokenizer"] for r in rows] == ["字符", "字节级 BPE", "字节级 BPE"]
    assert rows[0]["tokens_per_char"] == 1.0
    assert rows[1]["tokens_per_char"] > rows[2]["tokens_per_char"] > 1.0  # 小词表的字节级 BPE 比逐字还长
    assert [r["vocab_size"] for r in rows[1:]] == [300, 800]


def test_docstring_examples_hold():
    import doctest

    import tformer_lib.data.poems
    import tformer_lib.text.bpe
    import tformer_lib.text.char
    import tformer_lib.text.explain

    for module in (tformer_lib.text.bpe, tformer_lib.text.char, tformer_lib.text.explain, tformer_lib.data.poems):
        assert doctest.testmod(module).failed == 0, module.__name__
