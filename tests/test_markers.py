"""``tests/conftest.py`` 的标记守卫：启动进程却没带 ``distributed`` 标记的测试失败，带了的照常通过。"""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import _starts_distributed

INNER = '''
import multiprocessing

import pytest


def _start_one():
    p = multiprocessing.get_context("spawn").Process(target=abs, args=(-1,))
    p.start()
    p.join(timeout=60)
    assert p.exitcode == 0


def test_unmarked_starts_a_process():
    _start_one()


@pytest.mark.distributed
def test_marked_starts_a_process():
    _start_one()


def test_unmarked_without_processes():
    assert True
'''


@pytest.mark.slow
def test_an_unmarked_test_that_starts_a_process_fails(tmp_path):
    shutil.copy(Path(__file__).with_name("conftest.py"), tmp_path / "conftest.py")
    (tmp_path / "test_inner.py").write_text(INNER, encoding="utf-8")
    run = subprocess.run([sys.executable, "-m", "pytest", str(tmp_path), "-q", "-p", "no:cacheprovider",
                          "-W", "ignore::pytest.PytestUnknownMarkWarning", "-rA"],
                         capture_output=True, text=True, timeout=240, cwd=tmp_path)
    out = run.stdout + run.stderr
    assert run.returncode != 0, out
    assert "3 passed, 1 error" in out, out  # 守卫在收尾（teardown）时报错：那一个测试算 error
    assert "test_unmarked_starts_a_process" in out and "没有 @pytest.mark.distributed 标记" in out, out


def test_torchrun_commands_are_recognised():
    assert _starts_distributed(["torchrun", "--nproc-per-node", "2", "x.py"])
    assert _starts_distributed(["/venv/bin/torchrun", "x.py"])
    assert _starts_distributed([sys.executable, "-m", "torch.distributed.run", "x.py"])
    assert _starts_distributed("torchrun --standalone x.py")
    assert not _starts_distributed([sys.executable, "-m", "tformer_lib", "lm-train"])
    assert not _starts_distributed(["git", "status"])
