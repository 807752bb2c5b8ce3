"""真实规模的账本：在随书模型上，每一行都等于各章已核对过的测量；在预设上，至少一项等于测试里独立写出的闭式。"""

import dataclasses

import pytest
import torch
import torch.nn.functional as F

from tformer_lib import count_parameters
from tformer_lib.lm import LMCache, PRESETS, lm_kv_cache_bytes_per_token, load_poem_model, make_lm, parameter_breakdown
from tformer_lib.lm.data import loss_targets
from tformer_lib.lm.pretrained import poem_data
from tformer_lib.lm.training import make_adamw
from tformer_lib.measurement.memory import (
    korthikanti_activation_bytes,
    lm_activation_bytes,
    measure_activation_bytes,
    measured_model_state_bytes,
    training_memory,
)
from tformer_lib.parallel.layout import layout_parameters_per_rank
from tformer_lib.parallel.pipeline import LMStage
from tformer_lib.parallel.tensor_parallel import TensorParallelAttention, TensorParallelFFN
from tformer_lib.parallel.zero import zero_bytes_per_rank
from tformer_lib.measurement.profiling import count_training_flops
from tformer_lib.serving.roofline import decode_cost
from tformer_lib.scale import (
    ACCELERATORS,
    compute_row,
    format_table,
    ledger_table,
    memory_row,
    parallel_rows,
    parameter_row,
    serving_row,
)


@pytest.fixture(scope="module")
def poem():
    model, _, checkpoint = load_poem_model()
    return model.float().eval(), checkpoint


def _measured_kv_per_token(model, length=8):
    cache = model.new_cache()
    with torch.no_grad():
        model(torch.full((1, length), 4, dtype=torch.long), cache=cache)
    assert isinstance(cache, LMCache)
    return cache.nbytes() / length


# ---------------------------------------------------------------- 随书模型：账本 = 各章的测量


def test_chapter9_row_reads_the_shipped_checkpoint(poem):
    model, checkpoint = poem
    row = compute_row("poem")
    n = count_parameters(model)
    assert row["params"] == n and row["trained_tokens"] == checkpoint["extra"]["tokens_seen"]
    assert row["tokens_per_param"] == checkpoint["extra"]["tokens_seen"] / n
    assert row["trained_flops"] == 6 * n * checkpoint["extra"]["tokens_seen"]
    assert row["chinchilla_tokens"] == 20 * n
    # 每词元训练 FLOPs 与第 11 章的计数器一致（显式路径，快速路径的 SDPA 不在计数表里）
    explicit = make_lm(dataclasses.replace(model.config, fast_attention=False))
    tokens = torch.randint(4, model.config.vocab_size, (1, model.config.max_len))

    def step():
        F.cross_entropy(explicit(tokens).flatten(0, 1), tokens.flatten()).backward()

    assert row["counted_flops_per_token"] * model.config.max_len == count_training_flops(step)


def test_chapter10_row_equals_the_model_and_its_cache(poem):
    model, _ = poem
    row = parameter_row("poem", kv_bytes_per_element=4)
    assert row["total"] == count_parameters(model) == sum(v for k, v in parameter_breakdown(model).items() if k != "total")
    assert row["embedding"] == model.tok_embed.weight.numel() and row["head"] == 0  # 共享输出层只算一次
    assert row["kv_bytes_per_token"] == _measured_kv_per_token(model)
    # GQA：同一模型改成 1 个、2 个 K/V 头，缓存实测缩小 4 倍、2 倍
    for kv in (1, 2):
        gqa = make_lm(dataclasses.replace(model.config, n_kv_heads=kv)).eval()
        assert lm_kv_cache_bytes_per_token(gqa.config, 4) == _measured_kv_per_token(gqa)
        assert parameter_row(gqa.config, 4)["mha_over_gqa"] == model.config.n_heads / kv
    half = make_lm(model.config).eval().to(torch.bfloat16)
    assert parameter_row("poem")["kv_bytes_per_token"] == _measured_kv_per_token(half)  # 默认 2 字节


def test_chapter11_formulas_equal_what_pytorch_holds_on_the_poem_model(poem):
    model, _ = poem
    config = model.config
    data = poem_data()
    inputs, targets = loss_targets(data["train_blocks"][:2])
    inputs, targets = inputs.clone(), targets.clone()
    train = make_lm(config).train()
    account = training_memory(count_parameters(train), config, *inputs.shape, "fp32")
    assert account["activations"] == measure_activation_bytes(train, inputs, targets)
    optimizer = make_adamw(train, 1e-3)
    F.cross_entropy(train(inputs).flatten(0, 1), targets.flatten()).backward()
    optimizer.step()
    held = measured_model_state_bytes(train, optimizer)
    assert [account[k] for k in ("params", "grads", "adam_m", "adam_v")] == [held[k] for k in ("params", "grads", "adam_m", "adam_v")]
    train.set_activation_checkpointing(True)
    ckpt = training_memory(count_parameters(train), config, *inputs.shape, "fp32", checkpointing=True)
    assert ckpt["activations"] == measure_activation_bytes(train, inputs, targets)
    # 账本的行就是这些公式在混合精度、2 字节激活下的值
    row = memory_row("poem", context=64, micro_batch=3)
    mixed = training_memory(row["params"], config, 3, 64, "mixed", bytes_per_element=2)
    assert row["model_states_bytes"] == 16 * row["params"] and row["activations_bytes"] == mixed["activations"]
    assert row["total_bytes"] == mixed["total"]


def test_ours_against_korthikanti_on_the_poem_block():
    # 论文的前提：16 位激活、GPT 式的块、保存 softmax 输出（显式路径）。逐项对照：论文多出 dropout 的三个掩码
    # （注意力 a·s²·b 字节、注意力输出与 MLP 输出各 s·b·h 字节）；我们多出 LayerNorm 的均值与 1/标准差
    # （2 个归一化 × 2 × 4 字节 × s·b，论文略去）和两个 (s, s) 的布尔掩码。
    config = dataclasses.replace(load_poem_model()[0].config, fast_attention=False)
    s, b, h, a = 128, 3, config.d_model, config.n_heads
    assert config.d_ff == 4 * h and config.norm == "layer" and config.activation == "gelu"
    ours = lm_activation_bytes(config, b, s, bytes_per_element=2)["per_block"]
    paper = korthikanti_activation_bytes(config, b, s)["per_layer"]
    assert paper == s * b * h * (34 + 5 * a * s / h)
    dropout_masks = a * s * s * b + 2 * s * b * h
    assert ours == paper - dropout_masks + 2 * 2 * 4 * s * b + 2 * s * s
    assert korthikanti_activation_bytes(config, b, s, "full")["per_layer"] == 2 * s * b * h  # 只存每层输入（2 字节）


def test_chapter12_layout_counts_equal_the_chapter12_splits():
    config = dataclasses.replace(PRESETS["gpt2"], vocab_size=96, d_model=32, n_heads=4, n_layers=4, d_ff=64,
                                 max_len=16, tie_embeddings=False)
    model = make_lm(config)
    block = model.blocks[0]
    attn, ffn = TensorParallelAttention(block.self_attn, 0, 2), TensorParallelFFN(block.feed_forward, 0, 2)
    norms = count_parameters(block.residual_attn) + count_parameters(block.residual_ffn)
    per_block = count_parameters(attn) + count_parameters(ffn) + norms
    vocab = config.vocab_size * config.d_model // 2  # 词表并行：嵌入与输出层各一半
    ends = vocab + model.pos_embed.weight.numel() + vocab + count_parameters(model.norm)
    assert layout_parameters_per_rank(config, 2, 1) == [config.n_layers * per_block + ends]
    # 流水线：与 LMStage 切出的每一段参数个数相同
    assert layout_parameters_per_rank(config, 1, 2) == [count_parameters(LMStage(model, s, 2)) for s in range(2)]
    assert sum(layout_parameters_per_rank(config, 1, 1)) == count_parameters(model)
    tied = dataclasses.replace(config, tie_embeddings=True)
    assert layout_parameters_per_rank(tied, 1, 2)[1] == layout_parameters_per_rank(config, 1, 2)[1]  # 末段另存一份
    with pytest.raises(ValueError, match="tensor_parallel=3"):
        layout_parameters_per_rank(config, 3, 1)


def test_chapter12_and_13_rows_on_the_poem_model():
    rows = parallel_rows("poem", world_size=2, micro_batches=4)
    n = compute_row("poem")["params"]
    zero = {r["layout"]: r for r in rows}
    for stage in range(4):
        expected = zero_bytes_per_rank(n, 2, stage, param_bytes=2, grad_bytes=2, optimizer_bytes=12)["total"]
        assert zero[f"DP×2 ZeRO-{stage}"]["model_states_bytes_per_gpu"] == expected
    assert zero["DP×2 ZeRO-0"]["all_reduce_payload_bytes"] == 2 * n
    assert zero["TP×1 PP×2"]["bubble"] == 1 / 5
    row = serving_row("poem")
    cost = decode_cost(load_poem_model()[0].config, 1, 128, bytes_per_element=2)
    assert (row["decode_flops"], row["decode_bytes"]) == (cost["flops"], cost["bytes"])


# ---------------------------------------------------------------- 预设：与测试里独立写出的闭式相等


def test_llama2_7b_against_hand_closed_forms():
    L, d, V, f, T = 32, 4096, 32000, 11008, 4096
    n = V * d + L * (4 * d * d + 3 * d * f + 2 * d) + d + V * d  # 嵌入 + 块（注意力、SwiGLU、两个 RMSNorm）+ 末层归一化 + 输出层
    p = parameter_row("llama-2-7b")
    assert p["total"] == n and p["kv_bytes_per_token"] == 2 * 32 * 4096 * 2  # K 与 V × 32 层 × 4096 × fp16
    c = compute_row("llama-2-7b")
    weights = L * (4 * d * d + 3 * d * f) + d * V  # 矩阵乘法的权重（词嵌入是查表）
    assert c["counted_flops_per_token"] == 6 * weights + 12 * L * T * d  # 前向 2W + QKᵀ、AV 各 2·T·d 每层，×3
    assert c["trained_flops"] == 6 * n * 2 * 10**12
    m = memory_row("llama-2-7b")
    assert m["model_states_bytes"] == 16 * n and m["weights_bytes"] == 2 * n
    s = serving_row("llama-2-7b")
    assert s["sessions_fp16"] == 80 * 10**9 // (T * 2 * L * d * 2)
    assert s["sessions_int8"] == 80 * 10**9 // (T * 2 * L * d * 1)
    h100 = ACCELERATORS["H100-SXM"]
    # batch 1 的解码远低于机器平衡点：时间 = 搬动的字节 ÷ 带宽
    assert s["decode_flops"] / s["decode_bytes"] < h100["bf16_flops"] / h100["bandwidth"]
    assert s["decode_ms_H100-SXM"] == pytest.approx(1e3 * s["decode_bytes"] / h100["bandwidth"], rel=1e-12)
    assert s["decode_bytes"] > 2 * weights + T * 2 * L * d * 2  # 至少读一遍 fp16 权重与整个缓存


def test_decode_time_only_where_the_weights_fit_on_the_card():
    s = serving_row("llama-2-70b")
    weights = 2 * s["params"]  # fp16
    assert weights > 80 * 10**9 and weights + s["kv_fp16_session_bytes"] <= ACCELERATORS["H200-SXM"]["memory_bytes"]
    assert s["decode_ms_A100-80GB-SXM"] is None and s["decode_ms_H100-SXM"] is None
    assert s["decode_ms_H200-SXM"] == pytest.approx(1e3 * s["decode_bytes"] / ACCELERATORS["H200-SXM"]["bandwidth"])
    # 权重那份字节只数矩阵乘法的权重（输入嵌入是查表、归一化的增益不算），所以小于 2 × 参数数
    seven = serving_row("llama-2-7b")
    L, d, V, f = 32, 4096, 32000, 11008
    assert seven["decode_weight_bytes"] == 2 * (L * (4 * d * d + 3 * d * f) + d * V)
    assert 0.8 < seven["decode_weight_bytes"] / seven["decode_bytes"] < 2 * seven["params"] / seven["decode_bytes"]


def test_llama2_70b_gqa_and_layouts():
    p = parameter_row("llama-2-70b")
    assert p["kv_bytes_per_token"] == 2 * 80 * 8 * 128 * 2 and p["kv_bytes_per_token_mha"] == 2 * 80 * 8192 * 2
    rows = {r["layout"]: r for r in parallel_rows("llama-2-70b", world_size=8)}
    n = p["total"]
    assert rows["DP×8 ZeRO-3"]["model_states_bytes_per_gpu"] == 16 * n / 8
    tp8 = rows["TP×8 PP×1"]
    # TP=8：块内矩阵与词表各 1/8，归一化每卡一份
    d, L = 8192, 80
    assert tp8["params_per_gpu"] == (n - (2 * L + 1) * d) // 8 + (2 * L + 1) * d
    assert tp8["all_reduce_payload_bytes"] == 8 * 4 * L * 4096 * d * 2  # 8 个微批 × 每块 4 次 × (1, T, d) bf16


def test_ledger_table_covers_every_chapter_and_formats():
    models = ("poem", "qwen2.5-0.5b")
    for chapter in (9, 10, 11, 13):
        rows = ledger_table(chapter, presets=models)
        assert [r["name"] for r in rows] == list(models)
        assert format_table(rows).count("\n") == len(rows)
    assert len(ledger_table(12, presets="poem", world_size=4)) == 4 + 3  # ZeRO 0–3 + (4,1)、(2,2)、(1,4)
    assert ledger_table(13, presets=[PRESETS["gpt2"]])[0]["context"] == 1024  # 超过 max_len 时按 max_len 算
    with pytest.raises(ValueError, match="chapter"):
        ledger_table(8)
    with pytest.raises(ValueError, match="llama-9"):
        compute_row("llama-9")
