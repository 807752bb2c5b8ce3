"""一个训练步的内存账本：每一项公式与 PyTorch 实际分配/保存的字节逐项相等（随书的唐诗模型上），梯度累积等于大批。"""

import dataclasses
import itertools
import random

import pytest
import torch

from tformer_lib import BOS, EOS
from tformer_lib.lm import LMConfig, make_lm
from tformer_lib.lm.data import loss_targets, pack_documents
from tformer_lib.lm.pretrained import poem_data, poem_model_config
from tformer_lib.lm.training import LMTrainer, make_adamw
from tformer_lib.measurement.memory import (
    BYTES_PER_PARAMETER,
    lm_activation_bytes,
    measure_activation_bytes,
    measured_model_state_bytes,
    model_state_bytes,
    parameter_count,
    training_step_memory,
)


@pytest.fixture(scope="module")
def poem():
    data = poem_data()
    return data, poem_model_config(data["tokenizer"].vocab_size)


def poem_batch(data, batch=2):
    inputs, targets = loss_targets(data["train_blocks"][:batch])  # (B, 128), (B, 128)
    return inputs.clone(), targets.clone()  # 自己的存储：否则“保存的词元”会算上整个训练集的那块存储


def test_bytes_per_parameter_is_16_for_fp32_and_for_mixed_precision():
    assert {k: sum(v.values()) for k, v in BYTES_PER_PARAMETER.items()} == {"fp32": 16, "autocast": 16, "mixed": 16}
    mixed = model_state_bytes(1000, "mixed")
    assert mixed["params"] == 2000 and mixed["master"] == 4000 and mixed["total"] == 16_000
    assert model_state_bytes(1000)["bytes_per_parameter"] == 16


@pytest.mark.parametrize("tie", [True, False])
def test_model_states_equal_what_adamw_allocates_on_the_poem_model(poem, tie):
    data, config = poem
    config = dataclasses.replace(config, tie_embeddings=tie)
    model = make_lm(config)
    n = parameter_count(model)
    assert n == sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())
    if tie:  # 共享的矩阵只算一次
        assert model.lm_head.weight is model.tok_embed.weight
    optimizer = make_adamw(model, 1e-3)
    inputs, targets = poem_batch(data)
    loss = torch.nn.functional.cross_entropy(model(inputs).flatten(0, 1), targets.flatten())
    loss.backward()
    optimizer.step()
    measured = measured_model_state_bytes(model, optimizer)
    formula = model_state_bytes(n, "fp32")
    for part in ("params", "grads", "adam_m", "adam_v"):
        assert measured[part] == formula[part], part
    assert measured["step"] == 4 * len(list(model.parameters()))  # 每个参数张量一个 0 维 float32 的步数
    assert measured["other"] == 0


@pytest.mark.parametrize("fast", [True, False])
def test_activation_formula_equals_saved_tensors_on_the_poem_model(poem, fast):
    data, config = poem
    config = dataclasses.replace(config, fast_attention=fast)
    model = make_lm(config).train()
    inputs, targets = poem_batch(data)
    formula = lm_activation_bytes(config, *inputs.shape)
    assert measure_activation_bytes(model, inputs, targets) == formula["total"]
    # 显式路径多存两份 (B, h, T, T)，快速路径只存每行一个 logsumexp
    if not fast:
        assert formula["attention"] > lm_activation_bytes(poem_model_config(config.vocab_size), *inputs.shape)["attention"]


OPTIONS = list(itertools.product((False, True), ("layer", "rms"), ("relu", "gelu", "swiglu"),
                                 ("learned", "sinusoidal", "rope", "none"), (True, False)))


@pytest.mark.parametrize("fast,norm,activation,positional,norm_first", random.Random(0).sample(OPTIONS, 24))
@pytest.mark.parametrize("size", [(3, 7), (1, 16)])
def test_activation_formula_for_every_block_variant(fast, norm, activation, positional, norm_first, size):
    config = LMConfig(50, d_model=24, n_heads=4, n_layers=2, d_ff=40, max_len=16, fast_attention=fast, norm=norm,
                      activation=activation, positional=positional, norm_first=norm_first, tie_embeddings=fast)
    model = make_lm(config).train()
    tokens, targets = torch.randint(4, 50, size), torch.randint(4, 50, size)
    assert measure_activation_bytes(model, tokens, targets) == lm_activation_bytes(config, *size)["total"]


@pytest.mark.parametrize("fast,activation,positional,qkv_bias", [
    (False, "swiglu", "rope", False), (True, "swiglu", "rope", True), (False, "gelu_tanh", "learned", True),
    (True, "relu", "none", False)])
@pytest.mark.parametrize("n_kv_heads", [1, 2])
def test_activation_formula_covers_grouped_query_attention(fast, activation, positional, qkv_bias, n_kv_heads):
    # GQA 把 K/V 头复制给查询头后再打分：保存的张量与普通 MHA 一样多，公式不变；有无偏置也不改变保存的张量
    config = LMConfig(50, d_model=24, n_heads=4, n_kv_heads=n_kv_heads, n_layers=2, d_ff=40, max_len=16, norm="rms",
                      fast_attention=fast, activation=activation, positional=positional, tie_embeddings=False,
                      qkv_bias=qkv_bias, out_bias=False, ffn_bias=False, norm_eps=1e-6)
    model = make_lm(config).train()
    tokens, targets = torch.randint(4, 50, (3, 7)), torch.randint(4, 50, (3, 7))
    assert measure_activation_bytes(model, tokens, targets) == lm_activation_bytes(config, 3, 7)["total"]


def test_training_step_memory_adds_states_and_activations(poem):
    _, config = poem
    model = make_lm(config)
    account = training_step_memory(model, 16, 128)
    n = parameter_count(model)
    assert account["params"] == 4 * n and account["activations"] == lm_activation_bytes(config, 16, 128)["total"]
    assert account["total"] == 16 * n + account["activations"]


def test_memory_errors_are_clear():
    config = LMConfig(50, d_model=24, n_heads=4, n_layers=1, d_ff=40, max_len=16, dropout=0.1)
    with pytest.raises(ValueError, match="dropout=0.1"):
        lm_activation_bytes(config, 2, 8)
    with pytest.raises(TypeError, match="LMConfig"):
        lm_activation_bytes(object(), 2, 8)
    with pytest.raises(ValueError, match="precision"):
        model_state_bytes(10, "fp8")
    with pytest.raises(ValueError, match="batch"):
        lm_activation_bytes(LMConfig(50, max_len=16), 0, 8)


# ---------------------------------------------------------------- 梯度累积 = 大批


def padded_blocks(seed=0):
    """块尾带 PAD 的训练数据：各微批的有效目标数不同，按“总和 / 整批目标数”加权才等于大批。"""
    rng = random.Random(seed)
    docs = [[BOS] + [rng.randrange(4, 24) for _ in range(rng.randrange(3, 20))] + [EOS] for _ in range(200)]
    return pack_documents(docs, 25)


@pytest.mark.parametrize("steps", [2, 4, 8])
def test_gradient_accumulation_equals_the_large_batch(steps):
    blocks = padded_blocks()
    assert (blocks == 0).any()  # 有 PAD
    runs = []
    for k in (1, steps):
        torch.manual_seed(0)
        model = make_lm(LMConfig(24, d_model=32, n_heads=4, n_layers=2, d_ff=64, max_len=32))
        trainer = LMTrainer(model, blocks, batch_size=8, warmup=2, total_steps=5, accumulation_steps=k)
        trainer.fit()
        runs.append((trainer.history["step_loss"], [p.detach().clone() for p in model.parameters()]))
    (loss1, params1), (loss_k, params_k) = runs
    assert loss1 == pytest.approx(loss_k, abs=1e-6)
    assert max((a - b).abs().max().item() for a, b in zip(params1, params_k)) < 1e-5


def test_accumulation_arguments_are_checked():
    model = make_lm(LMConfig(24, d_model=32, n_heads=4, n_layers=1, d_ff=64, max_len=32))
    with pytest.raises(ValueError, match="accumulation_steps=3"):
        LMTrainer(model, padded_blocks(), batch_size=8, accumulation_steps=3)
    with pytest.raises(ValueError, match="accumulation_steps"):
        LMTrainer(model, padded_blocks(), batch_size=8, accumulation_steps=0)
    with pytest.raises(ValueError, match="autocast"):
        LMTrainer(model, padded_blocks(), batch_size=8, autocast="fp8")


@pytest.mark.parametrize("n_heads,d_k,size", [(2, 4, (2, 1)), (1, 4, (2, 3)), (2, 2, (2, 5)), (4, 2, (1, 1))])
def test_activation_formula_edge_shapes_with_rope_on_the_fast_path(n_heads, d_k, size):
    # T = 1 或 h = 1：拼接各头不必复制；d_k = 2：旋转后的 q 仍是连续的，SDPA 不退回数学后端
    config = LMConfig(13, d_model=n_heads * d_k, n_heads=n_heads, n_layers=2, d_ff=10, max_len=8, positional="rope",
                      fast_attention=True, tie_embeddings=False)
    model = make_lm(config).train()
    tokens, targets = torch.randint(4, 13, size), torch.randint(4, 13, size)
    assert measure_activation_bytes(model, tokens, targets) == lm_activation_bytes(config, *size)["total"]
