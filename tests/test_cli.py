"""命令行：帮助、训练→翻译→评估、以及检查点缺失/损坏与未知任务的清楚报错（用子进程真实运行）。"""

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def run(*args, stdin=None):
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    return subprocess.run([sys.executable, "-m", "tformer_lib", "--threads", "1", *args], capture_output=True,
                          text=True, input=stdin, cwd=ROOT, env=env, timeout=300)


@pytest.mark.slow
def test_help_lists_commands():
    r = run("--help")
    assert r.returncode == 0
    for cmd in ("train", "translate", "evaluate", "lm-train", "lm-generate", "serve", "lm-finetune"):
        assert cmd in r.stdout
    r = run("train", "--help")
    assert r.returncode == 0 and "--task" in r.stdout and "toy_zh_en" in r.stdout


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    out = tmp_path_factory.mktemp("cli") / "toy.pt"
    r = run("train", "--task", "toy_zh_en", "--epochs", "2", "--out", str(out), "--quiet")
    assert r.returncode == 0, r.stderr
    assert "已保存" in r.stdout and out.exists()
    assert r.stderr == ""  # 不是终端：没有进度条
    return out


@pytest.mark.slow
def test_translate_from_checkpoint(checkpoint):
    r = run("translate", "--checkpoint", str(checkpoint), "狗 咬 人", "人工智能改变世界")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.strip().splitlines()
    assert lines == ["the dog bites the person", "artificial intelligence changes the world"]
    # 只训练了 2 个 epoch 的模型在主宾互换的句子上还会出错，束搜索这里用它已学会的句子
    r = run("translate", "--checkpoint", str(checkpoint), "--method", "beam", stdin="狗 咬 人\n")
    assert r.returncode == 0 and r.stdout.strip() == "the dog bites the person"


@pytest.mark.slow
def test_evaluate_from_checkpoint(checkpoint):
    r = run("evaluate", "--checkpoint", str(checkpoint), "--split", "valid")
    assert r.returncode == 0, r.stderr
    assert "整句正确率（exact_match）：" in r.stdout and "BLEU（bleu）：" in r.stdout


@pytest.mark.slow
def test_missing_and_corrupt_checkpoint_and_unknown_task(tmp_path):
    r = run("translate", "--checkpoint", str(tmp_path / "nope.pt"), "狗 咬 人")
    assert r.returncode == 1 and "找不到检查点" in r.stderr and "Traceback" not in r.stderr
    bad = tmp_path / "bad.pt"
    bad.write_bytes(b"\x00garbage")
    r = run("evaluate", "--checkpoint", str(bad))
    assert r.returncode == 1 and "损坏" in r.stderr and "Traceback" not in r.stderr
    r = run("train", "--task", "sorting", "--out", str(tmp_path / "x.pt"))
    assert r.returncode == 2 and "sorting" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and r.stderr.startswith("错误：")  # 不再先打印整段 usage
    r = run("train", "--task", "copy", "--epochs", "0", "--out", str(tmp_path / "x.pt"))
    assert r.returncode == 1 and "--epochs" in r.stderr


@pytest.mark.slow
def test_shipped_checkpoints_work_with_every_command():
    from tformer_lib.translation.pretrained import SHIPPED_POSITIONAL, shipped_checkpoint_path

    for positional in SHIPPED_POSITIONAL:
        path = str(shipped_checkpoint_path(positional))
        r = run("evaluate", "--checkpoint", path, "--split", "valid")
        assert r.returncode == 0 and "任务 toy_zh_en" in r.stdout and "整句正确率（exact_match）：" in r.stdout, r.stderr
    r = run("translate", "--checkpoint", str(shipped_checkpoint_path()), "狗 咬人", "狗咬人", "狗 咬 人")
    assert r.returncode == 0 and r.stdout.splitlines() == ["the dog bites the person"] * 3, r.stderr


@pytest.mark.slow
def test_unknown_words_warn_by_default_and_fail_with_strict():
    from tformer_lib.translation.pretrained import shipped_checkpoint_path

    path = str(shipped_checkpoint_path())
    r = run("translate", "--checkpoint", path, "狗咬人。")
    assert r.returncode == 0 and r.stdout.strip()  # 照常翻译
    assert r.stderr.strip().splitlines() == [r.stderr.strip()] and r.stderr.startswith("警告：") and "'。'" in r.stderr
    assert "加 --strict 则报错退出" in r.stderr
    r = run("translate", "--checkpoint", path, "--strict", "狗咬人。")
    assert r.returncode == 1 and r.stdout == "" and r.stderr.startswith("错误：") and "'。'" in r.stderr
    assert "去掉 --strict 只警告" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


def test_train_out_is_checked_before_any_training(tmp_path, monkeypatch, capsys):
    from tformer_lib.commands import cli
    from tformer_lib.training import Trainer

    def no_training(self, epochs):
        raise AssertionError("不该开始训练")

    monkeypatch.setattr(Trainer, "fit", no_training)
    (tmp_path / "afile").write_text("x")
    for out in (tmp_path, tmp_path / "afile" / "m.pt"):
        assert cli.main(["train", "--task", "copy", "--out", str(out)]) == 1
        err = capsys.readouterr().err
        assert err.startswith("错误：--out") and len(err.strip().splitlines()) == 1, err
    monkeypatch.setattr("os.access", lambda path, mode: False)  # 以 root 运行时无法真正拿掉写权限，只能模拟
    assert cli.main(["train", "--task", "copy", "--out", str(tmp_path / "new" / "m.pt")]) == 1
    err = capsys.readouterr().err
    assert "--out" in err and "没有在目录" in err and "写文件的权限" in err
