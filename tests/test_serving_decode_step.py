"""引擎的固定形状步（``decode_step="fixed"``/``"compiled"``）：生成的词元与逐条 ``generate`` 相同。"""

import contextlib
import random

import pytest
import torch

from tformer_lib.lm import LMConfig, generate, make_lm
from tformer_lib.serving import Engine, PagedKVCache, Sampling
from tformer_lib.serving.decode_step import PagedDecodeStep, prefill_rows, read_blocks

CONFIGS = [
    dict(positional="learned"),
    dict(positional="rope", n_kv_heads=1),
    dict(positional="sinusoidal", n_kv_heads=2, norm="rms", activation="swiglu"),
    dict(positional="rope", norm_first=False, fast_attention=False),
]


def _model(seed, **options):
    torch.manual_seed(seed)
    config = LMConfig(vocab_size=40, d_model=32, n_heads=4, n_layers=2, d_ff=48, max_len=48, **options)
    return make_lm(config).eval()


def _alone(model, prompt, n, eos_id=None):
    out = generate(model, prompt, n, method="greedy", eos_id=eos_id).tolist()
    return out[: out.index(eos_id) + 1] if eos_id in out else out


def _no_eager_forward(engine):
    """让引擎的 eager 前向一调用就失败：证明这一次跑的全是固定形状步。"""
    def refuse(work):
        raise AssertionError("固定形状的引擎不该走 eager 的 _forward")
    engine._forward = refuse


@pytest.mark.parametrize("options", CONFIGS)
@pytest.mark.parametrize("seed", range(3))
def test_fixed_steps_equal_one_by_one_generation(options, seed):
    rng = random.Random(seed)
    model = _model(seed, **options)
    # 提示长短悬殊（到接近 max_len 的 40 个词元），max_batch 比同时在跑的多时有空槽位
    prompts = [[rng.randrange(3, 40) for _ in range(rng.choice([1, 3, 9, 17, 40]))] for _ in range(9)]
    limits = [rng.randint(1, 48 - len(p)) for p in prompts]
    engine = Engine(model, max_batch=rng.choice([3, 5]), block_size=rng.choice([3, 4, 16]), eos_id=9,
                    decode_step="fixed")
    _no_eager_forward(engine)
    requests = [engine.add_request(p, n) for p, n in zip(prompts, limits)]
    engine.run()
    assert [r.output for r in requests] == [_alone(model, p, n, 9) for p, n in zip(prompts, limits)]
    assert engine.cache.manager.used_blocks == 0


@pytest.mark.parametrize("seed", range(2))
def test_fixed_steps_with_shared_prefixes_admitted_together(seed):
    # 同一步接纳的请求共用前缀块：后一条的预填充读的是前一条刚写好的块
    model = _model(seed, positional="rope", n_kv_heads=2)
    rng = random.Random(10 + seed)
    heads = [[rng.randrange(3, 40) for _ in range(12)] for _ in range(2)]
    prompts = [rng.choice(heads)[: rng.randint(5, 12)] + [rng.randrange(3, 40) for _ in range(rng.randint(0, 4))]
               for _ in range(10)]
    engine = Engine(model, max_batch=4, block_size=2, decode_step="fixed")
    _no_eager_forward(engine)
    requests = [engine.add_request(p, 8) for p in prompts]
    engine.run()
    assert [r.output for r in requests] == [_alone(model, p, 8) for p in prompts]
    assert engine.prefill_tokens_saved > 0


def test_fixed_steps_sample_with_each_requests_generator():
    model = _model(4, positional="rope")
    engine = Engine(model, max_batch=3, block_size=4, decode_step="fixed")
    prompts = [[5, 6, 7], [8, 9], [10, 11, 12, 13]]
    samplings = [None, Sampling(0.9, None, torch.Generator().manual_seed(1)),
                 Sampling(1.5, 0.8, torch.Generator().manual_seed(2))]
    requests = [engine.add_request(p, 10, sampling=s) for p, s in zip(prompts, samplings)]
    engine.run()
    assert requests[0].output == _alone(model, prompts[0], 10)
    for prompt, seed, (t, p), request in zip(prompts[1:], (1, 2), ((0.9, None), (1.5, 0.8)), requests[1:]):
        want = generate(model, prompt, 10, method="sample", temperature=t, top_p=p,
                        generator=torch.Generator().manual_seed(seed)).tolist()
        assert request.output == want


def test_idle_rows_write_only_the_scratch_slot():
    model = _model(1, positional="rope")
    cache = PagedKVCache(model, num_blocks=6, block_size=4)
    assert cache.scratch_slot == 24 and cache.k[0].shape[0] == 25
    before = [s.clone() for s in cache.k + cache.v]
    step = PagedDecodeStep(model, 3, (0, 1))
    step.step(cache, {})  # 三行全空：只写草稿槽
    for old, new in zip(before, cache.k + cache.v):
        assert torch.equal(old[:24], new[:24]) and not torch.equal(old[24], new[24])


def test_prefill_rows_and_read_blocks_are_powers_of_two():
    assert [prefill_rows(n) for n in (0, 1, 8, 9, 16, 17, 33, 48)] == [0, 8, 8, 16, 16, 32, 64, 64]
    # block_size 4、max_len 48 → 至多 12 块
    assert [read_blocks(n, 4, 12) for n in (1, 8, 9, 16, 17, 33, 48)] == [2, 2, 4, 4, 8, 12, 12]


def test_bad_decode_step_and_quantized_store_are_refused():
    from tformer_lib.quant import Int8PagedKVCache

    model = _model(0)
    with pytest.raises(ValueError, match="decode_step"):
        Engine(model, decode_step="fast")
    engine = Engine(model, max_batch=2, block_size=4, decode_step="fixed")
    engine.cache = Int8PagedKVCache(model, engine.cache.manager.num_blocks, 4)
    engine.add_request([5, 6], 3)
    with pytest.raises(TypeError, match="decode_step='eager'"):
        engine.run()


@pytest.mark.slow
def test_compiled_engine_equals_the_eager_engine():
    rng = random.Random(7)
    model = _model(7, positional="rope", n_kv_heads=2, fast_attention=True)
    prompts = [[rng.randrange(3, 40) for _ in range(rng.randint(1, 20))] for _ in range(10)]
    limits = [rng.randint(1, 20) for _ in prompts]
    outputs = {}
    for mode in ("eager", "compiled"):
        engine = Engine(model, max_batch=4, block_size=4, eos_id=9, decode_step=mode)
        requests = [engine.add_request(p, n) for p, n in zip(prompts, limits)]
        engine.run()
        outputs[mode] = [r.output for r in requests]
    assert outputs["compiled"] == outputs["eager"] == [_alone(model, p, n, 9) for p, n in zip(prompts, limits)]


def test_suppress_ids_are_checked_against_the_vocabulary_in_every_mode():
    model = _model(0)
    for mode in ("eager", "fixed"):
        with pytest.raises(ValueError, match="suppress_ids"):
            Engine(model, suppress_ids=(0, -1), decode_step=mode)  # -1 会绕到最后一个词
        with pytest.raises(ValueError, match="suppress_ids"):
            Engine(model, suppress_ids=(0, 40), decode_step=mode)


def test_a_row_without_a_finite_logit_raises_like_the_eager_engine():
    model = _model(1, positional="rope")
    with torch.no_grad():
        model.lm_head.weight[5, 0] = float("nan")
    errors = {}
    for mode in ("eager", "fixed"):
        engine = Engine(model, max_batch=2, block_size=4, decode_step=mode)
        engine.add_request([6, 7, 8], 4)
        with pytest.raises(ValueError) as info:
            engine.run()
        errors[mode] = str(info.value)
    assert errors["fixed"] == errors["eager"]


@pytest.mark.parametrize("mode", ["eager", "fixed"])
def test_a_failed_step_is_undone_and_the_engine_goes_on(mode):
    model = _model(2, positional="rope")
    rng = random.Random(3)
    prompts = [[rng.randrange(3, 40) for _ in range(rng.randint(1, 9))] for _ in range(6)]
    limits = [2, 6, 6, 6, 6, 6]
    engine = Engine(model, max_batch=3, block_size=4, decode_step=mode)
    requests = [engine.add_request(p, n) for p, n in zip(prompts, limits)]
    engine.step()
    engine.step()  # 第 0 条写完 2 个词离开：下一步既有解码，也有新接纳的请求
    name = "_forward" if mode == "eager" else "_fixed_forward"
    real = getattr(engine, name)

    def fail_once(*args):
        setattr(engine, name, real)
        raise KeyboardInterrupt  # 例如编译到一半按了 Ctrl-C

    setattr(engine, name, fail_once)
    with pytest.raises(KeyboardInterrupt):
        engine.step()
    assert len(engine.running) == 2 and len(engine.waiting) == 3  # 新接纳的那条回到了队首
    engine.run()
    assert [r.output for r in requests] == [_alone(model, p, n) for p, n in zip(prompts, limits)]
    assert engine.cache.manager.used_blocks == 0



@pytest.mark.parametrize("mode", ["eager", "fixed"])
def test_forward_rows_skips_a_step_that_failed_inside_the_model(mode):
    # 前向做到输出层时出错：这一步被撤回，steps 与 forward_rows 都不算它；续跑之后与没出错的一遍相同
    model = _model(2, positional="rope")
    rng = random.Random(4)
    prompts = [[rng.randrange(3, 40) for _ in range(rng.randint(1, 9))] for _ in range(5)]

    def serve(fail_at=None):
        engine = Engine(model, max_batch=3, block_size=4, decode_step=mode)
        requests = [engine.add_request(p, 5) for p in prompts]
        calls = []

        def hook(*_):
            calls.append(1)
            if len(calls) == fail_at:
                raise KeyboardInterrupt

        handle = model.lm_head.register_forward_hook(hook)
        try:
            with pytest.raises(KeyboardInterrupt) if fail_at else contextlib.nullcontext():
                engine.run()
            engine.run()  # 出错之后续跑（没出错时什么也不做）
        finally:
            handle.remove()
        return engine, [r.output for r in requests]

    clean, outputs = serve()
    resumed, resumed_outputs = serve(fail_at=3)
    assert resumed_outputs == outputs
    assert (resumed.steps, resumed.forward_rows) == (clean.steps, clean.forward_rows)


def test_fixed_step_helpers_refuse_bad_arguments():
    model = _model(0)
    with pytest.raises(ValueError, match="n"):
        prefill_rows(-1)
    with pytest.raises(TypeError, match="n"):
        prefill_rows(2.0)
    with pytest.raises(ValueError, match="limit"):
        read_blocks(5, 16, 0)
    with pytest.raises(TypeError, match="block_size"):
        read_blocks(5, 0.5, 4)
    for bad in (0, 2.5, "2", None):
        with pytest.raises((TypeError, ValueError), match="max_batch"):
            PagedDecodeStep(model, bad, (0, 1))
    with pytest.raises(TypeError, match="compile"):
        PagedDecodeStep(model, 2, (0, 1), compile="yes")
    step = PagedDecodeStep(model, 2, (0, 1))
    cache = PagedKVCache(model, num_blocks=4, block_size=4)
    with pytest.raises(ValueError, match="rows"):
        step.step(cache, {-1: ([5], 0, [0], [0])})
    with pytest.raises(ValueError, match="槽位 1"):
        step.step(cache, {1: ([], 0, [], [0])})
    with pytest.raises(ValueError, match="max_len=48"):
        step.step(cache, {0: ([5, 6], 47, [0, 1], [0])})


def test_each_engine_step_is_one_fixed_shape_forward():
    # 解码与预填充同在一次前向里：前向的次数等于步数，不因每条新请求另算一次
    model = _model(5, positional="rope", n_kv_heads=2)
    rng = random.Random(5)
    engine = Engine(model, max_batch=3, block_size=4, decode_step="fixed")
    calls = []
    real = engine._fixed._run
    engine._fixed._run = lambda *args: calls.append(len(args[1])) or real(*args)  # 记下每次前向的行数
    prompts = [[rng.randrange(3, 40) for _ in range(rng.randint(2, 12))] for _ in range(7)]
    requests = [engine.add_request(p, rng.randint(1, 9)) for p in prompts]
    engine.run()
    assert [r.output for r in requests] == [_alone(model, p, r.max_new_tokens) for p, r in zip(prompts, requests)]
    assert len(calls) == engine.steps
    assert calls[0] == 3 + prefill_rows(sum(len(p) - 1 for p in prompts[:3]))  # 第一步：三条提示一起预填充
    assert min(calls) == 3  # 只有解码的步：恰好 max_batch 行
    assert engine.forward_rows == sum(calls)  # 含空槽位与补齐的行


def test_a_cache_of_another_model_is_refused():
    model = _model(0, positional="rope", n_kv_heads=2)
    shallow = make_lm(LMConfig(vocab_size=40, d_model=32, n_heads=4, n_layers=1, d_ff=48, max_len=48,
                               positional="rope", n_kv_heads=2)).eval()
    cache = PagedKVCache(shallow, num_blocks=4, block_size=4)  # K/V 的形状相同，只是少一层
    with pytest.raises(ValueError, match="cache 有 1 层"):
        PagedDecodeStep(model, 2, (0, 1)).step(cache, {})
