"""``torchrun --nproc_per_node 2 -m tformer_lib lm-train …``：不改任何参数就以 DDP 训练，2 步后的检查点与
单进程训练的一致（参数最大差 ≤ 1e-5，实测约 3e-7；PAD 目标按全局计数归一，所以是同一个量），只有 rank 0 打印与写盘。

用随书完整的唐诗数据（torchrun 起的子进程里无法替换数据）和一个小模型。
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tformer_lib.lm import load_lm

# 小模型：结论（两个进程 = 一个进程）与模型大小无关，而配方的 128 维 4 层模型光是最后一次全验证集评估
# 每个进程就要约 20 秒
ARGS = ["--threads", "1", "lm-train", "--steps", "2", "--total-steps", "100", "--no-progress",
        "--d-model", "32", "--n-layers", "1", "--n-heads", "2", "--d-ff", "64"]


def _run(cmd, cwd):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=400)


@pytest.mark.distributed
def test_torchrun_two_processes_equal_one_process(tmp_path):
    torchrun = Path(sys.executable).with_name("torchrun")
    if not torchrun.exists():
        pytest.skip("torchrun 不在这个 Python 环境里")
    single = _run([sys.executable, "-m", "tformer_lib", *ARGS, "--out", "single.pt"], tmp_path)
    assert single.returncode == 0, single.stderr
    ddp = _run([str(torchrun), "--nproc_per_node", "2", "-m", "tformer_lib", *ARGS, "--out", "ddp.pt"], tmp_path)
    assert ddp.returncode == 0, ddp.stderr
    assert ddp.stdout.count("已保存 ") == 1  # 只有 rank 0 打印
    a, b = load_lm(tmp_path / "single.pt"), load_lm(tmp_path / "ddp.pt")
    sa, sb = a[0].state_dict(), b[0].state_dict()
    assert max(float((sa[k] - sb[k]).abs().max()) for k in sa) <= 1e-5
    ha, hb = a[2]["trainer"], b[2]["trainer"]
    assert ha["history"]["step_loss"] == pytest.approx(hb["history"]["step_loss"], rel=1e-6)
    assert ha["tokens_seen"] == hb["tokens_seen"]
    assert torch.equal(torch.tensor(ha["step"]), torch.tensor(hb["step"]))
