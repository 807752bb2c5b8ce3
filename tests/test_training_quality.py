"""质量门槛（quality bars）：复制任务 ≥99%（现训练）、玩具中→英 ≥95%、去掉位置编码的消融明显失败
（在各章实际加载的随包检查点上）；以及这些随包检查点能由单线程的新训练逐位复现（在生成它们的 CPU 上，
这时也检查现训练的模型过 95% 的门槛）。

复制任务用 benchmarks/copy_task.py 的设置。
计时数字见 benchmarks/。
"""

import time

import pytest
import torch

from tformer_lib.commands.cli import COPY_SETUP, build_synthetic
from tformer_lib.data import make_batch
from tformer_lib.translation.decoding import beam_search, greedy_decode, sequence_log_probs, translate
from tformer_lib.translation.pretrained import (
    SHIPPED_POSITIONAL,
    cache_dir,
    cpu_fingerprint,
    load_or_train_toy_model,
    load_toy_data,
    shipped_checkpoint_path,
)
from tformer_lib.training import Trainer, evaluate, load_checkpoint

TINY = dict(epochs=1, d_model=32, n_heads=2, d_ff=32)  # 只为测缓存机制的小模型


@pytest.mark.slow
def test_copy_task_reaches_99_percent_on_200_held_out_sequences():
    # 在生成随包检查点的 AMD EPYC 上是 200/200；在 Intel Xeon（同为 AVX512）上浮点累加顺序不同，得到 199/200。
    # 学会复制任务是这里要证明的事，不是某一颗 CPU 上的最后一个样本，所以门槛是 ≥ 99%。
    model, vocab, train, test = build_synthetic("copy", seed=0)
    assert len(test) == 200
    s = COPY_SETUP
    Trainer(model, train, None, batch_size=s["batch_size"], warmup=s["warmup"], lr_factor=s["lr_factor"],
            label_smoothing=s["label_smoothing"], seed=0).fit(s["epochs"])
    assert evaluate(model, test, vocab)["exact_match"] >= 0.99


@pytest.fixture(scope="module")
def toy():
    """随包附带的默认模型——第 5–8 章加载的正是它（不训练、不写缓存）。

    质量门槛在它上面检查；它与单线程现训练逐位相同，由下面的逐位复现测试在生成它的 CPU 上证明
    （在别的 CPU 上现训练一遍要一两分钟，而浮点累加顺序不同，得到的只是另一份相近的权重）。
    """
    return load_or_train_toy_model()


@pytest.fixture(scope="module")
def fresh_toy():
    """现训练的默认模型（不读写任何缓存）。"""
    return load_or_train_toy_model(cache=False)


def _assert_same_weights(a, b, what):
    for (name, x), y in zip(a.state_dict().items(), b.state_dict().values()):
        assert torch.equal(x, y), f"{what}: {name} differs"


@pytest.mark.parametrize("positional", SHIPPED_POSITIONAL)
def test_shipped_checkpoint_exists_and_is_preferred(positional, tmp_path):
    path = shipped_checkpoint_path(positional)
    assert path.exists(), (
        f"{path.name} 不在 tformer_lib/checkpoints/：默认配方或语料改了？请运行 "
        "tformer_lib.translation.pretrained.build_shipped_checkpoints() 重新生成"
    )
    assert load_checkpoint(path)["extra"]["threads"] == 1
    start = time.perf_counter()
    model, *_ = load_or_train_toy_model(positional, directory=tmp_path)
    assert time.perf_counter() - start < 10 and not model.training
    assert list(tmp_path.iterdir()) == []  # 用的是随包附带的：没有训练，没有写用户缓存


def _skip_unless_same_torch(path):
    recorded = load_checkpoint(path)["torch_version"]
    if recorded != str(torch.__version__):
        pytest.skip(f"随包检查点由 torch {recorded} 生成，这里是 {torch.__version__}：逐位比较无意义")
    recorded_cpu = load_checkpoint(path)["extra"].get("cpu")
    if recorded_cpu != cpu_fingerprint():
        pytest.skip(f"逐位复现需要生成 {path.name} 的 CPU 与指令集「{recorded_cpu}」，这里是「{cpu_fingerprint()}」"
                    "（可用 ATEN_CPU_CAPABILITY 选指令集；换了 CPU 只能比较精度，见其余测试）")
    if torch.get_num_threads() != 1:
        pytest.skip("逐位复现要求单线程（tests/conftest.py 会设为 1）")


@pytest.mark.slow
def test_fresh_single_thread_training_reproduces_the_shipped_weights(request, tmp_path):
    _skip_unless_same_torch(shipped_checkpoint_path("sinusoidal"))  # 先判断，不能复现就不花时间训练
    fresh = request.getfixturevalue("fresh_toy")
    shipped, sv, tv, hist = load_or_train_toy_model(directory=tmp_path)  # 读随包附带的
    assert list(tmp_path.iterdir()) == []  # 没有训练、没有写缓存
    _assert_same_weights(fresh[0], shipped, "sinusoidal")
    assert hist.step_loss == fresh[3].step_loss
    assert evaluate(fresh[0], load_toy_data()["test"], tv)["exact_match"] >= 0.95


@pytest.mark.slow
def test_toy_translation_reaches_95_percent_on_order_swapped_test_split(toy):
    model, sv, tv, hist = toy
    data = load_toy_data()
    metrics = evaluate(model, data["test"], tv)
    assert metrics["exact_match"] >= 0.95, metrics
    assert hist.last["valid_exact_match"] >= 0.95
    assert translate(model, "狗 咬 人", sv, tv) == "the dog bites the person"
    assert translate(model, "人 咬 狗", sv, tv) == "the person bites the dog"  # 只在测试集里
    assert translate(model, "人工智能改变世界", sv, tv) == "artificial intelligence changes the world"
    # 文章 B 的例子（第 5 章）：短语说完就停（输出 EOS）
    assert translate(model, ["人工智能", "狗", "三 只 小 猫"], sv, tv) == [
        "artificial intelligence", "the dog", "three small cats"]


@pytest.mark.slow
def test_toy_beam_is_at_least_greedy_on_test_split(toy):
    model, _, tv, _ = toy
    test = load_toy_data()["test"]
    greedy = evaluate(model, test, tv)["exact_match"]
    beam = evaluate(model, test, tv, decode_fn=lambda m, src: beam_search(m, src, beam_size=4))["exact_match"]
    assert beam >= greedy >= 0.95


@pytest.mark.slow
def test_toy_beam_never_finds_a_less_likely_sentence_than_greedy(toy):
    """α=0 时束搜索的目标就是总 log 概率：它找到的句子不能比贪心的更不可能。"""
    model = toy[0]
    test = load_toy_data()["test"]
    batch = make_batch(test)
    greedy = greedy_decode(model, batch.src)
    for k in (2, 4):
        beam = beam_search(model, batch.src, beam_size=k, length_penalty=0.0)
        gap = sequence_log_probs(model, batch.src, beam) - sequence_log_probs(model, batch.src, greedy)
        assert gap.min().item() >= -1e-4, (k, gap.min().item())


@pytest.mark.slow
def test_toy_model_is_cached_and_loads_fast(tmp_path):
    model, sv, tv, hist = load_or_train_toy_model(directory=tmp_path, **TINY)  # 训练并写缓存
    assert len(list(tmp_path.glob("*.pt"))) == 1
    start = time.perf_counter()
    again, sv2, tv2, hist2 = load_or_train_toy_model(directory=tmp_path, **TINY)
    assert time.perf_counter() - start < 10
    assert sv2 == sv and tv2 == tv and hist2.to_dict() == hist.to_dict()
    _assert_same_weights(model, again, "cache")
    assert not again.training


@pytest.mark.slow
def test_training_leaves_the_callers_global_rng_untouched(tmp_path):
    torch.manual_seed(7)
    expected = torch.rand(3)
    torch.manual_seed(7)
    load_or_train_toy_model(directory=tmp_path, **TINY)  # 现训练
    assert torch.equal(torch.rand(3), expected)
    torch.manual_seed(7)
    load_or_train_toy_model(directory=tmp_path, **TINY)  # 读缓存
    assert torch.equal(torch.rand(3), expected)


@pytest.mark.slow
def test_training_recipe_overrides_get_their_own_cache_file(tmp_path):
    tiny = dict(epochs=1, directory=tmp_path, d_model=32, n_heads=2, d_ff=32)
    _, _, _, hist = load_or_train_toy_model(warmup=1, lr_factor=0.5, clip_grad_norm=None, eval_decode=False, **tiny)
    assert "valid_exact_match" not in hist.last and "valid_loss" in hist.last
    assert hist.step_lr[1] > hist.step_lr[-1]  # warmup=1：第 2 步起就在衰减
    load_or_train_toy_model(**tiny)
    assert len(list(tmp_path.glob("*.pt"))) == 2


@pytest.mark.slow
def test_corrupt_cache_is_retrained_with_a_warning(tmp_path):
    model, *_ = load_or_train_toy_model(directory=tmp_path, **TINY)
    (path,) = tmp_path.glob("*.pt")
    path.write_bytes(b"garbage")
    with pytest.warns(UserWarning, match="无法读取"):
        load_or_train_toy_model(directory=tmp_path, **TINY)


@pytest.mark.slow
def test_ablation_without_positional_encoding_fails_order_swapped_pairs(toy, tmp_path):
    test = load_toy_data()["test"]
    tv = toy[2]
    with_pe = evaluate(toy[0], test, tv)["exact_match"]
    shipped, *_ = load_or_train_toy_model("none", directory=tmp_path)  # 随包附带的消融模型（第 7 章加载它）
    assert list(tmp_path.iterdir()) == []
    without_pe = evaluate(shipped, test, tv)["exact_match"]
    assert without_pe < 0.6 and without_pe <= with_pe - 0.3, (with_pe, without_pe)
    _skip_unless_same_torch(shipped_checkpoint_path("none"))  # 在生成它的 CPU 上：现训练逐位得到它
    ablated, *_ = load_or_train_toy_model("none", cache=False)
    _assert_same_weights(ablated, shipped, "none")


def test_cache_dir_env_override(monkeypatch, tmp_path):
    monkeypatch.setenv("TFORMER_CACHE", str(tmp_path / "c"))
    assert cache_dir() == tmp_path / "c"
    monkeypatch.delenv("TFORMER_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "x"))
    assert cache_dir() == tmp_path / "x" / "tformer"


@pytest.mark.slow
def test_fresh_one_epoch_training_reproduces_the_shipped_snapshot(tmp_path):
    """第 7 章的 1-epoch 快照：在生成它的 CPU 上，单线程现训 1 个 epoch 逐位得到同一份权重。"""
    path = shipped_checkpoint_path("sinusoidal", epochs=1)
    assert path.exists(), "运行 build_shipped_checkpoints(which=(('sinusoidal', 1),)) 重新生成"
    shipped, _, _, hist = load_or_train_toy_model(epochs=1, directory=tmp_path)  # 读随包附带的
    assert list(tmp_path.iterdir()) == [] and len(hist.epochs) == 1
    _skip_unless_same_torch(path)
    fresh, _, _, fresh_hist = load_or_train_toy_model(epochs=1, cache=False)
    _assert_same_weights(fresh, shipped, "epoch-1 snapshot")
    assert fresh_hist.step_loss == hist.step_loss
