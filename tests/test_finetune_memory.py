"""QLoRA 与微调的内存账本：量化底座上的梯度、反向不存浮点权重、激活与模型状态的公式等于 PyTorch 实际保存/持有的字节。"""

import copy

import pytest
import torch
import torch.nn.functional as F

from tformer_lib.finetune import LoRALinear, apply_lora, merge_lora, trainable_parameters
from tformer_lib.finetune.memory import finetune_memory, lora_activation_bytes, lora_parameter_count
from tformer_lib.finetune.qlora import apply_qlora
from tformer_lib.lm import PRESETS, LMConfig, make_lm, make_adamw
from tformer_lib.measurement.memory import lm_activation_bytes, measure_activation_bytes, measured_model_state_bytes
from tformer_lib.quant import Int4Linear, Int8Linear
from tformer_lib.quant.sizes import parameter_count, tensor_bytes, weight_bytes

CONFIGS = {
    "poem-like": dict(positional="learned", norm="layer", activation="gelu", tie_embeddings=True),
    "llama-like": dict(positional="rope", norm="rms", activation="swiglu", tie_embeddings=False, n_kv_heads=2),
    "relu": dict(positional="sinusoidal", norm="layer", activation="relu", tie_embeddings=False),
}
TARGET_SETS = [("w_q",), ("w_k",), ("w_v",), ("w_o",), ("w_1",), ("w_2",), ("w_q", "w_v"), ("w_1", "w_2"),
               ("w_o", "w_2"), ("w_q", "w_k", "w_v", "w_o", "w_1", "w_2")]


def _config(name, **kw):
    base = dict(vocab_size=100, d_model=64, n_heads=4, n_layers=2, d_ff=128, max_len=32, norm_first=True,
                fast_attention=True)
    return LMConfig(**{**base, **CONFIGS[name], **kw})


def _model(name):
    torch.manual_seed(0)
    return make_lm(_config(name)).train()


def _batch(batch=3, length=32):
    g = torch.Generator().manual_seed(1)
    return torch.randint(3, 100, (batch, length), generator=g), torch.randint(3, 100, (batch, length), generator=g)


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_lora_and_qlora_activation_formula_equals_what_autograd_saves(name):
    model = _model(name)
    tokens, targets = _batch()
    sets = TARGET_SETS + ([("w_3",), ("w_1", "w_3", "w_2")] if CONFIGS[name]["activation"] == "swiglu" else [])
    full = measure_activation_bytes(model, tokens, targets)
    assert full == lm_activation_bytes(model.config, 3, 32)["total"]
    for targets_ in sets:
        want = lora_activation_bytes(model.config, 3, 32, targets_, rank=8)["total"]
        lora = apply_lora(copy.deepcopy(model), 8, 16, targets=targets_)
        assert measure_activation_bytes(lora, tokens, targets) == want, targets_
        for fmt in ("int8", "int4-g32"):
            qlora = apply_qlora(copy.deepcopy(model), 8, 16, targets=targets_, fmt=fmt)
            assert measure_activation_bytes(qlora, tokens, targets) == want, (targets_, fmt)
        assert want < full  # 冻结的层不存输入：LoRA 的激活比全量微调少


def test_quantized_layers_pass_gradients_to_their_input_without_saving_a_float_weight():
    torch.manual_seed(0)
    linear = torch.nn.Linear(64, 24)
    for layer in (Int8Linear.from_linear(linear), Int4Linear.from_linear(linear, 32)):
        x = torch.randn(5, 64, requires_grad=True)
        saved = []
        with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
            y = layer(x)
        assert not any(t.shape == (24, 64) for t in saved)  # 反量化的权重不为反向保存
        (y * torch.arange(24.0)).sum().backward()
        x2 = x.detach().clone().requires_grad_(True)
        (F.linear(x2, layer.dequantized_weight(), layer.bias) * torch.arange(24.0)).sum().backward()
        assert torch.allclose(x.grad, x2.grad, atol=1e-5)
        with torch.no_grad():
            assert torch.allclose(layer(x), F.linear(x, layer.dequantized_weight(), layer.bias), atol=1e-5)


def test_qlora_trains_the_same_function_as_lora_on_the_dequantized_model():
    base = _model("llama-like")
    qlora = apply_qlora(copy.deepcopy(base), 4, 8, targets=("w_q", "w_v", "w_2"), fmt="int4-g32")
    dequantized = copy.deepcopy(qlora)
    for m in dequantized.modules():
        if isinstance(m, LoRALinear):
            m.dequantize_base()
    assert not any(isinstance(m, LoRALinear) and m.quantized for m in dequantized.modules())
    with torch.no_grad():
        for a, b in zip(qlora.modules(), dequantized.modules()):
            if isinstance(a, LoRALinear):
                b.lora_B.normal_(generator=torch.Generator().manual_seed(2))
                a.lora_B.copy_(b.lora_B)
    tokens, _ = _batch(2, 16)
    q_out, d_out = qlora(tokens), dequantized(tokens)
    # 未适配的层在 qlora 里仍是量化层，在 dequantized 里也仍是量化层：两边是同一个函数
    assert float((q_out - d_out).detach().abs().max()) < 1e-5
    q_out.square().mean().backward()
    d_out.square().mean().backward()
    for a, b in zip(qlora.modules(), dequantized.modules()):
        if isinstance(a, LoRALinear):
            assert torch.allclose(a.lora_A.grad, b.lora_A.grad, atol=1e-6, rtol=1e-4)
            assert torch.allclose(a.lora_B.grad, b.lora_B.grad, atol=1e-6, rtol=1e-4)
    assert trainable_parameters(qlora) == lora_parameter_count(base.config, 4, ("w_q", "w_v", "w_2"))
    with torch.no_grad():
        merged = merge_lora(copy.deepcopy(qlora))
        assert not any(isinstance(m, LoRALinear) for m in merged.modules())
        assert float((merged(tokens) - q_out).abs().max()) < 1e-4
    with pytest.raises(TypeError, match="反量化"):
        next(m for m in qlora.modules() if isinstance(m, LoRALinear)).merge()


def test_qlora_refuses_bad_arguments_before_touching_the_model():
    model = _model("poem-like")
    before = copy.deepcopy(model.state_dict())
    for kwargs, match in ((dict(rank=0), "rank"), (dict(alpha=-1), "alpha"), (dict(targets=("w_x",)), "w_x"),
                          (dict(fmt="int3"), "fmt"), (dict(fmt="bf16"), "fmt")):
        args = dict(rank=4, alpha=8, targets=("w_q",), fmt="int8") | kwargs
        with pytest.raises((TypeError, ValueError), match=match):
            apply_qlora(model, **args)
    assert not any(isinstance(m, (Int8Linear, Int4Linear)) for m in model.modules())
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())


@pytest.mark.parametrize("method,fmt", [("full", None), ("lora", "fp32"), ("qlora", "int4-g32"), ("qlora", "int8")])
def test_model_state_formula_equals_what_pytorch_holds_after_one_step(method, fmt):
    model = _model("poem-like")
    targets_ = ("w_q", "w_v", "w_1")
    if method == "lora":
        apply_lora(model, 4, 8, targets=targets_)
    elif method == "qlora":
        apply_qlora(model, 4, 8, targets=targets_, fmt=fmt)
    optimizer = make_adamw(model, 1e-3)
    tokens, targets = _batch()
    F.cross_entropy(model(tokens).flatten(0, 1), targets.flatten()).backward()
    optimizer.step()
    held = measured_model_state_bytes(model, optimizer)
    want = finetune_memory(model.config, method, batch=3, length=32, rank=4, targets=targets_, base_format=fmt)
    assert want["trainable"] == trainable_parameters(model)
    assert held["grads"] == want["grads"] and held["adam_m"] + held["adam_v"] == want["adam"]
    assert tensor_bytes(model) == want["weights"]  # 参数 + 量化层的整数 buffer 与比例因子
    assert measure_activation_bytes(model, tokens, targets) == want["activations"]


def test_real_model_rows_follow_the_parameter_count():
    c = PRESETS["llama-2-7b"]
    full = finetune_memory(c, "full", batch=1, length=2048, activation_bytes=2)
    lora = finetune_memory(c, "lora", batch=1, length=2048, rank=16, base_format="bf16", activation_bytes=2)
    qlora = finetune_memory(c, "qlora", batch=1, length=2048, rank=16, rest_format="bf16", activation_bytes=2)
    n = parameter_count(c)
    assert full["weights"] + full["grads"] + full["adam"] == 16 * n
    per_layer = 16 * ((c.d_model + c.d_model) + (c.d_model + c.kv_heads * c.d_k))  # r·(in+out)，W^Q 与 W^V
    assert lora["trainable"] == qlora["trainable"] == c.n_layers * per_layer
    assert lora["weights"] == weight_bytes(c, "bf16") + 4 * lora["trainable"]
    assert qlora["weights"] == weight_bytes(c, "int4-g64", torch.bfloat16) + 4 * qlora["trainable"]
    assert qlora["total"] < lora["total"] < full["total"]
    with pytest.raises(ValueError, match="method"):
        finetune_memory(c, "adapter", batch=1, length=8)
    with pytest.raises(ValueError, match="base_format"):
        finetune_memory(c, "qlora", batch=1, length=8, base_format="bf16")
    with pytest.raises(ValueError, match="w_3"):
        lora_parameter_count(_config("poem-like"), 4, ("w_3",))
    with pytest.raises(ValueError, match="fast_attention"):
        lora_activation_bytes(_config("poem-like", fast_attention=False), 1, 8)
