"""训练器与检查点：历史记录、回调、NaN 报错、原子保存、weights_only 加载、续训逐位一致。"""

import os

import pytest
import torch

from tformer_lib import TransformerConfig, make_model, set_seed
from tformer_lib.data import encode_pairs, make_copy_task, synthetic_vocab
from tformer_lib.training import (
    CheckpointError,
    History,
    Trainer,
    TrainingDivergedError,
    evaluate,
    load_checkpoint,
    load_model,
    save_checkpoint,
)


@pytest.fixture(scope="module")
def copy_data():
    v = synthetic_vocab(8)
    train = encode_pairs(make_copy_task(96, n_symbols=8, min_len=2, max_len=6, seed=0), v, v)
    valid = encode_pairs(make_copy_task(24, n_symbols=8, min_len=2, max_len=6, seed=1), v, v)
    return v, train, valid


def _fresh(v, seed=0):
    set_seed(seed)
    cfg = TransformerConfig(len(v), len(v), d_model=32, n_heads=4, d_ff=64, n_encoder_layers=1,
                            n_decoder_layers=1, dropout=0.1, max_len=32)
    return make_model(cfg)


def _trainer(model, v, train, valid, **kw):
    return Trainer(model, train, valid, tgt_vocab=v, batch_size=16, warmup=10, seed=3, **kw)


def test_history_metrics_and_callbacks(copy_data, capsys):
    v, train, valid = copy_data
    events = []
    tr = _trainer(_fresh(v), v, train, valid, callbacks=[lambda e, info: events.append((e, info))])
    hist = tr.fit(2)
    assert len(hist) == 2 and len(hist.step_loss) == tr.step == 12 == len(hist.step_lr)
    last = hist.last
    for key in ("epoch", "step", "train_loss", "lr", "valid_loss", "valid_token_accuracy",
                "valid_exact_match", "valid_bleu", "seconds"):
        assert key in last, key
    assert hist["epoch"] == [1, 2]
    assert 0 <= last["valid_exact_match"] <= 1 and 0 <= last["valid_bleu"] <= 100
    assert [e for e, _ in events].count("step") == 12 and [e for e, _ in events].count("epoch") == 2
    assert events[-1][1]["history"] is hist
    assert capsys.readouterr().err == ""  # 不是终端：没有进度条
    assert History.from_dict(hist.to_dict()).to_dict() == hist.to_dict()
    with pytest.raises(KeyError, match="bleu"):
        hist["bleu"]


def test_progress_bar_can_be_forced_and_verbose_prints(copy_data, capsys):
    v, train, _ = copy_data
    _trainer(_fresh(v), v, train, None, progress=True, verbose=True).fit(1)
    out = capsys.readouterr()
    assert out.out.startswith("第 1 个 epoch（第 ") and "训练损失" in out.out and "epoch 1" in out.err


def test_fast_attention_path_trains_too(copy_data):
    v, train, valid = copy_data
    model = _fresh(v)
    model.set_fast_attention(True)
    hist = _trainer(model, v, train, valid).fit(1)
    assert hist.last["train_loss"] < 5 and hist.last["valid_loss"] == hist.last["valid_loss"]


def test_nan_loss_names_the_step_and_what_to_try(copy_data):
    v, train, valid = copy_data
    model = _fresh(v)
    tr = _trainer(model, v, train, valid)
    tr.fit(1)
    with torch.no_grad():
        model.generator.proj.weight.fill_(float("nan"))
    with pytest.raises(TrainingDivergedError, match=r"第 7 步.*lr_factor.*warmup"):
        tr.fit(1)


def test_gradient_clipping_is_applied(copy_data, monkeypatch):
    v, train, _ = copy_data
    seen = []
    real = torch.nn.utils.clip_grad_norm_
    monkeypatch.setattr(torch.nn.utils, "clip_grad_norm_", lambda p, m: seen.append(m) or real(p, m))
    tr = _trainer(_fresh(v), v, train, None, clip_grad_norm=0.5)
    tr.train_step(next(iter(__import__("tformer_lib.data", fromlist=["x"]).batch_iterator(train, 8))))
    assert seen == [0.5]


def test_trainer_validates_arguments(copy_data):
    v, train, _ = copy_data
    with pytest.raises(ValueError, match="train_data"):
        Trainer(_fresh(v), [])
    with pytest.raises(ValueError, match="batch_size"):
        Trainer(_fresh(v), train, batch_size=0)
    with pytest.raises(TypeError, match="callbacks"):
        Trainer(_fresh(v), train, callbacks=[3])
    with pytest.raises(TypeError, match="model"):
        Trainer(torch.nn.Linear(2, 2), train)
    with pytest.raises(ValueError, match="data"):
        evaluate(_fresh(v), [])


def test_resume_reproduces_uninterrupted_losses_exactly(copy_data, tmp_path):
    v, train, valid = copy_data
    straight = _trainer(_fresh(v), v, train, valid)
    straight.fit(3)

    first = _trainer(_fresh(v), v, train, valid)
    first.fit(1)
    path = save_checkpoint(tmp_path / "ckpt.pt", first.model, v, v, trainer=first)
    torch.manual_seed(12345)  # 打乱全局随机状态：续训必须从检查点恢复它
    model, sv, tv, ckpt = load_model(path)
    resumed = _trainer(model, sv, train, valid)
    resumed.load_state_dict(ckpt["trainer"])
    resumed.fit(2)
    assert resumed.step == straight.step and resumed.epoch == 3
    assert resumed.history.step_loss == straight.history.step_loss  # 逐位相同
    assert resumed.history["valid_loss"] == straight.history["valid_loss"]
    for (name, a), b in zip(straight.model.state_dict().items(), resumed.model.state_dict().values()):
        assert torch.equal(a, b), name


def test_checkpoint_is_plain_atomic_and_weights_only(copy_data, tmp_path):
    v, train, valid = copy_data
    tr = _trainer(_fresh(v), v, train, valid)
    tr.fit(1)
    path = save_checkpoint(tmp_path / "sub" / "m.pt", tr.model, v, v, trainer=tr, extra={"task": "copy"})
    assert os.listdir(tmp_path / "sub") == ["m.pt"]  # 没有残留的临时文件
    umask = os.umask(0)
    os.umask(umask)
    assert path.stat().st_mode & 0o777 == 0o666 & ~umask  # 不是 mkstemp 的 0600
    raw = torch.load(path, weights_only=True)  # 只含安全类型
    assert raw["config"]["d_model"] == 32 and raw["extra"] == {"task": "copy"}
    model, sv, tv, _ = load_model(path)
    assert sv == v and not model.training
    src = torch.tensor([[4, 5, 6]])
    tgt = torch.tensor([[1, 4, 5]])
    tr.model.eval()
    assert torch.equal(model(src, tgt), tr.model(src, tgt))


def test_failed_save_keeps_the_old_file(copy_data, tmp_path, monkeypatch):
    v, _, _ = copy_data
    model = _fresh(v)
    path = save_checkpoint(tmp_path / "m.pt", model, v, v)
    before = path.read_bytes()

    def boom(*a, **k):
        raise OSError("disk full")

    monkeypatch.setattr(torch, "save", boom)
    with pytest.raises(OSError, match="disk full"):
        save_checkpoint(path, model, v, v)
    assert path.read_bytes() == before and os.listdir(tmp_path) == ["m.pt"]


def test_checkpoint_errors(copy_data, tmp_path):
    v, _, _ = copy_data
    with pytest.raises(FileNotFoundError, match="找不到检查点"):
        load_checkpoint(tmp_path / "nope.pt")
    bad = tmp_path / "bad.pt"
    bad.write_bytes(b"this is not a checkpoint")
    with pytest.raises(CheckpointError, match="损坏"):
        load_checkpoint(bad)
    good = save_checkpoint(tmp_path / "good.pt", _fresh(v), v, v)
    truncated = tmp_path / "truncated.pt"
    truncated.write_bytes(good.read_bytes()[: good.stat().st_size // 2])
    with pytest.raises(CheckpointError):
        load_checkpoint(truncated)
    other = tmp_path / "other.pt"
    torch.save({"weights": torch.zeros(2)}, other)
    with pytest.raises(CheckpointError, match="不是 tformer 检查点"):
        load_checkpoint(other)
    with pytest.raises(TypeError, match="model"):
        save_checkpoint(tmp_path / "x.pt", torch.nn.Linear(2, 2))


def test_leftover_temp_files_of_a_killed_save_are_cleaned_up(tmp_path):
    """被杀掉的保存会在目标旁留下 .<名>.tformer-tmp-<pid>-….tmp；下一次保存或读取时删掉（写它的进程还活着就不动）。"""
    import os
    import subprocess
    import sys

    from tformer_lib import TransformerConfig, make_model
    from tformer_lib.training import load_checkpoint, save_checkpoint

    model = make_model(TransformerConfig(10, 10, d_model=8, n_heads=2, d_ff=8, n_encoder_layers=1,
                                         n_decoder_layers=1))
    target = tmp_path / "m.pt"
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True).stdout.strip()  # 一个已经退出的进程号
    leftover = tmp_path / f".m.pt.tformer-tmp-{dead}-abc123.tmp"
    leftover.write_bytes(b"half a checkpoint")
    alive = tmp_path / f".m.pt.tformer-tmp-{os.getppid()}-def456.tmp"  # 另一个还在写的进程
    alive.write_bytes(b"being written")
    other = tmp_path / ".other.pt.tformer-tmp-1-x.tmp"  # 别的检查点的临时文件
    other.write_bytes(b"x")
    save_checkpoint(target, model)
    assert not leftover.exists() and alive.exists() and other.exists()
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == sorted([target.name, alive.name, other.name])  # 这次保存自己的临时文件也没留下
    leftover.write_bytes(b"again")
    load_checkpoint(target)
    assert not leftover.exists() and alive.exists()
