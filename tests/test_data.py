"""词表、合成任务、玩具中→英语料与批处理的测试。"""

import pytest
import torch

from tformer_lib.data import (
    Vocab,
    batch_iterator,
    encode_pairs,
    make_batch,
    make_copy_task,
    make_reverse_task,
    make_synthetic_splits,
    make_toy_corpus,
    mirror_sentence,
    num_batches,
    synthetic_vocab,
    tokenize_en,
    tokenize_zh,
)
from tformer_lib.specials import BOS, EOS, PAD, SPECIAL_TOKENS, UNK


# ---- Vocab --------------------------------------------------------------------------------
def test_vocab_specials_and_roundtrip():
    v = Vocab(["狗", "咬", "人"])
    assert len(v) == 7
    assert [v[s] for s in SPECIAL_TOKENS] == [PAD, BOS, EOS, UNK]
    ids = v.encode(["狗", "咬", "人"], add_bos=True, add_eos=True)
    assert ids[0] == BOS and ids[-1] == EOS
    assert v.decode(ids) == ["狗", "咬", "人"]
    assert v.decode(torch.tensor(ids + [PAD, PAD])) == ["狗", "咬", "人"]


def test_vocab_unknown_maps_to_unk_and_decode_stops_at_eos():
    v = Vocab(["a", "b"])
    assert v.encode(["a", "zzz"]) == [4, UNK]
    assert v["zzz"] == UNK and "zzz" not in v
    assert v.decode([4, EOS, 5]) == ["a"]
    assert v.decode([4, EOS, 5], stop_at_eos=False) == ["a", "b"]
    assert v.decode([4, UNK]) == ["a", "<unk>"]


def test_vocab_build_is_deterministic_and_respects_min_freq():
    seqs = [["b", "a", "c"], ["a", "b"], ["a"]]
    v = Vocab.build(seqs)
    assert v.itos[4:] == ["a", "b", "c"]  # 频次降序，同频按字典序
    assert Vocab.build(seqs, min_freq=2).itos[4:] == ["a", "b"]
    assert Vocab.build(list(reversed(seqs))) == v


def test_vocab_dict_roundtrip_is_plain():
    v = Vocab.build([["人工智能", "改变", "世界"]])
    d = v.to_dict()
    assert all(isinstance(t, str) for t in d["tokens"])
    assert Vocab.from_dict(d) == v


def test_vocab_errors():
    with pytest.raises(ValueError, match="重复"):
        Vocab(["a", "a"])
    with pytest.raises(ValueError, match="<pad>"):
        Vocab(["<pad>"])
    with pytest.raises(TypeError, match="tokens"):
        Vocab(["a"]).encode("a b")
    with pytest.raises(TypeError, match="分词"):
        Vocab.build(["a b"])
    with pytest.raises(ValueError, match="index=99"):
        Vocab(["a"]).token(99)
    with pytest.raises(ValueError, match="min_freq"):
        Vocab.build([["a"]], min_freq=0)
    with pytest.raises(ValueError, match="tokens"):
        Vocab.from_dict({"x": 1})


# ---- synthetic ----------------------------------------------------------------------------
def test_copy_and_reverse_tasks():
    copy = make_copy_task(50, n_symbols=5, min_len=2, max_len=6, seed=1)
    assert len(copy) == 50 and all(x == y for x, y in copy)
    assert all(2 <= len(x) <= 6 and set(x) <= set("01234") for x, _ in copy)
    assert copy == make_copy_task(50, n_symbols=5, min_len=2, max_len=6, seed=1)
    rev = make_reverse_task(20, seed=3)
    assert all(y == x[::-1] for x, y in rev)
    v = synthetic_vocab(10)
    assert len(v) == 14 and v.encode(["0", "9"]) == [4, 13]


def test_synthetic_splits_are_disjoint():
    s = make_synthetic_splits("reverse", n_train=500, n_test=100, seed=0)
    test_inputs = {tuple(x) for x, _ in s["test"]}
    assert len(test_inputs) == 100
    assert not test_inputs & {tuple(x) for x, _ in s["train"]}
    assert all(y == x[::-1] for x, y in s["train"])
    with pytest.raises(ValueError, match="task"):
        make_synthetic_splits("sort")
    with pytest.raises(ValueError, match="min_len"):
        make_copy_task(3, min_len=5, max_len=2)


# ---- toy zh→en ----------------------------------------------------------------------------
@pytest.fixture(scope="module")
def corpus():
    return make_toy_corpus()


def test_toy_corpus_size_and_disjoint_splits(corpus):
    train, valid, test = ({z for z, _ in split} for split in (corpus.train, corpus.valid, corpus.test))
    assert not (train & valid) and not (train & test) and not (valid & test)  # 没有一句跨划分
    assert len(valid) == len(corpus.valid) and len(test) == len(corpus.test)
    pairs = set(corpus.train + corpus.valid + corpus.test)
    assert len(pairs) >= 5000  # 不同句对的个数
    # 训练集里唯一的重复是被刻意重复的光杆名词
    from collections import Counter

    from tformer_lib.data.toy_zh_en import BARE_NOUN_REPEATS, NOUNS

    repeated = {z: n for z, n in Counter(z for z, _ in corpus.train).items() if n > 1}
    assert repeated == {noun: BARE_NOUN_REPEATS for noun in NOUNS}


def test_toy_corpus_is_deterministic(corpus):
    again = make_toy_corpus()
    assert again.train == corpus.train and again.test == corpus.test and again.valid == corpus.valid
    assert make_toy_corpus(seed=1).test != corpus.test


def test_toy_test_split_is_order_swapped_mirrors_of_training(corpus):
    train_zh = {z for z, _ in corpus.train}
    for z, _ in corpus.test + corpus.valid:
        m = mirror_sentence(z)
        assert m is not None and m != z and m in train_zh


def test_toy_anchor_examples(corpus):
    train, test = dict(corpus.train), dict(corpus.test)
    assert train["狗 咬 人"] == "the dog bites the person"
    assert test["人 咬 狗"] == "the person bites the dog"
    assert train["人工智能 改变 世界"] == "artificial intelligence changes the world"
    assert train["人工智能"] == "artificial intelligence"
    assert train["两 只 大 狗"] == "two big dogs" and train["狗"] == "the dog"


def test_toy_train_holds_every_noun_phrase_alone():
    from tformer_lib.data.toy_zh_en import all_noun_phrases, translate_np

    phrases = [translate_np(np_) for np_ in all_noun_phrases()]
    assert len(phrases) == len(set(phrases)) == 482
    assert set(phrases) <= set(make_toy_corpus().train)


def test_toy_grammar_phenomena(corpus):
    en = " ".join(e for _, e in corpus.train)
    zh = " ".join(z for z, _ in corpus.train)
    for word in ("yesterday", "tomorrow", "today", "did not", "does not", "will not", "do not", "two", "big", "smart"):
        assert f" {word} " in f" {en} ", word
    for word in ("的", "没有", "不", "会", "了", "两"):
        assert f" {word} " in f" {zh} ", word
    d = dict(corpus.train + corpus.valid + corpus.test)
    # 一致性：复数主语不用第三人称单数
    for z, e in d.items():
        if e.startswith(("two ", "three ", "four ", "five ")):
            assert " does not " not in e


def test_tokenizers():
    assert tokenize_zh("人工智能 改变 世界") == ["人工智能", "改变", "世界"]
    assert tokenize_zh("人工智能改变世界") == ["人工智能", "改变", "世界"]
    assert tokenize_zh("昨天两只聪明的狗没有咬老师") == "昨天 两 只 聪明 的 狗 没有 咬 老师".split()
    assert tokenize_zh("狗咬X") == ["狗", "咬", "X"]
    assert tokenize_en("The Dog bites") == ["the", "dog", "bites"]
    with pytest.raises(TypeError, match="text"):
        tokenize_zh(3)


def test_mirror_sentence():
    assert mirror_sentence("狗 咬 人") == "人 咬 狗"
    assert mirror_sentence("昨天 两 只 狗 咬 了 老师") == "昨天 老师 咬 了 两 只 狗"
    assert mirror_sentence("明天 聪明 的 学生 不 会 帮助 猫") == "明天 猫 不 会 帮助 聪明 的 学生"
    assert mirror_sentence("狗 狗 狗") is None


# ---- batching -----------------------------------------------------------------------------
def test_make_batch_shapes_shift_and_masks():
    src_v = Vocab(["狗", "咬", "人"])
    tgt_v = Vocab(["the", "dog", "bites", "person"])
    pairs = encode_pairs([("狗 咬 人", "the dog bites the person"), ("狗", "the dog")], src_v, tgt_v)
    b = make_batch(pairs)
    assert b.src.shape == (2, 3) and b.tgt_in.shape == (2, 6) and b.tgt_out.shape == (2, 6)
    assert b.src[1].tolist() == [4, PAD, PAD]
    assert b.tgt_in[:, 0].tolist() == [BOS, BOS]
    assert b.tgt_out[0, -1].item() == EOS and b.tgt_out[1].tolist()[:3] == [4, 5, EOS]
    assert torch.equal(b.tgt_in[0, 1:], b.tgt_out[0, :-1])  # 错开一位
    assert b.n_tokens == 6 + 3
    assert b.src_mask.shape == (2, 1, 1, 3) and b.src_mask.dtype == torch.bool
    assert b.src_mask[1, 0, 0].tolist() == [True, False, False]
    assert b.tgt_mask.shape == (2, 1, 6, 6)
    assert not b.tgt_mask[0, 0, 0, 1]  # 因果：不能看未来
    assert not b.tgt_mask[1, 0, 5, 4] and b.tgt_mask[1, 0, 5, 2]  # 填充位不可见
    assert len(b) == 2 and b.to("cpu").src is not None


def test_batch_iterator_pads_per_batch_and_shuffles_deterministically():
    data = [([4] * n, [5] * n) for n in range(1, 11)]
    batches = list(batch_iterator(data, 4))
    assert [len(b) for b in batches] == [4, 4, 2] == [4, 4, 2][: num_batches(10, 4)]
    assert batches[0].src.shape == (4, 4)  # 只补齐到本批最长
    a = [b.src.tolist() for b in batch_iterator(data, 3, shuffle=True, seed=7)]
    b = [b.src.tolist() for b in batch_iterator(data, 3, shuffle=True, seed=7)]
    c = [b.src.tolist() for b in batch_iterator(data, 3, shuffle=True, seed=8)]
    assert a == b and a != c
    assert len(list(batch_iterator(data, 4, drop_last=True))) == 2 == num_batches(10, 4, drop_last=True)
    with pytest.raises(ValueError, match="batch_size"):
        list(batch_iterator(data, 0))
    with pytest.raises(ValueError, match="源句为空"):
        make_batch([([], [4])])


def test_spaced_unspaced_and_half_spaced_input_segment_alike():
    """每个语料句的三种写法（全带空格、全不带、随机去掉一半空格）切出同样的词；没有词典词的段保持整段。"""
    import random

    from tformer_lib.data import make_toy_corpus, tokenize_zh

    corpus = make_toy_corpus()
    rng = random.Random(0)
    for zh, _ in corpus.train[:1500] + corpus.valid + corpus.test:
        words = zh.split()
        half = "".join(w + (" " if rng.random() < 0.5 else "") for w in words)
        assert tokenize_zh(zh) == tokenize_zh("".join(words)) == tokenize_zh(half) == words, half
    assert tokenize_zh("狗 咬人") == tokenize_zh("狗咬人") == tokenize_zh("狗 咬 人") == ["狗", "咬", "人"]
    assert tokenize_zh("  人工智能改变 世界 ") == ["人工智能", "改变", "世界"]
    assert tokenize_zh("w1 w22") == ["w1", "w22"]  # 不是词典词：整段保留
    assert tokenize_zh("狗咬人。") == ["狗", "咬", "人", "。"]
