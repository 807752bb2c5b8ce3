"""命令行：lm-train（训练、定期保存、续训）与 lm-generate（作诗），以及一行的错误信息。"""

import pytest
import torch

from tformer_lib.commands.cli import main
from tformer_lib.lm.metrics_log import metrics_path, read_metrics
from tformer_lib.lm.training import load_lm
from tformer_lib.plotting.lm import plot_lm_metrics


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
    assert "第 3/100 步" in capsys.readouterr().out
    # 指标文件在检查点旁边；续训接着原来的记录写，第 3 步之前的行原样保留
    first, again = read_metrics(metrics_path(trained)), read_metrics(metrics_path(resumed))
    assert [r["step"] for r in first] == [1, 2] and [r["step"] for r in again] == [1, 2, 3]
    assert again[:2] == first
    assert [r["loss"] for r in again] == load_lm(resumed)[2]["trainer"]["history"]["step_loss"]
    assert all(r["tokens_per_s"] > 0 and r["lr"] > 0 for r in again)
    assert again[-1]["valid_ppl"] > 1 and first[0]["valid_ppl"] is None  # 每次 fit 的最后一步评估


def test_lm_train_flags_override_the_recipe(tmp_path, capsys):
    out = tmp_path / "small.pt"
    assert main(["lm-train", "--out", str(out), "--steps", "2", "--total-steps", "4", "--warmup", "2", "--lr", "2e-3",
                 "--batch-size", "4", "--d-model", "32", "--n-layers", "1", "--n-heads", "2", "--d-ff", "48",
                 "--quiet", "--no-progress"]) == 0
    model, _, ckpt = load_lm(out)
    c, recipe = model.config, ckpt["extra"]["recipe"]
    assert (c.d_model, c.n_layers, c.n_heads, c.d_ff) == (32, 1, 2, 48)
    assert (recipe["lr"], recipe["batch_size"], recipe["warmup"], recipe["total_steps"]) == (2e-3, 4, 2, 4)
    rows = read_metrics(metrics_path(out))
    assert rows[1]["lr"] == pytest.approx(2e-3)  # 预热 2 步后到峰值
    fig = plot_lm_metrics(metrics_path(out))
    assert len(fig.axes) == 2 and "tokens/s" in fig._suptitle.get_text()
    capsys.readouterr()
    assert main(["lm-train", "--out", str(tmp_path / "x.pt"), "--d-model", "30", "--n-heads", "4"]) == 1
    assert "--d-model" in capsys.readouterr().err
    assert main(["lm-train", "--out", str(tmp_path / "x.pt"), "--warmup", "500", "--total-steps", "10"]) == 1
    assert "--warmup" in capsys.readouterr().err
    assert main(["lm-train", "--out", str(tmp_path / "x.pt"), "--lr", "0"]) == 1
    assert "--lr" in capsys.readouterr().err


def test_help_numbers_match_the_recipe():
    from tformer_lib.commands.lm import POEM_MODEL
    from tformer_lib.lm.pretrained import POEM_RECIPE

    assert all(POEM_RECIPE["model"][k] == v for k, v in POEM_MODEL.items())


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
        (["lm-train", "--out", "x.pt", "--device", "gpu0"], "--device 'gpu0' 不是 torch 认得的设备"),
        pytest.param(["lm-train", "--out", "x.pt", "--device", "cuda"], "没有可用的 CUDA",
                     marks=pytest.mark.skipif(torch.cuda.is_available(), reason="这台机器有 CUDA：这条报错只在没有 GPU 时出现")),
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
