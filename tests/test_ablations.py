"""FFN 消融实验（tformer_lib.experiments.ablations）：去掉 FFN 的模型搭得对、能训练，随包附带的结果文件与代码一致。"""

import random

import numpy as np
import pytest
import torch

from tformer_lib import count_parameters, make_model
from tformer_lib.experiments.ablations import (
    FFN_ABLATION_ARMS,
    ZeroFeedForward,
    drop_feed_forward,
    load_ffn_ablation_results,
    make_ablation_model,
    run_ffn_ablation,
)
from tformer_lib.translation.pretrained import load_toy_data, toy_model_config


def test_drop_feed_forward_removes_exactly_the_ffn_parameters():
    torch.manual_seed(0)
    model = make_model(toy_model_config(30, 40))
    layers = [*model.encoder.layers, *model.decoder.layers]
    ffn = sum(count_parameters(layer.feed_forward) for layer in layers)
    before = count_parameters(model)
    drop_feed_forward(model)
    assert count_parameters(model) == before - ffn
    assert all(isinstance(layer.feed_forward, ZeroFeedForward) for layer in layers)
    src, tgt = torch.randint(4, 30, (2, 5)), torch.randint(4, 40, (2, 6))
    assert model(src, tgt).shape == (2, 6, 40)
    with pytest.raises(TypeError, match="Transformer"):
        drop_feed_forward(torch.nn.Linear(2, 2))


def test_ablation_models_leave_the_global_rng_alone_and_reject_unknown_arms():
    state = torch.get_rng_state(), random.getstate(), np.random.get_state()[1].copy()
    make_ablation_model("no_ffn", 30, 40, seed=3)
    assert torch.equal(torch.get_rng_state(), state[0]) and random.getstate() == state[1]
    assert np.array_equal(np.random.get_state()[1], state[2])
    with pytest.raises(ValueError, match="arm"):
        make_ablation_model("no_attention", 30, 40)


def test_shipped_results_match_the_code_that_builds_the_models():
    results = load_ffn_ablation_results()
    data = load_toy_data()
    produced = results["produced_by"]
    assert produced["threads"] == 1 and produced["command"] == "python -m tformer_lib.experiments.ablations"
    assert {"date", "torch", "cpu"} <= set(produced)
    arms = {r["arm"] for r in results["runs"]}
    assert arms == set(FFN_ABLATION_ARMS)
    for arm in arms:
        runs = [r for r in results["runs"] if r["arm"] == arm]
        assert sorted(r["seed"] for r in runs) == results["settings"]["seeds"] and len(runs) >= 3
        model = make_ablation_model(arm, len(data["src_vocab"]), len(data["tgt_vocab"]))
        assert all(r["parameters"] == count_parameters(model) for r in runs)
        assert all(len(r["epochs"]) == results["settings"]["training"]["epochs"] for r in runs)


@pytest.mark.slow
def test_run_ffn_ablation_trains_one_short_run():
    out = run_ffn_ablation(seeds=(0,), arms=("no_ffn",), epochs=1)
    (run,) = out["runs"]
    assert run["arm"] == "no_ffn" and len(run["epochs"]) == 1
    assert 0.0 <= run["test"]["exact_match"] <= 1.0 and run["epochs"][0]["valid_loss"] > 0
