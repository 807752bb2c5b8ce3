"""词表外的字（emoji、CJK 扩展 B 的生僻字）：字符分词器的 encode、sample_poems 与 lm-generate 都与 translate 一样——
默认警告并列出这些字，on_unknown="error"（命令行 --strict）报错，词表内的文本什么也不说。"""

import warnings

import pytest
import torch

from tformer_lib.commands.cli import main
from tformer_lib.lm import LMConfig, make_lm, sample_poems
from tformer_lib.specials import UNK
from tformer_lib.text import CharTokenizer
from tformer_lib.unknown_tokens import UnknownTokenError, UnknownTokenWarning

EMOJI, RARE = "😀", "𠀀"  # U+1F600 与 U+20000（CJK 扩展 B 的第一个字）


@pytest.fixture(scope="module")
def tok():
    return CharTokenizer.build(["五绝《春晓》春眠不觉晓，处处闻啼鸟。", "七绝律言"])


def test_encode_warns_naming_the_characters_and_still_encodes_them_as_unk(tok):
    with pytest.warns(UnknownTokenWarning) as record:
        ids = tok.encode(f"春{EMOJI}晓{RARE}{EMOJI}")
    assert len(record) == 1
    message = str(record[0].message)
    assert f"['{EMOJI}', '{RARE}']" in message and "<unk>" in message and "on_unknown='error'" in message
    assert ids == [tok.token_to_id("春"), UNK, tok.token_to_id("晓"), UNK, UNK]


def test_encode_strict_raises_and_ignore_is_silent(tok):
    with pytest.raises(UnknownTokenError, match=f"词表外的字 \\['{RARE}'\\]") as info:
        tok.encode(f"春{RARE}", on_unknown="error")
    assert isinstance(info.value, ValueError)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # 任何警告都会变成异常
        assert tok.encode(f"春{RARE}", on_unknown="ignore")[1] == UNK
        assert tok.encode("春眠不觉晓", add_bos=True) == [1] + [tok.token_to_id(c) for c in "春眠不觉晓"]  # 词表内：不警告
    with pytest.raises(ValueError, match="on_unknown 应是"):
        tok.encode("春", on_unknown="strict")
    assert tok.unknown_chars(f"{EMOJI}春{EMOJI}{RARE}") == [EMOJI, RARE]


def test_sample_poems_warns_once_for_all_prompts_or_raises_before_generating(tok):
    torch.manual_seed(0)
    model = make_lm(LMConfig(tok.vocab_size, d_model=16, n_heads=2, n_layers=1, d_ff=32, max_len=24))
    prompts = [("五言绝句", f"春{EMOJI}", ""), ("五言绝句", "春晓", ""), ("七言绝句", "", RARE)]
    with pytest.warns(UnknownTokenWarning) as record:
        texts = sample_poems(model, tok, prompts, seed=0)
    assert len(record) == 1 and len(texts) == 3  # 一次警告，照常作诗
    message = str(record[0].message)
    assert f"['{EMOJI}', '{RARE}']" in message and "2/3 个提示" in message
    with pytest.raises(UnknownTokenError, match="prompts 里有词表外的字"):
        sample_poems(model, tok, prompts, seed=0, on_unknown="error")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert len(sample_poems(model, tok, prompts[1:2], seed=0)) == 1  # 词表内的提示：不警告
        assert sample_poems(model, tok, prompts, seed=0, on_unknown="ignore") == texts  # 只是不作声，诗不变


def test_lm_generate_warns_on_stderr_and_strict_exits_nonzero(capsys):
    assert main(["lm-generate", "--title", f"春{EMOJI}{RARE}", "--seed", "0"]) == 0
    captured = capsys.readouterr()
    warning = [line for line in captured.err.splitlines() if line.startswith("警告：")]
    assert len(warning) == 1 and f"['{EMOJI}', '{RARE}']" in warning[0] and "--strict" in warning[0], captured.err
    assert captured.out.strip()  # 照常作了诗

    assert main(["lm-generate", "--first", RARE, "--strict"]) == 1
    captured = capsys.readouterr()
    assert f"['{RARE}']" in captured.err and "去掉 --strict" in captured.err and not captured.out

    assert main(["lm-generate", "--title", "春晓", "--strict", "--seed", "0"]) == 0  # 词表内：不警告
    captured = capsys.readouterr()
    assert "警告" not in captured.err and captured.out.strip()
