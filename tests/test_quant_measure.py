"""量化测量脚本的部件：经过缓存的困惑度在普通缓存下等于 lm_perplexity；int8 K/V 真的改变了它；
在随书模型上的小规模测量跑得通、字节与公式一致（数字本身不作结论，完整结果在 results/quantization.json）。"""

import json

import pytest
import torch

from tformer_lib.lm import LMConfig, lm_perplexity, make_lm
from tformer_lib.quant import kv_bytes_per_token, use_int8_kv_cache, weight_bytes
from tformer_lib.quant.measure import ROWS, measure_quantization, perplexity_through_cache


def test_perplexity_through_a_plain_cache_equals_lm_perplexity_and_int8_kv_changes_it():
    torch.manual_seed(0)
    model = make_lm(LMConfig(vocab_size=50, d_model=32, n_heads=4, n_layers=2, d_ff=64, max_len=16)).eval()
    with torch.no_grad():
        for block in model.blocks:
            block.self_attn.w_k.weight.mul_(20)
    inputs = torch.randint(3, 50, (10, 12))
    targets = torch.cat([inputs[:, 1:], torch.zeros(10, 1, dtype=torch.long)], dim=1)  # 末位是 PAD，不计
    plain = perplexity_through_cache(model, inputs, targets, batch_size=4)
    assert plain == pytest.approx(lm_perplexity(model, inputs, targets, batch_size=4), rel=1e-6)
    quantized = perplexity_through_cache(use_int8_kv_cache(model), inputs, targets, batch_size=4)
    assert quantized[1] != plain[1] and quantized[1] == pytest.approx(plain[1], rel=0.05)


@pytest.mark.slow
def test_small_measurement_on_the_shipped_model():
    from tformer_lib.lm import load_poem_model
    from tformer_lib.lm.data import encode_documents, loss_targets, pad_documents, split_documents

    model, tokenizer, _ = load_poem_model()
    data = {"test": loss_targets(pad_documents(encode_documents(split_documents("test")[:8], tokenizer)))}  # 只要 8 首
    rows = [r for r in ROWS if r[0] in ("fp32", "int4-g128", "int8-kv")]
    table = measure_quantization(model, tokenizer, data, rows=rows, n_samples=2)
    by_name = {r["name"]: r for r in table}
    assert by_name["fp32"]["top1_agreement_vs_first_row"] == 1.0
    assert by_name["int4-g128"]["weight_bytes"] == weight_bytes(model, "int4-g128")
    assert by_name["int8-kv"]["kv_bytes_per_token"] == kv_bytes_per_token(model, "int8")
    assert by_name["int8-kv"]["weight_bytes"] == by_name["fp32"]["weight_bytes"]
    assert 0 < by_name["int4-g128"]["max_abs_logit_diff_vs_first_row"]
    json.dumps(table)  # 结果能直接写进 JSON
    assert next(model.parameters()).dtype == torch.float32 and type(model.blocks[0].self_attn.w_q) is torch.nn.Linear
