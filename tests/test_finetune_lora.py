"""LoRA：刚加上时与原模型逐位相同；前向、梯度与合并都与 peft（``get_peft_model`` / ``merge_and_unload``）对照。"""

import copy
import logging

import pytest
import torch
from torch import nn

from tformer_lib.finetune import LoRALinear, apply_lora, lora_state_dict, merge_lora, trainable_parameters
from tformer_lib.lm import LMConfig, make_lm


def _model(**kw):
    torch.manual_seed(0)
    config = dict(vocab_size=50, d_model=32, n_heads=4, n_kv_heads=2, n_layers=2, d_ff=64, max_len=16,
                  positional="rope", norm="rms", activation="swiglu", norm_first=True, tie_embeddings=False)
    return make_lm(LMConfig(**{**config, **kw})).eval()


def _peft():
    for name in ("torchao", "torch.utils._pytree"):  # peft 导入 torchao 时往 stderr 写的日志
        logging.getLogger(name).setLevel(logging.ERROR)
    return pytest.importorskip("peft")


def test_a_fresh_adapter_leaves_the_model_bit_identical_and_only_trains_the_branch():
    base = _model()
    tokens = torch.randint(2, 50, (3, 10))
    lora = apply_lora(copy.deepcopy(base), rank=4, alpha=8, targets=("w_q", "w_v"))
    with torch.no_grad():
        assert torch.equal(lora(tokens), base(tokens))  # B = 0
    c = base.config
    kv = c.n_kv_heads * (c.d_model // c.n_heads)
    assert trainable_parameters(lora) == c.n_layers * 4 * ((c.d_model + c.d_model) + (c.d_model + kv))  # r·(in + out)
    assert {n.rsplit(".", 1)[-1] for n, p in lora.named_parameters() if p.requires_grad} == {"lora_A", "lora_B"}
    assert sorted(lora_state_dict(lora)) == sorted(n for n, p in lora.named_parameters() if p.requires_grad)


def _same_branches(ours, theirs, generator):
    """让两边的 A 相同（取 peft 的初始化），B 设成同一组随机数（B = 0 时梯度对照太弱）。"""
    for name, module in ours.named_modules():
        if isinstance(module, LoRALinear):
            peft_layer = theirs.get_submodule("base_model.model." + name)
            with torch.no_grad():
                module.lora_A.copy_(peft_layer.lora_A["default"].weight)
                b = torch.randn(module.lora_B.shape, generator=generator) * 0.1
                module.lora_B.copy_(b)
                peft_layer.lora_B["default"].weight.copy_(b)


def test_forward_gradients_and_merge_equal_peft():
    peft = _peft()
    base = _model()
    ours = apply_lora(copy.deepcopy(base), rank=4, alpha=16, targets=("w_q", "w_v", "w_2"))
    config = peft.LoraConfig(r=4, lora_alpha=16, target_modules=["w_q", "w_v", "w_2"], lora_dropout=0.0)
    theirs = peft.get_peft_model(copy.deepcopy(base), config)
    _same_branches(ours, theirs, torch.Generator().manual_seed(1))
    tokens = torch.randint(2, 50, (3, 12))
    ours_logits, theirs_logits = ours(tokens), theirs(tokens)
    assert float((ours_logits - theirs_logits).detach().abs().max()) < 1e-5
    ours_logits.square().mean().backward()
    theirs_logits.square().mean().backward()
    for name, module in ours.named_modules():
        if isinstance(module, LoRALinear):
            peft_layer = theirs.get_submodule("base_model.model." + name)
            assert torch.allclose(module.lora_A.grad, peft_layer.lora_A["default"].weight.grad, atol=1e-6, rtol=1e-5)
            assert torch.allclose(module.lora_B.grad, peft_layer.lora_B["default"].weight.grad, atol=1e-6, rtol=1e-5)
    assert trainable_parameters(ours) == theirs.get_nb_trainable_parameters()[0]
    merged_ours, merged_theirs = merge_lora(ours), theirs.merge_and_unload()
    assert not any(isinstance(m, LoRALinear) for m in merged_ours.modules())
    with torch.no_grad():
        assert float((merged_ours(tokens) - merged_theirs(tokens)).abs().max()) < 1e-5
        assert float((merged_ours(tokens) - ours_logits.detach()).abs().max()) < 1e-5  # 合并前后同一个函数


def test_merge_then_unmerge_restores_the_weight_and_merged_forward_matches():
    torch.manual_seed(3)
    linear = nn.Linear(24, 40)
    before = linear.weight.detach().clone()
    layer = LoRALinear(linear, rank=3, alpha=6)
    with torch.no_grad():
        layer.lora_B.normal_()
    x = torch.randn(5, 24)
    with torch.no_grad():
        unmerged = layer(x)
        assert torch.allclose(layer.merge()(x), unmerged, atol=1e-5)
        assert layer.merged and layer.merge().merged  # 再合并一次什么也不做
        layer.unmerge()
    assert torch.allclose(linear.weight, before, atol=1e-6) and not layer.merged
    assert not linear.weight.requires_grad and layer.lora_A.requires_grad


def test_bad_arguments_are_named():
    model = _model()
    with pytest.raises(TypeError, match="base 应是 nn.Linear"):
        LoRALinear(nn.Conv1d(2, 2, 1), 2, 4)
    for bad in (0, -1, True, 2.0):
        with pytest.raises((ValueError, TypeError), match="rank"):
            LoRALinear(nn.Linear(4, 4), bad, 4)
    for bad in (0, -1.0, float("nan"), True, "1", None):
        with pytest.raises((ValueError, TypeError), match="alpha"):
            LoRALinear(nn.Linear(4, 4), 2, bad)
    with pytest.raises(ValueError, match="dropout"):
        LoRALinear(nn.Linear(4, 4), 2, 4, dropout=1.0)
    with pytest.raises(ValueError, match="w_x"):
        apply_lora(copy.deepcopy(model), 2, 4, targets=("w_q", "w_x"))
    with pytest.raises(TypeError, match="targets"):
        apply_lora(copy.deepcopy(model), 2, 4, targets="w_q")
    twice = apply_lora(copy.deepcopy(model), 2, 4)
    with pytest.raises(ValueError, match="已经加过 LoRA"):
        apply_lora(twice, 2, 4)
    with pytest.raises(TypeError, match="model"):
        trainable_parameters("model")


def test_shared_layers_tied_weights_and_linear_subclasses_are_handled_up_front():
    lin = nn.Linear(4, 4)
    shared = nn.Sequential(lin, nn.Tanh(), lin)
    apply_lora(shared, 2, 4, targets=("0", "2"))
    assert shared[0] is shared[2] and trainable_parameters(shared) == 2 * (4 + 4)  # 一条支路，不是两条
    with torch.no_grad():
        shared[0].lora_B.normal_()
        x = torch.randn(3, 4)
        before = shared(x)
        merged = merge_lora(shared)
        assert type(merged[0]) is nn.Linear and torch.allclose(merged(x), before, atol=1e-5)
    with pytest.raises(ValueError, match="共享"):
        apply_lora(_model(tie_embeddings=True), 2, 4, targets=("lm_head",))
    encoder = nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, batch_first=True)
    with pytest.raises(TypeError, match="子类"):
        apply_lora(encoder, 2, 4, targets=("out_proj",))
    bare = LoRALinear(nn.Linear(4, 4), 2, 2.0)
    assert type(merge_lora(bare)) is nn.Linear and bare.merged
    for fn in (merge_lora, lora_state_dict):
        with pytest.raises(TypeError, match="model"):
            fn(None)


def test_merged_state_is_saved_with_the_weights_and_eval_models_stay_deterministic():
    adapted = apply_lora(_model(), 4, 8, dropout=0.5)
    assert not any(m.training for m in adapted.modules() if isinstance(m, LoRALinear))  # 跟着 eval 的模型
    with torch.no_grad():
        for m in adapted.modules():
            if isinstance(m, LoRALinear):
                m.lora_B.normal_()
    tokens = torch.randint(2, 50, (2, 8))
    with torch.no_grad():
        want = adapted(tokens)
        for m in adapted.modules():
            if isinstance(m, LoRALinear):
                m.merge()
        fresh = apply_lora(_model(), 4, 8, dropout=0.5)
        fresh.load_state_dict(adapted.state_dict())
        assert all(m.merged for m in fresh.modules() if isinstance(m, LoRALinear))
        assert float((fresh(tokens) - want).abs().max()) < 1e-5  # 支路没有被再加一遍
