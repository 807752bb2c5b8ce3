"""随库附带的唐诗语料：计数与清单一致、每首诗格式规整、划分互不重叠、sha256 核对真的起作用。"""

import gzip
import hashlib
import json
import re
import shutil

import pytest

from tformer_lib.data import poems as poems_mod
from tformer_lib.data.poems import FORMS, POEM_SPLITS, Poem, PoemDataError, load_poems, poem_texts, poems_manifest

HAN = re.compile(r"^[\u3400-\u4dbf\u4e00-\u9fff]+$")


@pytest.fixture(scope="module")
def splits():
    return {s: load_poems(s) for s in POEM_SPLITS}


def test_counts_match_the_manifest_and_the_docstring(splits):
    manifest = poems_manifest()
    for split, poems in splits.items():
        info = manifest["splits"][split]
        assert len(poems) == info["poems"]
        assert sum(len(line) for p in poems for line in p.lines) == info["characters"]
        assert len({c for p in poems for line in p.lines for c in line}) == info["distinct_characters"]
    # 模块文档里写的数是算出来的事实：与清单一致
    doc = poems_mod.__doc__.replace(",", "")
    for split in POEM_SPLITS:
        assert f"{split} {manifest['splits'][split]['poems']} 首" in doc
    assert f"{manifest['splits']['train']['characters']} 个汉字" in doc
    assert f"留下 {manifest['stats']['kept_poems']} 首" in doc
    assert f"{manifest['stats']['distinct_characters']} 个不同的字" in doc


def test_every_poem_is_a_regular_jueju_or_lushi(splits):
    for poems in splits.values():
        for p in poems:
            assert isinstance(p, Poem)
            assert len(p.lines) in (4, 8)
            assert {len(line) for line in p.lines} in ({5}, {7})
            assert all(HAN.match(line) for line in p.lines)
            assert p.form in FORMS.values()
            assert p.text.count("，") == p.text.count("。") == len(p.lines) // 2
            assert p.text.endswith("。")
            assert p.title.strip() and p.author.strip()


def test_splits_are_disjoint_and_without_duplicates(splits):
    texts = [p.text for poems in splits.values() for p in poems]
    assert len(texts) == len(set(texts))
    assert len(splits["train"]) > 10 * len(splits["valid"]) > 0


def test_simplified_characters():
    train = "".join(poem_texts("train"))
    # 繁体字在转换后不应再出现（这几个字的简体形式都很常见）
    for traditional in "風雲無來時":
        assert traditional not in train


def test_load_returns_fresh_lists():
    a = load_poems("valid")
    a.clear()
    assert len(load_poems("valid")) == poems_manifest()["splits"]["valid"]["poems"]


@pytest.mark.parametrize("bad, error", [("dev", ValueError), ("TRAIN", ValueError), (0, TypeError), (None, TypeError)])
def test_bad_split_names_the_choices(bad, error):
    with pytest.raises(error, match="split"):
        load_poems(bad)


def test_corrupted_file_is_refused(tmp_path, monkeypatch):
    data = tmp_path / "poems"
    shutil.copytree(poems_mod._data_dir(), data)
    raw = gzip.decompress((data / "valid.jsonl.gz").read_bytes()).replace("月".encode(), "日".encode(), 1)
    (data / "valid.jsonl.gz").write_bytes(gzip.compress(raw))
    monkeypatch.setattr(poems_mod, "_data_dir", lambda: data)
    poems_mod._load.cache_clear()
    try:
        with pytest.raises(PoemDataError, match="sha256"):
            load_poems("valid")
        (data / "test.jsonl.gz").write_bytes(b"not gzip")
        with pytest.raises(PoemDataError, match="读不出"):
            load_poems("test")
    finally:
        poems_mod._load.cache_clear()


def test_shipped_hashes_are_of_the_decompressed_text():
    manifest = poems_manifest()
    for split in POEM_SPLITS:
        raw = gzip.decompress(poems_mod._data_dir().joinpath(f"{split}.jsonl.gz").read_bytes())
        assert hashlib.sha256(raw).hexdigest() == manifest["splits"][split]["sha256"]
        first = json.loads(raw.decode("utf-8").splitlines()[0])
        assert sorted(first) == ["author", "lines", "title"]


def test_licence_ships_with_the_data():
    text = poems_mod._data_dir().joinpath("LICENSE").read_text(encoding="utf-8")
    assert "MIT" in text and "JackeyGao" in text
