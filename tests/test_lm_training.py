"""语言模型的训练：打包、学习率调度、损失下降、检查点的原子写入与逐位精确续训、质量度量函数。"""

import itertools
import math
import random

import pytest
import torch

from tformer_lib import BOS, EOS, PAD
from tformer_lib.lm import LMConfig, make_lm
from tformer_lib.lm.data import loss_targets, pack_documents, pad_documents, poem_document, poem_prompt
from tformer_lib.lm.quality import BigramLM, form_accuracy, lm_perplexity, poem_form, verbatim_line_rate
from tformer_lib.lm.training import LMTrainer, WarmupCosine, load_lm, save_lm_checkpoint
from tformer_lib.training import CheckpointError, load_checkpoint

V = 24


def synthetic_docs(n=300, seed=0):
    """可学的词元流：每篇文档是一段从随机起点开始的等差数列（模 20），长短不一。"""
    rng = random.Random(seed)
    docs = []
    for _ in range(n):
        start, step, length = rng.randrange(20), rng.choice([1, 2, 3]), rng.randrange(3, 14)
        docs.append([BOS] + [4 + (start + step * i) % 20 for i in range(length)] + [EOS])
    return docs


def tiny_model(dropout=0.0, seed=0):
    torch.manual_seed(seed)
    return make_lm(LMConfig(V, d_model=32, n_heads=4, n_layers=2, d_ff=64, max_len=32, dropout=dropout))


def test_packing_keeps_every_document_once():
    docs = synthetic_docs()
    blocks = pack_documents(docs, 33)
    assert blocks.shape[1] == 33 and (blocks[:, 0] == BOS).all()  # 每块从一篇文档的开头起
    assert torch.equal(blocks, pack_documents(docs, 33))  # 同一种子，同样的块
    flat = [t for t in blocks.flatten().tolist() if t != PAD]
    assert sorted(flat) == sorted(t for d in docs for t in d)
    assert flat.count(BOS) == len(docs)
    assert (blocks != PAD).float().mean() > 0.85
    with pytest.raises(ValueError, match="block_len=5"):
        pack_documents(docs, 5)


def test_loss_targets_shift_and_ignore():
    block = torch.tensor([[BOS, 5, 6, EOS, BOS, 7, EOS, PAD]])
    inputs, targets = loss_targets(block)
    assert inputs.tolist() == [[BOS, 5, 6, EOS, BOS, 7, EOS]]
    assert targets.tolist() == [[5, 6, EOS, PAD, 7, EOS, PAD]]  # 跨文档的 BOS 与 PAD 不计损失
    assert pad_documents([[1, 5], [1, 5, 6]]).tolist() == [[1, 5, 0], [1, 5, 6]]


def test_warmup_cosine():
    f = WarmupCosine(10, 110, min_ratio=0.1)
    assert f(0) == pytest.approx(0.1) and f(9) == pytest.approx(1.0)
    assert f(60) == pytest.approx(0.1 + 0.9 * 0.5)  # 余弦的一半
    assert f(110) == pytest.approx(0.1) and f(500) == pytest.approx(0.1)
    assert all(f(s) >= f(s + 1) for s in range(10, 120))
    for bad in (dict(warmup=0, total_steps=5), dict(warmup=5, total_steps=3), dict(warmup=1, total_steps=3, min_ratio=2)):
        with pytest.raises(ValueError):
            WarmupCosine(**bad)


def test_training_lowers_loss_on_a_learnable_stream():
    docs = synthetic_docs()
    valid = loss_targets(pad_documents(synthetic_docs(60, seed=1)))
    model = tiny_model()
    before = lm_perplexity(model, *valid)[1]
    trainer = LMTrainer(model, pack_documents(docs, 33), valid, batch_size=8, lr=3e-3, warmup=10,
                        total_steps=120, eval_every=60, progress=False)
    info = trainer.fit()
    assert trainer.step == 120 and len(trainer.history["step_loss"]) == 120
    assert [e["step"] for e in trainer.history["evals"]] == [60, 120]
    assert info["valid_ppl"] < before / 3
    assert trainer.history["step_lr"][0] == pytest.approx(3e-4)


def test_exact_resume_bit_for_bit(tmp_path):
    docs = synthetic_docs()
    blocks = pack_documents(docs, 33)
    kwargs = dict(batch_size=8, lr=2e-3, warmup=5, total_steps=40, progress=False)

    straight = LMTrainer(tiny_model(dropout=0.1), blocks, **kwargs)  # dropout 考验随机数状态也被保存
    straight.fit()

    first = LMTrainer(tiny_model(dropout=0.1), blocks, **kwargs)
    first.fit(17)
    path = save_lm_checkpoint(tmp_path / "half.pt", first.model, trainer=first)
    torch.manual_seed(12345)  # 打乱全局随机状态：续训必须从检查点恢复它
    model, _, ckpt = load_lm(path)
    resumed = LMTrainer(model, blocks, **kwargs)
    resumed.load_state_dict(ckpt["trainer"])
    resumed.fit()
    assert resumed.history["step_loss"] == straight.history["step_loss"]
    for (name, a), b in zip(straight.model.state_dict().items(), resumed.model.state_dict().values()):
        assert torch.equal(a, b), name


def test_checkpoint_round_trip_half_and_errors(tmp_path):
    from tformer_lib.text import CharTokenizer

    model = tiny_model().eval()
    tok = CharTokenizer.build(["白日依山尽，黄河入海流。"])
    path = save_lm_checkpoint(tmp_path / "m.pt", model, tok, extra={"note": "x"})
    assert not list(tmp_path.glob(".*.tmp"))  # 原子写入不留临时文件
    loaded, tok2, ckpt = load_lm(path)
    assert tok2 == tok and ckpt["extra"] == {"note": "x"} and loaded.config == model.config
    x = torch.randint(0, V, (2, 9))
    torch.testing.assert_close(loaded(x), model(x))
    half, _, _ = load_lm(save_lm_checkpoint(tmp_path / "h.pt", model, half=True))
    assert half.tok_embed.weight.dtype == torch.float32
    torch.testing.assert_close(half(x), model(x), rtol=0, atol=2e-3)
    assert (tmp_path / "h.pt").stat().st_size < 0.6 * path.stat().st_size
    assert load_checkpoint(path)["kind"] == "lm"
    with pytest.raises(TypeError, match="DecoderOnlyLM"):
        save_lm_checkpoint(tmp_path / "bad.pt", torch.nn.Linear(2, 2))
    with pytest.raises(FileNotFoundError):
        load_lm(tmp_path / "missing.pt")
    (tmp_path / "junk.pt").write_bytes(b"not a checkpoint")
    with pytest.raises(CheckpointError):
        load_lm(tmp_path / "junk.pt")


def test_resume_refuses_a_different_setup(tmp_path):
    blocks = pack_documents(synthetic_docs(), 33)
    a = LMTrainer(tiny_model(), blocks, batch_size=8, total_steps=10, warmup=2, progress=False)
    a.fit(2)
    b = LMTrainer(tiny_model(), blocks, batch_size=4, total_steps=10, warmup=2, progress=False)
    with pytest.raises(ValueError, match="batch_size"):
        b.load_state_dict(a.state_dict())


def test_bigram_perplexity_matches_hand_count():
    # 训练流 a b a b a c（id 4 5 4 5 4 6），λ 只有一个候选时可以手算
    train = torch.tensor([[BOS, 4, 5, 4, 5, 4, 6]])
    inputs, targets = loss_targets(train)
    bigram = BigramLM.fit((inputs, targets), (inputs, targets), vocab_size=8, grid=(0.9,))
    counts_next = torch.tensor([0, 0, 0, 0, 0, 0, 0, 0.0])
    for t in targets.flatten().tolist():
        counts_next[t] += 1
    uni = (counts_next + 1) / (counts_next + 1).sum()
    # P(5 | 4) = 0.9 · 2/3 + 0.1 · P1(5)
    expected = math.log(0.9 * 2 / 3 + 0.1 * float(uni[5]))
    got = float(bigram.log_prob(torch.tensor([4]), torch.tensor([5]))[0])
    assert got == pytest.approx(expected)
    assert bigram.perplexity(inputs, targets) > 1


def test_bigram_picks_the_best_lambda():
    docs = synthetic_docs(400)
    train = loss_targets(pack_documents(docs, 33))
    valid = loss_targets(pad_documents(synthetic_docs(80, seed=3)))
    grid = (0.3, 0.6, 0.9)
    best = BigramLM.fit(train, valid, V, grid=grid)
    assert all(best.perplexity(*valid) <= BigramLM.fit(train, valid, V, grid=(g,)).perplexity(*valid) for g in grid)


@pytest.mark.parametrize(
    "text, form",
    [
        ("白日依山尽，黄河入海流。欲穷千里目，更上一层楼。", "五言绝句"),
        ("朝辞白帝彩云间，千里江陵一日还。两岸猿声啼不住，轻舟已过万重山。", "七言绝句"),
        ("一二三四五，一二三四五。" * 4, "五言律诗"),
        ("白日依山尽，黄河入海流。欲穷千里目，更上一层。", None),  # 少一个字
        ("白日依山尽。黄河入海流，欲穷千里目，更上一层楼。", None),  # 标点不在原位
        ("白日依山尽，黄河入海流。欲穷千里目，更上一层楼", None),  # 没有收尾的“。”
        ("白日依山尽，黄河入海流。", None),  # 只有两句
        ("白日依山尽，黄河入海流。欲穷千里目，更上<unk>楼。", None),
        ("", None),
    ],
)
def test_poem_form(text, form):
    assert poem_form(text) == form


def test_form_accuracy_and_verbatim_rate():
    texts = ["白日依山尽，黄河入海流。欲穷千里目，更上一层楼。", "白日依山尽，黄河入海流。"]
    assert form_accuracy(texts, ["五言绝句", "五言绝句"]) == 0.5
    assert form_accuracy(texts[:1], ["七言绝句"]) == 0.0
    assert verbatim_line_rate(texts, {"白日依山尽", "更上一层楼"}) == pytest.approx(3 / 6)


def test_documents_and_prompts():
    from tformer_lib.data.poems import Poem

    poem = Poem("登鹳雀楼", "王之涣", ("白日依山尽", "黄河入海流", "欲穷千里目", "更上一层楼"))
    assert poem_document(poem) == "五绝《登鹳雀楼》白日依山尽，黄河入海流。欲穷千里目，更上一层楼。"
    assert poem_document(poem, with_title=False).startswith("五绝《》白日")
    assert poem_prompt("七言律诗", first="春") == "七律《》春"
    with pytest.raises(ValueError, match="form"):
        poem_prompt("词")


def _trainer(**kw):
    blocks = pack_documents(synthetic_docs(40), 17)
    valid = loss_targets(pad_documents(synthetic_docs(4, seed=1)))
    return LMTrainer(tiny_model(), blocks, kw.pop("valid", valid), **{"batch_size": 4, "warmup": 1, "total_steps": 3, **kw})


@pytest.mark.parametrize("kwargs, error, pattern", [
    ({"eval_every": 0}, ValueError, r"eval_every 应是正整数，收到 0"),
    ({"eval_every": 2.5}, TypeError, r"eval_every 应是整数"),
    ({"total_steps": 0}, ValueError, r"total_steps 应是正整数"),
    ({"clip": 0}, ValueError, r"clip 应是 > 0 的有限数，收到 0"),
    ({"clip": float("nan")}, ValueError, r"clip 应是 > 0 的有限数"),
    ({"weight_decay": -0.1}, ValueError, r"weight_decay 应是 ≥0 的有限数，收到 -0\.1"),
    ({"seed": "0"}, TypeError, r"seed 应是整数，收到 str"),
    ({"progress": "no"}, TypeError, r"progress 应是 True 或 False"),
    ({"verbose": 1}, TypeError, r"verbose 应是 True 或 False"),
    ({"valid": torch.zeros(2, 3, dtype=torch.long)}, TypeError, r"valid 应是 None 或 \(inputs, targets\)"),
    ({"valid": (torch.zeros(2, 3, dtype=torch.long), torch.zeros(2, 4, dtype=torch.long))}, ValueError, r"形状应相同"),
    ({"valid": (torch.zeros(2, 3), torch.zeros(2, 3))}, ValueError, r"valid\[0\]（inputs） 应是 \(M, L\) 的 LongTensor"),
])
def test_lm_trainer_bad_arguments_name_the_argument(kwargs, error, pattern):
    with pytest.raises(error, match=pattern):
        _trainer(**kwargs)


def test_lm_trainer_evaluate_and_fit_errors():
    trainer = _trainer(valid=None)
    with pytest.raises(ValueError, match="valid=None"):
        trainer.evaluate()
    with pytest.raises(ValueError, match="steps 应是正整数，收到 0"):
        trainer.fit(0)
    assert trainer.fit() == {} and trainer.step == 3  # 没有验证数据：照常训练，只是不评估


@pytest.mark.parametrize("accumulation_steps", [1, 2])
def test_a_batch_without_targets_is_refused_before_any_update(accumulation_steps):
    """一批块的目标全是 PAD/BOS：交叉熵是 0/0。以前不累积时得到 NaN（报成“损失发散、调小学习率”），累积时悄悄做一个
    梯度为 0 的 AdamW 步（权重衰减与动量照样改参数）。现在两种都在改动任何东西之前报错，点名 train_blocks。"""
    blocks = torch.full((4, 9), PAD)  # (N, L+1)
    blocks[:, 0] = BOS
    blocks[:, 4] = BOS  # 第二篇文档的 BOS 作目标也不计
    trainer = LMTrainer(tiny_model(), blocks, None, batch_size=4, warmup=1, total_steps=3, progress=False,
                        accumulation_steps=accumulation_steps)
    before = [p.detach().clone() for p in trainer.model.parameters()]
    trainer.model.eval()
    rows = sorted(int(r) for r in trainer._batch_rows(0))
    assert rows == [0, 1, 2, 3]  # 一批就是全部 4 块：报错信息按打乱后的次序列出它们
    with pytest.raises(ValueError, match=r"第 1 步的一批（batch_size=4 块：train_blocks 的第 (\d, ){3}\d 行；.*"
                                         r"没有要预测的目标.*train_blocks"):
        trainer.train_step()
    assert trainer.step == 0 and trainer.tokens_seen == 0 and trainer.history["step_lr"] == []
    assert not trainer.model.training  # 连 train/eval 模式也不动
    assert all(torch.equal(a, b) for a, b in zip(before, trainer.model.parameters()))
    assert all(p.grad is None for p in trainer.model.parameters())
    blocks[0, 2] = 7  # 一个真实目标就够：这一批照常训练，损失有限
    trainer = LMTrainer(tiny_model(), blocks, None, batch_size=4, warmup=1, total_steps=3, progress=False,
                        accumulation_steps=accumulation_steps)
    assert math.isfinite(trainer.train_step()) and trainer.tokens_seen == 1


def test_evaluate_poem_model_refuses_an_unknown_split():
    from tformer_lib.lm.quality import evaluate_poem_model

    with pytest.raises(ValueError, match="split 应是 'valid' 或 'test'.*收到 'foo'"):
        evaluate_poem_model(tiny_model(), None, {"valid": None, "test": None}, split="foo")


def test_stream_blocks_cut_one_stream_without_padding():
    from tformer_lib.lm.data import stream_blocks

    docs = [[1, 5, 6, 2], [1, 7, 2], [1, 8, 9, 10, 11, 2]]  # 13 个词元
    blocks = stream_blocks(docs, 4, seed=None)
    assert blocks.tolist() == [[1, 5, 6, 2], [1, 7, 2, 1], [8, 9, 10, 11]]  # 文档跨块，末尾 1 个词元丢掉
    shuffled = stream_blocks(docs, 4, seed=1)
    orders = [[docs[i] for i in order] for order in itertools.permutations(range(3))]
    assert shuffled.flatten().tolist() in [sum(o, [])[:12] for o in orders]  # 打乱的是文档的次序，不是词元
    assert torch.equal(stream_blocks(docs, 4, seed=1), shuffled)  # 同一种子同样的块
    with pytest.raises(ValueError, match="不够一块"):
        stream_blocks(docs, 14)
    with pytest.raises(ValueError, match="block_len"):
        stream_blocks(docs, 0)
