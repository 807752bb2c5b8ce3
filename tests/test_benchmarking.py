"""基准测试的库代码：交替计时的结构、比值的统计、随包结果文件的内容（计时的数值本身不检查）。"""

import json

import pytest
import torch

from tformer_lib import TransformerConfig, count_parameters, make_model
from tformer_lib.measurement.benchmarking import (
    RESULTS_PATH,
    TorchTransformerModel,
    benchmark_attention_paths,
    benchmark_train_step,
    interleaved,
    interleaved_samples,
    load_results,
    machine_info,
    ratio_summary,
    save_results,
)


def test_interleaved_runs_each_function_once_per_round_in_order():
    calls = []
    samples = interleaved_samples({"a": lambda: calls.append("a"), "b": lambda: calls.append("b")}, rounds=3, warmup=1)
    assert calls == ["a", "b"] * 4
    assert {k: len(v) for k, v in samples.items()} == {"a": 3, "b": 3}
    assert set(interleaved({"x": lambda: None}, rounds=2)) == {"x"}
    with pytest.raises(ValueError, match="rounds"):
        interleaved_samples({"a": lambda: None}, rounds=0)


def test_interleaved_can_alternate_the_order_each_round():
    calls = []
    samples = interleaved_samples({"a": lambda: calls.append("a"), "b": lambda: calls.append("b")}, rounds=3, warmup=1,
                                  alternate=True)
    assert calls == ["a", "b"] + ["a", "b", "b", "a", "a", "b"]  # 热身，然后 A B、B A、A B
    assert {k: len(v) for k, v in samples.items()} == {"a": 3, "b": 3}
    with pytest.raises(TypeError, match="alternate"):
        interleaved_samples({"a": lambda: None}, rounds=1, alternate="yes")


def test_ratio_summary_quartiles():
    r = ratio_summary([1.0, 2.0, 3.0, 4.0, 5.0], [1.0, 1.0, 1.0, 1.0, 1.0])
    assert r["ratios"] == [1.0, 2.0, 3.0, 4.0, 5.0] and (r["q1"], r["median"], r["q3"]) == (2.0, 3.0, 4.0)
    assert ratio_summary([2.0], [1.0])["median"] == 2.0
    with pytest.raises(ValueError, match="一样多"):
        ratio_summary([1.0], [1.0, 2.0])


def test_torch_twin_has_the_same_flops_and_two_more_layernorms():
    c = TransformerConfig(50, 60, d_model=32, n_heads=4, d_ff=64, n_encoder_layers=1, n_decoder_layers=1)
    ours, theirs = make_model(c), TorchTransformerModel(c)
    assert count_parameters(theirs) - count_parameters(ours) == 2 * 2 * c.d_model
    out = theirs(torch.randint(4, 50, (2, 5)), torch.randint(4, 60, (2, 7)))
    assert out.shape == (2, 7, 60)


def test_benchmarks_return_per_round_samples_and_save_roundtrip(tmp_path):
    c = TransformerConfig(50, 50, d_model=32, n_heads=4, d_ff=64, n_encoder_layers=1, n_decoder_layers=1,
                          fast_attention=True)
    res = benchmark_train_step(c, batch=4, length=6, rounds=2, warmup=0)
    assert len(res["seconds"]["ours"]) == len(res["ratio"]["ratios"]) == 2
    att = benchmark_attention_paths([8], rounds=2, batch=2, d_model=16, n_heads=2, warmup=0)
    assert att[0]["length"] == 8 and len(att[0]["seconds"]["fast"]) == 2
    result = {"machine": machine_info(), "train_step": {"small": res}, "attention": att}
    path = save_results(result, tmp_path / "r.json")
    assert load_results(path) == json.loads(json.dumps(result))
    with pytest.raises(FileNotFoundError, match="train_step.py"):
        load_results(tmp_path / "missing.json")


def test_shipped_results_say_where_and_when_they_were_measured():
    assert RESULTS_PATH.exists()
    res = load_results()
    assert {"cpu", "threads", "torch", "date"} <= set(res["machine"])
    assert res["train_step"]["small"]["rounds"] >= 10
    assert [a["length"] for a in res["attention"]] == [64, 128, 256, 512]


def test_measurement_record_names_the_command_the_machine_and_the_elapsed_time():
    import time

    from tformer_lib.measurement.benchmarking import machine_info, measurement_record

    info = machine_info()
    start = time.perf_counter() - 2.0  # 假装两秒前开始
    record = measurement_record("tformer_lib.quant.measure", ["--samples", "3"], info, start)
    assert record["command"] == "python -m tformer_lib.quant.measure --samples 3"
    assert record["machine"] == info and record["machine"] is not info  # 复制一份，之后改 info 不影响结果
    assert 2.0 <= record["wall_seconds"] < 60
    assert record["load_average_end"] is None or record["load_average_end"] >= 0
    assert measurement_record("m", [], info, start)["command"] == "python -m m"


@pytest.mark.parametrize("module, work", [("tformer_lib.finetune.measure", "measure_finetuning"),
                                          ("tformer_lib.quant.measure", "measure_quantization"),
                                          ("tformer_lib.scale.scaling", "scaling_study")])
def test_every_measurement_cli_refuses_a_bad_out_or_threads_before_measuring(module, work, tmp_path, monkeypatch, capsys):
    import importlib

    mod = importlib.import_module(module)
    monkeypatch.setattr(mod, work, lambda *a, **k: pytest.fail("不该开始测量"))
    (tmp_path / "file.json").write_text("{}")
    for argv in (["--out", str(tmp_path)], ["--out", str(tmp_path / "file.json" / "x.json")], ["--threads", "0"]):
        with pytest.raises(SystemExit):
            mod.main(argv)
        err = capsys.readouterr().err
        assert f"python -m {module}" in err and ("--out" in err or "--threads" in err)
