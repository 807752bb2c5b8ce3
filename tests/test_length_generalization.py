"""第 2 章的长度外推实验：脚本能跑（极小设置）、随库附带的结果文件完整且说明了它是怎么来的。"""

import torch

from tformer_lib.experiments import length_generalization as lg


def test_tiny_run_has_every_metric_for_every_length():
    torch.manual_seed(0)
    r = lg.run(positional=("sinusoidal", "learned"), n_train=64, epochs=1, test_lengths=(3, 9), n_test_per_length=4,
               d_model=16, n_heads=2, d_ff=32, n_layers=1)
    assert set(r["results"]) == {"sinusoidal", "learned"}
    for res in r["results"].values():
        assert set(res["exact_match"]) == set(res["token_accuracy"]) == {"3", "9"}
        assert all(0.0 <= v <= 1.0 for v in res["exact_match"].values())
    assert len(r["results"]["learned"]["encoder_table_cosine"]) == 16
    assert {"machine", "command", "settings", "results"} <= set(r)
    assert {"cpu", "threads", "torch", "date", "load_average"} <= set(r["machine"])  # benchmarking.machine_info


def test_shipped_results_file_matches_the_script_defaults():
    r = lg.load_results()
    s = r["settings"]
    assert s["positional"] == list(lg.DEFAULTS["positional"]) and s["epochs"] == lg.DEFAULTS["epochs"]
    assert s["test_lengths"] == list(lg.DEFAULTS["test_lengths"])
    assert set(r["results"]) == set(lg.DEFAULTS["positional"])
    assert r["machine"]["threads"] == 1 and r["machine"]["date"] and r["command"] == lg.COMMAND
