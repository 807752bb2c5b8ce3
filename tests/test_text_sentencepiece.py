"""SentencePiece 的 BPE（带字节回退）：特殊词元的 id、往返无损、罕见字退回到 UTF-8 字节而不是 UNK、
词表下限与 SentencePiece 自己的检查一致、同样的文本训练出同样的模型、存取、坏输入点名。"""

import collections

import pytest

from tformer_lib.data.poems import poem_texts
from tformer_lib.specials import BOS, EOS, SPECIAL_TOKENS, UNK
from tformer_lib.text import CharTokenizer, SentencePieceBPETokenizer, compression_table, fallback_rate, min_vocab_size, unk_rate

TRAIN = poem_texts("train")[:3000]
VALID = poem_texts("valid")[:400]


@pytest.fixture(scope="module")
def spm():
    return SentencePieceBPETokenizer.train(TRAIN, 4000)


def test_specials_vocab_and_lossless_round_trip(spm):
    assert spm.vocab_size == 4000
    assert [spm.token_text(i) for i in range(4)] == list(SPECIAL_TOKENS)
    assert sum(spm.is_byte(i) for i in range(spm.vocab_size)) == 256
    for text in VALID:
        ids = spm.encode(text, add_bos=True, add_eos=True)
        assert ids[0] == BOS and ids[-1] == EOS and UNK not in ids
        assert spm.decode(ids) == text
    assert spm.encode_batch(VALID[:5]) == [spm.encode(t) for t in VALID[:5]]


@pytest.mark.parametrize("rare", ["𠀀", "😀", "齉", "a<eos>b"])
def test_unseen_characters_fall_back_to_their_utf8_bytes(spm, rare):
    text = "白日依山尽" + rare
    ids = spm.encode(text)
    assert UNK not in ids and spm.decode(ids) == text
    unseen = [ch for ch in rare if ch not in "".join(TRAIN)]
    byte_ids = [i for i in ids if spm.is_byte(i)]
    assert len(byte_ids) == sum(len(ch.encode("utf-8")) for ch in unseen)  # 每个没见过的字 = 它的 UTF-8 字节
    assert [int(spm.token_text(i)[3:5], 16) for i in byte_ids] == list(b"".join(ch.encode() for ch in unseen))


def test_fallback_and_unk_rates_count_what_they_say(spm):
    # 独立地数：单独编码每个字，只由字节词元组成的字就是退回到字节的字
    counts = collections.Counter("".join(VALID))
    fell_back = sum(n for ch, n in counts.items() if all(spm.is_byte(i) for i in spm.encode(ch)))
    assert fallback_rate(spm, VALID) == pytest.approx(fell_back / sum(counts.values()))
    assert 0 < fell_back  # 验证诗里确有训练时覆盖不到的字
    assert unk_rate(spm, VALID) == 0.0
    chars = CharTokenizer.build(TRAIN)
    unknown = sum(n for ch, n in counts.items() if chars.encode(ch, on_unknown="ignore") == [UNK])
    assert unk_rate(chars, VALID) == pytest.approx(unknown / sum(counts.values())) and unknown > 0


def test_vocab_floor_matches_sentencepiece_and_is_named():
    floor = min_vocab_size(TRAIN, 0.98)
    assert SentencePieceBPETokenizer.train(TRAIN, floor, 0.98).vocab_size == floor
    with pytest.raises(ValueError, match=f"vocab_size={floor - 1}.*{floor}"):
        SentencePieceBPETokenizer.train(TRAIN, floor - 1, 0.98)
    assert min_vocab_size(TRAIN, 0.995) > floor  # 覆盖率越高，要进词表的字越多


def test_same_texts_same_model_and_save_load(spm, tmp_path):
    again = SentencePieceBPETokenizer.train(TRAIN, 4000)
    assert again.model_proto == spm.model_proto
    path = spm.save(tmp_path / "spm.json")
    loaded = SentencePieceBPETokenizer.load(path)
    assert [loaded.encode(t) for t in VALID[:20]] == [spm.encode(t) for t in VALID[:20]]
    CharTokenizer.build(TRAIN).save(tmp_path / "char.json")
    with pytest.raises(ValueError, match="sentencepiece_bpe"):
        SentencePieceBPETokenizer.load(tmp_path / "char.json")


def test_bad_arguments_are_named(spm):
    with pytest.raises(TypeError, match="vocab_size"):
        SentencePieceBPETokenizer.train(TRAIN, "4000")
    with pytest.raises(ValueError, match="character_coverage"):
        SentencePieceBPETokenizer.train(TRAIN, 4000, 0.9)
    with pytest.raises(TypeError, match="texts"):
        SentencePieceBPETokenizer.train("白日依山尽", 4000)
    with pytest.raises(TypeError, match="text"):
        spm.encode(b"abc")
    with pytest.raises(ValueError, match="id=4000"):
        spm.decode([4000])
    with pytest.raises(TypeError, match="model_proto"):
        SentencePieceBPETokenizer("not bytes")


def test_compression_table_adds_sentencepiece_rows():
    rows = compression_table(TRAIN, VALID, [1000], sentencepiece_sizes=[4000])
    assert [r["tokenizer"] for r in rows] == ["字符", "字节级 BPE", "SentencePiece BPE"]
    char, byte_bpe, spm_row = rows
    assert char["tokens_per_char"] == 1.0 and char["unk_rate"] > 0 and char["fallback_rate"] is None
    assert byte_bpe["unk_rate"] == 0.0 and spm_row["unk_rate"] == 0.0
    assert 0 < spm_row["fallback_rate"] < 0.05 and spm_row["vocab_size"] == 4000


def test_spaces_round_trip_even_when_training_text_has_none(spm):
    """SentencePiece 把空格记作 ▁；▁ 总在词表里，所以训练文本里没有空格也能无损往返（一个 ▁ 一个词元，不退回到字节）。"""
    for text in [" 白日", "a  b", "  ", "白日 依山\t尽\n"]:
        assert spm.decode(spm.encode(text)) == text
    assert not any(spm.is_byte(i) for i in spm.encode(" "))
    spaced = SentencePieceBPETokenizer.train([t[:5] + " " + t[5:] for t in TRAIN], 4000)
    assert all(spaced.decode(spaced.encode(t)) == t for t in VALID[:50] + ["a  b", " 白"])
    assert spaced.decode(spaced.encode("白\u2581日")) == "白 日"  # SentencePiece 的约定：文本里原有的 ▁ 解码成空格
    assert fallback_rate(spaced, ["白 日"]) == 0.0  # 空格按 ▁ 查词表，不算退回字节


def test_long_texts_are_trained_on_not_dropped():
    """长于 4192 字节的文本也参加训练（SentencePiece 默认悄悄丢掉它们）。"""
    long_text = "".join(TRAIN[:40])
    assert len(long_text.encode()) > 4192
    tok = SentencePieceBPETokenizer.train([long_text] + TRAIN[:300], min_vocab_size([long_text] + TRAIN[:300], 1.0),
                                          character_coverage=1.0)
    assert fallback_rate(tok, [long_text]) == 0.0  # 覆盖率 1：长文本里的每个字都进了词表


def test_defaults_agree_and_bad_files_are_named(tmp_path):
    assert SentencePieceBPETokenizer.train(TRAIN, min_vocab_size(TRAIN)).vocab_size == min_vocab_size(TRAIN)
    bad = tmp_path / "bad.json"
    bad.write_text('{"kind": "sentencepiece_bpe", "specials": ["<pad>", "<bos>", "<eos>", "<unk>"], "model_proto": "QUJD"}')
    with pytest.raises(ValueError, match="bad.json"):
        SentencePieceBPETokenizer.load(bad)
    bad.write_text("not json")
    with pytest.raises(ValueError, match="bad.json"):
        SentencePieceBPETokenizer.load(bad)
    with pytest.raises(ValueError, match="model_proto"):
        SentencePieceBPETokenizer(b"")
    with pytest.raises(ValueError, match="vocab_size"):
        SentencePieceBPETokenizer.train(TRAIN, 2**31)


def test_rates_and_table_refuse_wrong_arguments(spm):
    with pytest.raises(TypeError, match="encode"):
        spm.encode_batch("白日")
    with pytest.raises(TypeError, match="SentencePieceBPETokenizer"):
        fallback_rate(CharTokenizer.build(TRAIN), VALID)
    with pytest.raises(TypeError, match="tokenizer"):
        unk_rate(None, VALID)
    with pytest.raises(TypeError, match="sentencepiece_sizes"):
        compression_table(TRAIN, VALID, [], sentencepiece_sizes="4000")
