"""推理服务的坏输入（issue 14 的 API 攻击）：每种都给出点名参数的中文错误，不是 Python/torch 的原始异常。"""

import math
import time
import warnings

import matplotlib
import pytest
import torch

from tformer_lib.lm import LMConfig, make_lm
from tformer_lib.serving import (
    BlockManager,
    Engine,
    PagedKVCache,
    Request,
    SpeculativeStats,
    WorkItem,
    expected_speedup,
    expected_tokens_per_pass,
    greedy_batch,
    layer_skip_draft,
    left_pad,
    make_workload,
    run_continuous,
    run_static,
    speculative_generate,
    summarize,
)
from tformer_lib.serving.benchmark import report
from tformer_lib.serving.measure import batching_benchmark, prefix_caching_benchmark, speculative_benchmark
from tformer_lib.serving.draft import load_draft_model
from tformer_lib.serving.roofline import prefill_cost

matplotlib.use("Agg")

CONFIG = LMConfig(vocab_size=11, d_model=16, n_heads=2, n_layers=2, d_ff=16, max_len=12)
torch.manual_seed(0)
M = make_lm(CONFIG).eval()
ITEMS = [WorkItem((2, 3), 2, 0.0), WorkItem((4,), 3, 0.0)]


def _manager():
    bm = BlockManager(4, 2)
    bm.allocate(0, [2, 3, 4])
    return bm


def _cache():
    cache = PagedKVCache(M, 4, 2)
    cache.manager.allocate(0, [2, 3])
    return cache


def _done(n_out):
    r = Request([2], n_out, 0, 0.0)
    r.output = [5] * n_out
    r.first_token_time, r.finish_time = (0.1 if n_out else None), 0.2
    return r


def _slot_timeline_explorer(**kw):
    from tformer_lib.widgets.serving import slot_timeline_explorer

    return slot_timeline_explorer(M, [([2, 3], 2)], **kw)


def _block_table_explorer(requests=(([2, 3], 2),), **kw):
    from tformer_lib.widgets.serving import block_table_explorer

    return block_table_explorer(M, list(requests), **kw)


def _plot(name, *args, **kw):
    from tformer_lib.plotting import serving

    return getattr(serving, name)(*args, **kw)


# (说明, 调用, 异常类型, 消息里必须出现的片段)
BAD = [
    # 1. summarize 与基准
    ("summarize empty", lambda: summarize([], 1.0), ValueError, "requests"),
    ("summarize wall=0", lambda: summarize([_done(2)], 0), ValueError, "wall"),
    ("summarize wall=nan", lambda: summarize([_done(2)], math.nan), ValueError, "wall"),
    ("summarize unfinished", lambda: summarize([Request([2], 2)], 1.0), ValueError, "requests[0]"),
    ("batching_benchmark no items", lambda: batching_benchmark(M, []), ValueError, "items"),
    ("batching_benchmark rounds=0", lambda: batching_benchmark(M, ITEMS, rounds=0), ValueError, "rounds"),
    # 2. Engine.run 的参数
    ("run non-request", lambda: Engine(M).run([([2, 3], 2)]), TypeError, "requests[0]"),
    ("run one request", lambda: Engine(M).run(Request([2, 3], 2)), TypeError, "requests"),
    # 3. 点名对的参数
    ("run_static max_batch=0", lambda: run_static(M, ITEMS, max_batch=0), ValueError, "max_batch"),
    ("explorer max_batches=(0,)", lambda: _slot_timeline_explorer(max_batches=(0,)), ValueError, "max_batches"),
    ("prefix bench empty tails", lambda: prefix_caching_benchmark(M, [2, 3], [], 3), ValueError, "tails"),
    ("slot_utilization max_batch=0", lambda: _plot("slot_utilization", [[(0, 0)]], 0), ValueError, "max_batch 应是正整数"),
    ("prefill_cost prompt_len=0", lambda: prefill_cost(CONFIG, 0), ValueError, "prompt_len"),
    # 4. 画图
    ("plot_slot_timeline []", lambda: _plot("plot_slot_timeline", []), ValueError, "timeline"),
    ("plot_slot_timeline [[]]", lambda: _plot("plot_slot_timeline", [[]]), ValueError, "timeline"),
    ("slot_utilization slot >= max_batch", lambda: _plot("slot_utilization", [[(0, 0), (0, 1), (0, 2)]], 2),
     ValueError, "max_batch=2"),
    ("plot_slot_timeline max_batch=0", lambda: _plot("plot_slot_timeline", [[(0, 0)]], max_batch=0), ValueError,
     "max_batch"),
    ("plot_slot_timeline max_batch too small", lambda: _plot("plot_slot_timeline", [[(0, 0)], [(0, 1)]], max_batch=1),
     ValueError, "max_batch=1"),
    ("plot_block_table columns=0", lambda: _plot("plot_block_table", _manager(), columns=0), ValueError, "columns"),
    ("plot_block_table columns=-1", lambda: _plot("plot_block_table", _manager(), columns=-1), ValueError, "columns"),
    ("plot_roofline list", lambda: _plot("plot_roofline", [1.0], 1e9, 1e9), TypeError, "points"),
    # 5. 探索器
    ("block explorer max_frames=1", lambda: _block_table_explorer(max_frames=1), ValueError, "max_frames"),
    ("block explorer max_frames=0", lambda: _block_table_explorer(max_frames=0), ValueError, "max_frames"),
    ("block explorer n_new=0", lambda: _block_table_explorer([([2, 3], 0)]), ValueError, "max_new_tokens"),
    # 6. make_workload
    ("make_workload rate=0", lambda: make_workload([[2]], 3, max_len=12, rate=0), ValueError, "rate"),
    ("make_workload mean=0", lambda: make_workload([[2]], 3, max_len=12, mean_new_tokens=0), ValueError,
     "mean_new_tokens"),
    ("make_workload mean=nan", lambda: make_workload([[2]], 3, max_len=12, mean_new_tokens=math.nan), ValueError,
     "mean_new_tokens"),
    ("make_workload max_len=True", lambda: make_workload([[2]], 3, max_len=True), TypeError, "max_len"),
    # 7. speculative_benchmark 与 report
    ("spec bench prompts=[]", lambda: speculative_benchmark(M, M, [], 3), ValueError, "prompts"),
    ("spec bench max_new_tokens=0", lambda: speculative_benchmark(M, M, [[2]], 0), ValueError, "max_new_tokens"),
    ("spec bench ks=()", lambda: speculative_benchmark(M, M, [[2]], 3, ks=()), ValueError, "ks"),
    ("report partial dict", lambda: report({"batching": {}}), ValueError, "serving_results"),
    ("report not a dict", lambda: report([1]), TypeError, "serving_results"),
    # 8. 公式与统计
    ("tokens_per_pass k=-1", lambda: expected_tokens_per_pass(0.5, -1), ValueError, "k"),
    ("tokens_per_pass k=2.5", lambda: expected_tokens_per_pass(0.5, 2.5), TypeError, "k"),
    ("tokens_per_pass k=True", lambda: expected_tokens_per_pass(0.5, True), TypeError, "k"),
    ("tokens_per_pass alpha=True", lambda: expected_tokens_per_pass(True, 2), ValueError, "alpha"),
    ("tokens_per_pass alpha=nan", lambda: expected_tokens_per_pass(math.nan, 2), ValueError, "alpha"),
    ("speedup cost=nan", lambda: expected_speedup(0.5, 2, math.nan), ValueError, "cost_ratio"),
    ("speedup cost=inf", lambda: expected_speedup(0.5, 2, math.inf), ValueError, "cost_ratio"),
    ("stats negative", lambda: SpeculativeStats(proposed=-1, accepted=5), ValueError, "proposed"),
    ("stats accepted > proposed", lambda: SpeculativeStats(proposed=2, accepted=5), ValueError, "accepted"),
    # 9. BlockManager / PagedKVCache
    ("slot past end", lambda: _manager().slot(0, 4), ValueError, "position"),
    ("slot negative", lambda: _manager().slot(0, -1), ValueError, "position"),
    ("slot unknown seq", lambda: _manager().slot(7, 0), KeyError, "seq_id"),
    ("append_slots -2", lambda: _manager().append_slots(0, -2), ValueError, "n_tokens"),
    ("blocks_needed -1", lambda: _manager().blocks_needed(-1), ValueError, "n_tokens"),
    ("allocate empty prompt", lambda: _manager().allocate(1, []), ValueError, "prompt"),
    ("can_allocate str", lambda: _manager().can_allocate("3"), TypeError, "n_tokens"),
    ("BlockManager prefix str", lambda: BlockManager(4, 2, prefix_caching="no"), TypeError, "prefix_caching"),
    ("packed_view unknown seq", lambda: _cache().packed_view([1], [1]), KeyError, "seq_id"),
    ("packed_view length mismatch", lambda: _cache().packed_view([0], [1, 1]), ValueError, "n_new"),
    ("packed_view empty", lambda: _cache().packed_view([], []), ValueError, "seq_ids"),
    ("packed_view n_new=0", lambda: _cache().packed_view([0], [0]), ValueError, "n_new"),
    ("decode_view unknown seq", lambda: _cache().decode_view([1]), KeyError, "seq_id"),
    ("decode_view empty", lambda: _cache().decode_view([]), ValueError, "seq_ids"),
    ("decode_view not a list", lambda: _cache().decode_view(0), ValueError, "seq_ids"),
    # 10. 不是模型
    ("Engine('x')", lambda: Engine("x"), TypeError, "model"),
    ("greedy_batch('m')", lambda: greedy_batch("m", [[2, 3]], 2), TypeError, "model"),
    ("PagedKVCache('x')", lambda: PagedKVCache("x", 4), TypeError, "model"),
    ("speculative draft='d'", lambda: speculative_generate(M, "d", [2, 3], 2), TypeError, "draft"),
    ("layer_skip_draft('m')", lambda: layer_skip_draft("m", 1), TypeError, "model"),
    ("plot_arithmetic_intensity('x')", lambda: _plot("plot_arithmetic_intensity", "x"), TypeError, "config"),
    ("load_draft_model(123)", lambda: load_draft_model(123), TypeError, "path"),
    # 11. 其他参数
    ("Engine prefix_caching='no'", lambda: Engine(M, prefix_caching="no"), TypeError, "prefix_caching"),
    ("Engine suppress_ids='ab'", lambda: Engine(M, suppress_ids="ab"), TypeError, "suppress_ids"),
    ("Engine suppress_ids=3", lambda: Engine(M, suppress_ids=3), TypeError, "suppress_ids"),
    ("Engine suppress_ids=None", lambda: Engine(M, suppress_ids=None), TypeError, "suppress_ids"),
    ("greedy_batch suppress_ids='ab'", lambda: greedy_batch(M, [[2]], 2, suppress_ids="ab"), TypeError, "suppress_ids"),
    ("greedy_batch suppress_ids=3", lambda: greedy_batch(M, [[2]], 2, suppress_ids=3), TypeError, "suppress_ids"),
    ("speculative suppress_ids=None", lambda: speculative_generate(M, M, [2], 2, suppress_ids=None), TypeError,
     "suppress_ids"),
    ("greedy_batch on_token=5", lambda: greedy_batch(M, [[2]], 2, on_token=5), TypeError, "on_token"),
    ("left_pad []", lambda: left_pad([]), ValueError, "prompts"),
    ("left_pad ['ab']", lambda: left_pad(["ab"]), ValueError, "prompts[0]"),
    ("left_pad [[]]", lambda: left_pad([[]]), ValueError, "prompts[0]"),
    ("left_pad pad_id=0.5", lambda: left_pad([[2]], pad_id=0.5), TypeError, "pad_id"),
    ("left_pad pad_id=-1", lambda: left_pad([[2]], pad_id=-1), ValueError, "pad_id"),
    ("left_pad pad_id='x'", lambda: left_pad([[2]], pad_id="x"), TypeError, "pad_id"),
    ("run_continuous foo=1", lambda: run_continuous(M, ITEMS, foo=1), TypeError, "foo"),
]


def _has_chinese(text: str) -> bool:
    return any("\u4e00" <= ch <= "\u9fff" for ch in text)


@pytest.mark.parametrize("call, error, fragment", [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_bad_input_is_named_in_chinese(call, error, fragment):
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # 也不许先冒出 matplotlib / ipywidgets 的警告
        with pytest.raises(error) as info:
            call()
    message = str(info.value)
    assert _has_chinese(message), message
    assert fragment in message, message


def test_run_adds_the_requests_it_is_given():
    engine = Engine(M)
    mine = Request([2, 3], 3)
    queued = engine.add_request([4], 2)
    engine.run([mine, queued])  # 已提交的不会再排一次
    want = greedy_batch(M, [[2, 3], [4]], [3, 2])
    assert mine.done and mine.output == want[0] and queued.output == want[1]
    assert mine.request_id != queued.request_id and engine.cache.manager.used_blocks == 0
    with pytest.raises(ValueError, match="已经跑过"):
        Engine(M).run([mine])


def test_zero_token_requests_have_no_first_token():
    engine = Engine(M)
    zero, one = engine.add_request([2], 0), engine.add_request([3], 3)
    engine.run()
    assert zero.done and zero.first_token_time is None and zero.output == []
    stats = summarize([zero, one], 1.0)
    assert stats["ttft_p50"] == pytest.approx(one.first_token_time - one.arrival)
    static, _ = run_static(M, [WorkItem((2,), 0, 0.0), WorkItem((3,), 3, 0.0)])
    assert static[0].done and static[0].first_token_time is None


def test_summarize_undefined_latencies_are_nan():
    stats = summarize([_done(1)], 2.0)  # 只有 1 个词元：TPOT 无从定义
    assert stats["throughput"] == 0.5 and math.isnan(stats["tpot_p50"]) and math.isnan(stats["tpot_p95"])
    stats = summarize([_done(0)], 2.0)
    assert stats["tokens"] == 0 and math.isnan(stats["ttft_p50"])


def test_numpy_integers_and_sets_still_accepted():
    import numpy as np

    bm = BlockManager(4, 2)
    assert bm.blocks_needed(np.int64(3)) == 2
    assert Engine(M, suppress_ids=[0, 1]).suppress_ids == (0, 1)
    assert Engine(M, suppress_ids=torch.tensor([0, 1])).suppress_ids == (0, 1)
    assert greedy_batch(M, [[2]], 2, suppress_ids=np.array([0, 1])) == greedy_batch(M, [[2]], 2)
    assert expected_tokens_per_pass(0.5, 2) == pytest.approx(1.75)
    assert expected_speedup(0.5, 2, 0.0) == pytest.approx(1.75)
    tokens, positions, mask = left_pad(((2, 3), (4,)))  # 元组的提示也行
    assert tokens.tolist() == [[2, 3], [0, 4]] and positions.tolist() == [[0, 1], [0, 0]]
