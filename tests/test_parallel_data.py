"""数据并行：手写梯度 all-reduce 与 DDP（2 个进程，gloo），k 步后与单进程整批训练的损失、参数一致——
数据里的 PAD 故意分布不均（各进程每步的真实目标数不同），损失按全局目标数求平均。

容差：损失相对误差 ≤ 1e-5（实测约 6e-8）；AdamW 4 步后参数最大差 ≤ 5e-5（两条路径求和顺序不同，float32
舍入经 Adam 的归一化放大）。实测约 1.7e-5，全在 W^K 的偏置上：它的真实梯度恒为 0（softmax 对每个键加同一个
q·b_k 不变），只剩舍入噪声，Adam 把噪声放大成可见的更新；其余参数 ≤ 1.3e-6。
"""

import pytest
import torch

from tformer_lib import BOS, PAD
from tformer_lib.lm import LMConfig, make_lm
from tformer_lib.parallel.comm import data_parallel_payload, ring_all_reduce_bytes
from tformer_lib.parallel.data_parallel import (
    allreduce_gradients,
    global_batches,
    global_mean_lm_loss,
    rank_batches,
    train_data_parallel,
    train_single_process,
)

STEPS, BATCH, LR = 4, 8, 1e-2


def _uneven_pad_blocks(n=32, length=9, seed=2):
    """每块随机保留 2…length 个真实词元，其余是 PAD：各进程每步的真实目标数不同。
    奇数行在位置 4 开始第二篇文档（BOS；那一行够长时）：BOS 作为目标不计损失。"""
    gen = torch.Generator().manual_seed(seed)
    blocks = torch.randint(4, 30, (n, length), generator=gen)
    keep = torch.randint(2, length + 1, (n,), generator=gen)
    blocks[torch.arange(length) >= keep[:, None]] = PAD  # (n, length)：每行尾部填充
    blocks[1::2, 4] = torch.where(keep[1::2] > 4, BOS, blocks[1::2, 4])
    return blocks


def _targets_per_rank(blocks, step):
    targets = [blocks[rank_batches(len(blocks), BATCH, r, 2)[step]][:, 1:] for r in range(2)]
    return [int(((t != PAD) & (t != BOS)).sum()) for t in targets]


def test_global_mean_loss_counts_what_chapter_9_counts():
    """没有进程组时 global_mean_lm_loss 的值 = 手写的交叉熵平均：PAD 与 BOS 目标都不计（第 9 章的 loss_targets）。"""
    torch.manual_seed(0)
    model = make_lm(LMConfig(vocab_size=30, d_model=16, n_heads=2, n_layers=1, d_ff=32, max_len=16))
    blocks = _uneven_pad_blocks()
    assert (blocks[:, 1:] == BOS).any()
    loss, value = global_mean_lm_loss(model, blocks)
    logits = model(blocks[:, :-1])  # (n, L, V)
    counted = (blocks[:, 1:] != PAD) & (blocks[:, 1:] != BOS)  # (n, L)
    want = torch.nn.functional.cross_entropy(logits[counted], blocks[:, 1:][counted])
    assert value == pytest.approx(float(want), rel=1e-6)
    assert float(loss) == pytest.approx(float(want), rel=1e-6)  # p = 1：交给 backward 的也是它
    with_bos = torch.nn.functional.cross_entropy(logits.flatten(0, 1), blocks[:, 1:].flatten(), ignore_index=PAD)
    assert abs(float(with_bos) - value) > 1e-3  # 把 BOS 也算进去就不同：这个测试分得出两者


@pytest.fixture(scope="module")
def runs():
    torch.manual_seed(0)
    model = make_lm(LMConfig(vocab_size=30, d_model=16, n_heads=2, n_layers=2, d_ff=32, max_len=16))
    blocks = _uneven_pad_blocks()
    ref = train_single_process(model, blocks, STEPS, BATCH, LR)
    dp = train_data_parallel(model, blocks, STEPS, BATCH, LR, world_size=2, timeout=150)
    return model, ref, dp


@pytest.mark.distributed
@pytest.mark.parametrize("mode", ["manual", "ddp"])
def test_data_parallel_equals_single_process(runs, mode):
    model, ref, dp = runs
    assert ref["losses"] == pytest.approx(dp[mode]["losses"], rel=1e-5)
    for name, value in ref["params"].items():
        assert torch.allclose(dp[mode]["params"][name], value, atol=5e-5, rtol=0), name
    # 它确实在训练：参数离开了初值
    assert any(not torch.allclose(v, model.state_dict()[k]) for k, v in ref["params"].items())


@pytest.mark.distributed
def test_uneven_pad_really_makes_the_mean_of_means_wrong(runs):
    """这组数据确实考到了 PAD：各进程每步的目标数不同，旧做法（各自平均、再平均梯度）训练 4 步后的参数
    与整批相差远超测试的容差——所以上面的相等不是碰巧。旧做法在一个进程里模拟：两份损失的平均。"""
    import copy

    model, ref, _ = runs
    blocks = _uneven_pad_blocks()
    counts = [_targets_per_rank(blocks, step) for step in range(STEPS)]
    assert all(a != b for a, b in counts), counts
    old = copy.deepcopy(model)
    optimizer = torch.optim.AdamW(old.parameters(), lr=LR)
    for step in range(STEPS):
        optimizer.zero_grad()
        shards = [blocks[rank_batches(len(blocks), BATCH, r, 2)[step]] for r in range(2)]
        (sum(global_mean_lm_loss(old, s)[0] for s in shards) / 2).backward()  # 没有进程组：各自“总和 / 目标数”
        optimizer.step()
    worst = max(float((p.detach() - ref["params"][k]).abs().max()) for k, p in old.named_parameters())
    assert worst > 10 * 5e-5, worst


@pytest.mark.distributed
def test_manual_all_reduce_sends_every_gradient_once(runs):
    model, _, dp = runs
    n_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    assert dp["manual"]["bytes_per_step"] == n_bytes == data_parallel_payload(sum(p.numel() for p in model.parameters()))
    # DDP 把同样的 4N 字节装进桶里（小模型一个桶就够：默认桶容量 25 MiB）
    assert dp["ddp"]["bytes_per_step"] == n_bytes and dp["ddp"]["buckets"] == [n_bytes]
    assert ring_all_reduce_bytes(n_bytes, 2) == n_bytes  # p = 2：2(p−1)/p = 1
    assert ring_all_reduce_bytes(n_bytes, 8) == pytest.approx(1.75 * n_bytes)


def test_sampler_splits_each_global_batch_without_overlap():
    shards = [rank_batches(20, 4, r, 2, seed=3) for r in range(2)]
    for step, whole in enumerate(global_batches(20, 4, 2, seed=3)):
        a, b = shards[0][step], shards[1][step]
        assert len(a) == len(b) == 2 and not set(a.tolist()) & set(b.tolist())
        assert torch.equal(whole, torch.cat([a, b]))
    assert sorted(torch.cat(sum(shards, [])).tolist()) == list(range(20))
    with pytest.raises(ValueError, match="batch_size=5 不能被进程数 world_size=2 整除"):
        rank_batches(20, 5, 0, 2)


def test_bad_run_arguments_are_named():
    model = make_lm(LMConfig(vocab_size=10, d_model=8, n_heads=2, n_layers=1, d_ff=8, max_len=8))
    blocks = torch.randint(4, 10, (8, 5))
    with pytest.raises(ValueError, match="steps=3 超过了一个 epoch 的步数 2"):
        train_single_process(model, blocks, 3, 4, 1e-3)
    with pytest.raises(ValueError, match="steps=3 超过了一个 epoch 的步数 2"):
        train_data_parallel(model, blocks, 3, 4, 1e-3)  # 起进程之前就报错
    with pytest.raises(ValueError, match="batch_size 应是正整数，收到 0"):
        train_single_process(model, blocks, 1, 0, 1e-3)
    with pytest.raises(ValueError, match="lr 应是 > 0 的有限数"):
        train_single_process(model, blocks, 1, 4, float("nan"))
    with pytest.raises(TypeError, match="modes 应是写法名的序列"):
        train_data_parallel(model, blocks, 1, 4, 1e-3, modes="ddp")
    with pytest.raises(ValueError, match="rank 应是 0 到 world_size-1=1 之间的整数，收到 2"):
        rank_batches(8, 4, 2, 2)
    with pytest.raises(ValueError, match="block 应是 2 维张量"):
        global_mean_lm_loss(model, blocks[0])
    with pytest.raises(ValueError, match="block 每行至少要 2 个词元"):
        global_mean_lm_loss(model, blocks[:, :1])
    with pytest.raises(TypeError, match="blocks 应是整数类型的词元 id"):
        train_single_process(model, blocks.float(), 1, 4, 1e-3)


def test_bad_mode_is_rejected():
    model = make_lm(LMConfig(vocab_size=10, d_model=8, n_heads=2, n_layers=1, d_ff=8, max_len=8))
    with pytest.raises(ValueError, match="'zero9'"):
        train_data_parallel(model, torch.randint(4, 10, (8, 5)), 1, 4, 1e-3, modes=("zero9",))


@pytest.mark.distributed
def test_throughput_measurement_reports_both_layouts():
    from tformer_lib.parallel.throughput import measure_throughput

    model = make_lm(LMConfig(vocab_size=30, d_model=16, n_heads=2, n_layers=1, d_ff=32, max_len=16))
    out = measure_throughput(model, torch.randint(4, 30, (16, 9)), steps=1, batch_size=4, timeout=150)
    assert out["1x2"]["tokens_per_s"] > 0 and out["2x1"]["tokens_per_s"] > 0
    assert 0 < out["2x1"]["comm_share"] < 1


def test_losses_take_any_integer_blocks_and_check_the_layout():
    torch.manual_seed(0)
    model = make_lm(LMConfig(vocab_size=30, d_model=16, n_heads=2, n_layers=1, d_ff=32, max_len=16))
    from tformer_lib.parallel.data_parallel import lm_loss

    blocks = _uneven_pad_blocks()
    assert float(lm_loss(model, blocks.int())) == pytest.approx(float(lm_loss(model, blocks)))
    assert global_mean_lm_loss(model, blocks.int())[1] == pytest.approx(global_mean_lm_loss(model, blocks)[1])
    with pytest.raises(ValueError, match="block"):
        lm_loss(model, blocks[0])
    all_pad = torch.full((2, 9), PAD)  # 没有可计的目标：两种损失都是 0，不是 0/0 的 NaN
    assert float(lm_loss(model, all_pad)) == 0.0 and global_mean_lm_loss(model, all_pad)[1] == 0.0
