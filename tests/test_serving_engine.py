"""推理服务部件的逐词元等价性：参差批次、分页缓存、连续批处理都与逐条贪心生成相同。"""

import random

import pytest
import torch

from tformer_lib.lm import LMConfig, generate, make_lm
from tformer_lib.parts.rope_scaling import RopeScaling
from tformer_lib.serving import BlockManager, Engine, OutOfBlocksError, greedy_batch, left_pad

CONFIGS = [
    dict(positional="learned"),
    dict(positional="rope", n_kv_heads=1),
    dict(positional="sinusoidal", n_kv_heads=2, norm="rms", activation="swiglu"),
    dict(positional="rope", norm_first=False, fast_attention=True),
    dict(positional="rope", rope_scaling=RopeScaling("ntk", 4.0)),  # 第 16 章：缩放的表也走分页缓存的解码步
]


def _model(seed, **options):
    torch.manual_seed(seed)
    config = LMConfig(vocab_size=40, d_model=32, n_heads=4, n_layers=2, d_ff=48, max_len=48, **options)
    return make_lm(config).eval()


def _alone(model, prompt, n, eos_id=None):
    if n == 0:
        return []
    return generate(model, prompt, n, method="greedy", eos_id=eos_id).tolist()


def _prompts(rng, count, vocab=40, lo=1, hi=20):
    return [[rng.randrange(4, vocab) for _ in range(rng.randint(lo, hi))] for _ in range(count)]


def test_left_pad_positions_and_mask():
    tokens, positions, key_mask = left_pad([[5, 6, 7], [8]])
    assert tokens.tolist() == [[5, 6, 7], [0, 0, 8]]
    assert positions.tolist() == [[0, 1, 2], [0, 0, 0]]
    assert key_mask.tolist() == [[True, True, True], [False, False, True]]


@pytest.mark.parametrize("options", CONFIGS)
@pytest.mark.parametrize("seed", range(3))
def test_ragged_batch_equals_one_by_one(options, seed):
    rng = random.Random(seed)
    model = _model(seed, **options)
    prompts = _prompts(rng, 5)
    limits = [rng.randint(0, 20) for _ in prompts]
    eos = 7
    got = greedy_batch(model, prompts, limits, eos_id=eos)
    assert got == [_alone(model, p, n, eos) for p, n in zip(prompts, limits)]


@pytest.mark.parametrize("options", CONFIGS)
@pytest.mark.parametrize("seed", range(3))
def test_continuous_batching_equals_one_by_one(options, seed):
    rng = random.Random(100 + seed)
    model = _model(seed, **options)
    engine = Engine(model, max_batch=3, block_size=4, eos_id=9)
    prompts = _prompts(rng, 9)
    limits = [rng.randint(1, 25) for _ in prompts]
    requests = [engine.add_request(p, n) for p, n in zip(prompts, limits)]
    engine.run()
    assert [r.output for r in requests] == [_alone(model, p, n, 9) for p, n in zip(prompts, limits)]
    assert engine.cache.manager.used_blocks == 0  # 全部结束后块都还回去了
    # 每一步最多 max_batch 条在跑，而且确实有过同时在跑的多条（否则测的不是批处理）
    occupancy = {}
    for r in requests:
        for step, slot in r.slot_steps:
            occupancy.setdefault(step, set()).add(slot)
    assert max(len(s) for s in occupancy.values()) == 3


def test_min_prefill_batches_admissions_and_keeps_outputs():
    model = _model(2, positional="rope")
    rng = random.Random(9)
    prompts = _prompts(rng, 10)
    engine = Engine(model, max_batch=4, min_prefill=3)
    requests = [engine.add_request(p, rng.randint(2, 12)) for p in prompts]
    engine.run()
    assert [r.output for r in requests] == [_alone(model, r.prompt, r.max_new_tokens) for r in requests]
    first_steps = sorted(min(step for step, _ in r.slot_steps) for r in requests)
    joined = {step: first_steps.count(step) for step in first_steps}
    # 第一步接纳 4 条；之后每次接纳都至少凑齐 3 条，除非等待的请求已不足 3 条
    assert joined[0] == 4 and all(n >= 3 or step == max(joined) for step, n in joined.items())


def test_prefix_caching_reuses_blocks_and_keeps_outputs():
    model = _model(0, positional="rope")
    shared = list(range(4, 4 + 12))  # 3 个满块（block_size=4）
    prompts = [shared + [20, 21], shared + [22], shared + [23, 24, 25]]
    engine = Engine(model, max_batch=3, block_size=4)
    requests = [engine.add_request(prompts[0], 6)]
    engine.step()  # 第一条先预填充，其余随后到达（同一步接纳的情形见下一个测试）
    requests += [engine.add_request(p, 6) for p in prompts[1:]]
    engine.run()
    assert [r.output for r in requests] == [_alone(model, p, 6) for p in prompts]
    assert engine.prefill_tokens_saved == 2 * 12  # 后两条各复用 12 个位置


def test_paged_memory_waste_at_most_one_block_per_sequence():
    model = _model(1)
    rng = random.Random(5)
    engine = Engine(model, max_batch=4, block_size=8, prefix_caching=False)
    requests = [engine.add_request(p, rng.randint(1, 20)) for p in _prompts(rng, 8)]
    manager = engine.cache.manager
    while engine.has_work:
        engine.step()
        for r in engine.running.values():
            held = len(manager.tables[r.request_id]) * manager.block_size
            assert held - manager.lengths[r.request_id] < manager.block_size
    assert all(r.done for r in requests)


def test_block_manager_accounting_and_errors():
    manager = BlockManager(num_blocks=3, block_size=4, prefix_caching=False)
    assert manager.allocate(0, [5] * 6) == 0 and manager.used_blocks == 2  # 6 个位置要 2 块
    assert manager.append_slots(0, 3) == [0, 1, 2]  # 块 0 的前三个槽位
    assert manager.append_slots(0, 5) == [3, 4, 5, 6, 7]  # 块 0 写满，接着是块 1
    assert manager.append_slots(0, 1) == [8] and manager.used_blocks == 3  # 第 9 个位置新开块 2
    with pytest.raises(OutOfBlocksError):
        manager.allocate(1, [5] * 8)
    manager.free(0)
    assert manager.used_blocks == 0 and manager.allocate(1, [5] * 8) == 0
    with pytest.raises(ValueError, match="block_size"):
        BlockManager(2, 0)


def test_shared_prefix_block_is_freed_only_by_its_last_user():
    manager = BlockManager(num_blocks=4, block_size=2)
    prompt = [5, 6, 7, 8, 9]
    manager.allocate(0, prompt)
    manager.append_slots(0, len(prompt))
    manager.register_prefix(0, prompt)
    assert manager.allocate(1, prompt) == 4  # 两个满块可复用，最后一个词元要重算
    assert manager.tables[1][:2] == manager.tables[0][:2]
    manager.free(0)
    assert manager.used_blocks == 3  # 共用的两块仍被序列 1 引用
    manager.free(1)
    assert manager.used_blocks == 0


def test_engine_rejects_bad_requests():
    model = _model(0)
    engine = Engine(model)
    with pytest.raises(ValueError, match="max_len"):
        engine.add_request([5] * 40, 20)
    with pytest.raises(ValueError, match=r"prompts\[0\]"):
        engine.add_request([], 3)
    with pytest.raises(ValueError, match="max_new_tokens"):
        engine.add_request([5], -1)
    with pytest.raises(ValueError, match="max_batch"):
        Engine(model, max_batch=0)
    with pytest.raises(ValueError, match="max_batch"):
        Engine(model, max_batch="8")  # 先查 max_batch，min_prefill 的范围检查才不会拿字符串去比大小
    with pytest.raises(ValueError, match="min_prefill"):
        Engine(model, max_batch=4, min_prefill=5)


def test_requests_that_can_never_fit_are_refused_up_front():
    model = _model(0)
    engine = Engine(model, num_blocks=2, block_size=4)
    with pytest.raises(ValueError, match="num_blocks"):
        engine.add_request(list(range(4, 12)), 4)  # 12 个位置要 3 块，缓存只有 2 块：以前 run() 会永远等下去
    with pytest.raises(ValueError, match="block_size"):
        Engine(model, block_size=0)
    with pytest.raises(ValueError, match="eos_id"):
        Engine(model, eos_id=99)
    with pytest.raises(ValueError, match="arrival"):
        Engine(model).add_request([5], 2, arrival=float("nan"))


def test_failed_append_leaves_no_half_allocation():
    manager = BlockManager(num_blocks=4, block_size=2, prefix_caching=False)
    manager.allocate(0, [5, 6, 7])
    manager.append_slots(0, 3)
    before = manager.used_blocks
    with pytest.raises(OutOfBlocksError):
        manager.append_slots(0, 10)
    assert manager.used_blocks == before
    manager.free(0)
    with pytest.raises(KeyError, match="seq_id"):
        manager.free(0)


def test_packed_view_layout_positions_and_mask():
    from tformer_lib.serving import PagedKVCache

    model = _model(0, positional="rope")
    cache = PagedKVCache(model, num_blocks=6, block_size=2, prefix_caching=False)
    m = cache.manager
    m.allocate(0, [5, 6, 7])
    m.append_slots(0, 3)  # 序列 0 已缓存 3 个位置，这一步解码 1 个
    m.allocate(1, [8, 9])  # 序列 1 这一步预填充 2 个
    lm_cache, positions, mask, last = cache.packed_view([0, 1], [1, 2])
    assert positions.tolist() == [[3, 0, 1]] and last.tolist() == [0, 2]
    assert lm_cache.length == 3  # 已缓存的键在前，本步的 3 个新键在后
    expect = [[1, 1, 1, 1, 0, 0], [0, 0, 0, 0, 1, 1], [0, 0, 0, 0, 1, 1]]  # 同一条序列才可见（因果由模型再加）
    assert mask[0, 0].int().tolist() == expect
    assert lm_cache.layers[0].read_slots.tolist() == [m.slot(0, p) for p in range(4)] + [m.slot(1, 0), m.slot(1, 1)]


def test_decode_and_prefill_share_one_forward():
    model = _model(1, positional="learned")
    calls = []
    model.register_forward_hook(lambda mod, args, out: calls.append(tuple(args[0].shape)))
    engine = Engine(model, max_batch=2, block_size=4)
    a = engine.add_request([5, 6, 7], 1)
    b = engine.add_request([8, 9], 4)
    c = engine.add_request([10, 11, 12, 13], 3)
    engine.run()
    # 第 1 步：a、b 一起预填充；第 2 步：a 已离开，b 解码 1 个、c 预填充 4 个，打包成一次前向 (1, 5)
    assert calls[:2] == [(1, 5), (1, 5)] and len(calls) == engine.steps
    # eager 步只送真实的词元：每条提示一次，每个新词元（最后一个除外）再送回一次
    assert engine.forward_rows == sum(shape[0] * shape[1] for shape in calls) == \
        sum(len(r.prompt) + r.max_new_tokens - 1 for r in (a, b, c))
    assert [r.output for r in (a, b, c)] == [_alone(model, r.prompt, r.max_new_tokens) for r in (a, b, c)]


def test_requests_admitted_in_the_same_step_share_prefix_blocks():
    shared = list(range(4, 4 + 12))  # 3 个满块（block_size=4）
    prompts = [shared + [20, 21], shared + [22], shared + [23, 24, 25]]
    for options in (dict(positional="rope"), dict(positional="learned", n_kv_heads=2)):
        model = _model(2, **options)
        engine = Engine(model, max_batch=3, block_size=4)
        requests = [engine.add_request(p, 6) for p in prompts]  # 三条同一步接纳：第一条的块在本步前向里才写
        engine.step()
        manager = engine.cache.manager
        assert [manager.tables[r.request_id][:3] for r in requests[1:]] == [manager.tables[0][:3]] * 2
        engine.run()
        assert [r.output for r in requests] == [_alone(model, p, 6) for p in prompts]
        assert engine.prefill_tokens_saved == 2 * 12
        assert manager.used_blocks == 0 and sorted(manager.free_blocks) == list(range(manager.num_blocks))


def test_prefix_registration_survives_its_first_owner():
    # 序列 0 与 1 的提示相同、正好 2 个满块：1 只能共用第一块（最后一个词元要重算），第二块自己算一份（备用）
    prompt = [5, 6, 7, 8]
    manager = BlockManager(num_blocks=8, block_size=2)
    manager.allocate(0, prompt)
    manager.register_prefix(0, prompt)
    assert manager.allocate(1, prompt) == 2
    manager.register_prefix(1, prompt)
    manager.free(0)  # 第一个主人走了，序列 1 还持有内容相同的两块：登记转给它们
    assert manager.allocate(2, prompt + [9]) == 4 and manager.tables[2][:2] == manager.tables[1][:2]
    manager.free(1)
    manager.free(2)
    assert manager.used_blocks == 0 and sorted(manager.free_blocks) == list(range(8))
    assert manager.allocate(3, prompt + [9]) == 0  # 没有序列再持有这段前缀：登记作废，不会指向已空闲的块


@pytest.mark.parametrize("seed", range(6))
def test_ref_counts_exact_when_freed_in_any_order(seed):
    rng = random.Random(seed)
    manager = BlockManager(num_blocks=64, block_size=2)
    heads = [[5, 6, 7, 8, 9, 10], [5, 6, 11, 12]]
    live = {}
    for seq in range(40):
        if live and rng.random() < 0.4:  # 随机释放一条
            victim = rng.choice(sorted(live))
            manager.free(victim)
            del live[victim]
        prompt = rng.choice(heads)[: rng.randint(1, 6)] + [rng.randrange(4, 20) for _ in range(rng.randint(0, 3))]
        reused = manager.allocate(seq, prompt)
        manager.register_prefix(seq, prompt)
        live[seq] = prompt
        for i in range(reused // 2):  # 共用的块装的正是这段前缀
            assert manager._key_of[manager.tables[seq][i]] == tuple(prompt[: 2 * (i + 1)])
        held = [b for t in manager.tables.values() for b in t]
        assert all(manager.ref_count[b] == held.count(b) for b in set(held))
        assert not set(held) & set(manager.free_blocks) and len(set(manager.free_blocks)) == len(manager.free_blocks)
        assert all(manager.ref_count[b] > 0 for b in manager._key_of)  # 查找表里只有仍被占着的块
        assert {b: k for k, blocks in manager._cached.items() for b in blocks} == manager._key_of
    for victim in rng.sample(sorted(live), len(live)):
        manager.free(victim)
    assert sorted(manager.free_blocks) == list(range(64)) and manager.ref_count == [0] * 64
    assert not manager._cached and not manager._key_of and not manager.prefix_blocks


@pytest.mark.parametrize("options", CONFIGS)
@pytest.mark.parametrize("seed", range(2))
def test_heavy_prefix_sharing_keeps_outputs_and_returns_every_block(options, seed):
    # 很多请求共用几段开头、同一步一起接纳、任意先后结束：输出与逐条生成相同，块全部归还，登记全部撤下
    model = _model(seed, **options)
    rng = random.Random(seed)
    heads = [[rng.randrange(4, 40) for _ in range(rng.randint(4, 14))] for _ in range(3)]
    prompts = [rng.choice(heads)[: rng.randint(1, 14)] + [rng.randrange(4, 40) for _ in range(rng.randint(0, 5))]
               for _ in range(14)]
    n_new = [rng.randint(1, 12) for _ in prompts]
    engine = Engine(model, max_batch=4, block_size=rng.choice([2, 3]), eos_id=7)
    requests = [engine.add_request(p, n) for p, n in zip(prompts, n_new)]
    engine.run()
    assert [r.output for r in requests] == [_alone(model, p, n, eos_id=7) for p, n in zip(prompts, n_new)]
    assert engine.prefill_tokens_saved > 0
    manager = engine.cache.manager
    assert sorted(manager.free_blocks) == list(range(manager.num_blocks)) and not manager._cached


def _sampled_alone(model, prompt, n, temperature, top_p, seed, eos_id=None):
    g = torch.Generator().manual_seed(seed)
    out = generate(model, prompt, n, method="sample", temperature=temperature, top_p=top_p, generator=g, eos_id=eos_id)
    out = out.tolist()
    return out[: out.index(eos_id) + 1] if eos_id in out else out


@pytest.mark.parametrize("seed", range(3))
def test_per_request_sampling_equals_generate_with_the_same_seed(seed):
    """同批里有贪心的、有采样的请求：每个采样请求用自己的生成器，结果与单独 generate(method="sample") 相同。"""
    from tformer_lib.serving import Sampling

    rng = random.Random(300 + seed)
    model = _model(seed, positional="rope")
    engine = Engine(model, max_batch=4, block_size=4, eos_id=9)
    prompts = _prompts(rng, 6)
    settings = [(0.0, None), (0.8, None), (1.3, 0.9), (0.0, None), (1.0, 0.5), (2.0, None)]
    requests = []
    for i, (prompt, (t, p)) in enumerate(zip(prompts, settings)):
        sampling = Sampling(t, p, torch.Generator().manual_seed(1000 * seed + i)) if t else None
        requests.append(engine.add_request(prompt, 12, sampling=sampling))
    engine.run()
    for i, (prompt, (t, p), request) in enumerate(zip(prompts, settings, requests)):
        expected = _sampled_alone(model, prompt, 12, t, p, 1000 * seed + i, 9) if t else _alone(model, prompt, 12, 9)
        expected = expected[: expected.index(9) + 1] if 9 in expected else expected
        assert request.output == expected, i
    # 采样确实在起作用：高温下与贪心不同
    assert requests[5].output != _alone(model, prompts[5], 12, 9)[: len(requests[5].output)]


def test_tiny_temperature_is_greedy_not_nan():
    """温度 1e-40：logits/温度 本会溢出成 inf、softmax 成 NaN；减去每行最大值后，结果就是贪心。"""
    from tformer_lib.serving import Sampling

    model = _model(5)
    engine = Engine(model, max_batch=2, block_size=4)
    prompt = [5, 6, 7]
    request = engine.add_request(prompt, 10, sampling=Sampling(1e-40, None, torch.Generator().manual_seed(0)))
    engine.run()
    assert request.output == _alone(model, prompt, 10)


def test_cancel_frees_blocks_and_leaves_the_others_exact():
    model = _model(6)
    engine = Engine(model, max_batch=2, block_size=4, prefix_caching=False)
    free_at_start = len(engine.cache.manager.free_blocks)
    a = engine.add_request([5, 6, 7], 20)
    b = engine.add_request([8, 9], 15)
    c = engine.add_request([10, 11, 12], 5)  # 槽位只有两个：c 在等待队列里
    engine.step()
    engine.step()
    engine.cancel(a)
    engine.cancel(c)
    assert a.done and c.done and len(a.output) == 2 and c.output == []
    assert not engine.waiting and list(engine.running.values()) == [b]
    engine.cancel(a)  # 已结束的请求：什么也不做
    engine.run()
    assert b.output == _alone(model, [8, 9], 15)
    assert len(engine.cache.manager.free_blocks) == free_at_start
    with pytest.raises(TypeError, match="request"):
        engine.cancel("a")
    with pytest.raises(ValueError, match="不在这个引擎里"):
        Engine(model).cancel(engine.add_request([5], 3))


def test_block_manager_registers_only_the_allocated_prompt_and_reads_tensor_prompts():
    manager = BlockManager(num_blocks=16, block_size=4)
    prompt = list(range(100, 109))
    manager.allocate(1, torch.tensor(prompt))  # 一维整数张量与列表是同一个提示
    with pytest.raises(ValueError, match="prompt"):  # 另一段提示（或更长的）不能登记成这些块的内容
        manager.register_prefix(1, list(range(100, 120)))
    with pytest.raises(KeyError, match="seq_id"):
        manager.register_prefix(42, prompt)
    assert manager.prefix_blocks == []  # 出错的登记什么也没留下
    manager.register_prefix(1, prompt)
    assert manager.allocate(2, prompt + [7]) == 8  # 两个满块被共用
    for bad in ([1.5, 2.0], [True, 3], torch.tensor([1.0, 2.0]), "abc", []):
        with pytest.raises(ValueError, match="prompt"):
            manager.allocate(3, bad)
    with pytest.raises(KeyError, match="seq_id"):
        manager.free(55)


def test_paged_views_refuse_duplicate_sequences_and_positions_past_the_context():
    from tformer_lib.serving import PagedKVCache

    model = _model(0)
    cache = PagedKVCache(model, num_blocks=None, block_size=4, sequences=2)
    cache.manager.allocate(0, [5, 6, 7])
    with pytest.raises(ValueError, match="重复"):
        cache.decode_view([0, 0])
    with pytest.raises(ValueError, match="重复"):
        cache.packed_view([0, 0], [1, 1])
    with pytest.raises(ValueError, match="max_len"):
        cache.packed_view([0], [model.config.max_len + 1])
    assert cache.manager.lengths[0] == 0  # 被拒绝的视图没有动账本
