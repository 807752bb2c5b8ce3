"""推理服务测量函数：结构完整、两种批处理输出一致、内存账目与缓存形状相符。"""

import random

import pytest
import torch

from tformer_lib.lm import LMConfig, make_lm
from tformer_lib.serving import WorkItem, expected_speedup, layer_skip_draft, make_workload, run_static
from tformer_lib.serving.benchmark import load_results, save_results
from tformer_lib.serving.measure import batching_benchmark, prefix_caching_benchmark, speculative_benchmark


def _model():
    torch.manual_seed(0)
    return make_lm(LMConfig(vocab_size=30, d_model=32, n_heads=4, n_kv_heads=2, n_layers=2, d_ff=48, max_len=40)).eval()


def test_batching_benchmark_records_both_runs_and_memory():
    model = _model()
    rng = random.Random(0)
    prompts = [[rng.randrange(4, 30) for _ in range(rng.randint(2, 8))] for _ in range(10)]
    items = make_workload(prompts, 8, max_len=40, seed=1, mean_new_tokens=6)
    result = batching_benchmark(model, items, rounds=2, max_batch=4, block_size=4)
    assert len(result["throughput_ratios"]) == 2
    assert result["cpu_ratios"] == [r["cpu_ratio"] for r in result["rounds"]]
    assert result["rounds_at_least_2x_cpu"] == sum(r >= 2 for r in result["cpu_ratios"])
    assert result["workload"]["tokens_generated"] == result["workload"]["new_tokens_requested"]  # 没有 EOS：都生成满
    per_token = 2 * 2 * 2 * 8 * 4  # 2(K,V) × 层 × K/V 头 × d_k × float32
    assert result["memory"]["bytes_per_token"] == per_token
    assert result["memory"]["contiguous_bytes"] == 4 * 40 * per_token
    assert 0 < result["memory"]["paged_peak_bytes"] <= result["memory"]["contiguous_bytes"]
    assert result["memory"]["paged_peak_bytes"] % (4 * per_token) == 0  # 整块整块地分配
    assert set(result["timeline"]) == {"static", "continuous"}


def test_make_workload_is_seeded_and_respects_context():
    prompts = [[5] * n for n in (3, 10, 30)]
    a = make_workload(prompts, 20, max_len=40, seed=3)
    assert a == make_workload(prompts, 20, max_len=40, seed=3) and a != make_workload(prompts, 20, max_len=40, seed=4)
    assert all(len(it.prompt) + it.max_new_tokens <= 40 and it.max_new_tokens >= 1 for it in a)
    assert [it.arrival for it in a] == sorted(it.arrival for it in a)


def test_speculative_benchmark_rows():
    model = make_lm(LMConfig(vocab_size=30, d_model=32, n_heads=4, n_layers=3, d_ff=48, max_len=40)).eval()
    result = speculative_benchmark(model, layer_skip_draft(model, 1), [[5, 6], [7]], 8, ks=(1, 3), rounds=1)
    assert [row["k"] for row in result["rows"]] == [1, 3]
    for row in result["rows"]:
        assert 0 <= row["acceptance_rate"] <= 1 and 1 <= row["tokens_per_target_pass"] <= row["k"] + 1


def test_batching_benchmark_rounds_steps_and_prefix_record():
    model = _model()
    rng = random.Random(2)
    prompts = [[rng.randrange(4, 30) for _ in range(rng.randint(2, 8))] for _ in range(10)]
    items = make_workload(prompts, 10, max_len=40, seed=2, mean_new_tokens=8)
    result = batching_benchmark(model, items, rounds=3, max_batch=4, block_size=4)
    assert [r["order"] for r in result["rounds"]] == [["static", "continuous"], ["continuous", "static"],
                                                      ["static", "continuous"]]  # 交替，谁先谁后轮流
    low, high = result["throughput_ratio_range"]
    assert low <= result["throughput_ratio_median"] <= high
    assert result["rounds_at_least_2x"] == sum(r >= 2 for r in result["throughput_ratios"])
    for kind in ("static", "continuous"):
        # 步数与时间线一致：最后一步的步号 + 1
        assert result[kind]["steps"] == 1 + max(s for steps in result["timeline"][kind] for s, _ in steps)
        assert all(0 < r[kind]["slot_occupancy"] <= 1 and r[kind]["cpu_seconds"] > 0 for r in result["rounds"])
    assert result["prefix_caching"]["prefill_tokens_saved"] >= 0


def test_static_batch_waits_to_fill_or_times_out():
    model = _model()
    prompts = [[5, 6, 7]] * 6
    # 6 个请求每隔 10 ms 到一个：max_batch=3、不设超时上限（1 秒）时，第一批要等满 3 条
    items = [WorkItem(tuple(p), 4, 0.01 * i) for i, p in enumerate(prompts)]
    requests, _ = run_static(model, items, max_batch=3, max_wait=1.0)
    first = [min(s for s, _ in r.slot_steps) for r in requests]
    assert first == [0, 0, 0, 4, 4, 4]
    requests, _ = run_static(model, items, max_batch=3, max_wait=0.0)  # 不等：第一批只有已到的那一条
    assert [min(s for s, _ in r.slot_steps) for r in requests][:2] == [0, 4]
    with pytest.raises(ValueError, match="max_wait"):
        run_static(model, items, max_wait=-1)


def test_prefix_caching_benchmark_counts():
    model = _model()
    shared = list(range(4, 4 + 9))  # 2 个满块（block_size=4）再多 1 个
    result = prefix_caching_benchmark(model, shared, [[20], [21], [22]], 3, block_size=4)
    on, off = result["with_prefix_caching"], result["without_prefix_caching"]
    assert off["prefill_tokens"] == result["prompt_tokens"] == 3 * 10
    assert on["prefill_tokens_saved"] == 2 * 8  # 后两条各复用 2 个满块
    assert on["peak_blocks"] < off["peak_blocks"]


def test_results_file_round_trip(tmp_path):
    result = {"a": [1, 2.5, -3e-05], "timeline": {"static": [[[0, 1], [1, 1]], [[0, 0]]]}, "s": "x [1, 2]"}
    path = save_results(result, tmp_path / "serving.json")
    assert load_results(path) == result
    assert len(path.read_text(encoding="utf-8").splitlines()) < 15  # 数字与 (步, 槽位) 列表各占一行
    with pytest.raises(FileNotFoundError, match="serving.benchmark"):
        load_results(tmp_path / "missing.json")


def test_shipped_results_file_is_complete():
    result = load_results()
    assert not result["quick"] and result["machine"]["threads"] == 1
    b = result["batching"]
    assert len(b["throughput_ratios"]) >= 3 and b["workload"]["requests"] == 96
    assert set(b["timeline"]) == {"static", "continuous"} and len(b["timeline"]["static"]) == 96
    assert b["memory"]["paged_peak_bytes"] < b["memory"]["contiguous_bytes"]
    for key in ("speculative", "speculative_layer_skip"):
        assert [row["k"] for row in result[key]["rows"]] == [1, 2, 4]
        for row in result[key]["rows"]:
            assert row["expected_speedup"] == pytest.approx(
                expected_speedup(row["acceptance_rate"], row["k"], result[key]["cost_ratio"]))
