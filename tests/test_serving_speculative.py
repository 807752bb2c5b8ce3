"""推测解码：输出与目标模型单独贪心生成逐词元相同；草稿就是目标本身时全部接受；期望公式的边界值。"""

import random

import pytest
import torch

from tformer_lib.lm import LMConfig, generate, make_lm
from tformer_lib.serving.speculative import (
    expected_speedup,
    expected_tokens_per_pass,
    layer_skip_draft,
    speculative_generate,
)


def _model(seed, n_layers=3, **options):
    torch.manual_seed(seed)
    return make_lm(LMConfig(vocab_size=30, d_model=32, n_heads=4, n_layers=n_layers, d_ff=48, max_len=40,
                            **options)).eval()


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("k", [1, 3, 5])
def test_output_equals_target_alone(seed, k):
    rng = random.Random(seed)
    target = _model(seed, positional="rope" if seed % 2 else "learned")
    draft = _model(100 + seed, n_layers=1, positional="learned")  # 另一个随机模型：多半猜错
    prompt = [rng.randrange(4, 30) for _ in range(rng.randint(1, 10))]
    n = rng.randint(1, 25)
    out, stats = speculative_generate(target, draft, prompt, n, k=k, eos_id=5)
    assert out == generate(target, prompt, n, method="greedy", eos_id=5).tolist()
    assert stats.target_passes <= len(out)


def test_layer_skip_draft_and_perfect_draft():
    target = _model(3, n_layers=4, positional="rope")
    prompt = [7, 8, 9]
    alone = generate(target, prompt, 20, method="greedy").tolist()
    out, stats = speculative_generate(target, target, prompt, 20, k=4)
    assert out == alone and stats.acceptance_rate == 1.0
    assert stats.target_passes == 4  # 每次验证产出 k + 1 = 5 个
    draft = layer_skip_draft(target, 2)
    assert len(draft.blocks) == 2 and len(target.blocks) == 4
    assert draft.blocks[0] is target.blocks[0]  # 共享权重
    out2, _ = speculative_generate(target, draft, prompt, 20, k=3)
    assert out2 == alone


def test_expected_formulas():
    assert expected_tokens_per_pass(0.0, 4) == 1.0
    assert expected_tokens_per_pass(1.0, 4) == 5.0
    assert expected_tokens_per_pass(0.5, 1) == pytest.approx(1.5)
    assert expected_speedup(1.0, 4, 0.0) == 5.0
    assert expected_speedup(0.0, 4, 0.25) == pytest.approx(0.5)


def test_bad_arguments():
    target, other = _model(0), make_lm(LMConfig(vocab_size=31, d_model=32, n_heads=4, n_layers=1, d_ff=48, max_len=40))
    with pytest.raises(ValueError, match="k"):
        speculative_generate(target, target, [5], 3, k=0)
    with pytest.raises(ValueError, match="draft"):
        speculative_generate(target, other, [5], 3)
    with pytest.raises(ValueError, match="n_layers"):
        layer_skip_draft(target, 3)


def test_shipped_draft_is_small_shares_the_tokenizer_and_keeps_outputs():
    from tformer_lib.lm.pretrained import load_poem_model
    from tformer_lib.serving.draft import DRAFT_RECIPE, SHIPPED_DRAFT, load_draft_model

    target, tokenizer, _ = load_poem_model()
    draft, draft_tokenizer, ckpt = load_draft_model()
    assert draft_tokenizer.to_dict() == tokenizer.to_dict()
    assert draft.config.to_dict() == {**target.config.to_dict(), **{k: DRAFT_RECIPE["model"][k] for k in
                                                                     ("d_model", "n_heads", "n_layers", "d_ff")}}
    assert sum(p.numel() for p in draft.parameters()) < sum(p.numel() for p in target.parameters()) / 4
    assert SHIPPED_DRAFT.stat().st_size < 1_000_000 and ckpt["extra"]["steps"] == DRAFT_RECIPE["total_steps"]
    prompt = tokenizer.encode("七绝《春日》", add_bos=True)
    out, stats = speculative_generate(target, draft, prompt, 24, k=2)
    assert out == generate(target, prompt, 24, method="greedy").tolist()
    assert stats.accepted > 0  # 训练过的草稿确实猜对了一些


@pytest.mark.slow
def test_build_draft_checkpoint_writes_a_loadable_file(tmp_path):
    from tformer_lib.serving.draft import build_draft_checkpoint, load_draft_model

    path = build_draft_checkpoint(tmp_path / "draft.pt", steps=1, verbose=False)
    draft, _, ckpt = load_draft_model(path)
    assert draft.config.n_layers == 1 and ckpt["extra"]["steps"] == 1
    assert not list(tmp_path.glob("*.tmp"))  # 原子写入：不留临时文件
