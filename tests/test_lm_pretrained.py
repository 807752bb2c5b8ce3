"""随书附带的唐诗模型：能读、配置与配方一致、词表与语料重建的一致、记录了训练曲线与耗时、
同一配方从头训练的头几步与记录逐步吻合、能按体裁作诗。"""

import pytest
import torch

from tformer_lib.lm.pretrained import POEM_RECIPE, load_poem_model, poem_data, shipped_poem_checkpoint, train_poem_model
from tformer_lib.lm.quality import poem_form, sample_poems


@pytest.fixture(scope="module")
def shipped():
    return load_poem_model()


def test_shipped_checkpoint_is_small_and_matches_the_recipe(shipped):
    model, tokenizer, ckpt = shipped
    assert shipped_poem_checkpoint().stat().st_size < 4_000_000
    for key, value in POEM_RECIPE["model"].items():
        assert getattr(model.config, key) == value, key
    assert tokenizer == poem_data()["tokenizer"]  # 词表可由随库语料重建
    extra = ckpt["extra"]
    assert extra["recipe"]["total_steps"] == POEM_RECIPE["total_steps"]
    assert len(extra["history"]["step_loss"]) == POEM_RECIPE["total_steps"]
    assert extra["seconds"] > 0 and extra["tokens_per_second"] > 0 and extra["threads"] == POEM_RECIPE["threads"]
    assert not model.training


@pytest.mark.slow
def test_recipe_reproduces_the_first_recorded_steps(shipped):
    _, _, ckpt = shipped
    _, _, trainer = train_poem_model(steps=3, progress=False)
    recorded = ckpt["extra"]["history"]["step_loss"][:3]
    assert trainer.history["step_loss"] == pytest.approx(recorded, abs=1e-3)


def test_shipped_model_writes_poems_in_the_requested_form(shipped):
    model, tokenizer, _ = shipped
    prompts = [("五言绝句", "春晓", ""), ("七言绝句", "", "月"), ("五言律诗", "送友人", ""), ("七言律诗", "", "山")]
    texts = sample_poems(model, tokenizer, prompts, temperature=0.8, seed=0)
    assert sum(poem_form(t) == p[0] for t, p in zip(texts, prompts)) >= 3
    assert texts[1].startswith("月") and texts[3].startswith("山")
    again = sample_poems(model, tokenizer, prompts, temperature=0.8, seed=0)
    assert again == texts  # 同一种子，同样的诗
    torch.manual_seed(0)
