"""输出层与交叉熵融合（linear_cross_entropy）：损失与两个梯度等于 F.cross_entropy，不需要梯度时不算梯度；
DecoderOnlyLM.hidden_states 与 forward 逐位一致；LMTrainer(fused_loss=True) 的损失与默认做法相同。"""

import pytest
import torch
import torch.nn.functional as F

from tformer_lib import PAD
from tformer_lib.lm import LMConfig, LMTrainer, linear_cross_entropy, make_lm
from tformer_lib.lm.data import pack_documents

from test_lm_training import synthetic_docs  # 语言模型训练测试的那份可学的词元流

N, D, V = 23, 16, 40


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    """相对误差 ‖a − b‖ / ‖b‖。"""
    return float((a - b).norm() / b.norm())


def data(ignore_index=PAD, seed=0):
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(N, D, generator=g, requires_grad=True)
    weight = (torch.randn(V, D, generator=g) / 2).requires_grad_()
    targets = torch.randint(1, V, (N,), generator=g)
    targets[::4] = ignore_index  # 每四个忽略一个
    return hidden, weight, targets


@pytest.mark.parametrize("reduction", ["mean", "sum"])
@pytest.mark.parametrize("chunk_size", [1, 7, N, N + 10])
@pytest.mark.parametrize("ignore_index", [PAD, -100])
def test_matches_cross_entropy(reduction, chunk_size, ignore_index):
    hidden, weight, targets = data(ignore_index)
    ref = F.cross_entropy(hidden @ weight.T, targets, ignore_index=ignore_index, reduction=reduction)
    ref_grads = torch.autograd.grad(ref * 3.5, (hidden, weight))  # grad_output = 3.5，不是 1
    loss = linear_cross_entropy(hidden, weight, targets, ignore_index=ignore_index, reduction=reduction,
                                chunk_size=chunk_size)
    grads = torch.autograd.grad(loss * 3.5, (hidden, weight))
    assert loss.dtype == torch.float32 and loss.shape == ()
    assert abs(loss.item() - ref.item()) <= 1e-6 * abs(ref.item())
    for got, want in zip(grads, ref_grads):
        assert rel(got, want) < 1e-6
    assert grads[0][::4].abs().max() == 0  # 被忽略的位置没有梯度


def test_float64_inputs_get_float64_gradients():
    hidden, weight, targets = data()
    hidden64, weight64 = (hidden.detach().double().requires_grad_(), weight.detach().double().requires_grad_())
    loss = linear_cross_entropy(hidden64, weight64, targets, chunk_size=5)
    loss.backward()
    assert hidden64.grad.dtype == weight64.grad.dtype == torch.float64
    ref = F.cross_entropy(hidden64 @ weight64.T, targets, ignore_index=PAD)  # logits 在 float32 里算：误差在 float32 的量级
    assert abs(loss.item() - ref.item()) < 1e-5


def test_tied_weights_accumulate_both_gradients():
    """输出层与词嵌入共享权重：融合损失的梯度与查表的梯度都加到同一个 .grad 上。"""
    torch.manual_seed(1)
    tokens, targets = torch.randint(0, V, (N,)), torch.randint(0, V, (N,))
    grads, head_only = [], None
    for fused in (False, True):
        torch.manual_seed(2)  # 两次同样的参数
        emb, proj = torch.nn.Embedding(V, D), torch.nn.Linear(D, D)
        hidden = torch.tanh(proj(emb(tokens)))  # (N, D)
        if fused:
            loss = linear_cross_entropy(hidden, emb.weight, targets, chunk_size=6)
            head_only = torch.autograd.grad(linear_cross_entropy(hidden.detach(), emb.weight, targets), emb.weight)[0]
        else:
            loss = F.cross_entropy(hidden @ emb.weight.T, targets, ignore_index=PAD)
        loss.backward()
        grads.append((emb.weight.grad, proj.weight.grad))
    for got, want in zip(grads[1], grads[0]):
        assert rel(got, want) < 1e-6
    assert rel(grads[1][0], head_only) > 1e-2  # 共享的梯度确实是输出层与嵌入两条路加起来的


def _matmuls(fn) -> dict:
    """``fn()`` 里 ``aten::mm`` 与 ``aten::addmm_`` 各调用了几次。"""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        fn()
    counts = {e.key: e.count for e in prof.key_averages()}
    return {k: counts.get(k, 0) for k in ("aten::mm", "aten::addmm_")}


def test_no_gradient_work_without_grad():
    hidden, weight, targets = data()
    ref = linear_cross_entropy(hidden, weight, targets, chunk_size=8)  # 3 块
    with torch.no_grad():
        out = linear_cross_entropy(hidden, weight, targets, chunk_size=8)
        assert _matmuls(lambda: linear_cross_entropy(hidden, weight, targets, chunk_size=8)) == \
            {"aten::mm": 3, "aten::addmm_": 0}  # 每块只算 logits
    assert torch.equal(out, ref.detach()) and out.grad_fn is None and not out.requires_grad
    assert _matmuls(lambda: linear_cross_entropy(hidden, weight, targets, chunk_size=8)) == \
        {"aten::mm": 6, "aten::addmm_": 3}  # logits、∂hidden、∂weight
    frozen = hidden.detach()  # 特征不要梯度：只算 ∂weight
    assert _matmuls(lambda: linear_cross_entropy(frozen, weight, targets, chunk_size=8)) == \
        {"aten::mm": 3, "aten::addmm_": 3}
    loss = linear_cross_entropy(frozen, weight, targets, chunk_size=8)
    (grad_weight,) = torch.autograd.grad(loss, (weight,))
    ref_grad = torch.autograd.grad(F.cross_entropy(frozen @ weight.T, targets, ignore_index=PAD), (weight,))[0]
    assert rel(grad_weight, ref_grad) < 1e-6
    both_frozen = linear_cross_entropy(frozen, weight.detach(), targets, chunk_size=8)
    assert not both_frozen.requires_grad and torch.equal(both_frozen, out)


@pytest.mark.parametrize("reduction", ["mean", "sum"])
@pytest.mark.parametrize("n", [N, 0])
def test_all_ignored_matches_pytorch(reduction, n):
    """一个目标也没有：mean 与 F.cross_entropy 一样是 NaN（0/0），梯度是 0；sum 是 0。"""
    hidden, weight, _ = data()
    hidden = hidden.detach()[:n].requires_grad_()
    targets = torch.full((n,), PAD)
    ref = F.cross_entropy(hidden @ weight.T, targets, ignore_index=PAD, reduction=reduction)
    ref_grads = torch.autograd.grad(ref, (hidden, weight))
    loss = linear_cross_entropy(hidden, weight, targets, reduction=reduction, chunk_size=5)
    grads = torch.autograd.grad(loss, (hidden, weight))
    assert torch.equal(loss, ref) if reduction == "sum" else (loss.isnan() and ref.isnan())
    for got, want in zip(grads, ref_grads):
        assert torch.equal(got, want) and not got.isnan().any()


@pytest.mark.parametrize("change, error, pattern", [
    ({"hidden": torch.zeros(2, N, D)}, ValueError, r"hidden 应是 2 维张量 \(N, d\)，收到形状 \(2, 23, 16\)"),
    ({"hidden": torch.zeros(N, D, dtype=torch.long)}, TypeError, r"hidden 应是浮点张量，收到 dtype torch.int64"),
    ({"weight": torch.zeros(V)}, ValueError, r"weight 应是 2 维张量 \(V, d\)"),
    ({"weight": torch.zeros(V, D + 1)}, ValueError, r"weight 的形状 \(40, 17\).*d=16"),
    ({"weight": torch.zeros(0, D)}, ValueError, r"weight 的形状 \(0, 16\) 应为 \(V, d\)、V ≥ 1"),
    ({"hidden": [[0.0]]}, TypeError, r"hidden 应是形状为 \(N, d\) 的 torch.Tensor，收到 list"),
    ({"targets": torch.zeros(N, 1, dtype=torch.long)}, ValueError, r"targets 应是 1 维张量 \(N,\)"),
    ({"targets": torch.zeros(N, dtype=torch.int32)}, TypeError, r"targets 应是 torch.long.*收到 dtype torch.int32"),
    ({"targets": torch.zeros(N - 1, dtype=torch.long)}, ValueError, r"targets 的长度 22 应与 hidden 的行数 N=23 相同"),
    ({"targets": torch.full((N,), V)}, ValueError, r"targets 中不被忽略的 id 落在 \[40, 40\]，超出了词表范围 \[0, 39\]"),
    ({"targets": torch.full((N,), -3)}, ValueError, r"targets 中不被忽略的 id 落在 \[-3, -3\]"),
    ({"weight": torch.zeros(V, D, device="meta")}, ValueError, r"weight 在 meta 上，hidden 在 cpu 上"),
    ({"targets": torch.zeros(N, dtype=torch.long, device="meta")}, ValueError, r"targets 在 meta 上"),
    ({"reduction": "none"}, ValueError, r"reduction 应是 'mean'、'sum' 之一，收到 'none'"),
    ({"chunk_size": 0}, ValueError, r"chunk_size 应是正整数，收到 0"),
    ({"chunk_size": 2.5}, TypeError, r"chunk_size 应是整数，收到 float 2.5"),
    ({"ignore_index": "0"}, TypeError, r"ignore_index 应是整数，收到 str '0'"),
])
def test_bad_inputs_name_the_argument(change, error, pattern):
    hidden, weight, targets = data()
    kwargs = {"hidden": hidden, "weight": weight, "targets": targets, **change}
    with pytest.raises(error, match=pattern):
        linear_cross_entropy(kwargs.pop("hidden"), kwargs.pop("weight"), kwargs.pop("targets"), **kwargs)


def tiny_lm(seed=0, **overrides):
    torch.manual_seed(seed)
    return make_lm(LMConfig(24, **{"d_model": 32, "n_heads": 4, "n_layers": 2, "d_ff": 64, "max_len": 32,
                                   "dropout": 0.0, **overrides}))


@pytest.mark.parametrize("overrides", [{}, {"positional": "rope", "norm": "rms", "tie_embeddings": False}])
def test_hidden_states_then_lm_head_is_forward_bit_for_bit(overrides):
    model = tiny_lm(**overrides).eval()
    tokens = torch.randint(1, 24, (3, 9))
    hidden = model.hidden_states(tokens)
    assert hidden.shape == (3, 9, 32)
    assert torch.equal(model.lm_head(hidden), model(tokens))
    caches = model.new_cache(), model.new_cache()
    for piece in (tokens[:, :5], tokens[:, 5:6], tokens[:, 6:]):  # 提示，再一个一个、一段一段接着算
        logits = model(piece, cache=caches[0])
        assert torch.equal(model.lm_head(model.hidden_states(piece, cache=caches[1])), logits)
    assert caches[0].length == caches[1].length == 9
    with pytest.raises(ValueError, match="tokens 应是 2 维张量"):
        model.hidden_states(tokens[0])  # 与 forward 同样的参数检查


def _losses(model, steps=4, **kwargs):
    blocks = pack_documents(synthetic_docs(40), 17)
    trainer = LMTrainer(model, blocks, None, **{"batch_size": 4, "warmup": 1, "total_steps": 10, "progress": False,
                                                 "lr": 1e-2, **kwargs})
    trainer.fit(steps)
    return trainer


@pytest.mark.parametrize("model_overrides, kwargs", [
    ({}, {}),
    ({}, {"document_mask": True}),
    ({}, {"accumulation_steps": 2}),
    ({"tie_embeddings": False}, {}),
    ({"moe_experts": 4, "moe_top_k": 2}, {}),
])
def test_trainer_fused_loss_matches_default(model_overrides, kwargs):
    plain = _losses(tiny_lm(**model_overrides), **kwargs)
    fused = _losses(tiny_lm(**model_overrides), fused_loss=True, **kwargs)
    assert fused.fused_loss and not plain.fused_loss
    assert len(fused.history["step_loss"]) == 4
    for a, b in zip(fused.history["step_loss"], plain.history["step_loss"]):
        assert abs(a - b) < 1e-5
    assert fused.history["step_loss"][-1] < fused.history["step_loss"][0] - 0.1  # 真的在学
    for (name, a), b in zip(fused.model.state_dict().items(), plain.model.state_dict().values()):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-4, msg=name)


def test_trainer_fused_loss_under_bf16_autocast():
    """autocast 下默认做法的输出层在 bf16 里算，融合的在 float32 里：两者只差 bf16 的舍入。"""
    plain = _losses(tiny_lm(), steps=2, autocast="bf16")
    fused = _losses(tiny_lm(), steps=2, autocast="bf16", fused_loss=True)
    reference = _losses(tiny_lm(), steps=2)
    for a, b, c in zip(fused.history["step_loss"], plain.history["step_loss"], reference.history["step_loss"]):
        assert abs(a - b) < 2e-2 and abs(a - c) < 2e-2


def test_trainer_fused_loss_refuses_a_wrapped_model(monkeypatch):
    class Wrapper(torch.nn.Module):  # 像 DDP 一样把模型放在 .module 里
        def __init__(self, module):
            super().__init__()
            self.module = module

    blocks = pack_documents(synthetic_docs(40), 17)
    with pytest.raises(TypeError, match="fused_loss 应是 True 或 False，收到 int 1"):
        LMTrainer(tiny_lm(), blocks, None, batch_size=4, progress=False, fused_loss=1)
    trainer = LMTrainer(tiny_lm(), blocks, None, batch_size=4, progress=False, fused_loss=True)
    trainer.model = Wrapper(trainer.model)  # DistributedLMTrainer 前向时就是这样换成 DDP 的
    with pytest.raises(ValueError, match="fused_loss=True 需要没有包装的模型"):
        trainer.train_step()

    import torch.distributed as dist
    from tformer_lib.parallel import DistributedLMTrainer

    monkeypatch.setattr(dist, "is_initialized", lambda: True)  # 装作有两个进程：在建 DDP 之前就拒绝
    monkeypatch.setattr(dist, "get_world_size", lambda *a: 2)
    monkeypatch.setattr(dist, "get_rank", lambda *a: 0)
    with pytest.raises(ValueError, match="fused_loss=True 需要没有包装的模型"):
        DistributedLMTrainer(tiny_lm(), blocks, None, batch_size=4, progress=False, fused_loss=True)


def test_trainer_fused_loss_refuses_an_output_layer_it_cannot_read():
    """融合的损失只读 lm_head.weight：带偏置、装了 LoRA 或量化的输出层都会被悄悄算错，所以一开始就拒绝。"""
    from tformer_lib.finetune import apply_lora

    blocks = pack_documents(synthetic_docs(40), 17)
    biased = tiny_lm(tie_embeddings=False)
    biased.lm_head = torch.nn.Linear(biased.config.d_model, biased.config.vocab_size)
    lora = apply_lora(tiny_lm(tie_embeddings=False), 2, 4.0, targets=("w_q", "lm_head"))
    for model in (biased, lora):
        with pytest.raises(ValueError, match="不带偏置的浮点 nn.Linear"):
            LMTrainer(model, blocks, None, batch_size=4, progress=False, fused_loss=True)
        LMTrainer(model, blocks, None, batch_size=4, progress=False)  # 默认做法照常


def test_an_ignored_row_with_nan_does_not_touch_the_loss():
    hidden, weight, targets = data()
    with torch.no_grad():
        hidden[0, 1] = float("nan")  # targets[0] 是 PAD：这一行不计
        hidden[4, 2] = float("inf")
    want = F.cross_entropy(hidden @ weight.T, targets, ignore_index=PAD)
    got = linear_cross_entropy(hidden, weight, targets)
    assert torch.isfinite(want) and abs(got.item() - want.item()) <= 1e-6 * abs(want.item())


@pytest.mark.parametrize("d, rows, chunks", [(16, 300, 3), (200, 300, 2), (200, 200, 1)])
def test_default_chunk_is_max_128_d(d, rows, chunks):
    """默认每块 max(128, d) 行：d = 16 时 300 行分 3 块（128 + 128 + 44），d = 200 时 200 行一块。"""
    g = torch.Generator().manual_seed(1)
    hidden = torch.randn(rows, d, generator=g)
    weight = torch.randn(V, d, generator=g)
    targets = torch.randint(1, V, (rows,), generator=g)
    with torch.no_grad():
        assert _matmuls(lambda: linear_cross_entropy(hidden, weight, targets)) == {"aten::mm": chunks, "aten::addmm_": 0}
        assert rel(linear_cross_entropy(hidden, weight, targets), F.cross_entropy(hidden @ weight.T, targets)) < 1e-6


def test_half_precision_gradients_survive_loss_scaling():
    """16 位输入、损失乘 2^16 再反向（GradScaler 的做法）：梯度与 float32 里算好再转 16 位的一样准，
    不会在乘上缩放因子之前就转成 16 位而下溢成 0。"""
    g = torch.Generator().manual_seed(2)
    hidden = torch.randn(512, 64, generator=g).half().requires_grad_()
    weight = (torch.randn(2000, 64, generator=g) * 0.005).half().requires_grad_()
    targets = torch.randint(1, 2000, (512,), generator=g)
    scale = 2.0 ** 16
    grads = torch.autograd.grad(linear_cross_entropy(hidden, weight, targets) * scale, (hidden, weight))
    h32, w32 = (x.detach().float().requires_grad_() for x in (hidden, weight))
    want = torch.autograd.grad(F.cross_entropy(h32 @ w32.T, targets) * scale, (h32, w32))  # float32 的参照
    for got, ref in zip(grads, want):
        assert got.dtype == torch.float16
        assert int((got == 0).sum()) == int((ref.half() == 0).sum())  # 没有多出下溢的 0
        assert rel(got.float(), ref) < 1e-3  # 只差最后一次舍入到 16 位
