"""混合专家（tformer_lib.moe）：与稠密 FFN、逐专家循环、Hugging Face 的 Mixtral 块对照；梯度、容量、辅助损失。"""

import copy

import pytest
import torch
from torch.func import functional_call

from tformer_lib import PositionwiseFeedForward
from tformer_lib import PAD
from tformer_lib.lm import LMConfig, LMTrainer, make_lm
from tformer_lib.lm.data import loss_targets
from tformer_lib.moe import (
    MoEFeedForward,
    Routing,
    TopKRouter,
    expert_capacity,
    load_balancing_loss,
    combine,
    dispatch,
    moe_loop,
    plan_dispatch,
    router_z_loss,
    within_capacity,
)


def _layer(seed=0, **kw):
    torch.manual_seed(seed)
    args = dict(d_model=8, d_ff=12, n_experts=4, top_k=2)
    args.update(kw)
    return MoEFeedForward(**args)


@pytest.mark.parametrize("activation,bias", [("relu", True), ("gelu", False), ("swiglu", False)])
def test_one_expert_top1_equals_the_dense_ffn(activation, bias):
    moe = _layer(n_experts=1, top_k=1, activation=activation, bias=bias)
    dense = PositionwiseFeedForward(8, 12, 0.0, activation, bias=bias)
    dense.load_state_dict(moe.experts[0].state_dict())
    x = torch.randn(3, 5, 8)
    torch.testing.assert_close(moe(x), dense(x), rtol=0, atol=0)
    assert moe.last.dropped == 0 and moe.last.load.tolist() == [15]


def test_one_expert_lm_equals_the_dense_lm():
    base = dict(vocab_size=30, d_model=16, n_heads=2, n_layers=2, d_ff=24, max_len=16, activation="swiglu")
    torch.manual_seed(1)
    dense = make_lm(LMConfig(**base))
    moe = make_lm(LMConfig(**base, moe_experts=1, moe_top_k=1))
    state = {}
    for name, value in dense.state_dict().items():  # blocks.i.feed_forward.w_1 → blocks.i.feed_forward.experts.0.w_1
        state[name.replace(".feed_forward.", ".feed_forward.experts.0.")] = value
    state.update({k: v for k, v in moe.state_dict().items() if ".router." in k})
    moe.load_state_dict(state)
    tokens = torch.randint(1, 30, (2, 9))
    torch.testing.assert_close(moe(tokens), dense(tokens), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("capacity_factor", [None, 0.75, 1.25])
@pytest.mark.parametrize("shared", [0, 2])
def test_sorted_dispatch_equals_a_loop_over_experts_forward_and_backward(capacity_factor, shared):
    moe = _layer(seed=2, capacity_factor=capacity_factor, n_shared_experts=shared, activation="swiglu")
    moe.train()
    x = torch.randn(4, 6, 8, requires_grad=True)
    y = moe(x)
    g = torch.randn_like(y)
    grads = torch.autograd.grad(y, [x, *moe.parameters()], g, allow_unused=True)
    x2 = x.detach().clone().requires_grad_(True)
    ref = moe_loop(moe, x2)
    ref_grads = torch.autograd.grad(ref, [x2, *moe.parameters()], g, allow_unused=True)
    torch.testing.assert_close(y, ref, rtol=1e-6, atol=1e-6)
    for a, b in zip(grads, ref_grads):
        if a is None or b is None:
            assert a is None and b is None
        else:
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    if capacity_factor == 0.75:
        assert moe.last.dropped > 0  # 容量小于均匀份额：一定有任务被丢
    if shared:
        assert moe.shared.w_1.out_features == shared * 12


def test_gradcheck_float64_through_router_experts_and_auxiliary_losses():
    moe = _layer(seed=3, d_model=4, d_ff=5, n_experts=3, top_k=2, capacity_factor=0.5, activation="swiglu").double()
    moe.train()
    names, params = zip(*moe.named_parameters())
    x = torch.randn(5, 4, dtype=torch.float64, requires_grad=True)

    def f(x, *ps):
        y = functional_call(moe, dict(zip(names, ps)), (x,))
        return y, moe.last.aux_loss, moe.last.z_loss

    inputs = (x, *[p.detach().clone().requires_grad_(True) for p in params])
    assert torch.autograd.gradcheck(f, inputs, eps=1e-6, atol=1e-5)
    assert moe.last.dropped >= 4  # 10 份任务、3 个专家各只收 ⌈0.5·10/3⌉ = 2 份：丢弃的路径也查过了


def test_matches_transformers_mixtral_block_and_its_balancing_loss():
    pytest.importorskip("transformers")
    from transformers import MixtralConfig
    from transformers.models.mixtral.modeling_mixtral import MixtralSparseMoeBlock, load_balancing_loss_func

    config = MixtralConfig(hidden_size=16, intermediate_size=24, num_local_experts=4, num_experts_per_tok=2)
    theirs = MixtralSparseMoeBlock(config).eval()
    ours = _layer(seed=4, d_model=16, d_ff=24, n_experts=4, top_k=2, activation="swiglu", bias=False).eval()
    with torch.no_grad():
        theirs.gate.weight.copy_(ours.router.gate.weight)
        for e, expert in enumerate(ours.experts):  # Mixtral：gate_up_proj = [W_1; W_3]（先门后上），down_proj = W_2
            theirs.experts.gate_up_proj[e].copy_(torch.cat([expert.w_1.weight, expert.w_3.weight]))
            theirs.experts.down_proj[e].copy_(expert.w_2.weight)
    x = torch.randn(2, 7, 16)
    with torch.no_grad():
        torch.testing.assert_close(ours(x), theirs(x), rtol=1e-5, atol=1e-6)
        logits = ours.router.gate(x.reshape(-1, 16))
    hf = load_balancing_loss_func((logits,), 4, 2)
    torch.testing.assert_close(ours.last.aux_loss * 2, hf)  # HF 的 f_e 除以 N 而不是 N·k：k 倍


def test_router_renormalize_and_probabilities():
    torch.manual_seed(5)
    x = torch.randn(10, 8)
    for renormalize in (True, False):
        router = TopKRouter(8, 5, 2, renormalize=renormalize)
        r = router(x)
        probs = torch.softmax(x @ router.gate.weight.t(), dim=-1)
        torch.testing.assert_close(r.probs, probs)
        top, idx = probs.topk(2, dim=-1)
        assert torch.equal(r.experts, idx)
        expected = top / top.sum(-1, keepdim=True) if renormalize else top
        torch.testing.assert_close(r.weights, expected)
    # 重新归一 = 只对 top-k 的 logits 做 softmax（Mixtral 的写法）
    r = TopKRouter(8, 5, 3)(x)
    torch.testing.assert_close(r.weights, torch.softmax(r.logits.gather(1, r.experts), dim=-1))


def _routing(experts, probs):
    probs = torch.as_tensor(probs, dtype=torch.float32)
    experts = torch.as_tensor(experts)
    return Routing(probs.log(), probs, experts, probs.gather(1, experts))


def test_balancing_loss_is_one_when_uniform_and_e_when_collapsed():
    n_experts = 4
    uniform = _routing([[0], [1], [2], [3]], torch.full((4, 4), 0.25))
    torch.testing.assert_close(load_balancing_loss(uniform), torch.tensor(1.0))
    collapsed = _routing([[0]] * 4, [[1.0, 0, 0, 0]] * 4)
    torch.testing.assert_close(load_balancing_loss(collapsed), torch.tensor(float(n_experts)))
    # 一般情形：E · Σ f_e P_e 逐项算
    torch.manual_seed(6)
    r = TopKRouter(8, 4, 2)(torch.randn(9, 8))
    f = torch.stack([(r.experts == e).float().mean() for e in range(4)])
    torch.testing.assert_close(load_balancing_loss(r), 4 * (f * r.probs.mean(0)).sum())
    # z 损失：logsumexp 的平方的平均；logits 整体平移 c 改变它、不改变路由
    z = router_z_loss(r)
    torch.testing.assert_close(z, torch.logsumexp(r.logits, -1).square().mean())
    shifted = Routing(r.logits + 3, r.probs, r.experts, r.weights)
    assert float(router_z_loss(shifted).detach()) > float(z.detach())


def test_capacity_formula_and_first_choices_first():
    assert expert_capacity(12, 4, 2, 1.0) == 6
    assert expert_capacity(12, 4, 2, 1.25) == 8  # ⌈7.5⌉
    assert expert_capacity(10, 3, 2, 1.0) == 7  # ⌈6.67⌉
    assert expert_capacity(0, 3, 2, 1.0) == 0
    # 浮点的尾差不能多算一格：1.1 · 200 · 2 / 8 在浮点里是 55.000000000000007
    assert (expert_capacity(200, 8, 2, 1.1), expert_capacity(100, 4, 2, 1.1), expert_capacity(200, 4, 1, 2.2)) == (55, 55, 110)
    # 3 个词元、容量 2：专家 0 先收词元 0、1 的第一选择，词元 2 的第一选择排第三，被丢；
    # 第二选择排在所有第一选择之后：专家 1 收词元 0、2，专家 2 收词元 1
    experts = torch.tensor([[0, 1], [0, 2], [0, 1]])
    keep = within_capacity(experts, 3, 2)
    assert keep.tolist() == [[True, True], [True, True], [False, True]]
    # 第二选择不会挤掉第一选择：专家 1 的容量 1 给了词元 2 的第一选择，而不是排在前面的词元 0 的第二选择
    keep = within_capacity(torch.tensor([[0, 1], [2, 0], [1, 2]]), 3, 1)
    assert keep.tolist() == [[True, False], [True, False], [True, False]]


def test_drop_rate_falls_with_capacity_and_eval_never_drops():
    torch.manual_seed(7)
    x = torch.randn(64, 8)
    rates = []
    for cf in (0.5, 1.0, 2.0, 4.0):
        moe = _layer(seed=7, capacity_factor=cf).train()
        moe(x)
        rates.append(moe.last.drop_rate)
        plan = plan_dispatch(*moe.route(x))
        assert max(plan.counts) <= expert_capacity(64, 4, 2, cf)
        assert sum(plan.counts) + plan.dropped == 128
    assert rates == sorted(rates, reverse=True) and rates[0] > rates[-1]
    assert rates[-1] == 0.0  # 容量 = 全部任务：不可能再丢
    moe.capacity_factor = 0.5
    moe.eval()
    moe(x)
    assert moe.last.dropped == 0


def _moe_lm(seed=8, **kw):
    torch.manual_seed(seed)
    config = dict(vocab_size=40, d_model=16, n_heads=2, n_layers=2, d_ff=16, max_len=24, activation="swiglu",
                  moe_experts=4, moe_top_k=2, moe_capacity_factor=1.0)
    config.update(kw)
    return make_lm(LMConfig(**config))


def test_kv_cache_decoding_equals_the_full_forward():
    model = _moe_lm().eval()
    tokens = torch.randint(1, 40, (3, 12))
    with torch.no_grad():
        full = model(tokens)  # (B, T, V)
        cache = model.new_cache()
        steps = [model(tokens[:, :5], cache=cache)]
        for t in range(5, 12):
            steps.append(model(tokens[:, t : t + 1], cache=cache))
    torch.testing.assert_close(torch.cat(steps, dim=1), full, rtol=1e-5, atol=1e-5)


def test_trainer_adds_the_routing_loss_and_logs_the_cross_entropy():
    model = _moe_lm(moe_aux_weight=0.1, moe_z_weight=0.01)
    blocks = torch.randint(1, 40, (8, 13))
    trainer = LMTrainer(model, blocks, batch_size=4, lr=1e-3, warmup=1, total_steps=5, clip=None)
    batch = trainer.batch(0)
    before = copy.deepcopy(model).train()
    inputs, targets = loss_targets(batch)  # BOS 目标不计损失
    logits = before(inputs)
    ce = torch.nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten(), ignore_index=PAD)
    layers = before.moe_layers()
    assert len(layers) == 2
    routing = sum(0.1 * m.last.aux_loss + 0.01 * m.last.z_loss for m in layers)
    torch.testing.assert_close(before.moe_loss(), routing)
    (ce + routing).backward()
    value = trainer.train_step()
    assert value == pytest.approx(float(ce.detach()), rel=1e-6)  # 日志只记交叉熵
    for (name, p), q in zip(model.named_parameters(), before.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-5, atol=1e-7, msg=name)
    router = model.blocks[0].feed_forward.router.gate.weight.grad
    assert router.abs().sum() > 0


def test_dense_model_has_no_routing_loss():
    torch.manual_seed(9)
    model = make_lm(LMConfig(vocab_size=20, d_model=8, n_heads=2, n_layers=1, d_ff=8, max_len=8))
    model(torch.randint(1, 20, (1, 4)))
    assert model.moe_layers() == [] and float(model.moe_loss()) == 0.0


@pytest.mark.parametrize("field,value,error", [
    ("moe_experts", -1, ValueError), ("moe_experts", True, ValueError), ("moe_top_k", 0, ValueError),
    ("moe_top_k", 5, ValueError), ("moe_capacity_factor", 0.0, ValueError),
    ("moe_capacity_factor", float("inf"), ValueError), ("moe_shared_experts", 1.5, ValueError),
    ("moe_aux_weight", -0.1, ValueError), ("moe_z_weight", float("nan"), ValueError),
    ("moe_renormalize", 1, TypeError),
])
def test_config_names_the_bad_moe_field(field, value, error):
    with pytest.raises(error, match=field):
        LMConfig(vocab_size=20, **{"moe_experts": 4, field: value})


def test_layer_and_helpers_name_bad_arguments():
    with pytest.raises(ValueError, match="top_k=3 不能大于专家数 n_experts=2"):
        MoEFeedForward(8, 8, 2, 3)
    with pytest.raises(ValueError, match="capacity_factor"):
        MoEFeedForward(8, 8, 2, 1, capacity_factor=-1.0)
    with pytest.raises(ValueError, match="n_shared_experts"):
        MoEFeedForward(8, 8, 2, 1, n_shared_experts=-1)
    with pytest.raises(ValueError, match="activation"):
        MoEFeedForward(8, 8, 2, 1, activation="tanh")
    with pytest.raises(ValueError, match="capacity"):
        within_capacity(torch.zeros(2, 1, dtype=torch.long), 2, -1)
    with pytest.raises(ValueError, match="n_tokens"):
        expert_capacity(-1, 2, 1, 1.0)
    with pytest.raises(TypeError, match="routing"):
        load_balancing_loss(torch.zeros(2, 2))
    with pytest.raises(ValueError, match="keep"):
        r = TopKRouter(8, 2, 1)(torch.randn(3, 8))
        plan_dispatch(r, torch.ones(3, 2, dtype=torch.bool))
    with pytest.raises(ValueError, match=r"x 应是 2 维张量 \(N, d_model\)"):
        TopKRouter(8, 2, 1)(torch.randn(3))
    moe = MoEFeedForward(8, 8, 2, 1)
    with pytest.raises(TypeError, match="x 的 dtype 是 torch.float64"):
        moe(torch.randn(2, 3, 8, dtype=torch.float64))
    with pytest.raises(ValueError, match="x 的最后一维是 6，但这个混合专家层的 d_model=8"):
        moe(torch.randn(2, 3, 6))
    with pytest.raises(ValueError, match=r"experts 的编号应在 \[0, 1\] 内"):
        within_capacity(torch.tensor([[0], [2]]), 2, 1)
    with pytest.raises(ValueError, match="experts 应是整数的"):
        within_capacity(torch.zeros(3), 2, 1)
    r = TopKRouter(8, 2, 1)(torch.randn(3, 8))
    plan = plan_dispatch(r)
    with pytest.raises(ValueError, match="x 应是 \\(N=3, d\\)"):
        dispatch(torch.randn(4, 8), plan)
    with pytest.raises(ValueError, match="y 应是 \\(M=3, d\\)"):
        combine(torch.randn(2, 8), plan)


def test_save_hf_refuses_an_moe_model(tmp_path):
    from tformer_lib.lm import save_hf
    from tformer_lib.lm.hf_weights import UnsupportedHFConfig

    with pytest.raises(UnsupportedHFConfig, match="moe_experts=4"):
        save_hf(_moe_lm(positional="rope", norm="rms", qkv_bias=False, out_bias=False, ffn_bias=False), tmp_path / "m")
