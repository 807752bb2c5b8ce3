"""缩放实验的零件：幂律拟合找回已知的指数、下包络、非嵌入参数，以及一次真的小训练（词元与算力的账对得上）。"""

import math

import pytest

from tformer_lib.lm import LMConfig, make_lm
from tformer_lib.lm.pretrained import POEM_RECIPE, poem_data
from tformer_lib.measurement.profiling import lm_training_flops
from tformer_lib.scale.scaling import (compute_frontier, fit_power_law, non_embedding_parameters, scaling_config,
                                       scaling_study)


def test_fit_power_law_recovers_a_known_law_and_its_fit_quality():
    xs = [1e6 * 3**k for k in range(6)]
    fit = fit_power_law(xs, [7.0 * x**-0.08 for x in xs])
    assert fit["a"] == pytest.approx(7.0, rel=1e-9) and fit["alpha"] == pytest.approx(0.08, rel=1e-9)
    assert fit["r2"] == pytest.approx(1.0)
    noisy = fit_power_law(xs, [7.0 * x**-0.08 * (1.05 if k % 2 else 0.95) for k, x in enumerate(xs)])
    assert 0 < noisy["r2"] < 1


@pytest.mark.parametrize("xs, ys", [([1.0], [1.0]), ([1.0, 1.0], [2.0, 3.0]), ([1.0, 2.0], [0.0, 1.0]),
                                    ([1.0, 2.0], [1.0]), ([-1.0, 2.0], [1.0, 1.0]), ([1.0, math.inf], [1.0, 1.0])])
def test_fit_power_law_refuses_what_it_cannot_fit(xs, ys):
    with pytest.raises(ValueError, match="xs|ys"):
        fit_power_law(xs, ys)


def test_frontier_keeps_only_points_better_than_every_cheaper_one():
    rows = [{"flops": 1, "valid_loss": 5.0}, {"flops": 2, "valid_loss": 5.5}, {"flops": 3, "valid_loss": 4.0},
            {"flops": 3, "valid_loss": 4.5}, {"flops": 4, "valid_loss": 4.2}, {"flops": 5, "valid_loss": 3.9}]
    assert [r["flops"] for r in compute_frontier(rows)] == [1, 3, 5]
    with pytest.raises(ValueError):
        compute_frontier([])


def test_non_embedding_parameters_leave_out_exactly_the_embeddings():
    for tie in (True, False):
        config = LMConfig(100, d_model=32, n_heads=4, n_layers=2, d_ff=64, max_len=16, positional="learned",
                          tie_embeddings=tie)
        model = make_lm(config)
        embeddings = sum(p.numel() for n, p in model.named_parameters()
                         if n.startswith(("tok_emb", "pos_emb", "lm_head", "embed", "head")))
        blocks = sum(p.numel() for n, p in model.named_parameters() if n.startswith("blocks"))
        final_norm = sum(p.numel() for n, p in model.named_parameters()
                         if not n.startswith("blocks") and p.dim() == 1 and "norm" in n)
        assert non_embedding_parameters(config) == blocks + final_norm
        assert non_embedding_parameters(config) + embeddings == sum(p.numel() for p in model.parameters())


def test_a_tiny_study_trains_each_cell_on_the_budget_it_names():
    data = poem_data()
    rows = scaling_study(sizes=((16, 1),), token_budgets=(20_480, 40_960), data=data)
    length = data["train_blocks"].shape[1] - 1
    per_step = POEM_RECIPE["batch_size"] * length
    config = scaling_config(data["tokenizer"].vocab_size, 16, 1)
    for row, budget in zip(rows, (20_480, 40_960)):
        assert row["steps"] == budget // per_step
        assert row["tokens"] <= row["steps"] * per_step  # 目标里的填充不算词元
        assert row["flops"] == row["steps"] * lm_training_flops(config, POEM_RECIPE["batch_size"], length)["total"]
        assert row["flops_6nd"] == 6 * row["params"] * row["tokens"]
        assert math.isfinite(row["valid_loss"]) and row["valid_loss"] < math.log(data["tokenizer"].vocab_size)
    assert rows[1]["valid_loss"] < rows[0]["valid_loss"]  # 同一个模型，多训一倍的词元


def test_plot_scaling_draws_one_line_per_size_the_frontier_and_the_fit():
    from tformer_lib.plotting.scaling import plot_scaling

    rows = [{"d_model": d, "n_layers": 2, "non_embedding_params": 100 * d, "flops": f * d, "valid_loss": 6.0 / (f * d) ** 0.05}
            for d in (8, 16) for f in (1e9, 2e9, 4e9)]
    frontier = compute_frontier(rows)
    fit = fit_power_law([r["flops"] for r in frontier], [r["valid_loss"] for r in frontier])
    ax = plot_scaling(rows, fit, frontier=frontier).axes[0]
    lines = ax.get_lines()
    assert len(lines) == 2 + 1 + 1  # 两种大小 + 下包络 + 拟合
    assert sorted(x for line in lines[:2] for x in line.get_xdata()) == sorted(r["flops"] for r in rows)
    assert ax.get_xscale() == "log" and ax.get_yscale() == "log"
    with pytest.raises(ValueError, match="valid_loss"):
        plot_scaling([{"d_model": 8, "n_layers": 2, "non_embedding_params": 1, "flops": 1.0}])


@pytest.mark.parametrize("rows, where", [
    ([{"flops": 3, "valid_loss": 1}, {"flops": math.nan, "valid_loss": 0.5}, {"flops": 1, "valid_loss": 2}], "rows\\[1\\]\\['flops'\\]"),
    ([{"flops": 1, "valid_loss": math.inf}], "valid_loss"),
    ([{"flops": 1}], "valid_loss"),
    ([{"flops": 1, "valid_loss": None}], "valid_loss"),
    ("ab", "rows"),
    ({"flops": 1, "valid_loss": 1}, "rows"),
])
def test_frontier_refuses_non_finite_or_missing_values_naming_the_row(rows, where):
    with pytest.raises(ValueError, match=where):
        compute_frontier(rows)


@pytest.mark.parametrize("xs, ys, word", [("12", "34", "xs"), ([True, 2.0], [1.0, 2.0], "xs"), ([1.0, 2.0], ["1", 2.0], "ys"),
                                           ([1.0, 1.0, 1.0], [1.0, 2.0, 3.0], "两个不同"),
                                           ([1e300, math.nextafter(1e300, math.inf)], [1.0, 2.0], "两个不同")])
def test_fit_power_law_names_what_is_wrong(xs, ys, word):
    with pytest.raises(ValueError, match=word):
        fit_power_law(xs, ys)


def test_scaling_study_checks_every_cell_before_training_any(monkeypatch):
    import tformer_lib.scale.scaling as scaling

    trained = []
    monkeypatch.setattr(scaling, "train_for_tokens", lambda *a, **k: trained.append(a))
    data = poem_data()
    for sizes, budgets, error in ((((16, 1), (16, 0)), (20_480,), ValueError), (((16, 1),), (20_480, 100), ValueError),
                                  ((16, 1), (20_480,), TypeError), (((16, 1),), 20_480, TypeError)):
        with pytest.raises(error):
            scaling.scaling_study(sizes, budgets, data=data)
    with pytest.raises(TypeError, match="data"):
        scaling.scaling_study(((16, 1),), (20_480,), data={"valid": None})
    assert trained == []


def test_the_cli_refuses_an_unwritable_out_before_the_study(monkeypatch, tmp_path, capsys):
    import tformer_lib.scale.scaling as scaling

    monkeypatch.setattr(scaling, "scaling_study", lambda **k: pytest.fail("不该开始训练"))
    for out in (tmp_path, tmp_path / "file.json" / "x.json"):
        (tmp_path / "file.json").write_text("{}")
        with pytest.raises(SystemExit):
            scaling.main(["--out", str(out)])
        assert "--out" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        scaling.main(["--threads", "0"])


def test_measurement_record_refuses_a_string_argv_and_quotes_arguments():
    import time

    from tformer_lib.measurement.benchmarking import machine_info, measurement_record

    info, start = machine_info(), time.perf_counter()
    with pytest.raises(TypeError, match="argv"):
        measurement_record("m", "--out x.json", info, start)
    for bad in (time.time() + 1e6, math.nan, "0"):
        with pytest.raises(ValueError, match="start"):
            measurement_record("m", [], info, bad)
    assert measurement_record("m", ["--out", "my file.json"], info, start)["command"] == "python -m m --out 'my file.json'"


def test_quantize_base_for_wants_a_list_of_adapter_dicts():
    import copy

    from tformer_lib.finetune import adapter_from_model, apply_qlora, quantize_base_for

    base = make_lm(LMConfig(40, d_model=64, n_heads=4, n_layers=1, d_ff=128, max_len=16))
    adapter = adapter_from_model(apply_qlora(copy.deepcopy(base), 2, 4, targets=("w_q",)))
    for bad in (adapter, "adapter.pt", ["adapter.pt"], [None, adapter]):
        with pytest.raises(TypeError, match="adapters"):
            quantize_base_for(copy.deepcopy(base), bad)
    with pytest.raises(TypeError, match="model"):
        quantize_base_for(None, [adapter])
