"""第 16 章实测脚本（tformer_lib.experiments.moe）的部件：组的配置、激活参数的算法、按容量量丢弃率。"""

import pytest
import torch

from tformer_lib.lm import LMConfig, make_lm
from tformer_lib.translation.model import count_parameters
from tformer_lib.experiments.moe import MOE_ARMS, evaluate_with_capacity, active_parameters, moe_arm_config


def test_arms_have_the_dense_models_active_ffn_width():
    for arm, change in MOE_ARMS.items():
        config = moe_arm_config(arm, 100)
        width = config.d_ff * (config.moe_top_k if config.moe_experts else 1)
        assert width == moe_arm_config("dense", 100).d_ff, arm
    with pytest.raises(ValueError, match="arm"):
        moe_arm_config("sparse", 100)


def test_active_parameters_subtract_the_unchosen_experts():
    torch.manual_seed(0)
    base = dict(vocab_size=30, d_model=16, n_heads=2, n_layers=2, d_ff=24, max_len=16)
    dense = make_lm(LMConfig(**base))
    moe = make_lm(LMConfig(**base, moe_experts=4, moe_top_k=1))
    assert active_parameters(dense) == count_parameters(dense)
    router = 16 * 4 * 2  # 每层一个 d_model × E 的门
    assert active_parameters(moe) == count_parameters(dense) + router
    assert count_parameters(moe) - active_parameters(moe) == 2 * 3 * count_parameters(moe.blocks[0].feed_forward.experts[0])


def test_drop_rate_by_capacity_restores_the_model():
    torch.manual_seed(1)
    model = make_lm(LMConfig(vocab_size=30, d_model=16, n_heads=2, n_layers=1, d_ff=16, max_len=16, moe_experts=4,
                             moe_top_k=2, moe_capacity_factor=1.25)).eval()
    blocks = torch.randint(4, 30, (6, 13))
    low, high = evaluate_with_capacity(model, blocks, 0.5, 3), evaluate_with_capacity(model, blocks, 4.0, 3)
    assert low["drop_rate"] >= 0.5 and high["drop_rate"] == 0.0  # 容量 0.5：至少一半的任务排不上
    assert not model.training and model.moe_layers()[0].capacity_factor == 1.25  # 量完恢复原样


def test_shipped_results_cover_every_arm_and_seed_with_equal_active_width():
    import json

    from tformer_lib.experiments.moe import CAPACITY_FACTORS, RESULTS_PATH

    data = json.loads(RESULTS_PATH.read_text(encoding="utf-8"))
    seeds = data["settings"]["seeds"]
    assert len(seeds) >= 2
    assert sorted((r["arm"], r["seed"]) for r in data["runs"]) == sorted((a, s) for a in MOE_ARMS for s in seeds)
    active = [data["arms"][a]["active_parameters"] for a in MOE_ARMS]
    assert max(active) / min(active) < 1.01  # 激活参数相同（只差路由器的几千个）
    for arm in ("top1", "top2_fine"):
        rates = [c["drop_rate"] for c in data["capacity"] if c["arm"] == arm and c["seed"] == seeds[0]]
        assert len(rates) == len(CAPACITY_FACTORS) and rates == sorted(rates, reverse=True)
