"""README 里的每一条命令都能照抄运行（在一个空目录里，就像刚克隆完仓库，什么都还没训练）。

短的命令照原样运行；长的加上让它变短的参数（argparse 里后出现的同名参数覆盖前面的）真跑一次；
会一直运行的（``serve``）和 CI 另有一步专门运行的（测试、建书、基准）只检查参数能被解析 / 脚本存在。
README 里出现一条本测试不认识的命令时测试失败：改 README 时请同时在 ``SHORTEN`` 或 ``CHECKED_ELSEWHERE`` 里登记。
"""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from tformer_lib.commands.cli import _parser, main

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text(encoding="utf-8")

#: 长命令的“变短”参数（追加在 README 原命令后面）
SHORTEN = {
    "train": ["--epochs", "1", "--size", "tiny", "--progress"],
    "evaluate": ["--limit", "8", "--no-progress"],
    "lm-train": ["--steps", "2", "--total-steps", "2", "--warmup", "1", "--eval-every", "2", "--d-model", "16",
                 "--n-layers", "1", "--n-heads", "2", "--d-ff", "32", "--batch-size", "2", "--no-progress"],
    "lm-finetune": ["--steps", "2"],
}
SUBCOMMANDS = ("train", "translate", "evaluate", "lm-train", "lm-generate", "serve", "lm-finetune")
#: 只解析参数、不运行的子命令（会一直运行下去）
PARSE_ONLY = {"serve"}
#: CI 里另有步骤真跑它们（scripts/test.sh）；这里只检查脚本在、能打印用法
SCRIPTS_WITH_HELP = ("scripts/execute_notebooks.py", "benchmarks/train_step.py", "benchmarks/lm_step.py",
                     "benchmarks/serving.py", "benchmarks/decode.py", "benchmarks/quant_gemv.py",
                     "benchmarks/vs_transformers.py")


def readme_commands() -> list[str]:
    """README 里 ```bash 代码块中的每一条命令（去掉行尾注释）。"""
    out = []
    for block in re.findall(r"```bash\n(.*?)```", README, flags=re.S):
        for line in block.splitlines():
            line = line.strip()
            if line:
                words = shlex.split(line, comments=True)
                out.append(words)
    return out


COMMANDS = readme_commands()


def _kind(words: list[str]) -> str:
    if words[:2] == ["bash", "scripts/build_book.sh"] or words[:2] == ["bash", "scripts/test.sh"]:
        return "ci-script"
    if words[0] == ".venv/bin/jupyter":
        return "jupyter"
    assert words[0] == ".venv/bin/python", f"README 的命令应以 .venv/bin/python 开头：{words}"
    if words[1:3] == ["-m", "tformer_lib"]:
        return "cli"
    if words[1:4] == ["-m", "pytest", "tests"]:
        return "pytest"
    if words[1] == "-c":
        return "python-c"
    if words[1] in SCRIPTS_WITH_HELP:
        return "script"
    return "unknown"


def test_every_readme_command_is_known_to_this_test():
    assert len(COMMANDS) >= 15
    unknown = [" ".join(w) for w in COMMANDS if _kind(w) == "unknown"]
    assert not unknown, f"README 里有本测试不认识的命令，请在 tests/test_readme_commands.py 里登记：{unknown}"


def test_readme_says_how_to_open_the_notebooks_and_jupyterlab_is_installed_by_the_book_extra():
    assert ["bash", "scripts/build_book.sh"] in COMMANDS and ["bash", "scripts/test.sh"] in COMMANDS
    assert [".venv/bin/jupyter", "lab", "notebooks/"] in COMMANDS
    pyproject = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    book = re.search(r"^book = \[(.*?)^\]", pyproject, flags=re.S | re.M).group(1)
    assert '"jupyterlab' in book
    assert "占位符" in README  # 安装行里的仓库地址在发布之前只是占位符


def test_ci_scripts_exist_and_parse():
    for script in ("scripts/build_book.sh", "scripts/test.sh"):
        subprocess.run(["bash", "-n", str(ROOT / script)], check=True, timeout=30)


@pytest.mark.slow
def test_scripts_print_their_usage():
    procs = [subprocess.Popen([sys.executable, str(ROOT / s), "--help"], cwd=ROOT, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for s in SCRIPTS_WITH_HELP]
    for script, proc in zip(SCRIPTS_WITH_HELP, procs):
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0 and "usage" in out.lower(), (script, err[-500:])
    assert any(_kind(w) == "pytest" for w in COMMANDS)


def test_help_lists_every_subcommand(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["--help"])
    assert exc.value.code == 0
    text = capsys.readouterr().out
    for name in SUBCOMMANDS:
        assert re.search(rf"^\s+{name}\s", text, flags=re.M), f"--help 没有列出 {name}：\n{text}"


@pytest.mark.slow
def test_every_cli_command_in_the_readme_runs_in_a_fresh_directory(tmp_path, monkeypatch, capsys):
    """按 README 的顺序在一个空目录里运行：先用随库模型（不训练），再训练、再用训练出的检查点。"""
    monkeypatch.chdir(tmp_path)
    ran = []
    for words in COMMANDS:
        kind = _kind(words)
        if kind == "python-c":
            code = words[2]
            exec(compile(code, "<README>", "exec"), {})  # 如 plot_lm_metrics(...).savefig(...)
            ran.append("python -c")
            continue
        if kind != "cli":
            continue
        argv = words[3:]
        if argv == ["--help"]:
            continue  # 见 test_help_lists_every_subcommand
        sub = next(a for a in argv if a in SUBCOMMANDS)
        if sub in PARSE_ONLY:
            _parser().parse_args(argv)
            continue
        code = main(argv + SHORTEN.get(sub, []))
        out, err = capsys.readouterr()
        expect_fail = "--strict" in argv
        assert (code == 1) if expect_fail else (code == 0), f"{' '.join(words)} 退出码 {code}：{err}"
        ran.append(sub)
        if sub == "translate" and not expect_fail:
            assert out.strip() and "<unk>" not in out
        if expect_fail:
            assert "--strict" in err and "。" in err
    assert {"translate", "evaluate", "train", "lm-generate", "lm-train", "lm-finetune", "python -c"} <= set(ran)
    assert (tmp_path / "dufu.lora.pt").exists() and (tmp_path / "dufu.pt").exists()
    assert (tmp_path / "toy.pt").exists() and (tmp_path / "small.metrics.jsonl").exists()
    assert (tmp_path / "small.png").stat().st_size > 0


def test_readme_translation_examples_print_what_the_readme_says(capsys):
    """README 里带 “→ 译文” 的例子用随库模型（或同一句的译文）真的得到那句话。"""
    for line in README.splitlines():
        m = re.match(r'\.venv/bin/python -m tformer_lib translate ("[^"]+")\s+#.*→ (.+)$', line)
        if m:
            assert main(["translate", *shlex.split(m.group(1))]) == 0
            assert capsys.readouterr().out.strip() == m.group(2).strip()
