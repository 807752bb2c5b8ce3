"""第 10 章的对比实验：每组只改一项配置、K/V 缓存按 n_kv_heads 缩放、短跑能出结果、随包的结果文件完整且写明出处。"""

import statistics

import pytest
import torch

from tformer_lib.lm import make_lm
from tformer_lib.experiments.modern_variants import (
    VARIANT_ARMS,
    SPEED_ROUNDS,
    VARIANT_LABELS,
    VARIANT_MODEL,
    WARMUP_ARMS,
    kv_cache_bytes_per_token,
    load_variant_results,
    run_variant_comparison,
    run_warmup_ablation,
    variant_config,
)
from tformer_lib.translation.model import count_parameters


def test_each_arm_changes_only_its_own_fields():
    base = variant_config("baseline", 100).to_dict()
    for arm, change in VARIANT_ARMS.items():
        cfg = variant_config(arm, 100).to_dict()
        assert {k for k in cfg if cfg[k] != base[k]} == set(change), arm
    assert all(base[k] == v for k, v in VARIANT_MODEL.items())
    with pytest.raises(ValueError, match="arm"):
        variant_config("llama", 100)


def test_kv_cache_scales_with_kv_heads_and_swiglu_keeps_the_ffn_size():
    torch.manual_seed(0)
    sizes = {arm: kv_cache_bytes_per_token(make_lm(variant_config(arm, 50))) for arm in ("baseline", "gqa", "mqa")}
    assert sizes["baseline"] == 2 * sizes["gqa"] == 4 * sizes["mqa"]
    d, f = VARIANT_MODEL["d_model"], VARIANT_MODEL["d_ff"]
    ffn = lambda arm: count_parameters(make_lm(variant_config(arm, 50)).blocks[0].feed_forward)  # noqa: E731
    assert abs(ffn("swiglu") - ffn("baseline")) / ffn("baseline") < 0.01


@pytest.mark.slow
def test_a_short_run_produces_complete_results():
    r = run_variant_comparison(arms=("baseline", "mqa"), seeds=(0,), steps=4)
    assert [(x["arm"], x["seed"]) for x in r["runs"]] == [("baseline", 0), ("mqa", 0)]
    assert [e["step"] for e in r["runs"][0]["evals"]] == [0, 2, 4]
    assert r["arms"]["baseline"]["kv_bytes_per_token"] == 4 * r["arms"]["mqa"]["kv_bytes_per_token"]
    assert all(v["tokens_per_second"] > 0 for v in r["arms"].values())


def test_shipped_results_cover_every_arm_with_two_seeds_and_say_how_they_were_made():
    r = load_variant_results()
    assert r["settings"]["arms"] == list(VARIANT_ARMS)
    seeds = {arm: sorted(x["seed"] for x in r["runs"] if x["arm"] == arm) for arm in VARIANT_ARMS}
    assert all(len(s) >= 2 for s in seeds.values()), seeds
    for x in r["runs"]:
        assert x["evals"][0]["step"] == 0 and x["evals"][-1]["step"] == r["settings"]["training"]["steps"]
    made = r["produced_by"]
    assert made["command"] == "python -m tformer_lib.experiments.modern_variants" and made["threads"] == 1
    assert made["date"] and made["cpu"] and made["torch"]
    torch.manual_seed(0)
    for arm, info in r["arms"].items():
        assert info["parameters"] == count_parameters(make_lm(variant_config(arm, info["config"]["vocab_size"])))


def test_shipped_throughput_keeps_every_round_and_its_median():
    r = load_variant_results()
    speed = r["speed_produced_by"]
    assert speed["command"].startswith("python -m tformer_lib.experiments.modern_variants") and speed["threads"] == 1
    assert speed["date"] and speed["cpu"] and speed["load_average"] is not None
    for arm, info in r["arms"].items():
        rounds = info["tokens_per_second_rounds"]
        assert len(rounds) == SPEED_ROUNDS and all(x > 0 for x in rounds), arm
        assert info["tokens_per_second"] == statistics.median(rounds)


def test_shipped_warmup_ablation_changes_only_the_warmup():
    r = load_variant_results()
    assert r["warmup_produced_by"]["command"] == "python -m tformer_lib.experiments.modern_variants --warmup-only"
    for arm, (structure, change) in WARMUP_ARMS.items():
        assert change == {"warmup": 1} and structure in VARIANT_ARMS
        assert r["settings"]["warmup_arms"][arm] == {"structure": structure, "training": change}
        runs = [x for x in r["runs"] if x["arm"] == arm]
        assert sorted(x["seed"] for x in runs) == r["settings"]["seeds"]
        assert all(x["evals"][-1]["step"] == r["settings"]["training"]["steps"] for x in runs)
        assert arm in VARIANT_LABELS


@pytest.mark.parametrize("seeds", [(), 5, (True,), ("0",)])
def test_warmup_ablation_refuses_bad_seeds_before_training(seeds):
    with pytest.raises(ValueError, match="seeds"):
        run_warmup_ablation(seeds=seeds)


def test_loading_a_file_that_is_not_a_comparison_names_what_is_missing(tmp_path):
    path = tmp_path / "other.json"
    path.write_text('{"runs": []}', encoding="utf-8")
    with pytest.raises(ValueError, match=r"缺 \['arms', 'settings'\]"):
        load_variant_results(path)
