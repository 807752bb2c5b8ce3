"""激活重算（activation checkpointing）：梯度与不重算时相同，保存的激活字节按公式减少，推理与生成不受影响。"""

import dataclasses

import pytest
import torch
import torch.nn.functional as F

from tformer_lib.lm import LMConfig, generate, make_lm
from tformer_lib.lm.data import loss_targets
from tformer_lib.lm.pretrained import poem_data, poem_model_config
from tformer_lib.lm.training import LMTrainer
from tformer_lib.measurement.memory import lm_activation_bytes, measure_activation_bytes


def grads(model, tokens, targets):
    model.zero_grad(set_to_none=True)
    torch.manual_seed(1)  # dropout 的随机数：重算时 checkpoint 会恢复同一状态
    loss = F.cross_entropy(model(tokens).flatten(0, 1), targets.flatten())
    loss.backward()
    return loss.detach(), [p.grad.clone() for p in model.parameters()]


@pytest.mark.parametrize("options", [
    dict(),
    dict(fast_attention=True),
    dict(positional="rope", norm="rms", activation="swiglu"),
    dict(norm_first=False, n_kv_heads=2),
    dict(dropout=0.2),
    dict(dropout=0.1, fast_attention=True, positional="sinusoidal"),
])
def test_checkpointing_gives_identical_gradients(options):
    torch.manual_seed(0)
    model = make_lm(LMConfig(40, d_model=32, n_heads=4, n_layers=3, d_ff=48, max_len=24, **options)).train()
    tokens, targets = torch.randint(4, 40, (3, 20)), torch.randint(4, 40, (3, 20))
    loss_a, grads_a = grads(model, tokens, targets)
    model.set_activation_checkpointing(True)
    loss_b, grads_b = grads(model, tokens, targets)
    assert torch.equal(loss_a, loss_b)
    for a, b in zip(grads_a, grads_b):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-7)


@pytest.mark.parametrize("fast", [True, False])
def test_checkpointing_saves_the_block_activations_on_the_poem_model(fast):
    data = poem_data()
    config = dataclasses.replace(poem_model_config(data["tokenizer"].vocab_size), fast_attention=fast)
    model = make_lm(config).train()
    inputs, targets = (t.clone() for t in loss_targets(data["train_blocks"][:4]))  # (4, 128)
    full = measure_activation_bytes(model, inputs, targets)
    model.set_activation_checkpointing(True)
    kept = measure_activation_bytes(model, inputs, targets)
    formula = lm_activation_bytes(config, 4, 128, checkpointing=True)
    assert kept == formula["total"]
    assert full - kept == lm_activation_bytes(config, 4, 128)["total"] - formula["total"]
    # 省下的正是 N 块的块内激活，减去每块留下的输入
    assert full - kept == config.n_layers * formula["per_block"] - formula["block_inputs"]
    assert kept < full


@pytest.mark.parametrize("fast", [True, False])
@pytest.mark.parametrize("positional", ["rope", "learned"])
def test_checkpointing_formula_matches_autograd_for_rope_and_learned_positions(fast, positional):
    # RoPE 的 cos/sin 表不重算时各层共用、存一次；重算时随块内的激活一起不存（公式里 "rope" 为 0）
    config = LMConfig(50, d_model=24, n_heads=4, n_kv_heads=2, n_layers=2, d_ff=40, max_len=16, norm="rms",
                      activation="swiglu", positional=positional, fast_attention=fast, tie_embeddings=False)
    model = make_lm(config).train()
    tokens, targets = torch.randint(4, 50, (3, 7)), torch.randint(4, 50, (3, 7))
    for checkpointing in (False, True):
        model.set_activation_checkpointing(checkpointing)
        formula = lm_activation_bytes(config, 3, 7, checkpointing=checkpointing)
        assert measure_activation_bytes(model, tokens, targets) == formula["total"]
        assert (formula["rope"] > 0) == (positional == "rope" and not checkpointing)


def test_checkpointing_does_not_change_inference_or_generation():
    torch.manual_seed(0)
    model = make_lm(LMConfig(40, d_model=32, n_heads=4, n_layers=2, d_ff=48, max_len=24)).eval()
    prompt = torch.randint(4, 40, (1, 5))
    plain = generate(model, prompt, max_new_tokens=6, method="greedy")
    with torch.no_grad():
        logits = model(prompt)
    model.set_activation_checkpointing(True)
    assert torch.equal(generate(model, prompt, max_new_tokens=6, method="greedy"), plain)
    with torch.no_grad():
        assert torch.equal(model(prompt), logits)


def test_trainer_flag_trains_the_same_losses():
    blocks = torch.randint(4, 40, (32, 17))
    histories = []
    for flag in (False, True):
        torch.manual_seed(0)
        model = make_lm(LMConfig(40, d_model=32, n_heads=4, n_layers=2, d_ff=48, max_len=16))
        trainer = LMTrainer(model, blocks, batch_size=8, warmup=2, total_steps=4, activation_checkpointing=flag)
        trainer.fit()
        assert model.activation_checkpointing is flag
        histories.append(trainer.history["step_loss"])
    assert histories[0] == pytest.approx(histories[1], abs=1e-6)


def test_flag_type_is_checked():
    model = make_lm(LMConfig(40, d_model=32, n_heads=4, n_layers=1, d_ff=48, max_len=16))
    with pytest.raises(TypeError, match="enabled"):
        model.set_activation_checkpointing("yes")
    with pytest.raises(TypeError, match="activation_checkpointing"):
        LMTrainer(model, torch.randint(4, 40, (8, 17)), batch_size=4, activation_checkpointing=1)


@pytest.mark.slow
def test_lm_train_cli_takes_the_memory_flags(tmp_path, monkeypatch):
    """``lm-train --accumulation-steps 2 --autocast bf16 --activation-checkpointing`` 训一步并存盘（小数据）。"""
    from tformer_lib.commands.cli import main
    from tformer_lib.lm import pretrained
    from tformer_lib.lm.training import load_lm

    full = pretrained.poem_data

    def small(recipe=pretrained.POEM_RECIPE):
        data = full(recipe)
        data["train_blocks"] = data["train_blocks"][:32]
        data["valid"] = tuple(t[:4] for t in data["valid"])
        return data

    monkeypatch.setattr(pretrained, "poem_data", small)
    out = tmp_path / "poem.pt"
    assert main(["--threads", "1", "lm-train", "--out", str(out), "--steps", "1", "--total-steps", "100", "--quiet",
                 "--no-progress", "--accumulation-steps", "2", "--autocast", "bf16", "--activation-checkpointing"]) == 0
    _, _, ckpt = load_lm(out)
    assert ckpt["trainer"]["step"] == 1
    assert main(["lm-train", "--out", str(out), "--accumulation-steps", "0"]) == 1
