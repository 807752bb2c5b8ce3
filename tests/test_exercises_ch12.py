"""第 12 章检查器的机关：读者的函数用到禁用的库函数（不论在本进程还是子进程里）得到同一句 ❌ library_call 提示，
库函数本身不被改动；笔记本里（``__main__``）定义的函数连同它用到的辅助函数、闭包与模块被送进子进程，
“找错”题的检查器真的在 2 个与 3 个 gloo 进程里运行它。"""

import importlib
import sys
import types

import torch.distributed as dist

import pytest

from tformer_lib.exercises import _sandbox, ch12
from tformer_lib.exercises._core import LIBRARY_CALL_HINT
from tformer_lib.parallel import comm
from tformer_lib.parallel.comm import ring_all_reduce_bytes
from tformer_lib.parallel.pipeline import bubble_fraction

NOTEBOOK_CELL = '''
import torch.distributed as dist

def _world():
    return dist.get_world_size()

def make(scale):
    def fixed(model):
        for p in model.parameters():
            if p.grad is not None:
                dist.all_reduce(p.grad)
                p.grad *= scale / _world()
        return model
    return fixed

allreduce_fixed = make(1.0)
'''


_LIBRARY_CALL = LIBRARY_CALL_HINT.split("{")[0]  # 那一句提示点名禁用对象之前的部分


def _notebook_namespace():
    ns = {"__name__": "__main__"}
    exec(compile(NOTEBOOK_CELL, "<ipython-input-1>", "exec"), ns)  # 像笔记本的单元格：模块名是 __main__
    return ns


def test_a_banned_call_gets_the_one_hint_and_the_library_is_untouched(capsys):
    code = bubble_fraction.__code__
    r = ch12.check_bubble_fraction(lambda p, m, c: 1 - m * (p - 1 + c) / (p * (p - 1 + m * c)) + 0 * bubble_fraction(p, m))
    assert r.mistake == "library_call" and "bubble_fraction" in r.hint and r.hint.startswith(_LIBRARY_CALL), r.message
    r = ch12.check_ring_allreduce_bytes(lambda n, p, b: getattr(comm, "ring_all_reduce_" + "bytes")(n * b, p))
    assert r.mistake == "library_call" and "ring_all_reduce_bytes" in r.hint, r.message  # 拐弯拿到的：运行时记下
    assert bubble_fraction.__code__ is code and bubble_fraction(2, 4) == pytest.approx(0.2)
    assert ring_all_reduce_bytes(8, 2) == 8 and sys.getprofile() is None
    assert ch12.check_ring_allreduce_bytes(_stub).pending
    capsys.readouterr()


def _stub(n_elements, world_size, element_bytes):
    raise NotImplementedError


def test_a_notebook_function_with_helpers_and_closures_survives_shipping():
    ns = _notebook_namespace()
    shipped = _sandbox.ship(ns["allreduce_fixed"])
    assert shipped[0] == "code"  # __main__ 里的函数不能按名字导入，送的是字节码
    fn = _sandbox.unship(shipped)
    assert isinstance(fn, types.FunctionType) and fn.__closure__[0].cell_contents == 1.0
    assert fn.__globals__["_world"].__code__.co_code == ns["_world"].__code__.co_code
    assert fn.__globals__["dist"].__name__ == "torch.distributed"


@pytest.mark.distributed
def test_allreduce_checker_runs_a_notebook_function_in_two_and_three_processes(capsys):
    ns = _notebook_namespace()
    assert ch12.check_allreduce_gradients(ns["allreduce_fixed"]).passed
    doubled = ch12.check_allreduce_gradients(ns["make"](2.0))  # 平均的 2 倍：先起的 2 个进程里正好是总和
    assert doubled.status == "failed" and doubled.mistake == "sum_not_mean" and "2 个进程" in doubled.hint
    wrong = ch12.check_allreduce_gradients(ns["make"](1.5))  # 平均的 1.5 倍：哪一种已知错误都不是
    assert wrong.status == "failed" and wrong.mistake == "values"
    capsys.readouterr()


def _only_rank0(model):
    if dist.get_rank() == 0:  # 别的进程不参加：rank 0 的 all_reduce 等不到同伴
        for p in model.parameters():
            if p.grad is not None:
                dist.all_reduce(p.grad)
    return model


def _raise_on_rank1(model):
    if dist.get_rank() == 1:
        raise KeyError("只在 rank 1 上出错")
    for p in model.parameters():
        if p.grad is not None:
            dist.all_reduce(p.grad)
    return model


@pytest.mark.distributed
def test_collective_mistakes_are_named_and_the_real_error_is_reported_first(capsys):
    r = ch12.check_allreduce_gradients(_only_rank0, timeout=60)
    assert r.status == "failed" and r.mistake == "collective_mismatch", r.message
    r = ch12.check_allreduce_gradients(_raise_on_rank1, timeout=60)
    assert r.status == "failed" and r.mistake == "exception" and "KeyError" in r.hint and "rank 1" in r.hint, r.message
    capsys.readouterr()


def _library_in_the_worker(model):
    dist.get_rank()  # 本进程里试调时没有进程组：在这里停下，禁用的库函数只在子进程里执行到
    data_parallel = importlib.import_module("tformer_lib.parallel." + "data_parallel")
    getattr(data_parallel, "allreduce_" + "gradients")(model)  # 代码里看不出名字：只有子进程里的运行时记录认得出
    return model


@pytest.mark.distributed
def test_a_banned_call_inside_a_worker_process_gets_the_one_hint(capsys):
    r = ch12.check_allreduce_gradients(_library_in_the_worker, timeout=60)
    assert r.status == "failed" and r.mistake == "library_call", r.message
    assert r.hint == LIBRARY_CALL_HINT.format(names="`tformer_lib.parallel.data_parallel.allreduce_gradients`")
    capsys.readouterr()
