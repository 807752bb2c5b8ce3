r"""只量化权重（weight-only）的线性层：权重存成整数，前向时当场反量化（dequantize on the fly）。

- :class:`Int8Linear`：逐输出通道（per-channel）的对称 int8——``W`` ``(out, in)`` 的每一行一个比例因子
  :math:`s_j`，:math:`\hat W_{j,:} = s_j\,q_{j,:}`。因为 :math:`s_j` 只属于输出 j，它可以提到矩阵乘法之外：
  :math:`y_j = s_j \sum_i x_i q_{j,i}`——先用整数权重（转成浮点）乘，再逐列乘比例因子（torchao 与 gpt-fast 都这样算）。
- :class:`Int4Linear`：分组（group-wise）的对称 int4——每行每 ``group_size``（32/64/128）个相邻输入共用一个比例因子，
  两个 4 位数装一个字节（:mod:`~tformer_lib.quant.int4_packing`）。比例因子随 i 变化，提不出去，所以前向先把整块
  权重反量化成浮点，再做普通的矩阵乘法。

偏置（bias）不量化，保持原来的浮点类型。两种层的权重都是 buffer，不求梯度；但梯度可以**穿过**它们流向输入
（QLoRA 在冻结的量化底座上训练 LoRA，第 17 章）：这时反向在当场重算反量化的权重，不为反向保存一份浮点权重。
在 CPU 的 eager 模式下它们比原来的 ``nn.Linear`` *慢*：每次前向都要先把整块权重转成浮点（多一遍读写），
之后的矩阵乘法与浮点版一样；省下的只是常驻内存。速度要等权重读取成为瓶颈、并且转换与乘法融合在一起时才出现
（``benchmarks/quant_gemv.py``）。
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .._checks import positive_int
from .affine import dequantize_groupwise, dequantize_symmetric, quantize_groupwise, quantize_symmetric
from .int4_packing import pack_int4, packed_length, unpack_int4

__all__ = ["Int8Linear", "Int4Linear", "INT4_GROUP_SIZES"]

INT4_GROUP_SIZES = (32, 64, 128)


def _check_linear(linear) -> nn.Linear:
    if not isinstance(linear, nn.Linear):
        raise TypeError(f"linear 应是 nn.Linear，收到 {type(linear).__name__}")
    return linear


def _copy_bias(linear: nn.Linear) -> nn.Parameter | None:
    return None if linear.bias is None else nn.Parameter(linear.bias.detach().clone(), requires_grad=False)


def _check_scale(scale, shape: tuple[int, ...]) -> None:
    """比例因子：浮点张量、形状 ``shape``、每个都是有限的正数（构造时查一次，前向里不再查）。"""
    if not isinstance(scale, torch.Tensor) or not scale.dtype.is_floating_point:
        raise TypeError(f"scale 应是浮点张量，收到 {getattr(scale, 'dtype', type(scale).__name__)}")
    if tuple(scale.shape) != shape:
        raise ValueError(f"scale 的形状应为 {shape}，收到 {tuple(scale.shape)}")
    if not bool((torch.isfinite(scale) & (scale > 0)).all()):
        raise ValueError("scale 的每个元素都应是有限的正数（对称量化的比例因子），收到了零、负数、NaN 或 inf")


def _bias(bias, out_features: int) -> nn.Parameter | None:
    """偏置注册成不求梯度的 Parameter（于是在 state_dict 里、随 .to() 移动）；形状必须是 (out,)。"""
    if bias is None:
        return None
    if not isinstance(bias, torch.Tensor) or not bias.dtype.is_floating_point:
        raise TypeError(f"bias 应是浮点张量或 None，收到 {getattr(bias, 'dtype', type(bias).__name__)}")
    if tuple(bias.shape) != (out_features,):
        raise ValueError(f"bias 的形状应为 ({out_features},)，收到 {tuple(bias.shape)}")
    return bias if isinstance(bias, nn.Parameter) else nn.Parameter(bias.detach(), requires_grad=False)


class _DequantizeAgainInBackward(torch.autograd.Function):
    """量化层的前向；反向时**重新**反量化权重求 ∂L/∂x = grad · Ŵ，而不是让 autograd 把反量化出来的浮点权重存下来。

    直接在要求梯度的输入上调用 ``F.linear(x, Ŵ)`` 时，autograd 为每一层存一份 ``(out, in)`` 的浮点权重——
    正是量化想省掉的那份内存；QLoRA（bitsandbytes）同样在反向里重算。这里除了对层本身的引用，什么也不存。
    """

    @staticmethod
    def forward(ctx, x: torch.Tensor, layer: nn.Module) -> torch.Tensor:
        ctx.layer = layer
        return layer.quantized_forward(x)  # (..., out)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return grad @ ctx.layer.dequantized_weight(grad.dtype), None  # (..., out) @ (out, in) → (..., in)


class _QuantizedLinear(nn.Module):
    """两种量化层共用的前向入口：输入要求梯度时走 :class:`_DequantizeAgainInBackward`。"""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if torch.is_grad_enabled() and x.requires_grad:
            return _DequantizeAgainInBackward.apply(x, self)
        return self.quantized_forward(x)


class Int8Linear(_QuantizedLinear):
    """逐通道 int8 权重的线性层：``weight`` int8 ``(out, in)``，``scale`` float32 ``(out,)``。"""

    def __init__(self, weight: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None = None):
        super().__init__()
        if weight.dtype != torch.int8 or weight.dim() != 2:
            raise TypeError(f"weight 应是二维 int8 张量 (out, in)，收到 {weight.dtype} {tuple(weight.shape)}")
        _check_scale(scale, (weight.shape[0],))  # 每个输出通道一个
        self.out_features, self.in_features = weight.shape
        self.register_buffer("weight", weight)
        self.register_buffer("scale", scale)
        self.bias = _bias(bias, self.out_features)

    @classmethod
    def from_linear(cls, linear: nn.Linear) -> "Int8Linear":
        """量化一个 ``nn.Linear``：每行 ``s_j = max_i |W_{j,i}| / 127.5``，``q = round(W / s)``。"""
        _check_linear(linear)
        q, scale = quantize_symmetric(linear.weight, bits=8)  # (out, in), (out, 1)
        return cls(q, scale.squeeze(1), _copy_bias(linear))

    def dequantized_weight(self, dtype: torch.dtype | None = None) -> torch.Tensor:
        """反量化的权重 ``Ŵ = s q`` ``(out, in)``（默认用偏置的 dtype，没有偏置时 float32）。"""
        return dequantize_symmetric(self.weight, self.scale[:, None], dtype or self._float_dtype())

    def _float_dtype(self) -> torch.dtype:
        return self.bias.dtype if self.bias is not None else torch.float32

    def quantized_forward(self, x: torch.Tensor) -> torch.Tensor:
        # y = (x · qᵀ) ⊙ s + b：整数权重转成 x 的浮点类型再乘，比例因子逐输出通道乘在结果上
        y = F.linear(x, self.weight.to(x.dtype)) * self.scale.to(x.dtype)  # (..., out)
        return y if self.bias is None else y + self.bias

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}, int8 逐通道"


class Int4Linear(_QuantizedLinear):
    """分组 int4 权重的线性层：``packed`` uint8 ``(out, in/2)``，``scale`` float32 ``(out, in/group_size)``。"""

    def __init__(self, packed: torch.Tensor, scale: torch.Tensor, in_features: int, group_size: int,
                 bias: torch.Tensor | None = None):
        super().__init__()
        if not isinstance(packed, torch.Tensor) or packed.dtype != torch.uint8 or packed.dim() != 2:
            raise TypeError(f"packed 应是二维 uint8 张量 (out, in/2)，收到 {getattr(packed, 'dtype', type(packed).__name__)} "
                            f"{tuple(getattr(packed, 'shape', ()))}")
        if isinstance(group_size, bool) or not isinstance(group_size, int) or group_size not in INT4_GROUP_SIZES:
            raise ValueError(f"group_size 应是 {INT4_GROUP_SIZES} 之一，收到 {group_size!r}")
        in_features = positive_int("in_features", in_features)
        if in_features % group_size:
            raise ValueError(f"in_features 应是 group_size={group_size} 的正整数倍，收到 {in_features!r}")
        if packed.shape[1] != packed_length(in_features):
            raise ValueError(f"packed 的第二维应是 ⌈in_features/2⌉ = {packed_length(in_features)}，收到 {packed.shape[1]}")
        _check_scale(scale, (packed.shape[0], in_features // group_size))  # 每行每组一个
        self.out_features, self.in_features, self.group_size = packed.shape[0], in_features, group_size
        self.register_buffer("packed", packed)
        self.register_buffer("scale", scale)
        self.bias = _bias(bias, self.out_features)

    @classmethod
    def from_linear(cls, linear: nn.Linear, group_size: int = 128) -> "Int4Linear":
        """量化一个 ``nn.Linear``：每行每 ``group_size`` 个输入一组，``s = max|w| / 7.5``，再两两打包。

        ``in_features`` 不是 ``group_size`` 的整数倍时报错（不补零；torchao 此时干脆跳过这一层，gpt-fast 则补零）。
        """
        _check_linear(linear)
        if group_size not in INT4_GROUP_SIZES:
            raise ValueError(f"group_size 应是 {INT4_GROUP_SIZES} 之一，收到 {group_size!r}")
        q, scale = quantize_groupwise(linear.weight, bits=4, group_size=group_size)  # (out, in), (out, in/g)
        return cls(pack_int4(q), scale, linear.in_features, group_size, _copy_bias(linear))

    def int_weight(self) -> torch.Tensor:
        """解包后的整数权重 ``q`` ``(out, in)``（int8 容器，取值 [−8, 7]）。"""
        return unpack_int4(self.packed, self.in_features)

    def dequantized_weight(self, dtype: torch.dtype | None = None) -> torch.Tensor:
        """反量化的权重 ``Ŵ`` ``(out, in)``：每组乘自己的比例因子。"""
        dtype = dtype or (self.bias.dtype if self.bias is not None else torch.float32)
        return dequantize_groupwise(self.int_weight(), self.scale, dtype)

    def quantized_forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.dequantized_weight(x.dtype), self.bias)  # (..., out)：先反量化整块权重再乘

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}, "
                f"int4 分组 group_size={self.group_size}")
