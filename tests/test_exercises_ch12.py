"""第 12 章检查器的机关：库函数在读者的函数运行期间被禁用（之后原样恢复）；笔记本里（``__main__``）定义的函数
连同它用到的辅助函数、闭包与模块被送进子进程，“找错”题的检查器真的在 3 个 gloo 进程里运行它。"""

import types

import torch.distributed as dist

import pytest

from tformer_lib.exercises import _sandbox, ch12
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


def _notebook_namespace():
    ns = {"__name__": "__main__"}
    exec(compile(NOTEBOOK_CELL, "<ipython-input-1>", "exec"), ns)  # 像笔记本的单元格：模块名是 __main__
    return ns


def test_forbidden_library_functions_raise_inside_and_are_restored_after():
    code = bubble_fraction.__code__
    with pytest.raises(RuntimeError, match="forbidden-library-call:bubble_fraction"):
        with _sandbox.forbid(bubble_fraction, ring_all_reduce_bytes):
            bubble_fraction(2, 4)
    assert bubble_fraction.__code__ is code and bubble_fraction(2, 4) == pytest.approx(0.2)
    assert ring_all_reduce_bytes(8, 2) == 8


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
