"""文档掩码（document masking）：打包的块里每篇文档位置从 0 数、只看自己（tformer_lib.lm.data.document_layout）。

核心的一条：打开文档掩码后，块里每首“诗”的 logits 与把它单独从位置 0 送进模型时相同；不打开时不同。
"""

import copy
import random

import pytest
import torch
import torch.nn.functional as F

from tformer_lib import BOS, EOS, PAD
from tformer_lib.lm import LMConfig, make_lm
from tformer_lib.lm.data import document_layout, loss_targets, pack_documents
from tformer_lib.lm.training import LMTrainer

V = 24
T, F_ = True, False


def docs_of(lengths, seed=0):
    rng = random.Random(seed)
    return [[BOS] + [rng.randrange(4, V) for _ in range(n)] + [EOS] for n in lengths]


def tiny_model(positional="learned", fast=True, seed=0):
    torch.manual_seed(seed)
    return make_lm(LMConfig(V, d_model=32, n_heads=4, n_layers=2, d_ff=64, max_len=32, positional=positional,
                            norm_first=True, fast_attention=fast)).eval()


def test_layout_of_a_hand_made_block():
    tokens = torch.tensor([[BOS, 5, 6, EOS, BOS, 7, EOS, PAD, PAD]])
    positions, mask = document_layout(tokens)
    assert positions.tolist() == [[0, 1, 2, 3, 0, 1, 2, 0, 0]]
    assert mask.shape == (1, 1, 9, 9) and mask.dtype == torch.bool
    expected = [
        # 第一篇（下标 0–3）：分块内的下三角
        [T, F_, F_, F_, F_, F_, F_, F_, F_],
        [T, T, F_, F_, F_, F_, F_, F_, F_],
        [T, T, T, F_, F_, F_, F_, F_, F_],
        [T, T, T, T, F_, F_, F_, F_, F_],
        # 第二篇（下标 4–6）：看不见第一篇
        [F_, F_, F_, F_, T, F_, F_, F_, F_],
        [F_, F_, F_, F_, T, T, F_, F_, F_],
        [F_, F_, F_, F_, T, T, T, F_, F_],
        # PAD 只看自己
        [F_, F_, F_, F_, F_, F_, F_, T, F_],
        [F_, F_, F_, F_, F_, F_, F_, F_, T],
    ]
    assert mask[0, 0].tolist() == expected


def test_tokens_before_the_first_bos_form_a_document_from_position_0():
    """stream_blocks 的块可能从上一篇文档的中间开始：那段尾巴自成一篇、从 0 数。"""
    positions, mask = document_layout(torch.tensor([[5, 6, EOS, BOS, 7, 8], [BOS, 9, 10, 11, 12, 13]]))
    assert positions.tolist() == [[0, 1, 2, 0, 1, 2], [0, 1, 2, 3, 4, 5]]
    assert mask[0, 0, 2].tolist() == [T, T, T, F_, F_, F_]
    assert mask[0, 0, 5].tolist() == [F_, F_, F_, T, T, T]
    # 只有一篇文档、没有 PAD 的块：就是普通的因果掩码与 0..T-1 的位置
    assert torch.equal(mask[1, 0], torch.ones(6, 6, dtype=torch.bool).tril())


@pytest.mark.parametrize("positional", ["learned", "sinusoidal", "rope", "alibi"])
@pytest.mark.parametrize("fast", [True, False])
def test_each_document_in_a_packed_block_sees_what_it_would_see_alone(positional, fast):
    model = tiny_model(positional, fast)
    docs = docs_of([9, 4, 12, 6])  # 11 + 6 + 14 + 8 = 39 个词元：装进长 33 的块时分成两块
    blocks = pack_documents(docs, 33, seed=None)
    inputs, _ = loss_targets(blocks)  # (N, 32)
    positions, mask = document_layout(inputs)
    with torch.no_grad():
        masked = model(inputs, positions=positions, attn_mask=mask)  # (N, 32, V)
        plain = model(inputs)  # (N, 32, V)：只有因果掩码
    assert torch.isfinite(masked).all()  # PAD 行也没有 NaN
    checked = differs = 0
    for row in range(inputs.shape[0]):
        starts = (inputs[row] == BOS).nonzero().flatten().tolist()
        for k, s in enumerate(starts):
            doc = next(d for d in docs if inputs[row, s : s + len(d)].tolist() == d[: min(len(d), 32 - s)])
            n = min(len(doc), 32 - s)  # 块最后一篇的 EOS 不在输入里
            with torch.no_grad():
                alone = model(torch.tensor([doc[:n]]))  # (1, n, V)：单独送进去，位置从 0 起
            assert (masked[row, s : s + n] - alone[0]).abs().max() < 1e-5, (row, k)
            gap = (plain[row, s : s + n] - alone[0]).abs().max()
            if k == 0:
                assert gap < 1e-5  # 块里的第一篇：打包与否本来就一样
            else:
                differs += bool(gap > 1e-3)  # 后面的几篇：只用因果掩码时看得见前文、位置也不同
            checked += 1
    assert checked == len(docs) and differs == len(docs) - 2  # 两块，各有一篇是“第一篇”


def test_trainer_with_document_mask_trains_on_each_document_alone():
    """document_mask=True 时一步的损失 = 把这一批里每篇文档单独送进模型的交叉熵（按词元平均）；默认则不同。"""
    docs = docs_of([random.Random(i).randrange(3, 12) for i in range(60)], seed=1)
    blocks = pack_documents(docs, 33)
    losses = {}
    for document_mask in (True, False):
        model = tiny_model()
        trainer = LMTrainer(model, blocks, None, batch_size=4, warmup=1, total_steps=3, progress=False,
                            document_mask=document_mask)
        reference = copy.deepcopy(model)
        batch = trainer.batch(0)
        losses[document_mask] = trainer.train_step()
    inputs, targets = loss_targets(batch)  # (4, 32), (4, 32)
    total, count = 0.0, 0
    with torch.no_grad():
        for row in range(inputs.shape[0]):
            starts = (inputs[row] == BOS).nonzero().flatten().tolist() + [32]
            for s, e in zip(starts, starts[1:]):
                keep = targets[row, s:e] != PAD
                logits = reference(inputs[row : row + 1, s:e])[0]  # (e - s, V)
                total += float(F.cross_entropy(logits[keep], targets[row, s:e][keep], reduction="sum"))
                count += int(keep.sum())
    assert losses[True] == pytest.approx(total / count, abs=1e-5)
    assert abs(losses[False] - total / count) > 1e-4


def test_document_mask_with_gradient_accumulation_matches_one_batch():
    blocks = pack_documents(docs_of([random.Random(i).randrange(3, 12) for i in range(60)], seed=2), 33)
    losses = []
    for k in (1, 2):
        trainer = LMTrainer(tiny_model(), blocks, None, batch_size=4, warmup=1, total_steps=3, progress=False,
                            document_mask=True, accumulation_steps=k)
        losses.append([trainer.train_step() for _ in range(2)])
    assert losses[0] == pytest.approx(losses[1], abs=1e-5)


def test_resuming_with_a_different_document_mask_is_refused():
    blocks = pack_documents(docs_of([5] * 40), 33)
    state = LMTrainer(tiny_model(), blocks, None, batch_size=4, progress=False, document_mask=True).state_dict()
    assert state["document_mask"] is True
    other = LMTrainer(tiny_model(), blocks, None, batch_size=4, progress=False)
    with pytest.raises(ValueError, match="document_mask=True"):
        other.load_state_dict(state)
    old = {k: v for k, v in other.state_dict().items() if k != "document_mask"}  # 旧检查点没有这一项
    other.load_state_dict(old)


@pytest.mark.parametrize("bad, error, words", [
    (torch.tensor([BOS, 5, 6]), ValueError, ["tokens", "2 维", "(3,)"]),
    ([[BOS, 5, 6]], TypeError, ["tokens", "list"]),
    (torch.tensor([[1.0, 5.0]]), TypeError, ["tokens", "float32"]),
    (torch.tensor([[BOS, -3, 6]]), ValueError, ["tokens", "-3"]),
    (torch.zeros(2, 0, dtype=torch.long), ValueError, ["tokens", "空序列"]),
])
def test_bad_tokens_are_named(bad, error, words):
    with pytest.raises(error) as info:
        document_layout(bad)
    for w in words:
        assert w in str(info.value)


def test_bad_document_mask_flag_is_named():
    blocks = pack_documents(docs_of([5] * 40), 33)
    with pytest.raises(TypeError, match="document_mask 应是 bool，收到 1"):
        LMTrainer(tiny_model(), blocks, None, batch_size=4, progress=False, document_mask=1)


def test_experiment_parts_start_positions_and_probe():
    """第 9 章实测脚本的部件：起始位置的计数，与“单独读 / 打包读”的探针（块里第一首两种读法必然相同）。"""
    from tformer_lib.experiments.document_masking import probe_losses, start_positions

    blocks = torch.tensor([[BOS, 5, EOS, BOS, 6, 7, EOS, PAD], [BOS, 8, 9, 10, 11, EOS, BOS, 12]])
    assert start_positions(blocks).tolist() == [0, 3, 0, 6]
    model = tiny_model()
    probe = probe_losses(model, docs_of([5, 9, 3, 7, 6, 4, 8, 2]), 17)
    assert probe["first_alone"] == pytest.approx(probe["first_packed"], abs=1e-5)
    assert abs(probe["later_alone"] - probe["later_packed"]) > 1e-4  # 后面几首：看得见前文、位置不同
    assert probe["first_tokens"] > 0 and probe["later_tokens"] > 0


def test_shipped_results_cover_both_arms_and_every_seed():
    import json

    from tformer_lib.experiments.document_masking import ARMS, RESULTS_PATH

    data = json.loads(RESULTS_PATH.read_text(encoding="utf-8"))
    seeds = data["settings"]["seeds"]
    assert len(seeds) >= 2 and data["machine"]["threads"] == 1
    assert sorted((r["arm"], r["seed"]) for r in data["runs"]) == sorted((a, s) for a in ARMS for s in seeds)
    for run in data["runs"]:
        assert run["evals"][-1]["step"] == data["settings"]["training"]["steps"]
        assert run["probe"]["first_alone"] == pytest.approx(run["probe"]["first_packed"], abs=1e-4)
    assert 0 < data["train_documents"]["share_at_position_0"] < 1
