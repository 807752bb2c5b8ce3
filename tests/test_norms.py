"""RMSNorm 与 torch.nn.RMSNorm 逐元素相等；ResidualNorm 可选 RMSNorm；坏参数报中文错误。"""

import warnings

import pytest
import torch
from torch import nn

from tformer_lib import ResidualNorm
from tformer_lib.parts.norms import RMSNorm, make_norm


@pytest.mark.parametrize("shape", [(3, 16), (2, 5, 8), (1, 1, 4, 32)])
@pytest.mark.parametrize("eps", [1e-5, 1e-6])
def test_rmsnorm_equals_torch(shape, eps):
    d = shape[-1]
    ours, theirs = RMSNorm(d, eps=eps), nn.RMSNorm(d, eps=eps)
    with torch.no_grad():
        w = torch.randn(d)
        ours.weight.copy_(w)
        theirs.weight.copy_(w)
    x = torch.randn(*shape) * 3 + 1
    torch.testing.assert_close(ours(x), theirs(x), rtol=1e-6, atol=1e-6)
    # 梯度也相同
    x1, x2 = x.clone().requires_grad_(), x.clone().requires_grad_()
    ours(x1).square().sum().backward()
    theirs(x2).square().sum().backward()
    torch.testing.assert_close(x1.grad, x2.grad, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(ours.weight.grad, theirs.weight.grad, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float16, torch.bfloat16])
def test_rmsnorm_dtypes_follow_torch(dtype):
    """fp32 权重、其他 dtype 的输入：输出 dtype 与 torch.nn.RMSNorm 相同；float64 不被降到 float32 算。"""
    ours, theirs = RMSNorm(8), nn.RMSNorm(8, eps=1e-5)
    with torch.no_grad():
        w = torch.randn(8)
        ours.weight.copy_(w)
        theirs.weight.copy_(w)
    x = (torch.randn(4, 8, dtype=torch.float64) * 3).to(dtype)
    y = ours(x)
    assert y.dtype == dtype
    exact = x.double() * torch.rsqrt(x.double().pow(2).mean(-1, keepdim=True) + 1e-5) * w.double()
    tol = {torch.float64: 1e-12, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}[dtype]
    torch.testing.assert_close(y.double(), exact, rtol=tol, atol=tol)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch 对 dtype 不一致的输入会提示不能走融合实现
        torch.testing.assert_close(y, theirs(x).to(dtype), rtol=tol, atol=tol)


def test_rmsnorm_has_unit_rms_and_no_bias():
    norm = RMSNorm(64)
    y = norm(torch.randn(10, 64) * 7 + 3)
    torch.testing.assert_close(y.pow(2).mean(-1), torch.ones(10), rtol=1e-4, atol=1e-4)
    assert [n for n, _ in norm.named_parameters()] == ["weight"]


def test_make_norm_and_residual_norm():
    assert isinstance(make_norm("layer", 8), nn.LayerNorm)
    assert isinstance(make_norm("rms", 8), RMSNorm)
    assert isinstance(ResidualNorm(8).norm, nn.LayerNorm)  # 默认不变：编码器–解码器的检查点照旧能读
    assert isinstance(ResidualNorm(8, norm="rms").norm, RMSNorm)


@pytest.mark.parametrize(
    "call, exc, word",
    [
        (lambda: make_norm("batch", 8), ValueError, "norm"),
        (lambda: RMSNorm(0), ValueError, "d_model"),
        (lambda: RMSNorm(8, eps=0.0), ValueError, "eps"),
        (lambda: RMSNorm(8)(torch.zeros(2, 7)), ValueError, "d_model=8"),
    ],
)
def test_bad_arguments(call, exc, word):
    with pytest.raises(exc, match=word):
        call()
