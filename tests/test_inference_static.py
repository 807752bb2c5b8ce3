"""静态 K/V 缓存与固定形状的解码步：与第 9 章的动态缓存生成逐词元相同（贪心与种子相同的采样），
在多种随机模型与随书唐诗模型上；参差批次（左侧填充）与逐条生成相同；缓存原地写入、字节数合公式。

这些都在 eager 模式下核对（与编译版同一段代码）；编译版只在一个很小的模型上核对一次（编译要十几秒）。
"""

import pytest
import torch

from tformer_lib.lm import LMConfig, generate, load_poem_model, make_lm
from tformer_lib.inference import StaticDecoder, StaticKVCache, generate_static, static_positions_and_mask
from tformer_lib.parts.rope_scaling import RopeScaling
from tformer_lib.specials import EOS

CONFIGS = {
    "learned-layer-gelu": dict(),
    "rope-gqa-rms-swiglu": dict(positional="rope", n_kv_heads=2, norm="rms", activation="swiglu", tie_embeddings=False),
    "sinusoidal-fast-mqa": dict(positional="sinusoidal", fast_attention=True, n_kv_heads=1),
    "post-ln-relu": dict(norm_first=False, activation="relu"),
    "none-fast-rope": dict(positional="rope", fast_attention=True),
    "rope-yarn": dict(positional="rope", rope_scaling=RopeScaling("yarn", 4.0, 10)),  # 第 16 章：缩放的表也走静态步
}


def random_model(seed=0, scale=20.0, **overrides):
    torch.manual_seed(seed)
    config = dict(vocab_size=61, d_model=32, n_heads=4, n_layers=2, d_ff=48, max_len=40)
    config.update(overrides)
    model = make_lm(LMConfig(**config))
    # 随机初始化的 logits 几乎一样平：把输出层放大，让贪心与采样都有明确的偏好（并列时比的只是舍入）
    with torch.no_grad():
        model.lm_head.weight.mul_(scale)
    return model.eval()


@pytest.fixture(scope="module")
def poem():
    model, _, _ = load_poem_model()
    return model.eval()


@pytest.mark.parametrize("name", CONFIGS)
def test_greedy_is_token_identical_to_generate(name):
    model = random_model(**CONFIGS[name])
    prompt = torch.randint(3, 61, (3, 5), generator=torch.Generator().manual_seed(1))
    expected = generate(model, prompt, 30, method="greedy")
    assert torch.equal(generate_static(model, prompt, 30, method="greedy"), expected)


@pytest.mark.parametrize("name", ["learned-layer-gelu", "rope-gqa-rms-swiglu", "sinusoidal-fast-mqa"])
@pytest.mark.parametrize("sampling", [dict(temperature=1.0), dict(temperature=0.7, top_k=8), dict(top_p=0.8),
                                      dict(temperature=1.3, top_k=20, top_p=0.9)])
def test_seeded_sampling_draws_the_same_tokens(name, sampling):
    model = random_model(scale=3.0, **CONFIGS[name])
    prompt = torch.randint(3, 61, (2, 4), generator=torch.Generator().manual_seed(2))
    expected = generate(model, prompt, 25, generator=torch.Generator().manual_seed(7), **sampling)
    got = generate_static(model, prompt, 25, generator=torch.Generator().manual_seed(7), **sampling)
    assert torch.equal(got, expected)
    assert len(set(expected.flatten().tolist())) > 3  # 确实在采样，不是每步都取同一个词


@pytest.mark.parametrize("temperature", [0, 0.0, 1e-40])
def test_temperature_zero_is_greedy_and_draws_no_random_numbers(temperature):
    """温度 0 与 lm.generate 一样表示贪心，不消耗 generator 的随机数；极小的正温度（1e-40，float32 里不为 0）
    仍按采样走，但分布已是贪心的独热分布，所以抽出的词与贪心相同（不会变成 NaN）。"""
    model = random_model(scale=3.0)
    prompt = torch.randint(3, 61, (2, 4), generator=torch.Generator().manual_seed(2))
    gen = torch.Generator().manual_seed(7)
    got = generate_static(model, prompt, 20, temperature=temperature, generator=gen)
    assert torch.equal(got, generate(model, prompt, 20, method="greedy"))
    if temperature == 0:
        assert torch.equal(gen.get_state(), torch.Generator().manual_seed(7).get_state())


def test_logits_match_the_dynamic_cache_step_by_step():
    model = random_model(**CONFIGS["rope-gqa-rms-swiglu"])
    decoder = StaticDecoder(model, compile=False)
    tokens = torch.randint(3, 61, (2, 9), generator=torch.Generator().manual_seed(3))
    full = model(tokens)  # (B, T, V)：不用缓存一次算完
    cache = decoder.cache(2)
    pads = torch.zeros(2, dtype=torch.long)
    logits = [decoder.prefill(cache, tokens[:, :4], pads)]
    for t in range(4, 9):
        logits.append(decoder.decode_step(cache, tokens[:, t:t + 1], torch.tensor([t]), pads)[0])
    torch.testing.assert_close(torch.stack(logits, dim=1), full[:, 3:], rtol=1e-5, atol=1e-5)


def test_poem_model_greedy_and_sampled(poem):
    prompt = torch.tensor([[2, 5, 6, 7, 8], [2, 9, 10, 11, 12]])
    assert torch.equal(generate_static(poem, prompt, 40, method="greedy"), generate(poem, prompt, 40, method="greedy"))
    kwargs = dict(temperature=0.8, top_k=50, top_p=0.95)
    expected = generate(poem, prompt, 40, generator=torch.Generator().manual_seed(11), **kwargs)
    got = generate_static(poem, prompt, 40, generator=torch.Generator().manual_seed(11), **kwargs)
    assert torch.equal(got, expected)


def test_ragged_prompts_equal_one_by_one_generation(poem):
    prompts = [[2, 5, 6], [2, 9, 10, 11, 12, 13, 14], [2, 7]]
    got = generate_static(poem, prompts, 20, method="greedy")
    for row, prompt in zip(got, prompts):
        assert torch.equal(row, generate(poem, prompt, 20, method="greedy"))
    rope = random_model(**CONFIGS["rope-gqa-rms-swiglu"])
    got = generate_static(rope, [[5, 6, 7, 8, 9], [10, 11]], 12, method="greedy")
    assert torch.equal(got[1], generate(rope, [10, 11], 12, method="greedy"))


def test_eos_stops_and_pads_like_generate():
    model = random_model()
    prompt = torch.randint(3, 61, (4, 3), generator=torch.Generator().manual_seed(5))
    free = generate(model, prompt, 20, method="greedy")
    eos = int(free[0, 4])  # 第 0 行第 5 个词当作 EOS：第 0 行在那里停，其余行要么也碰上、要么跑满
    expected = generate(model, prompt, 20, method="greedy", eos_id=eos)
    assert torch.equal(generate_static(model, prompt, 20, method="greedy", eos_id=eos), expected)
    assert expected[0, 5:].eq(0).all()


def test_cache_is_preallocated_and_written_in_place():
    model = random_model(**CONFIGS["rope-gqa-rms-swiglu"])
    decoder = StaticDecoder(model, compile=False)
    cache = decoder.cache(3)
    c = model.config
    assert cache.layers[0].k.shape == (3, c.kv_heads, c.max_len, c.d_k)
    assert cache.nbytes() == 2 * c.n_layers * 3 * c.kv_heads * c.max_len * c.d_k * 4
    pointers = [layer.k.data_ptr() for layer in cache.layers]
    decoder.generate(torch.randint(3, 61, (3, 4)), 6, method="greedy")
    assert [layer.k.data_ptr() for layer in cache.layers] == pointers  # 没有重新分配
    assert cache.layers[0].k[:, :, :9].abs().sum() > 0 and cache.layers[0].k[:, :, 9:].abs().sum() == 0
    assert decoder.cache(3) is cache


def test_positions_and_mask_for_left_padding():
    positions, mask = static_positions_and_mask(torch.tensor([5]), torch.tensor([0, 2]), 8)
    assert positions.tolist() == [[5], [3]]
    assert mask.shape == (2, 1, 1, 8)
    assert mask[0, 0, 0].tolist() == [True] * 6 + [False] * 2
    assert mask[1, 0, 0].tolist() == [False] * 2 + [True] * 4 + [False] * 2


def test_bad_arguments_are_named():
    model = random_model()
    decoder = StaticDecoder(model, compile=False)
    with pytest.raises(ValueError, match="max_new_tokens"):
        decoder.generate([5, 6], 39)
    with pytest.raises(ValueError, match="method"):
        decoder.generate([5, 6], 3, method="beam")
    with pytest.raises(ValueError, match="prompt"):
        decoder.generate([5, 600], 3)
    with pytest.raises(TypeError, match="prompt"):
        decoder.generate("床前明月光", 3)
    with pytest.raises(ValueError, match="mode"):
        StaticDecoder(model, mode="fastest")
    with pytest.raises(ValueError, match="max_len"):
        StaticKVCache(model, 1, max_len=41)
    with pytest.raises(ValueError, match="eos_id"):
        decoder.generate([5, 6], 3, eos_id=0)
    assert EOS != 0


@pytest.mark.slow
def test_compiled_step_on_a_tiny_model_matches_generate():
    """唯一的编译测试：Inductor 的 C++ 后端编译一个 1 块的小模型，用 benchmarks/decode.py 的全部选项（冻结、C++ 包装、
    跳过守卫），贪心、采样与遇到 EOS 就停的生成都与 generate 逐词元相同。"""
    model = random_model(n_layers=1, d_model=16, n_heads=2, d_ff=32)
    decoder = StaticDecoder(model, compile=True, freeze=True, skip_guards=True, cpp_wrapper=True)
    prompt = torch.randint(3, 61, (2, 4), generator=torch.Generator().manual_seed(4))
    assert torch.equal(decoder.generate(prompt, 12, method="greedy"), generate(model, prompt, 12, method="greedy"))
    got = decoder.generate(prompt, 12, top_k=10, generator=torch.Generator().manual_seed(3))
    assert torch.equal(got, generate(model, prompt, 12, top_k=10, generator=torch.Generator().manual_seed(3)))
    assert set(decoder.compile_seconds) == {2} and decoder.compile_seconds[2] > 0
    eos = int(generate(model, prompt[:1], 12, method="greedy")[0, 5])  # 第一行第 6 个词：让生成在中途停下
    got = decoder.generate(prompt, 12, method="greedy", eos_id=eos)
    assert torch.equal(got, generate(model, prompt, 12, method="greedy", eos_id=eos))
    with pytest.raises(ValueError, match="mode 与 freeze"):
        StaticDecoder(model, mode="default", freeze=True)


def test_static_decoder_checks_max_len_empty_batches_and_long_prompts_up_front():
    from tformer_lib.inference import StaticDecoder, generate_static
    from tformer_lib.lm import LMConfig, make_lm

    model = make_lm(LMConfig(vocab_size=40, d_model=32, n_heads=2, n_layers=1, d_ff=64, max_len=16)).eval()
    for bad in (0, -1, True, 3.5, 17):
        with pytest.raises(ValueError, match="max_len"):
            StaticDecoder(model, compile=False, max_len=bad)
    with pytest.raises(ValueError, match="空批次"):
        generate_static(model, torch.empty(0, 3, dtype=torch.long), 2, method="greedy")
    with pytest.raises(ValueError, match="超过了缓存的槽位数"):
        generate_static(model, torch.randint(2, 40, (1, 17)), method="greedy")
