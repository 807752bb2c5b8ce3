"""与 Hugging Face 互通：``load_hf`` 读 transformers 写的目录、``save_hf`` 写 transformers 读得回的目录。

每个家族（llama：GQA、不共享；qwen2：q/k/v 偏置、共享；mistral：GQA、窗口不短于上下文；gpt2）都用
transformers 按配置建一个随机小模型（不连任何模型仓库），偏置与归一化的 γ/β 也随机化（否则全 0/全 1，
对应错了也看不出来），``save_pretrained`` 后由 ``load_hf`` 读：带填充的 logits 误差 < 1e-5、贪心生成 32 个词元
与 ``generate`` 相同、带缓存与不带缓存相同；save_hf → transformers → save_pretrained → load_hf 的张量逐位相同。
运行 ``pytest tests/test_lm_hf.py -s`` 会打印每个家族实测的最大 |Δlogit|。
"""

import json
import shutil

import pytest
import torch

from tformer_lib.lm import LMConfig, UnsupportedHFConfig, generate, load_hf, load_poem_model, make_lm, save_hf
from tformer_lib.text import CharTokenizer

transformers = pytest.importorskip("transformers")
transformers.logging.set_verbosity_error()
transformers.utils.logging.disable_progress_bar()

V, CONTEXT = 96, 64
SMALL = dict(vocab_size=V, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
             max_position_embeddings=CONTEXT, bos_token_id=1, eos_token_id=2, pad_token_id=0)
FAMILIES = {
    "llama": lambda: transformers.LlamaConfig(**SMALL, num_key_value_heads=2, tie_word_embeddings=False,
                                              rms_norm_eps=1e-6, rope_theta=500000.0),
    "qwen2": lambda: transformers.Qwen2Config(**SMALL, num_key_value_heads=4, tie_word_embeddings=True),
    "mistral": lambda: transformers.MistralConfig(**SMALL, num_key_value_heads=1, sliding_window=CONTEXT,
                                                  tie_word_embeddings=False),
    "gpt2": lambda: transformers.GPT2Config(vocab_size=V, n_embd=32, n_layer=2, n_head=4, n_positions=CONTEXT,
                                            bos_token_id=1, eos_token_id=2, layer_norm_epsilon=1e-5),
}


@torch.no_grad()
def randomize(model, seed=0):
    """把全部参数换成随机值：权重 N(0, 0.15²)，归一化的 γ ≈ 1 ± 0.2，偏置与 β ≈ ±0.1。"""
    g = torch.Generator().manual_seed(seed)
    for name, p in model.named_parameters():
        noise = torch.randn(p.shape, generator=g)
        if "norm" in name or ".ln_" in name:
            p.copy_(1 + 0.2 * noise if name.endswith("weight") else 0.1 * noise)
        elif name.endswith("bias"):
            p.copy_(0.1 * noise)
        else:
            p.copy_(0.15 * noise)
    return model


def hf_model(family):
    torch.manual_seed(0)
    return randomize(transformers.AutoModelForCausalLM.from_config(FAMILIES[family]()).eval())


@pytest.fixture(scope="module")
def hf_dirs(tmp_path_factory):
    """每个家族一个 save_pretrained 目录；llama 另存一份分片的（max_shard_size 很小）。"""
    root = tmp_path_factory.mktemp("hf")
    out = {}
    for family in FAMILIES:
        model = hf_model(family)
        model.save_pretrained(root / family)
        out[family] = (root / family, model)
    out["llama"][1].save_pretrained(root / "llama_sharded", max_shard_size="20KB")
    return out


def padded_batch(seed=1):
    """3 行、长度 12 的左填充批次：每行真实长度不同（12、7、3），位置从每行第一个真实词元数起。"""
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(3, V, (3, 12), generator=g)
    mask = torch.ones(3, 12, dtype=torch.long)
    mask[1, :5], mask[2, :9] = 0, 0
    tokens = tokens.masked_fill(mask == 0, 0)
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    return tokens, mask, positions


@pytest.mark.parametrize("family", list(FAMILIES))
def test_logits_with_padding_match_transformers(hf_dirs, family):
    path, theirs = hf_dirs[family]
    ours, tokenizer = load_hf(path)
    assert tokenizer is None  # 目录里没有 tokenizer.json
    tokens, mask, positions = padded_batch()
    with torch.no_grad():
        want = theirs(tokens, attention_mask=mask, position_ids=positions).logits
        got = ours(tokens, positions=positions, attn_mask=mask.bool()[:, None, None, :])
        full_want, full_got = theirs(tokens).logits, ours(tokens)
    real = mask.bool()
    diff = max((got - want)[real].abs().max().item(), (full_got - full_want).abs().max().item())
    print(f"\n{family}: max|Δlogit| = {diff:.2e}（logits 的量级 {want[real].abs().max().item():.2f}）")
    assert diff < 1e-5
    assert want[real].std() > 0.3  # 随机化过的模型：logits 不是几乎全 0


@pytest.mark.parametrize("family", list(FAMILIES))
def test_greedy_generation_and_cache_match_transformers(hf_dirs, family):
    path, theirs = hf_dirs[family]
    ours, _ = load_hf(path)
    prompt = torch.randint(3, V, (2, 5), generator=torch.Generator().manual_seed(2))
    theirs.generation_config.eos_token_id = None  # 两边都不提前停：恰好 32 个
    want = theirs.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=32, do_sample=False,
                           pad_token_id=0)[:, 5:]
    cached = generate(ours, prompt, 32, method="greedy", suppress_ids=())
    uncached = generate(ours, prompt, 32, method="greedy", suppress_ids=(), use_cache=False)
    assert want.shape == (2, 32)
    assert torch.equal(cached, want) and torch.equal(uncached, want)
    if family != "gpt2":  # 随机的 GPT-2 会一直重复同一个词元；有意义的 GPT-2 生成见随书模型那个测试
        assert len(set(want.flatten().tolist())) > 2, want  # 不是同一个词元重复到底
    # 带缓存逐个喂的 logits 也与一次算完相同
    seq = torch.cat([prompt, want], dim=1)
    cache = ours.new_cache()
    with torch.no_grad():
        steps = [ours(seq[:, :5], cache=cache)] + [ours(seq[:, i:i + 1], cache=cache) for i in range(5, seq.shape[1])]
        torch.testing.assert_close(torch.cat(steps, dim=1), ours(seq), rtol=0, atol=1e-5)


def test_sharded_checkpoint_loads_the_same_tensors(hf_dirs):
    sharded = hf_dirs["llama"][0].parent / "llama_sharded"
    assert (sharded / "model.safetensors.index.json").is_file() and not (sharded / "model.safetensors").exists()
    assert len(set(json.loads((sharded / "model.safetensors.index.json").read_text())["weight_map"].values())) > 1
    whole, parts = load_hf(hf_dirs["llama"][0]).model.state_dict(), load_hf(sharded).model.state_dict()
    assert whole.keys() == parts.keys() and all(torch.equal(whole[k], parts[k]) for k in whole)


@pytest.mark.parametrize("family", list(FAMILIES))
def test_round_trip_through_transformers_gives_identical_tensors(hf_dirs, family, tmp_path):
    first, _ = load_hf(hf_dirs[family][0])
    save_hf(first, tmp_path / "ours")
    written = json.loads((tmp_path / "ours" / "config.json").read_text())
    assert written["model_type"] == {"mistral": "llama"}.get(family, family)  # 窗口不起作用的 Mistral 就是 LLaMA 的形状
    theirs = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "ours").eval()
    tokens = torch.randint(0, V, (2, 10))
    with torch.no_grad():
        torch.testing.assert_close(theirs(tokens).logits, first(tokens), rtol=0, atol=1e-5)
    theirs.save_pretrained(tmp_path / "again")
    second, _ = load_hf(tmp_path / "again")
    a, b = first.state_dict(), second.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert second.config == first.config


@pytest.mark.parametrize("biases, family", [((False, False, False), "llama"), ((True, True, True), "llama"),
                                            ((True, True, False), "llama"), ((True, False, False), "qwen2")])
def test_save_hf_of_our_rope_models(biases, family, tmp_path):
    qkv, out, ffn = biases
    cfg = LMConfig(V, d_model=32, n_heads=4, n_kv_heads=2, n_layers=2, d_ff=40, max_len=CONTEXT, positional="rope",
                   norm="rms", activation="swiglu", tie_embeddings=family == "qwen2", rope_base=1000.0,
                   qkv_bias=qkv, out_bias=out, ffn_bias=ffn, norm_eps=1e-6)
    ours = randomize(make_lm(cfg).eval(), seed=3)
    save_hf(ours, tmp_path / "m")
    assert json.loads((tmp_path / "m" / "config.json").read_text())["model_type"] == family
    theirs = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "m").eval()
    tokens = torch.randint(0, V, (2, 20))
    with torch.no_grad():
        torch.testing.assert_close(theirs(tokens).logits, ours(tokens), rtol=0, atol=1e-5)


@pytest.fixture(scope="module")
def poem_dir(tmp_path_factory):
    model, tokenizer, _ = load_poem_model()
    path = save_hf(model, tmp_path_factory.mktemp("poem") / "poem", tokenizer=tokenizer)
    return path, model, tokenizer


def test_poem_model_loads_in_transformers_with_identical_logits(poem_dir):
    path, ours, tokenizer = poem_dir
    config = json.loads((path / "config.json").read_text())
    assert (config["model_type"], config["activation_function"]) == ("gpt2", "gelu")  # 精确 GELU
    theirs = transformers.AutoModelForCausalLM.from_pretrained(path).eval()
    tokens = torch.tensor([tokenizer.encode("五绝《春晓》春眠不觉晓，处处闻啼鸟。", add_bos=True)] * 2)
    tokens[1, :4] = 0
    mask = (tokens != 0).long()
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        want = theirs(tokens, attention_mask=mask, position_ids=positions).logits
        got = ours(tokens, positions=positions, attn_mask=mask.bool()[:, None, None, :])
    diff = (got - want)[mask.bool()].abs().max().item()
    print(f"\npoem (gpt2): max|Δlogit| = {diff:.2e}")
    assert diff < 1e-5
    back, char = load_hf(path)
    assert char == tokenizer and back.config == ours.config
    assert all(torch.equal(a, b) for a, b in zip(back.state_dict().values(), ours.state_dict().values()))


def test_poem_model_greedy_generation_matches_transformers(poem_dir):
    path, ours, tokenizer = poem_dir
    theirs = transformers.AutoModelForCausalLM.from_pretrained(path).eval()
    prompt = torch.tensor([tokenizer.encode("五绝《春晓》", add_bos=True), tokenizer.encode("七绝《山行》", add_bos=True)])
    theirs.generation_config.eos_token_id = None
    want = theirs.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=32, do_sample=False,
                           pad_token_id=0)[:, prompt.shape[1]:]
    got = generate(ours, prompt, 32, method="greedy", suppress_ids=())
    assert torch.equal(got, want)
    assert len(set(want[0].tolist())) > 10  # 一首像样的诗，不是重复


def test_poem_tokenizer_json_round_trips_text(poem_dir):
    from tokenizers import Tokenizer

    path, _, tokenizer = poem_dir
    text = "七律《秋兴》玉露凋伤枫树林，巫山巫峡气萧森。"
    ids = tokenizer.encode(text)
    raw = Tokenizer.from_file(str(path / "tokenizer.json"))
    fast = transformers.PreTrainedTokenizerFast(tokenizer_file=str(path / "tokenizer.json"))
    auto = transformers.AutoTokenizer.from_pretrained(path)
    assert raw.encode(text).ids == ids and raw.decode(ids) == text
    assert fast.encode(text) == ids and fast.decode(ids) == text
    assert auto.encode(text) == ids and (auto.bos_token_id, auto.eos_token_id, auto.pad_token_id) == (1, 2, 0)
    assert [raw.token_to_id(t) for t in ("<pad>", "<bos>", "<eos>", "<unk>")] == [0, 1, 2, 3]
    assert raw.encode("春\u9fff").ids == [tokenizer.token_to_id("春"), 3]  # 词表外的字 → UNK
    assert raw.get_vocab_size() == tokenizer.vocab_size


def test_other_tokenizer_json_is_wrapped_with_the_model_special_ids(hf_dirs, tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers

    from tformer_lib.lm.hf_tokenizer import HFTokenizer

    words = ["<pad>", "<bos>", "<eos>", "<unk>", "the", "cat", "dog", "sat", "on", "mat", "log"]
    words_tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    words_tok.pre_tokenizer = pre_tokenizers.Whitespace()  # 按空格分词的词级模型：不是我们的逐字符格式
    path = edited(hf_dirs, tmp_path, "llama", eos_token_id=[2, 5])  # LLaMA-3 式：几个结束词元，取第一个
    (path / "tokenizer.json").write_text(words_tok.to_str())
    model, tok = load_hf(path)
    assert isinstance(tok, HFTokenizer) and (tok.bos_id, tok.eos_id, tok.vocab_size) == (1, 2, len(words))
    text = "the cat sat on the log"
    ids = tok.encode(text, add_bos=True)
    assert ids == [1, 4, 5, 7, 8, 4, 10] and tok.decode(ids) == text
    assert tok.decode(ids + [2] + ids[1:]) == text  # 遇 eos_id 停
    save_hf(model, tmp_path / "again", tokenizer=tok)  # 原样写回
    assert (tmp_path / "again" / "tokenizer.json").read_text() == words_tok.to_str()
    assert json.loads((tmp_path / "again" / "config.json").read_text())["eos_token_id"] == 2
    big = Tokenizer(models.WordLevel({f"w{i}": i for i in range(V + 1)}, unk_token="w3"))
    (path / "tokenizer.json").write_text(big.to_str())
    with pytest.raises(ValueError, match="vocab_size"):
        load_hf(path)


def test_dtype_follows_the_checkpoint_unless_given(hf_dirs, tmp_path):
    path = hf_dirs["qwen2"][0]
    assert load_hf(path).model.tok_embed.weight.dtype == torch.float32
    half = load_hf(path, dtype=torch.bfloat16).model
    assert {p.dtype for p in half.parameters()} == {torch.bfloat16}
    save_hf(half, tmp_path / "bf16")
    assert json.loads((tmp_path / "bf16" / "config.json").read_text())["torch_dtype"] == "bfloat16"
    assert {p.dtype for p in load_hf(tmp_path / "bf16").model.parameters()} == {torch.bfloat16}
    assert load_hf(tmp_path / "bf16", dtype="float32").model.norm.weight.dtype == torch.float32


def test_sliding_window_runs_exactly_inside_the_window(hf_dirs, tmp_path):
    path = tmp_path / "mistral_w16"
    shutil.copytree(hf_dirs["mistral"][0], path)
    config = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**config, "sliding_window": 16}))
    with pytest.raises(UnsupportedHFConfig, match="sliding_window=16"):
        load_hf(path)
    ours, _ = load_hf(path, max_len=16)  # 只在窗口以内运行：与 transformers 的滑动窗口模型相同
    theirs = transformers.AutoModelForCausalLM.from_pretrained(path).eval()
    tokens = torch.randint(0, V, (2, 16))
    with torch.no_grad():
        torch.testing.assert_close(ours(tokens), theirs(tokens).logits, rtol=0, atol=1e-5)
    with pytest.raises(ValueError, match="max_len=16"):
        ours(torch.randint(0, V, (1, 17)))


def edited(hf_dirs, tmp_path, family, **changes):
    path = tmp_path / f"{family}_edited"
    shutil.copytree(hf_dirs[family][0], path)
    config = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**config, **changes}))
    return path


@pytest.mark.parametrize("family, changes, field", [
    ("llama", dict(rope_parameters={"rope_type": "dynamic", "factor": 2.0, "rope_theta": 1e4}), "rope_parameters"),
    ("llama", dict(rope_parameters={"rope_type": "llama3", "factor": 8.0, "rope_theta": 1e4}), "rope_parameters"),
    ("llama", dict(rope_parameters={"rope_type": "yarn", "factor": 2.0, "rope_theta": 1e4, "mscale": 0.7,
                                    "mscale_all_dim": 0.7, "original_max_position_embeddings": 32}), "mscale"),
    ("llama", dict(rope_parameters=None, rope_theta=1e4, rope_scaling={"type": "dynamic", "factor": 2.0}), "rope_scaling"),
    ("llama", dict(hidden_act="gelu"), "hidden_act"),
    ("llama", dict(head_dim=16), "head_dim"),
    ("llama", dict(model_type="bert"), "model_type"),
    ("llama", dict(attention_bias=True), "缺少"),  # 配置说有偏置，权重里没有
    ("qwen2", dict(use_sliding_window=True, sliding_window=8, layer_types=["sliding_attention"] * 2), "sliding_window"),
    ("mistral", dict(sliding_window=32), "sliding_window=32"),
    ("gpt2", dict(activation_function="relu"), "activation_function"),
    ("gpt2", dict(scale_attn_by_inverse_layer_idx=True), "scale_attn_by_inverse_layer_idx"),
    ("gpt2", dict(tie_word_embeddings=False), "lm_head.weight"),
])
def test_unsupported_hf_fields_are_named(hf_dirs, tmp_path, family, changes, field):
    with pytest.raises(UnsupportedHFConfig, match=field):
        load_hf(edited(hf_dirs, tmp_path, family, **changes))


def test_missing_files_and_bad_arguments(hf_dirs, tmp_path):
    with pytest.raises(FileNotFoundError, match="config.json"):
        load_hf(tmp_path)
    (tmp_path / "config.json").write_text((hf_dirs["gpt2"][0] / "config.json").read_text())
    with pytest.raises(FileNotFoundError, match="model.safetensors"):
        load_hf(tmp_path)
    with pytest.raises(ValueError, match="dtype"):
        load_hf(hf_dirs["gpt2"][0], dtype="int8")
    with pytest.raises(ValueError, match="max_len"):
        load_hf(hf_dirs["gpt2"][0], max_len=CONTEXT + 1)


def rope(**kw):
    base = dict(d_model=32, n_heads=4, n_layers=1, d_ff=40, positional="rope", norm="rms", activation="swiglu")
    return {**base, **kw}


@pytest.mark.parametrize("kw, field", [
    (dict(positional="sinusoidal"), "positional"),
    (dict(norm_first=False), "norm_first"),
    (dict(norm="rms"), "norm"),
    (dict(activation="relu"), "activation"),
    (dict(qkv_bias=False), "qkv_bias"),
    (dict(n_kv_heads=2), "n_kv_heads"),
    (rope(norm="layer"), "norm"),
    (rope(activation="gelu"), "activation"),
    (rope(qkv_bias=True, out_bias=False, ffn_bias=True), "ffn_bias"),
    (rope(qkv_bias=False, out_bias=True), "out_bias"),
])
def test_save_hf_refuses_what_no_family_expresses(kw, field, tmp_path):
    with pytest.raises(UnsupportedHFConfig, match=field):
        save_hf(make_lm(LMConfig(V, **kw)), tmp_path / "m")
    assert not (tmp_path / "m").exists()


def test_save_hf_is_atomic_and_does_not_clobber(tmp_path):
    model = make_lm(LMConfig(V, d_model=16, n_heads=2, n_layers=1, d_ff=16))
    with pytest.raises(TypeError, match="DecoderOnlyLM"):
        save_hf(model.state_dict(), tmp_path / "m")
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "a.txt").write_text("keep")
    with pytest.raises(FileExistsError, match="notes"):
        save_hf(model, tmp_path / "notes")
    assert (tmp_path / "notes" / "a.txt").read_text() == "keep"
    save_hf(model, tmp_path / "m")
    save_hf(model, tmp_path / "m", tokenizer=CharTokenizer("春眠不觉晓"))  # 替换以前写的模型目录
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m", "notes"]  # 不留临时目录
    assert isinstance(load_hf(tmp_path / "m").tokenizer, CharTokenizer)
    with pytest.raises(ValueError, match="vocab_size"):
        save_hf(make_lm(LMConfig(8, d_model=16, n_heads=2, n_layers=1, d_ff=16)), tmp_path / "small",
                tokenizer=CharTokenizer("春眠不觉晓"))


@pytest.mark.parametrize("family, changes", [
    ("mistral", dict(sliding_window=None)),
    ("mistral", dict(sliding_window="absent")),  # 没写这个键：transformers 取缺省的 4096
    ("mistral", dict(sliding_window="absent", max_position_embeddings=5000)),
    ("qwen2", dict(use_sliding_window=True, sliding_window=8, max_window_layers=0, layer_types="absent")),
    ("qwen2", dict(use_sliding_window=True, sliding_window=8, max_window_layers=2, layer_types="absent")),
    ("qwen2", dict(use_sliding_window=True, sliding_window="absent", max_window_layers=1, layer_types="absent",
                   max_position_embeddings=5000)),
    ("qwen2", dict(use_sliding_window=False, sliding_window=8, layer_types=["sliding_attention"] * 2)),
    ("llama", dict(sliding_window=8)),  # transformers 的 LLaMA 没有滑动窗口
])
def test_sliding_window_is_the_one_transformers_uses(hf_dirs, tmp_path, family, changes):
    from tformer_lib.lm.hf_load import _sliding_window

    path = edited(hf_dirs, tmp_path, family, **{k: v for k, v in changes.items() if v != "absent"})
    config = json.loads((path / "config.json").read_text())
    for key in [k for k, v in changes.items() if v == "absent"]:
        config.pop(key, None)
    (path / "config.json").write_text(json.dumps(config))
    hf = transformers.AutoConfig.from_pretrained(path)
    layer_types = getattr(hf, "layer_types", None) or ["full_attention"]
    # transformers 的注意力用不用窗口：Qwen2 只在标成 sliding_attention 的层用，Mistral 总用，LLaMA 从不用
    sliding = any(t == "sliding_attention" for t in layer_types) if family == "qwen2" else family == "mistral"
    theirs = getattr(hf, "sliding_window", None) if sliding else None
    assert _sliding_window(config) == theirs
    if theirs is not None and theirs < config["max_position_embeddings"]:
        with pytest.raises(UnsupportedHFConfig, match="sliding_window"):
            load_hf(path)
    else:
        load_hf(path)  # 窗口（若有）不短于上下文：与 transformers 相同的普通因果注意力


def test_end_tokens_come_from_generation_config_and_all_stop_decoding(hf_dirs, tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers

    words = ["<pad>", "<bos>", "<eos>", "<unk>", "the", "cat", "dog", "<eot>"]
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    path = edited(hf_dirs, tmp_path, "llama", eos_token_id=2)
    (path / "tokenizer.json").write_text(tok.to_str())
    (path / "generation_config.json").write_text(json.dumps({"eos_token_id": [7, 2], "bos_token_id": 1}))
    _, ours = load_hf(path)
    assert ours.eos_ids == (7, 2) and ours.eos_id == 7  # transformers 的 generate 也读 generation_config.json
    assert ours.decode([4, 5, 7, 6]) == "the cat" and ours.decode([4, 2, 5, 7]) == "the"


def test_an_edited_char_tokenizer_json_is_not_taken_for_ours(poem_dir, tmp_path):
    from tokenizers import Tokenizer, normalizers

    from tformer_lib.lm.hf_tokenizer import HFTokenizer

    path = tmp_path / "poem_lower"
    shutil.copytree(poem_dir[0], path)
    tok = Tokenizer.from_file(str(path / "tokenizer.json"))
    tok.normalizer = normalizers.Lowercase()
    (path / "tokenizer.json").write_text(tok.to_str())
    _, ours = load_hf(path)
    assert isinstance(ours, HFTokenizer)  # 多了归一化：不再是本书的逐字符格式，照原样包起来
    text = "春眠不觉晓"
    assert ours.encode(text) == tok.encode(text, add_special_tokens=False).ids
    assert isinstance(load_hf(poem_dir[0]).tokenizer, CharTokenizer)


def test_a_tensor_stored_with_and_without_prefix_is_refused(hf_dirs, tmp_path):
    from safetensors.torch import load_file, save_file

    path = edited(hf_dirs, tmp_path, "llama")
    tensors = load_file(path / "model.safetensors")
    tensors["embed_tokens.weight"] = torch.zeros_like(tensors["model.embed_tokens.weight"])
    save_file(tensors, path / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(UnsupportedHFConfig, match="embed_tokens.weight"):
        load_hf(path)


@pytest.mark.parametrize("family, changes, field", [
    ("llama", dict(num_attention_heads=0), "num_attention_heads"),
    ("llama", dict(num_attention_heads=3), "num_attention_heads"),  # 32 不能被 3 整除
    ("llama", dict(num_key_value_heads=3), "num_key_value_heads"),
    ("llama", dict(hidden_size="32"), "hidden_size"),
    ("llama", dict(vocab_size=None), "vocab_size"),
    ("qwen2", dict(torch_dtype="int8", dtype=None), "dtype|torch_dtype"),
    ("llama", dict(quantization_config={"quant_method": "gptq", "bits": 4}), "quantization_config"),
    ("gpt2", dict(n_inner=0), "n_inner"),
    ("gpt2", dict(n_head=5), "n_head"),
])
def test_bad_config_values_are_named(hf_dirs, tmp_path, family, changes, field):
    path = edited(hf_dirs, tmp_path, family, **{k: v for k, v in changes.items() if v is not None})
    config = json.loads((path / "config.json").read_text())
    for key in [k for k, v in changes.items() if v is None]:
        config.pop(key, None)
    (path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match=field):
        load_hf(path)


def test_unreadable_config_files_and_arguments_are_named(hf_dirs, tmp_path):
    path = edited(hf_dirs, tmp_path, "llama")
    with pytest.raises(FileNotFoundError, match="是一个文件"):
        load_hf(path / "config.json")
    (path / "config.json").write_text("[1, 2]")
    with pytest.raises(ValueError, match="JSON 对象"):
        load_hf(path)
    (path / "config.json").write_text("{not json")
    with pytest.raises(ValueError, match="config.json"):
        load_hf(path)
    with pytest.raises(TypeError, match="dtype"):
        load_hf(hf_dirs["llama"][0], dtype=torch.float8_e4m3fn)
    model, _ = load_hf(hf_dirs["gpt2"][0])
    with pytest.raises(TypeError, match="tokenizer"):
        save_hf(model, tmp_path / "out", tokenizer="not a tokenizer")


def test_integer_weights_are_refused_by_name(hf_dirs, tmp_path):
    from safetensors.torch import load_file, save_file

    path = edited(hf_dirs, tmp_path, "llama")
    tensors = load_file(path / "model.safetensors")
    tensors["model.norm.weight"] = tensors["model.norm.weight"].to(torch.int32)
    save_file(tensors, path / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(UnsupportedHFConfig, match="model.norm.weight"):
        load_hf(path)


def test_a_missing_context_length_is_transformers_default(hf_dirs, tmp_path):
    for family, default in (("qwen2", 32768), ("mistral", 131072)):
        path = edited(hf_dirs, tmp_path, family, sliding_window=None)
        config = json.loads((path / "config.json").read_text())
        del config["max_position_embeddings"]
        (path / "config.json").write_text(json.dumps(config))
        assert transformers.AutoConfig.from_pretrained(path).max_position_embeddings == default
        assert load_hf(path).model.config.max_len == default
        shutil.rmtree(path)
