"""命令行说一种语言：argparse 自己的帮助与报错也是中文，训练与评估的进度、指标行是中文；输出接到管道时长任务每段打印一行。"""

import re
import subprocess
import sys

import pytest

from tformer_lib.commands.cli import main
from tformer_lib.commands.base import ARGPARSE_ZH
from tformer_lib.training.trainer import epoch_line

COMMANDS = ("train", "translate", "evaluate", "lm-train", "lm-generate", "serve", "lm-finetune")
# argparse 英文模板里的固定词句（去掉占位符）：出现任何一句都说明有一处没译
ENGLISH = sorted({piece.strip(" :") for text in ARGPARSE_ZH for piece in re.split(r"%\(\w+\)[rs]|%[rs]", text)
                  if len(piece.strip(" :")) > 3} | {"error:", "(default:"})


def _english_in(text: str) -> list[str]:
    return [phrase for phrase in ENGLISH if phrase in text]


@pytest.mark.parametrize("command", [None, *COMMANDS])
def test_help_is_chinese(command, capsys):
    with pytest.raises(SystemExit) as info:
        main([command, "--help"] if command else ["--help"])
    out = capsys.readouterr().out
    assert info.value.code == 0 and out.startswith("用法：") and "选项" in out
    assert _english_in(out) == [], out


@pytest.mark.parametrize("argv, words", [
    (["train", "--task", "copy"], ["缺少必需的参数", "--out"]),
    (["evaluate", "--split", "nope"], ["'nope' 不是可选的值", "valid"]),
    (["lm-generate", "--temperature", "x"], ["--temperature", "不是合法的 float 值"]),
    (["serve", "--port"], ["--port", "后面要跟一个值"]),
    (["serve", "--bogus"], ["不认识的参数", "--bogus"]),
    (["nope"], ["不是可选的值", "lm-finetune"]),
    ([], ["缺少必需的参数"]),
])
def test_argument_errors_are_one_chinese_line(argv, words, capsys):
    with pytest.raises(SystemExit) as info:
        main(argv)
    err = capsys.readouterr().err
    assert info.value.code == 2 and err.startswith("错误：") and len(err.strip().splitlines()) == 1, err
    assert all(w in err for w in words) and _english_in(err) == [], err


def test_the_translation_is_scoped_to_our_parsers():
    import argparse

    main_help = argparse._("usage: ")
    with pytest.raises(SystemExit):
        main(["train", "--task", "copy"])
    assert argparse._("usage: ") == main_help == "usage: "  # 别的 argparse 解析器（pytest 的）仍说英文


def test_epoch_line_names_every_metric_in_chinese():
    line = epoch_line({"epoch": 2, "step": 188, "train_loss": 1.23456, "lr": 5.9e-3, "valid_loss": 0.7,
                       "valid_token_accuracy": 0.73, "valid_exact_match": 0.17, "valid_bleu": 49.3, "seconds": 3.0})
    assert line == ("第 2 个 epoch（第 188 步）：训练损失 1.235，学习率 0.0059，验证损失 0.7，验证词元准确率 0.73，"
                    "验证整句正确率 0.17，验证 BLEU 49.3")


def test_epoch_line_skips_an_empty_metric_name_and_keeps_unknown_ones():
    line = epoch_line({"epoch": 1, "step": 3, "train_loss": 2.0, "lr": 0.1, "valid_": 5.0, "valid_ppl": 7.5})
    assert line == "第 1 个 epoch（第 3 步）：训练损失 2，学习率 0.1，验证 ppl 7.5"


def _run(*args):
    return subprocess.run([sys.executable, "-m", "tformer_lib", "--threads", "1", *args], capture_output=True,
                          text=True, timeout=600)


@pytest.mark.slow
def test_piped_evaluate_prints_one_progress_line_per_stage_in_chinese():
    r = _run("evaluate", "--method", "beam", "--limit", "40")
    progress = r.stderr.strip().splitlines()
    assert r.returncode == 0 and [line.split("：")[1].split("（")[0] for line in progress] == \
        ["16/40 句", "32/40 句", "40/40 句"], r.stderr
    assert r.stdout.splitlines()[0] == "任务 toy_zh_en，划分 test，解码 beam，40 句"
    assert "整句正确率（exact_match）：" in r.stdout and _english_in(r.stdout + r.stderr) == []


@pytest.mark.slow
def test_piped_train_prints_a_stage_line_and_one_chinese_line_per_epoch(tmp_path):
    out = tmp_path / "c.pt"
    r = _run("train", "--task", "copy", "--epochs", "2", "--out", str(out))
    lines = r.stdout.strip().splitlines()
    assert r.returncode == 0 and out.exists(), r.stderr
    assert r.stderr.strip().splitlines() == [r.stderr.strip()] and r.stderr.startswith("开始训练 copy：2 个 epoch")
    assert [line.split("（")[0] for line in lines[:2]] == ["第 1 个 epoch", "第 2 个 epoch"]
    assert "验证整句正确率" in lines[1] and lines[2].startswith("已保存") and len(lines) == 3
