"""第 16 章长上下文实测（tformer_lib.experiments.long_context）的部件：换缩放不动权重、按位置的交叉熵、区间汇总，
以及随包结果文件覆盖每种方法、每个评测长度与每个种子。"""

import json
import math

import pytest
import torch
import torch.nn.functional as F

from tformer_lib.experiments.long_context import (
    BASES,
    EVAL_LENS,
    FINETUNED,
    RESULTS_PATH,
    TRAIN_LEN,
    ZERO_SHOT,
    position_losses,
    range_losses,
    scaled_model,
    summary,
)
from tformer_lib.lm import LMConfig, make_lm
from tformer_lib.specials import BOS, PAD


def tiny(**kw):
    torch.manual_seed(0)
    return make_lm(LMConfig(vocab_size=30, d_model=16, n_heads=2, n_layers=1, d_ff=16, max_len=32, positional="rope", **kw))


def test_scaled_model_shares_weights_and_changes_only_the_rotation():
    model = tiny().eval()
    tokens = torch.randint(4, 30, (2, 24))
    before = model(tokens)
    same = scaled_model(model, "none", 4.0)
    torch.testing.assert_close(same(tokens), before, rtol=0, atol=0)
    pi = scaled_model(model, "linear", 2.0)
    assert pi.config.rope_scaling.kind == "linear" and model.config.rope_scaling is None  # 原模型不变
    assert not torch.allclose(pi(tokens), before)
    torch.testing.assert_close(model(tokens), before, rtol=0, atol=0)
    assert scaled_model(model, "yarn", 2.0).config.rope_scaling.original_max_len == TRAIN_LEN
    assert scaled_model(model, "ntk", 1.0).config.rope_scaling is None  # s = 1 就是不缩放
    with pytest.raises(ValueError, match="kind"):
        scaled_model(model, "dynamic", 2.0)
    for bad in (True, 0.5, float("nan"), "4"):
        with pytest.raises(ValueError, match="factor"):
            scaled_model(model, "none", bad)
    assert next(scaled_model(model.double(), "linear", 2.0).parameters()).dtype == torch.float64
    with pytest.raises(ValueError, match="只有 RoPE"):
        scaled_model(make_lm(LMConfig(vocab_size=30, d_model=16, n_heads=2, n_layers=1, d_ff=16)), "linear", 2.0)


def test_position_losses_average_cross_entropy_per_position_skipping_pad_and_bos():
    model = tiny().eval()
    blocks = torch.randint(4, 30, (5, 9))
    blocks[1, 4] = BOS  # 目标是 BOS 的位置（第 3 个）不计
    blocks[2, 7:] = PAD
    got = position_losses(model, blocks, batch_size=2)
    inputs, targets = blocks[:, :-1], blocks[:, 1:]
    with torch.no_grad():
        ce = F.cross_entropy(model(inputs).transpose(1, 2), targets, reduction="none")  # (5, 8)
    keep = (targets != PAD) & (targets != BOS)
    expected = [(ce[:, t][keep[:, t]]).mean().item() for t in range(8)]
    assert got == pytest.approx(expected, rel=1e-6)
    assert range_losses(got, ((0, 4), (4, 8), (8, 16))) == {"0-4": pytest.approx(sum(got[:4]) / 4),
                                                           "4-8": pytest.approx(sum(got[4:]) / 4)}
    blocks[:, 3] = PAD  # 第 2 个位置一个目标都没有：NaN，不是 0，区间平均不算它
    empty = position_losses(model, blocks)
    assert math.isnan(empty[2]) and range_losses(empty, ((0, 4),))["0-4"] == pytest.approx(
        (empty[0] + empty[1] + empty[3]) / 3)
    with pytest.raises(ValueError, match="0 ≤ a < b"):
        range_losses(got, ((3, 3),))


def test_shipped_results_cover_every_method_length_and_seed():
    data = json.loads(RESULTS_PATH.read_text(encoding="utf-8"))
    seeds = data["settings"]["seeds"]
    assert len(seeds) >= 2
    methods = {"alibi", *(f"rope/{k}" for k in ZERO_SHOT), *(f"ft/{k}" for k in FINETUNED)}
    seen = {(e["seed"], e["method"], e["eval_len"]) for e in data["evals"]}
    for seed in seeds:
        for method in methods:
            for length in EVAL_LENS:
                if method.startswith("rope/") and method != "rope/none" and length == TRAIN_LEN:
                    continue  # s = 1 与不缩放相同，不重复量
                assert (seed, method, length) in seen, (seed, method, length)
    for e in data["evals"]:
        assert len(e["position_loss"]) == e["eval_len"] and all(math.isfinite(v) for v in e["position_loss"])
    assert {(r["seed"], r["arm"]) for r in data["runs"]} == {(s, a) for s in seeds for a in (*BASES, *(f"ft/{k}" for k in FINETUNED))}
    table = summary(data)
    assert set(table) == methods and all(set(v) == {"0-64", "64-128", "128-256"} for v in table.values())
