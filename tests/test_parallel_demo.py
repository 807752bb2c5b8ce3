"""第 12 章的现场演示（tformer_lib.parallel.demo）：常驻进程池与三个演示函数（2 个进程，gloo，有超时）。

演示函数本身只是把已测过的 worker（test_parallel_data/fsdp/tensor/pipeline）串起来，这里核对它们的返回值
说的是真话：在容差内、通信字节等于公式、FSDP2 的字节合起来正好 4N；进程池出错时报错而不挂住。
"""

import pytest
import torch

from tformer_lib import MultiHeadAttention, causal_mask
from tformer_lib.parts.feedforward import PositionwiseFeedForward
from tformer_lib.parallel.demo import (
    demo_blocks,
    demo_data_parallel,
    demo_lm,
    demo_pipeline,
    demo_tensor_parallel,
    hello_all_reduce,
    max_param_diff,
)
from tformer_lib.parallel.launch import DistributedError, WorkerPool
from tformer_lib.parallel.tensor_parallel import ResidualBlock


def _fails(rank, world_size):  # 顶层函数：子进程按名字导入它
    if rank == 1:
        raise RuntimeError("第 1 个进程故意出错")
    return rank


@pytest.fixture(scope="module")
def pool():
    with WorkerPool(2, timeout=150) as p:
        yield p


@pytest.fixture(scope="module")
def tiny():
    torch.manual_seed(0)
    return demo_lm(31), torch.randint(4, 31, (16, 9))  # 奇数词表：FSDP2 的分片不均


@pytest.mark.distributed
def test_pool_runs_tasks_repeatedly(pool):
    for _ in range(2):
        out = hello_all_reduce(pool=pool)
        assert [r["after"] for r in out] == [3.0, 3.0] and [r["before"] for r in out] == [1.0, 2.0]
        assert {r["backend"] for r in out} == {"gloo"}


@pytest.mark.distributed
def test_demos_report_equality_and_bytes(pool, tiny):
    model, blocks = tiny
    dp = demo_data_parallel(model, blocks, steps=2, batch_size=4, lr=1e-3, pool=pool)
    for mode in ("manual", "ddp", "fsdp"):
        assert dp[mode]["within"], (mode, dp[mode]["param_diff"])
    n = dp["n_params"]
    assert dp["bytes_per_step"] == dp["payload_formula"] == 4 * n == sum(dp["ddp_buckets"])
    assert sum(b["parameters"] for b in dp["fsdp_bytes"]) == 4 * n
    assert dp["fsdp_bytes"][0]["parameters"] > dp["zero3_formula"]["parameters"] > dp["fsdp_bytes"][1]["parameters"]
    c = dp["fsdp_comm"]  # 前向收齐全部参数（含补齐）、反向只收齐各块（根模块不释放）、梯度 reduce-scatter 一遍
    assert c["all_gather_forward"] == c["reduce_scatter"] >= 4 * n > c["all_gather_backward"] > 0

    pp = demo_pipeline(model, blocks, steps=2, batch_size=4, micro_batches=2, lr=0.5, pool=pool)
    for mode in ("manual", "manual_1f1b", "gpipe", "1f1b"):
        assert pp[mode]["within"], (mode, pp[mode]["param_diff"])
    assert pp["bytes_per_step"] == pp["payload_formula"]
    assert {e.rank for e in pp["manual"]["timeline"]} == {0, 1} and 0 <= pp["manual"]["idle_fraction"] < 1
    assert sum(pp["manual"]["stage_params"]) == n


@pytest.mark.distributed
def test_tensor_parallel_demo_without_pool():
    torch.manual_seed(0)
    block = ResidualBlock(MultiHeadAttention(16, 4), PositionwiseFeedForward(16, 32))
    x, target = torch.randn(2, 5, 16), torch.randn(2, 5, 16)
    tp = demo_tensor_parallel(block, x, target, causal_mask(5), steps=2)  # 不给 pool：走 launch
    assert tp["manual"]["within"] and tp["manual"]["ranks_agree"] and tp["torch"]["within"], (tp["manual"]["param_diff"], tp["torch"]["param_diff"])
    assert tp["manual"]["bytes_per_step"] == tp["manual"]["payload_formula"] == tp["torch"]["bytes_per_step"]
    assert tp["manual"]["shard_shapes"]["attn.w_q.weight"] == (8, 16)


@pytest.mark.distributed
def test_pool_error_is_reported_and_closes_the_pool():
    p = WorkerPool(2, timeout=60)
    with pytest.raises(DistributedError, match="第 1 个进程故意出错"):
        p.run(_fails)
    assert p.closed
    with pytest.raises(DistributedError, match="已经关闭"):
        p.run(_fails)
    assert all(not proc.is_alive() for proc in p._procs)


@pytest.mark.distributed
def test_bad_arguments():
    with pytest.raises(ValueError, match="world_size 应是正整数"):
        WorkerPool(0)
    with pytest.raises(ValueError, match="timeout"):
        WorkerPool(2, timeout=-1)
    with pytest.raises(ValueError, match="名字不同"):
        max_param_diff({"a": torch.zeros(1)}, {"b": torch.zeros(1)})
    with pytest.raises(ValueError, match="不能为空"):
        max_param_diff({}, {})
    with pytest.raises(ValueError, match="device='tpu'"):
        WorkerPool(2, device="tpu")
    with pytest.raises(ValueError, match="launch"):  # GPU 的路在 launch，不在这个演示用的池
        WorkerPool(2, device="cuda")
    for bad in ((0, 8), (-1, 8), (True, 8), (4, 0)):
        with pytest.raises((TypeError, ValueError), match="n_blocks|length"):
            demo_blocks(*bad)


def test_throughput_results_file_says_where_it_was_measured():
    from tformer_lib.parallel.throughput import load_throughput_results

    r = load_throughput_results()
    assert {"command", "date", "cpu", "load_average", "torch"} <= set(r["produced_by"])
    assert len(r["rounds"]) == r["settings"]["rounds"] >= 3
    for one in r["rounds"]:
        assert one["1x2"]["tokens_per_s"] > 0 and one["2x1_ddp"]["tokens_per_s"] > 0 and 0 < one["2x1"]["comm_share"] < 1
    with pytest.raises(FileNotFoundError, match="python -m tformer_lib.parallel.throughput"):
        load_throughput_results("/nonexistent/throughput.json")


@pytest.mark.distributed
def test_demo_arguments_are_checked_before_any_process_starts(tiny):
    model, blocks = tiny
    with pytest.raises(ValueError, match="batch_size=6 不能被 micro_batches=4 整除"):
        demo_pipeline(model, blocks, batch_size=6, micro_batches=4)
    with pytest.raises(ValueError, match="需要 24 块"):
        demo_data_parallel(model, blocks, steps=3, batch_size=8)
    with pytest.raises(ValueError, match="batch_size=3 不能被进程数"):
        demo_data_parallel(model, blocks, batch_size=3)
    with pytest.raises(ValueError, match="modes"):
        demo_pipeline(model, blocks, batch_size=4, micro_batches=2, modes="manual")
    with pytest.raises(ValueError, match="lr"):
        demo_data_parallel(model, blocks, batch_size=4, lr=float("nan"))
    tied = demo_lm(31, tie_embeddings=True)
    with pytest.raises(ValueError, match="tie_embeddings=False"):
        demo_pipeline(tied, blocks, batch_size=4, micro_batches=2)
    block = ResidualBlock(MultiHeadAttention(16, 4), PositionwiseFeedForward(16, 31))
    with pytest.raises(ValueError, match="d_ff=31 不能被进程数 2 整除"):
        demo_tensor_parallel(block, torch.randn(2, 5, 16), torch.randn(2, 5, 16))
