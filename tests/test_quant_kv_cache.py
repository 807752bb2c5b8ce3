"""int8 K/V 缓存：每词元每头的误差界、与“缓存里直接存反量化值”的生成逐位相同、接进连续缓存与分页缓存
（包括推理引擎）后生成照常、字节数等于公式。"""

import random

import pytest
import torch

from tformer_lib.parts.kv_cache import AttentionCache
from tformer_lib.lm import LMCache, LMConfig, generate, make_lm
from tformer_lib.quant import (
    Int8LMCache,
    Int8PagedKVCache,
    dequantize_kv_rows,
    kv_bytes_per_token,
    quantize_kv_rows,
    symmetric_scale,
    use_int8_kv_cache,
)
from tformer_lib.serving import Engine, PagedKVCache

CONFIGS = [
    dict(positional="learned"),
    dict(positional="rope", n_kv_heads=2, norm="rms", activation="swiglu"),
]


def _model(seed, **options):
    torch.manual_seed(seed)
    config = LMConfig(vocab_size=40, d_model=32, n_heads=4, n_layers=2, d_ff=48, max_len=48, **options)
    model = make_lm(config).eval()
    with torch.no_grad():  # 放大 K/V 投影，让量化误差足以改变 logits（否则“逐位相同”测不出东西）
        for block in model.blocks:
            block.self_attn.w_k.weight.mul_(20)
            block.self_attn.w_v.weight.mul_(20)
    return model


def _round_trip(x):
    return dequantize_kv_rows(quantize_kv_rows(x), x.dtype)


class DequantizedCache(AttentionCache):
    """参照：缓存里直接存浮点的反量化值 ŝ·q（不存 int8）。"""

    def update(self, k, v):
        return super().update(_round_trip(k), _round_trip(v))


class DequantizedLMCache(LMCache):
    def __init__(self, n_layers):
        super().__init__(n_layers)
        self.layers = [DequantizedCache() for _ in range(n_layers)]


def test_rows_hold_values_and_their_scale_and_round_trip_within_half_a_step():
    k = torch.randn(2, 3, 5, 16) * torch.rand(2, 3, 5, 1) * 4  # 每个词元、每个头的尺度不同
    rows = quantize_kv_rows(k)
    assert rows.dtype == torch.int8 and rows.shape == (2, 3, 5, 20)
    scale = rows[..., 16:].contiguous().view(torch.float32)  # (B, h, T, 1)：最后 4 个字节就是比例因子
    assert torch.equal(scale, symmetric_scale(k, 8))
    err = (k - dequantize_kv_rows(rows)).abs()
    assert bool((err <= scale / 2 + 4 * torch.finfo(torch.float32).eps * k.abs()).all())
    assert dequantize_kv_rows(quantize_kv_rows(k.bfloat16()), torch.bfloat16).dtype == torch.bfloat16
    with pytest.raises(ValueError, match="rows"):
        dequantize_kv_rows(torch.zeros(3, 4, dtype=torch.int8))


@pytest.mark.parametrize("options", CONFIGS, ids=["gpt", "gqa-rope"])
def test_int8_cache_generation_equals_a_cache_of_dequantized_values(options):
    model = _model(0, **options)
    prompt = torch.tensor([[5, 6, 7, 8], [9, 10, 11, 12]])
    reference_model = _model(0, **options)
    reference_model.new_cache = lambda: DequantizedLMCache(len(reference_model.blocks))
    use_int8_kv_cache(model)
    assert isinstance(model.new_cache(), Int8LMCache)
    for method in ("greedy", "sample"):
        got = generate(model, prompt, 20, method=method, generator=torch.Generator().manual_seed(1))
        want = generate(reference_model, prompt, 20, method=method, generator=torch.Generator().manual_seed(1))
        assert torch.equal(got, want), method
    # 逐步的 logits 也逐位相同；而与 float 缓存相比确实不同（量化真的发生了）
    cache, ref_cache, plain = model.new_cache(), reference_model.new_cache(), LMCache(len(model.blocks))
    step = prompt
    with torch.no_grad():
        for _ in range(4):
            a, b, c = model(step, cache=cache), reference_model(step, cache=ref_cache), model(step, cache=plain)
            assert torch.equal(a, b) and not torch.equal(a, c)
            assert torch.allclose(a, c, atol=0.1)
            step = a[:, -1:].argmax(-1)
    assert cache.layers[0].k.dtype == torch.int8
    assert cache.nbytes() == 2 * len(cache) * kv_bytes_per_token(model.config, "int8")  # 批大小 2
    assert plain.nbytes() == 2 * len(plain) * kv_bytes_per_token(model.config, "fp32")
    use_int8_kv_cache(model, enabled=False)
    assert type(model.new_cache()) is LMCache


def test_int8_cache_crops_and_reorders_through_the_plain_lm_cache_code():
    model = _model(1)
    tokens = torch.tensor([[5, 6, 7, 8, 9, 10], [11, 12, 13, 14, 15, 16]])
    with torch.no_grad():
        full = Int8LMCache(2)
        model(tokens, cache=full)
        full.crop(4)  # LMCache.crop 只切 k、v：比例因子与它的值同行，一起被切
        full.reorder(torch.tensor([1, 0]))
        fresh = Int8LMCache(2)
        model(tokens[[1, 0], :4], cache=fresh)
        nxt = torch.tensor([[20], [21]])
        assert torch.equal(model(nxt, cache=full), model(nxt, cache=fresh))
    with pytest.raises(TypeError, match="DecoderOnlyLM"):
        use_int8_kv_cache(torch.nn.Linear(2, 2))


class DequantizedStorePagedCache(PagedKVCache):
    """参照：分页缓存的浮点存储里直接写反量化值。"""

    class _Store:
        def __init__(self, shape, dtype, device):
            self.data = torch.zeros(shape, dtype=dtype, device=device)
            self.dtype, self.device, self.nbytes = dtype, self.data.device, self.data.nbytes

        def index_copy_(self, dim, index, source):
            self.data.index_copy_(dim, index, _round_trip(source))
            return self

        def index_select(self, dim, index):
            return self.data.index_select(dim, index)

    def _new_store(self, shape, dtype, device):
        return self._Store(shape, dtype, device)


def _paged_logits(cache_cls, model, prompts, steps, packed):
    cache = cache_cls(model, num_blocks=16, block_size=4)
    ids = list(range(len(prompts)))
    for i, p in zip(ids, prompts):
        cache.manager.allocate(i, p)
    outs, tokens, lengths = [], [torch.tensor(p) for p in prompts], [len(p) for p in prompts]
    with torch.no_grad():
        for step in range(steps):
            if packed or step == 0:  # 预填充总是打包的一行；packed=False 时解码步走 (B, 1) 的 decode_view
                view, positions, mask, last = cache.packed_view(ids, lengths)
                logits = model(torch.cat(tokens)[None], cache=view, positions=positions, attn_mask=mask)[0, last]
            else:
                view, positions, mask = cache.decode_view(ids)
                logits = model(torch.cat(tokens)[:, None], cache=view, positions=positions, attn_mask=mask)[:, -1]
            outs.append(logits)
            tokens, lengths = [t[None] for t in logits.argmax(-1)], [1] * len(ids)
    return torch.stack(outs), cache


@pytest.mark.parametrize("packed", [False, True], ids=["decode_view", "packed"])
def test_int8_paged_cache_equals_a_paged_cache_of_dequantized_values(packed):
    model = _model(2, positional="rope", n_kv_heads=2)
    prompts = [[5, 6, 7, 8, 9], [10, 11]]
    got, cache = _paged_logits(Int8PagedKVCache, model, prompts, 5, packed)
    want, _ = _paged_logits(DequantizedStorePagedCache, model, prompts, 5, packed)
    plain, plain_cache = _paged_logits(PagedKVCache, model, prompts, 5, packed)
    assert torch.equal(got, want) and not torch.equal(got, plain)
    assert cache.k[0].rows.dtype == torch.int8
    assert cache.bytes_per_block == 4 * kv_bytes_per_token(model.config, "int8")
    assert plain_cache.bytes_per_block == 4 * kv_bytes_per_token(model.config, "fp32")
    # 16 块，外加每层 K、V 各一个草稿槽（固定形状的解码步里空行写到那里）
    per_slot = cache.bytes_per_block // 4
    assert sum(s.nbytes for s in cache.k + cache.v) == 16 * cache.bytes_per_block + per_slot


def test_engine_with_an_int8_paged_cache_equals_one_by_one_int8_generation():
    rng = random.Random(0)
    model = _model(3, positional="rope", n_kv_heads=2)
    engine = Engine(model, max_batch=3, block_size=4, eos_id=9)
    engine.cache = Int8PagedKVCache(model, engine.cache.manager.num_blocks, 4)
    prompts = [[rng.randrange(4, 40) for _ in range(rng.randint(1, 12))] for _ in range(6)]
    limits = [rng.randint(1, 15) for _ in prompts]
    requests = [engine.add_request(p, n) for p, n in zip(prompts, limits)]
    engine.run()
    use_int8_kv_cache(model)
    alone = [generate(model, p, n, method="greedy", eos_id=9).tolist() for p, n in zip(prompts, limits)]
    assert [r.output for r in requests] == alone
    assert bool(engine.cache.k[0].rows.any())  # 引擎确实把 K 写进了 int8 存储
    assert engine.peak_held_bytes % engine.cache.bytes_per_block == 0
    assert engine.cache.bytes_per_block == 4 * kv_bytes_per_token(model.config, "int8")
    assert engine.cache.manager.used_blocks == 0
