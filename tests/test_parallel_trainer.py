"""``DistributedLMTrainer``（2 个进程，gloo）与全是 PAD 的块。

- 一个进程分到的块全是 PAD、全局批里仍有目标：照常训练，损失、参数与 ``tokens_seen`` 都与单进程整批相同
  （梯度累积时以前各进程把自己的 0 个目标记成 1 个，全局目标数多出一个，损失与梯度都偏小）；
- 全局批一个目标也没有：两个进程一起报错（目标数是全局的），没有进程等在 all-reduce 里。

容差与 ``test_parallel_data.py`` 相同：损失相对误差 ≤ 1e-5，参数最大差 ≤ 5e-5。
"""

import pytest
import torch

from tformer_lib import BOS, PAD
from tformer_lib.lm import LMConfig, make_lm
from tformer_lib.lm.training import LMTrainer
from tformer_lib.parallel.launch import DistributedError, launch

CONFIG = {"vocab_size": 24, "d_model": 16, "n_heads": 2, "n_layers": 1, "d_ff": 32, "max_len": 16, "dropout": 0.0}
STEPS, BATCH = 2, 4


def _state():
    torch.manual_seed(0)
    return {k: v.clone() for k, v in make_lm(LMConfig(**CONFIG)).state_dict().items()}


def _options(accumulation_steps):
    return {"batch_size": BATCH, "warmup": 1, "total_steps": STEPS, "progress": False,
            "accumulation_steps": accumulation_steps}


def _run(trainer):
    losses = [trainer.train_step() for _ in range(STEPS)]
    return losses, {k: v.detach().clone() for k, v in trainer.model.state_dict().items()}, trainer.tokens_seen


def _train(rank, world_size, blocks, state, accumulation_steps):  # 顶层函数：子进程按名字导入它
    from tformer_lib.parallel import DistributedLMTrainer

    model = make_lm(LMConfig(**CONFIG))
    model.load_state_dict(state)
    return _run(DistributedLMTrainer(model, blocks, None, **_options(accumulation_steps)))


def _blocks_with_an_empty_rank():
    """4 块 = 一个全局批。第 0 步 rank 1 分到全局批的第 1、3 块：让这两块只剩 BOS 与 PAD。"""
    gen = torch.Generator().manual_seed(3)
    blocks = torch.randint(4, 24, (4, 9), generator=gen)  # (N, L+1)
    blocks[:, 0] = BOS
    blocks[:, 6:] = PAD
    probe = LMTrainer(make_lm(LMConfig(**CONFIG)), blocks, None, **_options(1))
    order = probe._batch_rows(0).tolist()  # 全局批的第 i 块是原来的第 order[i] 块
    blocks[[order[1], order[3]], 1:] = PAD
    return blocks


@pytest.mark.distributed
@pytest.mark.parametrize("accumulation_steps", [1, 2])
def test_a_rank_without_targets_trains_like_the_whole_batch(accumulation_steps):
    blocks, state = _blocks_with_an_empty_rank(), _state()
    model = make_lm(LMConfig(**CONFIG))
    model.load_state_dict(state)
    want_losses, want_params, want_tokens = _run(LMTrainer(model, blocks, None, **_options(accumulation_steps)))
    losses, params, tokens = launch(_train, 2, (blocks, state, accumulation_steps), timeout=120)[0]
    assert losses == pytest.approx(want_losses, rel=1e-5)
    assert max(float((params[k] - want_params[k]).abs().max()) for k in want_params) <= 5e-5
    assert tokens == want_tokens == STEPS * 2 * 5  # 每步两块各 5 个目标（第 1…5 个词元）


@pytest.mark.distributed
def test_a_global_batch_without_targets_fails_on_every_rank_without_hanging():
    blocks = torch.full((4, 9), PAD)
    blocks[:, 0] = BOS
    with pytest.raises(DistributedError, match="没有要预测的目标"):
        launch(_train, 2, (blocks, _state(), 2), timeout=60)
