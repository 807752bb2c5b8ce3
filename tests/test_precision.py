"""混合精度：格式表来自 torch.finfo；fp16 的上溢与梯度下溢确实发生，GradScaler 修好下溢；bf16 训练的损失贴着 fp32。"""

import pytest
import torch

from tformer_lib.lm import LMConfig, make_lm
from tformer_lib.lm.data import loss_targets
from tformer_lib.lm.pretrained import load_poem_model, poem_data
from tformer_lib.lm.training import LMTrainer
from tformer_lib.measurement.precision import autocast, compare_autocast_training, float_formats, fp16_overflow, gradient_underflow

#: bf16 autocast 与 fp32 从同一初始化训练时，每一步损失之差的上限（nats）。
#: 实测（tiny 配置 20 步）约 5e-5；随书配置 30 步约 5e-3。
BF16_LOSS_TOLERANCE = 0.02


def test_float_formats_match_ieee_and_bfloat16():
    f = float_formats()
    assert (f["fp32"]["exponent_bits"], f["fp32"]["mantissa_bits"]) == (8, 23)
    assert (f["bf16"]["exponent_bits"], f["bf16"]["mantissa_bits"]) == (8, 7)
    assert (f["fp16"]["exponent_bits"], f["fp16"]["mantissa_bits"]) == (5, 10)
    assert f["fp16"]["max"] == 65504 and f["fp16"]["smallest_subnormal"] == 2.0**-24
    assert f["bf16"]["tiny"] == f["fp32"]["tiny"]  # 同样的指数范围


def test_fp16_overflows_where_bf16_and_fp32_do_not():
    out = fp16_overflow()
    assert out["fp32"]["score"] == 102400 and out["fp32"]["finite"] and not out["fp32"]["softmax_nan"]
    assert out["bf16"]["finite"] and not out["bf16"]["softmax_nan"]
    assert not out["fp16"]["finite"] and out["fp16"]["softmax_nan"]
    assert fp16_overflow(value=30.0)["fp16"]["finite"]  # 57600 < 65504


@pytest.fixture(scope="module")
def poem_batch():
    model, _, _ = load_poem_model()
    inputs, targets = (t.clone() for t in loss_targets(poem_data()["train_blocks"][:4]))  # (4, 128)
    return model.train(), inputs, targets


@pytest.mark.slow
def test_fp16_gradients_underflow_and_grad_scaler_fixes_them(poem_batch):
    out = gradient_underflow(*poem_batch)
    # 实测（4 × 128 个词元）：fp16 里 61% 的 logits 梯度为 0、参数梯度误差 2.5%；加 GradScaler 后 1.9%、0.15%
    assert out["fp32"]["logit_grad_zero"] == 0 and out["fp32"]["rel_error"] == 0
    # 训练好的模型：fp16 里大多数 logits 梯度下溢成 0，参数梯度跟着出错，还多出一批恰为 0 的参数梯度
    assert out["fp16"]["logit_grad_zero"] > 0.5 and out["fp16"]["rel_error"] > 0.01
    assert out["fp16"]["param_grad_zero"] > 10 * out["fp32"]["param_grad_zero"]
    # 损失缩放 2^16 之后几乎都回来了：为 0 的只剩 fp32 里本来就为 0 的（批里没出现的字的嵌入行）
    assert out["fp16+scaler"]["logit_grad_zero"] < 0.1 * out["fp16"]["logit_grad_zero"]
    assert out["fp16+scaler"]["rel_error"] < 0.2 * out["fp16"]["rel_error"]
    # 与 float64 参照相比，多出来的零：fp16 超过 1%，加缩放后不到万分之一；float32 自己因相消偶尔有几个（随 CPU 而变）
    assert out["fp16"]["extra_zero"] > 0.01
    assert out["fp16+scaler"]["extra_zero"] < 1e-4 and out["fp32"]["extra_zero"] < 1e-5
    assert out["fp16+scaler"]["param_grad_zero"] == pytest.approx(out["fp32"]["param_grad_zero"], abs=1e-5)
    # bf16 的指数范围与 fp32 相同：不下溢，只是尾数少（误差约 1%）
    assert out["bf16"]["logit_grad_zero"] == 0 and out["bf16"]["rel_error"] < 0.05
    for mode in out:
        assert out[mode]["loss"] == pytest.approx(out["fp32"]["loss"], abs=0.01)


@pytest.mark.slow
def test_bf16_training_loss_stays_within_tolerance_of_fp32():
    losses = compare_autocast_training(20, batch_size=4, d_model=32, n_layers=1, d_ff=64)
    assert len(losses["fp32"]) == len(losses["bf16"]) == 20
    assert losses["fp32"][-1] < losses["fp32"][0] - 0.5  # 真的在学
    assert max(abs(a - b) for a, b in zip(losses["fp32"], losses["bf16"])) < BF16_LOSS_TOLERANCE


def test_trainer_fp16_uses_a_grad_scaler_and_resumes_it():
    torch.manual_seed(0)
    model = make_lm(LMConfig(40, d_model=32, n_heads=4, n_layers=1, d_ff=48, max_len=16))
    trainer = LMTrainer(model, torch.randint(4, 40, (16, 17)), batch_size=4, warmup=1, total_steps=3, autocast="fp16")
    trainer.fit()
    assert trainer.scaler is not None and trainer.state_dict()["scaler"]["scale"] > 0
    assert all(torch.isfinite(p).all() for p in model.parameters())


def test_autocast_helper():
    x = torch.randn(4, 4)
    with autocast("cpu", "bf16"):
        assert (x @ x).dtype == torch.bfloat16
    with autocast("cpu", "fp32"):
        assert (x @ x).dtype == torch.float32
    with autocast("cpu", "bf16", enabled=False):
        assert (x @ x).dtype == torch.float32
    with pytest.raises(ValueError, match="dtype"):
        autocast("cpu", "fp8")
