"""启动器：2 个进程（CPU、gloo、操作系统分配的空闲端口），结果按 rank 返回；出错与超时都不会挂住；
报错的第一行点名真正出错的 rank（不是随之断开连接的那个）；启动的时间不算在 timeout 里。"""

import os
import signal
import time

import pytest
import torch
import torch.distributed as dist

from tformer_lib.parallel import DistributedError, backend_for, launch
from tformer_lib.parallel.launch import STARTUP_TIMEOUT, _failure_message


def _sum_ranks(rank, world_size, offset):
    t = torch.tensor([float(rank + offset)])
    dist.all_reduce(t)
    return {"rank": rank, "world_size": world_size, "sum": t, "backend": dist.get_backend()}


def _fail_on_rank1(rank, world_size):
    if rank == 1:
        raise ValueError("rank 1 故意出错")
    dist.barrier()  # rank 0 在这里等一个永远不来的同伴：启动器必须结束它
    return rank


def _fail_after_closing_the_connection(rank, world_size):
    t = torch.ones(4)
    dist.all_reduce(t)
    if rank == 1:
        dist.destroy_process_group()  # 连接先断：rank 0 的下一次 all_reduce 立刻报 Connection closed，先到父进程
        time.sleep(2)
        raise ValueError("rank 1 的真正原因")
    dist.all_reduce(t)
    return rank


def _exit_without_a_word(rank, world_size):
    t = torch.ones(4)
    dist.all_reduce(t)
    if rank == 1:
        os._exit(3)  # 不报任何消息就退出（像被信号杀掉、或 C++ 里崩溃）
    dist.all_reduce(t)
    return rank


def _slow_to_unpickle(seconds):
    time.sleep(seconds)
    return seconds


class SlowArgument:
    """子进程解开它要 ``seconds`` 秒：模拟忙机器上很慢的启动（导入 torch 等）。"""

    def __init__(self, seconds):
        self.seconds = seconds

    def __reduce__(self):
        return _slow_to_unpickle, (self.seconds,)


def _return_argument(rank, world_size, value):
    return value


def _add_in_place(rank, world_size, t, layer):
    t.add_(rank + 1)  # 每个进程原地改自己拿到的参数
    with torch.no_grad():
        layer.weight.add_(10.0)
    dist.barrier()
    return float(t.sum()), float(layer.weight.sum())


@pytest.mark.distributed
def test_each_rank_gets_a_private_copy_of_the_arguments():
    t, layer = torch.zeros(3), torch.nn.Linear(2, 2, bias=False)
    with torch.no_grad():
        layer.weight.zero_()
    out = launch(_add_in_place, 2, (t, layer), timeout=90)
    assert out == [(3.0, 40.0), (6.0, 40.0)]  # 各改各的：没有看到另一个进程的修改
    assert float(t.sum()) == 0.0 and float(layer.weight.detach().sum()) == 0.0  # 父进程的张量没有被改动


def _sleep(rank, world_size):
    time.sleep(600)


@pytest.mark.distributed
def test_launch_returns_each_rank_result():
    out = launch(_sum_ranks, 2, (3,), timeout=90)
    assert [o["rank"] for o in out] == [0, 1]
    assert all(o["world_size"] == 2 and o["backend"] == "gloo" for o in out)
    assert all(torch.equal(o["sum"], torch.tensor([7.0])) for o in out)


@pytest.mark.distributed
def test_error_in_one_rank_is_reported_and_others_are_stopped():
    start = time.monotonic()
    with pytest.raises(DistributedError) as info:
        launch(_fail_on_rank1, 2, timeout=900)
    assert str(info.value).splitlines()[0] == "rank 1 出错：ValueError: rank 1 故意出错"
    # 没被结束的 rank 0 会在 barrier 里等到 timeout=900 秒；界限留出负载很高时的启动（实测 20–60 秒，上限 STARTUP_TIMEOUT）
    assert time.monotonic() - start < STARTUP_TIMEOUT + 60


@pytest.mark.distributed
def test_the_first_line_blames_the_rank_that_failed_not_the_one_whose_connection_closed():
    with pytest.raises(DistributedError) as info:
        launch(_fail_after_closing_the_connection, 2, timeout=90)
    lines = str(info.value).splitlines()
    assert lines[0] == "rank 1 出错：ValueError: rank 1 的真正原因", lines[:3]
    assert any(line.startswith("rank 0：") for line in lines)  # 随之失败的 rank 0 排在后面
    with pytest.raises(DistributedError) as info:
        launch(_exit_without_a_word, 2, timeout=90)
    assert str(info.value).splitlines()[0] == "rank 1 意外退出（exitcode=3），没有返回结果", str(info.value)[:300]


def test_failure_message_orders_real_errors_first_and_explains_sigkill():
    closed = "Traceback…\nRuntimeError: [gloo/pair.cc:553] Connection closed by peer [127.0.0.1]:7555"
    real = "Traceback…\nKeyError: 'x'"
    assert _failure_message({0: closed, 2: real}, {}).splitlines()[0] == "rank 2 出错：KeyError: 'x'"
    text = _failure_message({0: closed}, {1: -signal.SIGKILL})
    assert text.splitlines()[0].startswith("rank 1 意外退出（exitcode=-9，被 SIGKILL 结束：不是本库发出的")
    assert "OOM" in text.splitlines()[0] and "rank 0：RuntimeError" in text
    only = _failure_message({0: closed}, {})  # 只有通信错误：照实报，并说明它可能不是原因
    assert only.startswith("rank 0 出错：RuntimeError") and "通信错误" in only.splitlines()[1]


@pytest.mark.distributed
def test_start_up_is_not_counted_in_the_timeout():
    # 子进程解开参数要 4 秒（像负载很高时导入 torch）；timeout=2 只管启动之后的运行，不该超时
    assert launch(_return_argument, 2, (SlowArgument(4),), timeout=2) == [4, 4]


@pytest.mark.distributed
def test_timeout_kills_the_processes():
    start = time.monotonic()
    with pytest.raises(DistributedError, match="timeout=3"):
        launch(_sleep, 2, timeout=3)
    assert time.monotonic() - start < STARTUP_TIMEOUT + 60  # 早于 _sleep 的 600 秒：进程被结束了（界限留出负载下的启动）


@pytest.mark.distributed
def test_backend_and_argument_errors():
    assert backend_for("cpu") == "gloo" and backend_for("cuda") == "nccl"
    with pytest.raises(ValueError, match="device='mps'"):
        backend_for("mps")
    with pytest.raises(ValueError, match="world_size"):
        launch(_sum_ranks, 0)
    with pytest.raises(ValueError, match="timeout"):
        launch(_sum_ranks, 2, timeout=-1)
