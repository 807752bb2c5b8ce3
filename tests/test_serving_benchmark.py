"""推理服务测量函数：结构完整、两种批处理输出一致、内存账目与缓存形状相符。"""

import random

import torch

from tformer_lib.lm import LMConfig, make_lm
from tformer_lib.serving import layer_skip_draft, make_workload
from tformer_lib.serving.benchmark import batching_benchmark, speculative_benchmark


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
