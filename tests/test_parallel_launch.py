"""启动器：2 个进程（CPU、gloo、操作系统分配的空闲端口），结果按 rank 返回；出错与超时都不会挂住。"""

import time

import pytest
import torch
import torch.distributed as dist

from tformer_lib.parallel import DistributedError, backend_for, launch


def _sum_ranks(rank, world_size, offset):
    t = torch.tensor([float(rank + offset)])
    dist.all_reduce(t)
    return {"rank": rank, "world_size": world_size, "sum": t, "backend": dist.get_backend()}


def _fail_on_rank1(rank, world_size):
    if rank == 1:
        raise ValueError("rank 1 故意出错")
    dist.barrier()  # rank 0 在这里等一个永远不来的同伴：启动器必须结束它
    return rank


def _add_in_place(rank, world_size, t, layer):
    t.add_(rank + 1)  # 每个进程原地改自己拿到的参数
    with torch.no_grad():
        layer.weight.add_(10.0)
    dist.barrier()
    return float(t.sum()), float(layer.weight.sum())


def test_each_rank_gets_a_private_copy_of_the_arguments():
    t, layer = torch.zeros(3), torch.nn.Linear(2, 2, bias=False)
    with torch.no_grad():
        layer.weight.zero_()
    out = launch(_add_in_place, 2, (t, layer), timeout=90)
    assert out == [(3.0, 40.0), (6.0, 40.0)]  # 各改各的：没有看到另一个进程的修改
    assert float(t.sum()) == 0.0 and float(layer.weight.detach().sum()) == 0.0  # 父进程的张量没有被改动


def _sleep(rank, world_size):
    time.sleep(120)


def test_launch_returns_each_rank_result():
    out = launch(_sum_ranks, 2, (3,), timeout=90)
    assert [o["rank"] for o in out] == [0, 1]
    assert all(o["world_size"] == 2 and o["backend"] == "gloo" for o in out)
    assert all(torch.equal(o["sum"], torch.tensor([7.0])) for o in out)


def test_error_in_one_rank_is_reported_and_others_are_stopped():
    start = time.monotonic()
    with pytest.raises(DistributedError, match="rank 1 出错") as info:
        launch(_fail_on_rank1, 2, timeout=90)
    assert "rank 1 故意出错" in str(info.value)
    assert time.monotonic() - start < 60


def test_timeout_kills_the_processes():
    start = time.monotonic()
    with pytest.raises(DistributedError, match="timeout=3"):
        launch(_sleep, 2, timeout=3)
    assert time.monotonic() - start < 15


def test_backend_and_argument_errors():
    assert backend_for("cpu") == "gloo" and backend_for("cuda") == "nccl"
    with pytest.raises(ValueError, match="device='mps'"):
        backend_for("mps")
    with pytest.raises(ValueError, match="world_size"):
        launch(_sum_ranks, 0)
    with pytest.raises(ValueError, match="timeout"):
        launch(_sum_ranks, 2, timeout=-1)
