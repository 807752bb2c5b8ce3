"""标签平滑损失与预热调度的测试。"""

import math

import pytest
import torch
import torch.nn.functional as F

from tformer_lib.specials import PAD
from tformer_lib.training import (
    LabelSmoothingLoss,
    NoamLambda,
    label_smoothing_loss,
    make_optimizer,
    make_scheduler,
    noam_rate,
)


@pytest.mark.parametrize("eps", [0.0, 0.1, 0.3])
def test_label_smoothing_equals_torch_cross_entropy(eps):
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 5, 11, generator=g)
    target = torch.randint(1, 11, (3, 5), generator=g)
    target[0, 3:] = PAD
    target[2, 1:] = PAD
    ours = LabelSmoothingLoss(eps)(logits, target)
    ref = F.cross_entropy(logits.reshape(-1, 11), target.reshape(-1), label_smoothing=eps, ignore_index=PAD)
    assert torch.allclose(ours, ref, atol=1e-6)
    ours_sum = label_smoothing_loss(logits, target, eps, reduction="sum")
    ref_sum = F.cross_entropy(
        logits.reshape(-1, 11), target.reshape(-1), label_smoothing=eps, ignore_index=PAD, reduction="sum"
    )
    assert torch.allclose(ours_sum, ref_sum, atol=1e-5)
    per_pos = label_smoothing_loss(logits, target, eps, reduction="none")
    assert per_pos.shape == (3, 5) and (per_pos[target == PAD] == 0).all()


def test_label_smoothing_gradient_flows_and_all_pad_is_zero():
    logits = torch.randn(2, 3, 7, requires_grad=True)
    target = torch.full((2, 3), PAD)
    loss = label_smoothing_loss(logits, target, 0.1)
    assert loss.item() == 0.0
    target[0, 0] = 4
    label_smoothing_loss(logits, target, 0.1).backward()
    assert logits.grad is not None and logits.grad[0, 0].abs().sum() > 0 and logits.grad[1].abs().sum() == 0


def test_label_smoothing_errors():
    with pytest.raises(ValueError, match="smoothing"):
        LabelSmoothingLoss(1.0)
    with pytest.raises(ValueError, match="形状"):
        label_smoothing_loss(torch.randn(2, 3, 5), torch.zeros(2, 4, dtype=torch.long))
    with pytest.raises(ValueError, match="reduction"):
        label_smoothing_loss(torch.randn(2, 5), torch.zeros(2, dtype=torch.long), reduction="avg")


def test_noam_rate_formula_peak_and_step_zero():
    d, w = 512, 4000
    assert noam_rate(0, d, w) == noam_rate(1, d, w)  # step 0 被守护
    assert math.isclose(noam_rate(100, d, w), d ** -0.5 * 100 * w ** -1.5)
    assert math.isclose(noam_rate(10000, d, w), d ** -0.5 * 10000 ** -0.5)
    rates = [noam_rate(s, d, w) for s in range(1, 10001)]
    assert max(range(len(rates)), key=rates.__getitem__) + 1 == w
    assert math.isclose(noam_rate(w, d, w, factor=2.0), 2 * d ** -0.5 * w ** -0.5)
    with pytest.raises(ValueError, match="warmup"):
        noam_rate(1, 512, 0)
    with pytest.raises(ValueError, match="d_model"):
        NoamLambda(0, 10)


def test_optimizer_and_scheduler_follow_the_paper():
    model = torch.nn.Linear(4, 4)
    opt = make_optimizer(model)
    assert opt.defaults["betas"] == (0.9, 0.98) and opt.defaults["eps"] == 1e-9
    sched = make_scheduler(opt, d_model=64, warmup=10, factor=2.0)
    seen = []
    for _ in range(20):
        seen.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    assert math.isclose(seen[0], noam_rate(0, 64, 10, 2.0))
    assert math.isclose(seen[10], noam_rate(10, 64, 10, 2.0))
    assert max(seen) == seen[10]
    state = sched.state_dict()  # 只含普通数字，可 weights_only 加载
    assert state["lr_lambdas"][0] == {"d_model": 64, "warmup": 10, "factor": 2.0}
    with pytest.raises(TypeError, match="model"):
        make_optimizer("model")
