"""流水线并行（2 段、2 个进程、gloo、4 个微批）：手写 GPipe、手写 1F1B（send/recv）与 torch.distributed.pipelining
的 ScheduleGPipe、Schedule1F1B，SGD 训练 3 步后与单进程整批训练的损失（相对 1e-6）、参数（≤ 1e-6）一致——
数据是带 PAD 尾巴的块，各微批的 PAD 多少不一（有一个微批全是 PAD）：按微批求平均再平均就会不同；
块中间有第二篇文档的 BOS，它作为目标不计损失（与第 9 章相同）。
"""

import pytest
import torch

from tformer_lib.lm import LMConfig, make_lm
from tformer_lib.parallel import launch
from tformer_lib.parallel.comm import pipeline_payload
from tformer_lib.parallel.pipeline import LMStage, PIPELINE_MODES, bubble_fraction, pipeline_worker, split_points
from tformer_lib.specials import BOS, PAD

STEPS, BATCH, MICRO, LR = 3, 8, 4, 0.5


def padded_blocks(n_blocks: int, length: int, micro_batches: int, batch_size: int = BATCH) -> torch.Tensor:
    """打包的块、尾巴填 PAD，PAD 的多少随行而变：每步里各微批的目标数都不同，每步的第一个微批全是 PAD。
    够长的行在位置 3 开始第二篇文档（BOS）。"""
    g = torch.Generator().manual_seed(7)
    blocks = torch.randint(4, 30, (n_blocks, length), generator=g)
    rows_per_micro = batch_size // micro_batches
    for row in range(n_blocks):
        micro = (row % batch_size) // rows_per_micro
        keep = 1 if micro == 0 else 2 + (row * 5 + micro) % (length - 1)  # 第 0 个微批：只留第一个词元，目标全是 PAD
        blocks[row, keep:] = PAD
        if keep > 5:
            blocks[row, 3] = BOS
    return blocks


def _counted(targets: torch.Tensor) -> int:
    return int(((targets != PAD) & (targets != BOS)).sum())


@pytest.fixture(scope="module")
def problem(sgd_reference):
    torch.manual_seed(0)
    model = make_lm(LMConfig(vocab_size=30, d_model=16, n_heads=2, n_layers=4, d_ff=32, max_len=16,
                             tie_embeddings=False, positional="rope"))
    blocks = padded_blocks(STEPS * BATCH, 9, MICRO)
    losses, params = sgd_reference(model, blocks, STEPS, BATCH, LR)
    return model, blocks, losses, params


def test_the_padded_blocks_make_per_micro_batch_means_differ_from_the_batch_mean():
    blocks = padded_blocks(STEPS * BATCH, 9, MICRO)
    for s in range(STEPS):
        counts = [_counted(mb[:, 1:]) for mb in blocks[s * BATCH : (s + 1) * BATCH].chunk(MICRO)]
        assert counts[0] == 0 and len(set(counts)) == MICRO, counts  # 各微批的目标数两两不同
    assert int((blocks[:, 1:] == BOS).sum()) >= STEPS  # 每步都有不计损失的 BOS 目标


@pytest.mark.distributed
@pytest.mark.parametrize("mode", PIPELINE_MODES)
def test_pipeline_equals_single_process(problem, mode):
    model, blocks, losses, params = problem
    res = launch(pipeline_worker, 2, (mode, model.config.to_dict(), model.state_dict(), blocks, STEPS, BATCH, MICRO, LR),
                 timeout=150)
    assert res[0]["losses"] == res[1]["losses"]
    assert losses == pytest.approx(res[0]["losses"], rel=1e-6)
    got = {**res[0]["params"], **res[1]["params"]}
    assert sorted(got) == sorted(params)
    assert not set(res[0]["params"]) & set(res[1]["params"])  # 每个参数只在一段里
    for name, value in params.items():
        assert torch.allclose(got[name], value, atol=1e-6, rtol=0), name
    if mode in ("manual", "manual_1f1b"):  # 两段各发一个方向：激活 (B, T, d) 前向、梯度 (B, T, d) 反向，合计 = 公式
        sent = res[0]["bytes_per_step"] + res[1]["bytes_per_step"]
        assert sent == pipeline_payload(BATCH, blocks.shape[1] - 1, model.config.d_model, stages=2)
        assert res[0]["bytes_per_step"] == res[1]["bytes_per_step"]


def test_bubble_fraction_and_split_points():
    assert bubble_fraction(2, 4) == pytest.approx(1 / 5)
    assert bubble_fraction(1, 7) == 0.0
    assert bubble_fraction(4, 1) == pytest.approx(3 / 4)
    assert split_points(4, 2) == [(0, 2), (2, 4)] and split_points(5, 2) == [(0, 2), (2, 5)]
    with pytest.raises(ValueError, match="stages=3 多于块数 n_layers=2"):
        split_points(2, 3)
    with pytest.raises(ValueError, match="micro_batches"):
        bubble_fraction(2, 0)


def test_single_process_stages_compose_to_the_model(problem):
    model = problem[0]
    tokens = torch.randint(4, 30, (2, 7))
    with torch.no_grad():
        out = LMStage(model, 1, 2)(LMStage(model, 0, 2)(tokens))
        assert torch.allclose(out, model(tokens), atol=1e-6)
    tied = make_lm(LMConfig(vocab_size=30, d_model=16, n_heads=2, n_layers=2, d_ff=32, max_len=16))
    with pytest.raises(ValueError, match="tie_embeddings=False"):
        LMStage(tied, 0, 2)


def test_every_accepted_mode_is_listed_and_bad_arguments_fail_before_launching():
    from tformer_lib.parallel.pipeline import MANUAL_MODES, PIPELINE_MODES, measure_pipeline_timeline

    assert set(MANUAL_MODES) <= set(PIPELINE_MODES) and {"gpipe", "1f1b"} <= set(PIPELINE_MODES)
    with pytest.raises(ValueError, match="mode 应是"):
        pipeline_worker(0, 2, "zb", {}, {}, torch.zeros(1, 2), 1, 1, 1, 0.1)
    model = make_lm(LMConfig(vocab_size=30, d_model=16, n_heads=2, n_layers=2, d_ff=32, max_len=16, tie_embeddings=False))
    with pytest.raises(ValueError, match="steps 应 ≥ 2"):  # 第一步是预热、不算：只跑一步就没有可返回的时间线
        measure_pipeline_timeline(model, torch.randint(4, 30, (8, 9)), steps=1)
    with pytest.raises(ValueError, match="stages=3 多于块数 n_layers=2"):
        measure_pipeline_timeline(model, torch.randint(4, 30, (24, 9)), stages=3)
