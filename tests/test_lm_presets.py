"""真实模型的预设：在 meta 设备上搭出的模型与 ``transformers`` 按同一份公开配置搭出的模型参数逐个对得上，且不占内存。

``transformers`` 这一侧的配置在这里按各模型 ``config.json`` 的数字独立写一遍（不从 PRESETS 转换），
这样预设里抄错的任何一个数都会让参数形状对不上。
"""

import collections
import dataclasses
import os

import pytest
import torch

from tformer_lib import count_parameters
from tformer_lib.lm import PRESETS, PRESET_SOURCES, PUBLISHED_TRAINING_TOKENS, make_lm, meta_lm, parameter_breakdown, preset

transformers = pytest.importorskip("transformers")

# 各模型 config.json 里的数字（出处：PRESET_SOURCES 里的网址）
_LLAMA2 = dict(vocab_size=32000, max_position_embeddings=4096, rms_norm_eps=1e-5, rope_theta=10000.0,
               tie_word_embeddings=False)
_LLAMA3 = dict(vocab_size=128256, max_position_embeddings=8192, rms_norm_eps=1e-5, rope_theta=500000.0,
               tie_word_embeddings=False)
_QWEN = dict(rope_theta=1000000.0, use_sliding_window=False)
HF_CONFIGS = {
    "gpt2": ("GPT2Config", dict(vocab_size=50257, n_positions=1024, n_embd=768, n_layer=12, n_head=12,
                                activation_function="gelu_new", layer_norm_epsilon=1e-5)),
    "gpt2-xl": ("GPT2Config", dict(vocab_size=50257, n_positions=1024, n_embd=1600, n_layer=48, n_head=25,
                                   activation_function="gelu_new", layer_norm_epsilon=1e-5)),
    "llama-2-7b": ("LlamaConfig", dict(hidden_size=4096, intermediate_size=11008, num_hidden_layers=32,
                                       num_attention_heads=32, num_key_value_heads=32, **_LLAMA2)),
    "llama-2-13b": ("LlamaConfig", dict(hidden_size=5120, intermediate_size=13824, num_hidden_layers=40,
                                        num_attention_heads=40, num_key_value_heads=40, **_LLAMA2)),
    "llama-2-70b": ("LlamaConfig", dict(hidden_size=8192, intermediate_size=28672, num_hidden_layers=80,
                                        num_attention_heads=64, num_key_value_heads=8, **_LLAMA2)),
    "llama-3-8b": ("LlamaConfig", dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                                       num_attention_heads=32, num_key_value_heads=8, **_LLAMA3)),
    "llama-3-70b": ("LlamaConfig", dict(hidden_size=8192, intermediate_size=28672, num_hidden_layers=80,
                                        num_attention_heads=64, num_key_value_heads=8, **_LLAMA3)),
    "mistral-7b": ("MistralConfig", dict(vocab_size=32000, hidden_size=4096, intermediate_size=14336,
                                         num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8,
                                         max_position_embeddings=32768, sliding_window=4096, rms_norm_eps=1e-5,
                                         rope_theta=10000.0, tie_word_embeddings=False)),
    "qwen2.5-0.5b": ("Qwen2Config", dict(vocab_size=151936, hidden_size=896, intermediate_size=4864,
                                         num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2,
                                         max_position_embeddings=32768, rms_norm_eps=1e-6, tie_word_embeddings=True,
                                         **_QWEN)),
    "qwen2.5-7b": ("Qwen2Config", dict(vocab_size=152064, hidden_size=3584, intermediate_size=18944,
                                       num_hidden_layers=28, num_attention_heads=28, num_key_value_heads=4,
                                       max_position_embeddings=131072, rms_norm_eps=1e-6, tie_word_embeddings=False,
                                       **_QWEN)),
    "qwen2.5-72b": ("Qwen2Config", dict(vocab_size=152064, hidden_size=8192, intermediate_size=29568,
                                        num_hidden_layers=80, num_attention_heads=64, num_key_value_heads=8,
                                        max_position_embeddings=131072, rms_norm_eps=1e-5, tie_word_embeddings=False,
                                        **_QWEN)),
}


@pytest.fixture(scope="module")
def hf_models():
    """按需在 meta 设备上搭 transformers 的模型（每个只搭一次）。"""
    cache = {}

    def get(name):
        if name not in cache:
            kind, kwargs = HF_CONFIGS[name]
            cfg = getattr(transformers, kind)(**kwargs)
            with torch.device("meta"):
                cache[name] = transformers.AutoModelForCausalLM.from_config(cfg)
        return cache[name]

    return get


def _shapes(model) -> collections.Counter:
    return collections.Counter(tuple(p.shape) for p in model.parameters())


def _hf_breakdown(model) -> dict[str, int]:
    """按 transformers 的参数名分部件（与 parameter_breakdown 的部件对应）。"""
    rules = (("wte.", "embedding"), ("embed_tokens.", "embedding"), ("wpe.", "positional"), (".attn.", "attention"),
             (".self_attn.", "attention"), (".mlp.", "ffn"), ("ln_", "norms"), ("norm.", "norms"), ("lm_head.", "head"))
    out = collections.Counter()
    for name, p in model.named_parameters():
        out[next(part for key, part in rules if key in name)] += p.numel()
    return {k: v for k, v in out.items() if v}


def _hf_norm_eps(model) -> set[float]:
    return {float(getattr(m, "variance_epsilon", getattr(m, "eps", 0.0))) for m in model.modules()
            if type(m).__name__.endswith(("RMSNorm", "LayerNorm"))}


def _our_norm_eps(model) -> set[float]:
    return {float(m.eps) for m in model.modules() if type(m).__name__ in ("RMSNorm", "LayerNorm")}


def test_every_required_preset_is_there_with_a_source():
    required = {"gpt2", "gpt2-xl", "llama-2-7b", "llama-2-13b", "llama-2-70b", "llama-3-8b", "llama-3-70b",
                "mistral-7b", "qwen2.5-0.5b", "qwen2.5-7b", "qwen2.5-72b"}
    assert required <= set(PRESETS) and set(PRESETS) == set(HF_CONFIGS) == set(PRESET_SOURCES)
    assert all(url.startswith("https://huggingface.co/") and url.endswith("config.json") for url in PRESET_SOURCES.values())
    assert set(PUBLISHED_TRAINING_TOKENS) <= set(PRESETS)


@pytest.mark.parametrize("name", sorted(HF_CONFIGS))
def test_meta_model_has_exactly_the_parameters_transformers_builds(name, hf_models):
    ours, theirs = meta_lm(PRESETS[name]), hf_models(name)
    assert count_parameters(ours) == sum(p.numel() for p in theirs.parameters())
    breakdown = parameter_breakdown(ours)
    assert breakdown["total"] == count_parameters(ours)
    assert {k: v for k, v in breakdown.items() if v and k != "total"} == _hf_breakdown(theirs)  # 每个部件都对得上
    if PRESETS[name].positional == "rope":  # GPT-2 的 q/k/v 在 transformers 里并成一个 Conv1D，形状不可比
        assert _shapes(ours) == _shapes(theirs)  # 每个矩阵、偏置、归一化权重的形状一个不差
    # 参数个数看不出的几项：ε、RoPE 的底数、激活函数、输出层是否共享
    assert _our_norm_eps(ours) == _hf_norm_eps(theirs)
    c, hc = PRESETS[name], theirs.config
    if c.positional == "rope":
        theta = (getattr(hc, "rope_parameters", None) or {}).get("rope_theta", getattr(hc, "rope_theta", None))
        assert c.rope_base == float(theta)
        assert c.max_len == min(hc.max_position_embeddings, getattr(hc, "sliding_window", None) or 10**9)
    else:
        assert c.max_len == hc.n_positions
    act = getattr(hc, "hidden_act", None) or hc.activation_function
    assert {"silu": "swiglu", "gelu_new": "gelu_tanh"}[act] == c.activation
    tied = theirs.get_output_embeddings().weight is theirs.get_input_embeddings().weight
    assert tied == c.tie_embeddings == (ours.lm_head.weight is ours.tok_embed.weight)


def test_published_totals():
    # 独立的核对：广为引用的精确参数量，与模型卡（model card）上四舍五入的数
    exact = {"gpt2": 124_439_808, "llama-2-7b": 6_738_415_616, "llama-3-8b": 8_030_261_248, "mistral-7b": 7_241_732_096}
    for name, total in exact.items():
        assert parameter_breakdown(PRESETS[name])["total"] == total, name
    # Qwen2.5 的模型卡写 0.49B、7.61B、72.7B：是截断到这几位的数（7.6156B 写作 7.61B）
    card = {"qwen2.5-0.5b": (49, 10**7), "qwen2.5-7b": (761, 10**7), "qwen2.5-72b": (727, 10**8)}
    for name, (digits, unit) in card.items():
        assert parameter_breakdown(PRESETS[name])["total"] // unit == digits, name


def _rss_bytes() -> int:
    with open(f"/proc/{os.getpid()}/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


@pytest.mark.skipif(not os.path.exists("/proc/self/statm"), reason="需要 Linux 的 /proc 来读常驻内存")
def test_building_the_largest_presets_on_meta_allocates_nothing():
    meta_lm(PRESETS["gpt2"])  # 先付掉一次性的导入开销
    for name in ("llama-2-70b", "qwen2.5-72b", "llama-3-70b"):
        before = _rss_bytes()
        with torch.device("meta"):
            model = make_lm(PRESETS[name])
        grown = _rss_bytes() - before
        assert all(t.is_meta for t in (*model.parameters(), *model.buffers())), name
        # 一层的 W^Q（8192² 个 float32）就有 268 MB；真的分配了权重，常驻内存会长几百 GB
        assert grown < 64 * 2**20, (name, grown)


def test_preset_returns_an_independent_copy():
    c = preset("llama-2-7b", max_len=512)
    assert c.max_len == 512 and PRESETS["llama-2-7b"].max_len == 4096
    model = make_lm(preset("gpt2", vocab_size=64, d_model=32, n_heads=4, n_layers=1, d_ff=64, max_len=16))
    model.set_fast_attention(False)  # 改的是副本
    assert PRESETS["gpt2"].fast_attention is True
    assert dataclasses.replace(PRESETS["qwen2.5-0.5b"]) == preset("qwen2.5-0.5b")
    with pytest.raises(ValueError, match="llama-9"):
        preset("llama-9")
    with pytest.raises(ValueError, match="d_mdoel"):
        preset("gpt2", d_mdoel=3)


def test_a_small_copy_of_a_preset_runs_on_cpu():
    # 同一结构缩小到能在 CPU 上算：前向给出有限的 logits（权重共享与否、偏置与否都是预设里的）
    for name in ("gpt2", "qwen2.5-0.5b", "llama-3-8b"):
        c = preset(name, vocab_size=64, d_model=32, n_heads=4, n_kv_heads=2 if PRESETS[name].n_kv_heads else None,
                   n_layers=2, d_ff=48, max_len=16)
        logits = make_lm(c)(torch.randint(0, 64, (2, 9)))
        assert logits.shape == (2, 9, 64) and torch.isfinite(logits).all()
