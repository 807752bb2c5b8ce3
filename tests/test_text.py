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
    decoded = char_tok.decode(char_tok.encode(text))
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
    assert UNK in small.encode("".join(train_texts[:200]))


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
