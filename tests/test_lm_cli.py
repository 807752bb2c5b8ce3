"""命令行：lm-train（训练、定期保存、续训）与 lm-generate（作诗），以及一行的错误信息。"""

import pytest
import torch

from tformer_lib.cli import main
from tformer_lib.lm.training import load_lm


@pytest.fixture(scope="module", autouse=True)
def small_data():
    """命令行用真实的唐诗数据与配方，但测试只取前几十块/首，几秒内跑完。"""
    from tformer_lib.lm import pretrained

    full = pretrained.poem_data

    def small(recipe=pretrained.POEM_RECIPE):
        data = full(recipe)
        data["train_blocks"] = data["train_blocks"][:64]
        data["valid"] = tuple(t[:16] for t in data["valid"])
        return data

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(pretrained, "poem_data", small)
        yield


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    out = tmp_path_factory.mktemp("lm") / "poem.pt"
    assert main(["--threads", "1", "lm-train", "--out", str(out), "--steps", "2", "--total-steps", "100",
                 "--quiet", "--no-progress"]) == 0
    return out


def test_lm_train_writes_a_resumable_checkpoint(trained, capsys):
    model, tokenizer, ckpt = load_lm(trained)
    assert ckpt["trainer"]["step"] == 2 and tokenizer.vocab_size == model.config.vocab_size
    assert ckpt["extra"]["recipe"]["total_steps"] == 100
    resumed = trained.parent / "resumed.pt"
    assert main(["lm-train", "--out", str(resumed), "--resume", str(trained), "--steps", "1", "--quiet",
                 "--no-progress"]) == 0
    assert load_lm(resumed)[2]["trainer"]["step"] == 3
    assert "step 3/100" in capsys.readouterr().out


def test_lm_generate_prints_poems(trained, capsys):
    assert main(["lm-generate", "--checkpoint", str(trained), "--form", "五绝", "--title", "春晓", "-n", "2",
                 "--seed", "1"]) == 0
    out = capsys.readouterr().out
    assert out.strip() and "<pad>" not in out and "<bos>" not in out


@pytest.mark.parametrize(
    "argv, words",
    [
        (["lm-generate", "--form", "词"], "--form"),
        (["lm-generate", "--first", "春天"], "--first"),
        (["lm-generate", "--checkpoint", "/nonexistent/poem.pt"], "找不到"),
        (["lm-train", "--out", "x.pt", "--steps", "0"], "--steps"),
    ],
)
def test_errors_are_one_line(argv, words, capsys):
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert words in err and len(err.strip().splitlines()) == 1


def test_lm_train_refuses_a_directory(tmp_path, capsys):
    assert main(["lm-train", "--out", str(tmp_path)]) == 1
    assert "目录" in capsys.readouterr().err


def test_resume_needs_trainer_state(tmp_path, trained, capsys):
    model, tokenizer, _ = load_lm(trained)
    from tformer_lib.lm.training import save_lm_checkpoint

    bare = save_lm_checkpoint(tmp_path / "bare.pt", model, tokenizer)
    assert main(["lm-train", "--out", str(tmp_path / "o.pt"), "--resume", str(bare)]) == 1
    assert "训练器状态" in capsys.readouterr().err
    torch.set_num_threads(1)
