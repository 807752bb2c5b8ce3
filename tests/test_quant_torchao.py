"""与 torchao 交叉核对：我们的逐通道 int8 与 ``Int8WeightOnlyConfig``（经 ``torchao.quantization.quantize_``），
我们的分组 int4 与 torchao 的量化原语（``choose_qparams_affine`` + ``quantize_affine``，对称、[−8, 7]）。

结论（测试逐条核对）：
1. float32 权重：比例因子逐位相同（都是 max|w| / 127.5、float32、下限 float32 的 eps）；整数权重只在一处不同——
   我们按公式算 ``round(w / s)``，torchao 算 ``round(w * (1 / s))``，w/s 恰在半步附近时两者可能差一个台阶。
   这些位置可以事先算出来，在那里恰好差 1，其余位置（以及反量化值）逐位相同。
2. bfloat16 权重：torchao 在权重自己的 dtype 里算 max|w| / 127.5（比例因子先被舍入到 bf16 的 8 位有效数字，
   再存成 float32），我们在 float32 里算。把 torchao 的比例因子代进我们的公式，整数权重又只差第 1 条那些位置。
3. int4：torchao 0.18 的 ``Int4WeightOnlyConfig`` 在这台 CPU 上跑不起来（默认格式要 mslk 库，其余格式要 CUDA），
   所以 int4 只与它的原语比；结论同第 1 条。torchao 的 int4 配置默认是非对称（带零点）的，与我们的对称格式本就不同。
"""

import copy

import pytest
import torch
from torch import nn

from tformer_lib.quant import Int8Linear, quantize_groupwise
from tformer_lib.quant.torchao_twin import reciprocal_rounding_differs, torchao_int8_weight_only

torchao = pytest.importorskip("torchao")


def _reciprocal_differs(w: torch.Tensor, scale: torch.Tensor, q_min: int, q_max: int) -> torch.Tensor:
    """``round(w / s)`` 与 ``round(w * (1 / s))`` 截断后不同的位置（库里的 :func:`reciprocal_rounding_differs`）。"""
    return reciprocal_rounding_differs(w, scale, {-128: 8, -8: 4}[q_min])


def _torchao_int8(linear: nn.Linear):
    from torchao.quantization import Int8WeightOnlyConfig, quantize_

    theirs = copy.deepcopy(linear)
    quantize_(theirs, Int8WeightOnlyConfig())
    return theirs


def test_int8_float32_matches_torchao_except_where_division_and_reciprocal_round_apart():
    torch.manual_seed(0)
    linear = nn.Linear(512, 384)
    theirs = _torchao_int8(linear)
    t = theirs.weight
    ours = Int8Linear.from_linear(linear)
    assert t.scale.dtype == torch.float32 and torch.equal(ours.scale, t.scale.flatten())
    assert t.zero_point is None or not bool(t.zero_point.any())  # 对称：零点为 0
    differs = _reciprocal_differs(linear.weight.detach(), ours.scale[:, None], -128, 127)
    assert 0 < int(differs.sum()) < 1e-3 * differs.numel()  # 这个种子下确实出现了，但极少
    assert torch.equal(ours.weight != t.qdata, differs)
    assert bool(((ours.weight.int() - t.qdata.int())[differs].abs() == 1).all())
    same = ~differs
    assert torch.equal(ours.dequantized_weight()[same], t.dequantize()[same])
    x = torch.randn(4, 512)
    step = float(ours.scale.max()) * float(x.abs().sum(1).max())  # 差一个台阶最多改变输出这么多
    with torch.no_grad():
        assert float((ours(x) - theirs(x)).abs().max()) <= step


def test_int8_bfloat16_scale_is_rounded_to_bf16_in_torchao():
    torch.manual_seed(1)
    linear = nn.Linear(256, 96).to(torch.bfloat16)
    t = _torchao_int8(linear).weight
    ours = Int8Linear.from_linear(linear)
    w = linear.weight.detach()
    eps = torch.finfo(torch.float32).eps
    torchao_rule = (w.abs().amax(1) / 127.5).float().clamp(min=eps)  # 在 bf16 里相除，再放宽成 float32
    assert torch.equal(t.scale.flatten(), torchao_rule)
    assert torch.equal(ours.scale, (w.float().abs().amax(1) / 127.5).clamp(min=eps))  # 我们：在 float32 里相除
    assert not torch.equal(ours.scale, t.scale.flatten())
    # 用 torchao 的比例因子代进我们的公式：只剩“除法 vs 乘倒数”那几处
    q = torch.round(w.float() / t.scale).clamp(-128, 127).to(torch.int8)
    assert torch.equal(q != t.qdata, _reciprocal_differs(w, t.scale, -128, 127))


@pytest.mark.parametrize("group", [32, 64, 128])
def test_int4_matches_torchao_primitives_except_where_division_and_reciprocal_round_apart(group):
    from torchao.quantization.quant_primitives import MappingType, choose_qparams_affine, quantize_affine

    torch.manual_seed(group)
    w = torch.randn(64, 512)
    scale, zero = choose_qparams_affine(w, MappingType.SYMMETRIC, [1, group], torch.int8, quant_min=-8, quant_max=7,
                                        eps=torch.finfo(torch.float32).eps, scale_dtype=torch.float32)
    theirs = quantize_affine(w, [1, group], scale, zero, torch.int8, quant_min=-8, quant_max=7)
    q, ours_scale = quantize_groupwise(w, 4, group)
    assert torch.equal(ours_scale, scale.reshape(64, 512 // group)) and not bool(zero.any())
    expanded = ours_scale.repeat_interleave(group, dim=1)  # (out, in)：每个元素所在组的比例因子
    differs = _reciprocal_differs(w, expanded, -8, 7)
    assert torch.equal(q != theirs, differs)
    assert bool(((q.int() - theirs.int())[differs].abs() == 1).all())


def test_torchao_twin_returns_torchao_int8_tensors_and_leaves_the_layer_alone():
    torch.manual_seed(2)
    linear = nn.Linear(64, 48)
    before = linear.weight.detach().clone()
    q, scale = torchao_int8_weight_only(linear)
    t = _torchao_int8(linear).weight
    assert q.dtype == torch.int8 and torch.equal(q, t.qdata)
    assert scale.shape == (48,) and torch.equal(scale, t.scale.flatten())
    assert torch.equal(linear.weight, before) and type(linear.weight) is nn.Parameter
    with pytest.raises(TypeError, match="linear 应是 nn.Linear"):
        torchao_int8_weight_only(nn.Conv1d(2, 2, 1))
    w, s = torch.tensor([[0.5, 1.5, 2.5]]), torch.tensor([[1.0]])
    assert not reciprocal_rounding_differs(w, s).any()  # 除以 1 与乘 1 相同
