"""第 13 章的 GQA 解码测量（tformer_lib.serving.gqa_decode）与 bf16 服务（tformer_lib.serving.bf16）。"""

import math

import pytest
import torch

from tformer_lib.lm import LMConfig, make_lm
from tformer_lib.lm.cache import lm_kv_cache_bytes_per_token
from tformer_lib.plotting.serving import kv_head_label, plot_gqa_decode
from tformer_lib.serving import Engine, WorkItem
from tformer_lib.serving.bf16 import (
    bf16_copy, compare_bf16, main as bf16_main, parameter_bytes, serve, teacher_forced_agreement,
)
from tformer_lib.serving.gqa_decode import decode_config, decode_step, filled_cache, gqa_decode_benchmark
from tformer_lib.serving.roofline import decode_cost


def tiny_decode_model(kv):
    torch.manual_seed(0)
    return make_lm(decode_config(kv, d_model=64, n_heads=4, n_layers=2, d_ff=96, vocab_size=50, max_len=64)).eval()


@pytest.mark.parametrize("kv", [4, 2, 1])
def test_filled_cache_matches_a_real_prefill_and_the_bytes_formula(kv):
    model = tiny_decode_model(kv)
    batch, t = 3, 10
    real = model.new_cache()
    with torch.no_grad():
        model(torch.randint(4, 50, (batch, t)), cache=real)
    fake = filled_cache(model, batch, t)
    assert len(fake) == len(real) == t
    for a, b in zip(fake.layers, real.layers):
        assert a.k.shape == b.k.shape == (batch, kv, t, 16) and a.k.dtype == b.k.dtype
        assert a.v.shape == b.v.shape
    assert fake.nbytes() == real.nbytes() == batch * t * lm_kv_cache_bytes_per_token(model.config)
    # 解码一步读的 K/V（新词元看 t + 1 个位置）= 这一步之后缓存真实的字节
    with torch.no_grad():
        model(torch.randint(4, 50, (batch, 1)), cache=fake)
    assert decode_cost(model.config, batch, t + 1)["bytes_parts"]["kv_cache"] == fake.nbytes()


def test_decode_step_repeats_the_same_step():
    model = tiny_decode_model(2)
    cache = filled_cache(model, 2, 12)
    step = decode_step(model, cache)
    first, second = step(), step()
    assert first.shape == (2, 1, 50)
    assert torch.equal(first, second) and len(cache) == 12
    assert cache.layers[0].k.shape[2] == 12


def test_filled_cache_refuses_a_context_without_room():
    model = tiny_decode_model(1)
    with pytest.raises(ValueError, match="max_len=64"):
        filled_cache(model, 1, 64)
    with pytest.raises(ValueError, match="batch"):
        filled_cache(model, 0, 8)


def test_benchmark_records_spreads_bytes_and_the_bytes_ratio():
    result = gqa_decode_benchmark(kv_heads=(4, 2, 1), contexts=(8, 32), batch=2, rounds=3, warmup=1, n_heads=4,
                                  d_model=64, n_layers=1, log=None)
    assert result["base"] == 4 and len(result["rows"]) == 2
    for row in result["rows"]:
        ratios = []
        for h in (4, 2, 1):
            v = row["variants"][str(h)]
            assert len(v["seconds"]) == 3
            assert v["min"] <= v["q1"] <= v["median"] <= v["q3"] <= v["max"]
            c = decode_config(h, d_model=64, n_heads=4, n_layers=1, max_len=128)
            cost = decode_cost(c, 2, row["context"] + 1)
            assert v["bytes"] == cost["bytes_parts"] and v["flops"] == cost["flops"]
            ratios.append(v["predicted_ratio_to_base"])
            assert v["predicted_seconds"] > 0
        assert ratios[0] == 1.0 and ratios[0] > ratios[1] > ratios[2] > 0
        assert row["variants"]["4"]["ratio_to_base"]["median"] == 1.0
    # 更长的缓存里 K/V 占得更多，省下的比例更大
    assert result["rows"][1]["variants"]["1"]["predicted_ratio_to_base"] < \
        result["rows"][0]["variants"]["1"]["predicted_ratio_to_base"]
    fig = plot_gqa_decode(result)
    assert len(fig.axes) == 2
    labels = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert labels == ["MHA（h_kv=4）", "GQA（h_kv=2）", "MQA（h_kv=1）"]
    # 左图的竖线是上下四分位（不是最小到最大），纵轴是对数刻度
    left = fig.axes[0]
    ends = sorted(y for coll in left.collections for seg in coll.get_segments() for y in (seg[0][1], seg[1][1]))
    q = sorted(v[k] * 1e3 for row in result["rows"] for v in row["variants"].values() for k in ("q1", "q3"))
    assert ends == pytest.approx(q)
    assert left.get_yscale() == "log"


def test_plot_gqa_decode_names_what_is_missing():
    with pytest.raises(ValueError, match="rows"):
        plot_gqa_decode({"rows": []})
    bad = {"rows": [{"context": 8, "variants": {"4": {"median": 1.0}}}], "kv_heads": [4], "model": {"n_heads": 4}}
    with pytest.raises(ValueError, match=r"\['variants'\]\['4'\]"):
        plot_gqa_decode(bad)
    assert kv_head_label(8, 8).startswith("MHA") and kv_head_label(1, 8).startswith("MQA")
    assert kv_head_label(2, 8) == "GQA（h_kv=2）"


# ---------------------------------------------------------------- bf16


def tiny_lm():
    torch.manual_seed(0)
    return make_lm(LMConfig(vocab_size=40, d_model=32, n_heads=4, n_kv_heads=2, n_layers=2, d_ff=64,
                            max_len=32)).eval()


def tiny_items():
    g = torch.Generator().manual_seed(1)
    return [WorkItem(prompt=tuple([2] + torch.randint(4, 40, (n,), generator=g).tolist()), max_new_tokens=m,
                     arrival=0.0) for n, m in ((3, 6), (7, 4), (2, 9), (5, 5), (9, 3))]


def test_bf16_engine_holds_half_the_bytes():
    model = tiny_lm()
    half = bf16_copy(model)
    assert next(model.parameters()).dtype == torch.float32  # 原模型不变
    assert parameter_bytes(half) * 2 == parameter_bytes(model)
    # 不设 EOS：每个请求都写满 max_new_tokens，调度与输出无关，两个引擎走同样的步
    out32, e32 = serve(model, tiny_items(), max_batch=2, eos_id=None, block_size=4)
    out16, e16 = serve(half, tiny_items(), max_batch=2, eos_id=None, block_size=4)
    assert e16.cache.k[0].dtype == torch.bfloat16
    assert e16.cache.bytes_per_block * 2 == e32.cache.bytes_per_block
    assert e16.peak_held_bytes * 2 == e32.peak_held_bytes > 0
    assert e16.steps == e32.steps
    assert [len(o) for o in out16] == [len(o) for o in out32] == [it.max_new_tokens for it in tiny_items()]


def test_teacher_forced_agreement_is_one_with_itself_and_drops_for_another_model():
    model = tiny_lm()
    items = tiny_items()
    prompts = [list(it.prompt) for it in items]
    outputs, _ = serve(model, items, max_batch=2, eos_id=None)
    same = teacher_forced_agreement(model, model, prompts, outputs)
    assert same["top1_agreement"] == 1.0 and same["max_abs_logit_diff"] == 0.0
    assert same["positions"] == sum(it.max_new_tokens for it in items)
    other = tiny_lm()
    with torch.no_grad():
        other.norm.weight.neg_()  # 最后一层归一化的增益取反：logits 整体取反，argmax 变成 argmin
    flipped = teacher_forced_agreement(model, other, prompts, outputs)
    assert flipped["top1_agreement"] < 0.5 and flipped["max_abs_logit_diff"] > 0
    with pytest.raises(ValueError, match="一样多"):
        teacher_forced_agreement(model, model, prompts, outputs[:-1])


def test_compare_bf16_reports_bytes_and_agreement():
    model = tiny_lm()
    result = compare_bf16(model, tiny_items(), max_batch=2, eos_id=None)
    assert result["parameter_bytes"]["bf16"] * 2 == result["parameter_bytes"]["fp32"]
    assert result["peak_held_bytes"]["bf16"] * 2 == result["peak_held_bytes"]["fp32"]
    assert result["requests"] == 5 and 0 <= result["identical_requests"] <= 5
    assert 0 <= result["tokens_before_divergence"] <= 1
    assert 0 <= result["teacher_forced"]["top1_agreement"] <= 1
    assert math.isfinite(result["teacher_forced"]["max_abs_logit_diff"])
    assert 0 <= result["bf16_engine_equals_bf16_generate"] <= 5


def test_bf16_main_refuses_an_unknown_lane(capsys):
    with pytest.raises(SystemExit) as exit_info:
        bf16_main(["--lanes", "avx2,avx9000"])
    assert exit_info.value.code == 2 and "avx9000" in capsys.readouterr().err


@pytest.mark.parametrize("kwargs, match", [
    (dict(kv_heads=(4, 4, 2)), "重复"), (dict(contexts=(8, 8)), "重复"), (dict(warmup=-1), "warmup"),
    (dict(kv_heads=4), "kv_heads"), (dict(contexts=()), "contexts"),
])
def test_benchmark_refuses_bad_sweeps_before_timing(kwargs, match):
    args = dict(kv_heads=(4, 2), contexts=(8,), n_heads=4, d_model=32, n_layers=1, rounds=2, warmup=0, batch=1, log=None)
    with pytest.raises((ValueError, TypeError), match=match):
        gqa_decode_benchmark(**{**args, **kwargs})


def test_decode_step_refuses_a_cache_of_another_shape():
    model = tiny_decode_model(2)
    with pytest.raises(ValueError, match="cache"):
        decode_step(model, None)
    with pytest.raises(ValueError, match="K/V 头"):
        decode_step(model, filled_cache(tiny_decode_model(4), 1, 8))
    with pytest.raises(TypeError, match="seed"):
        filled_cache(model, 1, 8, seed=True)
    with pytest.raises(TypeError, match="model"):
        filled_cache("x", 1, 8)


def test_teacher_forced_agreement_checks_its_inputs():
    model = tiny_lm()
    half = bf16_copy(model)
    with pytest.raises(ValueError, match=r"prompts\[0\]"):
        teacher_forced_agreement(model, half, [[]], [[3, 4]])
    with pytest.raises(ValueError, match=r"outputs\[0\]"):
        teacher_forced_agreement(model, half, [[3, 4]], [[400]])
    with pytest.raises(ValueError, match="没有可比较的位置"):
        teacher_forced_agreement(model, half, [], [])
    with pytest.raises(ValueError, match="全部"):
        teacher_forced_agreement(model, half, [[3]], [[4]], suppress_ids=range(40))


def test_compare_bf16_needs_a_float32_model_and_work():
    model = tiny_lm()
    with pytest.raises(ValueError, match="float32"):
        compare_bf16(bf16_copy(model), tiny_items(), eos_id=None)
    with pytest.raises(ValueError, match="items"):
        compare_bf16(model, [], eos_id=None)
