"""第 14 章的工具：编译路径上的推测解码（eager 下核对与贪心逐词元相同）、一步解码的时间分解（四份之和 = 实测总时间）、
FLOP 与字节下限（= 第 13 章的公式 ÷ 速率）、同一份权重的 GPT-2 孪生模型（logits 与贪心输出与我们的相同）。"""

import pytest
import torch

from tformer_lib.lm import LMConfig, generate, load_poem_model, make_lm
from tformer_lib.inference import StaticDecoder
from tformer_lib.inference.breakdown import CATEGORIES, categorize_op, profile_breakdown
from tformer_lib.inference.floors import decode_floors, times_above_floor
from tformer_lib.inference.speculative import CompiledSpeculative
from tformer_lib.serving.roofline import decode_cost
from tformer_lib.serving.speculative import layer_skip_draft


def small(seed, **kw):
    torch.manual_seed(seed)
    config = dict(vocab_size=70, d_model=32, n_heads=4, n_layers=3, d_ff=64, max_len=64)
    config.update(kw)
    model = make_lm(LMConfig(**config)).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(10.0)
    return model


@pytest.mark.parametrize("k", [1, 2, 4])
def test_speculative_on_static_caches_equals_greedy(k):
    target = small(0)
    for draft in (small(1, n_layers=1, d_model=16, n_heads=2), layer_skip_draft(target, 1)):
        runner = CompiledSpeculative(target, draft, k, compile=False)
        for prompt in ([2, 5, 6], [2, 9, 10, 11, 12]):
            out, stats = runner.generate(prompt, 30)
            assert out == generate(target, prompt, 30, method="greedy").tolist()
            assert stats.target_passes < 30 or stats.accepted == 0  # 接受过草稿时验证次数少于词元数
            assert stats.proposed == k * stats.target_passes


def test_speculative_with_the_trained_draft_accepts_and_stops_at_eos():
    from tformer_lib.serving.draft import load_draft_model

    target, _, _ = load_poem_model()
    draft, _, _ = load_draft_model()
    prompt = [2, 40, 41, 42]
    free = generate(target, prompt, 20, method="greedy").tolist()
    out, stats = CompiledSpeculative(target, draft, 2, compile=False).generate(prompt, 20)
    assert out == free and stats.accepted > 0
    eos = free[6]
    out, _ = CompiledSpeculative(target, draft, 2, compile=False).generate(prompt, 20, eos_id=eos)
    assert out == generate(target, prompt, 20, method="greedy", eos_id=eos).tolist()[: len(out)] and out[-1] == eos
    with pytest.raises(ValueError, match="k="):
        CompiledSpeculative(target, draft, 2, compile=False).generate(prompt, 124)


def test_breakdown_parts_sum_to_the_measured_total():
    model = small(2)
    decoder = StaticDecoder(model, compile=False)
    cache, tokens = decoder.cache(1), torch.tensor([[5]])
    slot, pads = torch.tensor([7]), torch.zeros(1, dtype=torch.long)

    def step():
        with torch.no_grad():
            decoder.decode_step(cache, tokens, slot, pads)

    parts = profile_breakdown(step, steps=5, warmup=1)
    assert sum(parts[c] for c in CATEGORIES) == pytest.approx(parts["total"], rel=1e-9)
    assert all(parts[c] >= 0 for c in CATEGORIES) and parts["matmul"] > 0 and parts["overhead"] > 0
    linear_calls = sum(n for name, n in parts["calls"].items() if categorize_op(name) == "matmul" and "addmm" in name)
    assert linear_calls == 3 * 6  # 每块 W^Q、W^K、W^V、W^O、W_1、W_2 六个带偏置的线性层（输出层无偏置，是 mm）
    assert categorize_op("TorchDynamo Cache Lookup") == "overhead" and categorize_op("aten::view") == "overhead"
    assert categorize_op("aten::_scaled_dot_product_flash_attention_for_cpu") == "attention"
    assert categorize_op("aten::layer_norm") == "other"
    with pytest.raises(ValueError, match="steps"):
        profile_breakdown(step, steps=0)


def test_floors_are_the_roofline_formulas_over_the_rates():
    config = LMConfig(vocab_size=500, d_model=64, n_heads=4, n_layers=2, d_ff=256, max_len=64)
    floors = decode_floors(config, 4, 32, peak_flops=1e11, bandwidth=2e10)
    cost = decode_cost(config, 4, 32)
    assert floors["flop_floor_s"] == pytest.approx(cost["flops"] / 1e11)
    assert floors["byte_floor_s"] == pytest.approx(cost["bytes"] / 2e10)
    assert floors["floor_s"] == max(floors["flop_floor_s"], floors["byte_floor_s"])
    above = times_above_floor(2 * floors["byte_floor_s"], floors)
    assert above["vs_bytes"] == pytest.approx(2.0)
    with pytest.raises(ValueError, match="bandwidth"):
        decode_floors(config, 1, 8, peak_flops=1e11, bandwidth=0)


def test_gpt2_twin_has_our_logits_and_our_greedy_tokens():
    pytest.importorskip("transformers")
    from tformer_lib.inference.hf_twin import to_gpt2

    model = small(3)
    hf = to_gpt2(model)
    x = torch.randint(3, 70, (2, 9), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(hf(x).logits, model(x), rtol=1e-5, atol=1e-5)
    ours = generate(model, x, 12, method="greedy")
    theirs = hf.generate(x, max_new_tokens=12, min_new_tokens=12, do_sample=False, suppress_tokens=[0, 1],
                         pad_token_id=0, eos_token_id=None)[:, 9:]
    assert torch.equal(theirs, ours)
    with pytest.raises(ValueError, match="GPT-2"):
        to_gpt2(small(4, positional="rope"))
