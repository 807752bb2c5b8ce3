"""输入检查：坏输入给出清楚的错误——点名参数、收到了什么、期望什么。

检查放在边界上（配置、构造函数、公开入口）。``forward`` 与解码的热循环里只查不花时间的东西（形状、dtype）；
要读出张量取值的检查（词元 id、位置是否越界）由 :func:`check_values` 把关：它们在 GPU 上每次都要让主机等设备。
"""

import math
import numbers
import os
from collections.abc import Sequence

import torch

#: 数据相关检查的开关（debug switch）：``None``（默认）= 只在 CPU 张量上做（在 CPU 上读出取值几乎不花时间，
#: 读者与测试都在 CPU 上，坏 id 照样得到点名参数的错误）；``True`` / ``False`` = 一律做 / 一律不做。
#: 环境变量 ``TFORMER_CHECK_VALUES=1`` 或 ``0`` 在导入时设定它；测试（``tests/conftest.py``）把它设为 ``True``。
CHECK_VALUES: bool | None = {"1": True, "0": False}.get(os.environ.get("TFORMER_CHECK_VALUES", ""))


def check_values(x: torch.Tensor) -> bool:
    """要不要对张量 ``x`` 做读取取值的检查（见 :data:`CHECK_VALUES`）。"""
    return bool(CHECK_VALUES) if CHECK_VALUES is not None else x.device.type == "cpu"


#: 能当索引（查嵌入表、取位置）用的整数 dtype：``nn.Embedding`` 只接受这两种
INDEX_DTYPES = (torch.int64, torch.int32)


class NotAnInteger(TypeError, ValueError):
    """该是整数的参数收到了别的东西（``1.5``、``"3"``、``True``）。

    它既是 ``TypeError`` 也是 ``ValueError``：库里早先各处的整数检查有的抛这个、有的抛那个，合并成
    :func:`positive_int` 之后，按哪一种捕获的调用者都照样接得住。
    """


def positive_int(name: str, value, minimum: int = 1) -> int:
    """要求 ``value`` 是 ≥ ``minimum``（默认 1）的整数（NumPy 的整数也算，bool 不算），返回 Python ``int``。"""
    if isinstance(minimum, bool) or not isinstance(minimum, numbers.Integral):
        raise TypeError(f"positive_int 的 minimum 应是整数，收到 {minimum!r}")
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise NotAnInteger(f"{name} 应是整数，收到 {type(value).__name__} {value!r}")
    if value < minimum:
        expected = {1: "应是正整数", 0: "应是非负整数"}.get(minimum, f"应 ≥ {minimum}")
        raise ValueError(f"{name} {expected}，收到 {value}")
    return int(value)


def non_negative_int(name: str, value) -> int:
    """要求 ``value`` 是非负整数（NumPy 的整数也算，bool 不算），返回 Python ``int``。"""
    return positive_int(name, value, minimum=0)


def positive_ints(name: str, values) -> list[int]:
    """非空的正整数序列（NumPy 的整数也算；bool 不算），返回 Python ``int`` 的列表。

    字符串、字节串、集合与字典不算序列（没有顺序，或元素不是数）：TypeError。
    """
    if isinstance(values, (str, bytes, bytearray, set, frozenset, dict)):
        raise TypeError(f"{name} 应是非空的正整数序列（列表或元组），收到 {type(values).__name__}")
    try:
        values = list(values)
    except TypeError:
        raise TypeError(f"{name} 应是非空的正整数序列，收到 {type(values).__name__}") from None
    if not values or any(isinstance(v, bool) or not isinstance(v, numbers.Integral) or v < 1 for v in values):
        raise ValueError(f"{name} 应是非空的正整数序列，收到 {values!r}")
    return [int(v) for v in values]


def tensor_with_dim(name: str, x, dim: int, layout: str) -> torch.Tensor:
    """要求 ``x`` 是 ``dim`` 维张量，``layout`` 是期望形状的写法，如 ``"(B, T, d_model)"``。"""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} 应是形状为 {layout} 的 torch.Tensor，收到 {type(x).__name__}")
    if x.dim() != dim:
        raise ValueError(f"{name} 应是 {dim} 维张量 {layout}，收到形状 {tuple(x.shape)}")
    return x


def non_empty_sequence(name: str, x: torch.Tensor, seq_dim: int = -2) -> None:
    """要求序列维度长度至少为 1。"""
    if x.shape[seq_dim] == 0:
        raise ValueError(f"{name} 是空序列（形状 {tuple(x.shape)}）；序列长度至少应为 1")


def token_ids(name: str, tokens, vocab_size: int) -> torch.Tensor:
    """要求 ``tokens`` 是整数张量，且每个 id 都落在 ``[0, vocab_size)`` 内（范围要读取值：:func:`check_values`）。"""
    if not isinstance(tokens, torch.Tensor):
        raise TypeError(f"{name} 应是由词元 id 组成的 torch.Tensor，收到 {type(tokens).__name__}")
    if isinstance(vocab_size, bool) or not isinstance(vocab_size, numbers.Integral) or vocab_size < 1:
        raise ValueError(f"vocab_size 应是正整数（{name} 的词表大小），收到 {vocab_size!r}")
    if tokens.dtype not in INDEX_DTYPES:
        raise TypeError(f"{name} 应是整数类型的词元 id（torch.long 或 torch.int32），收到 dtype {tokens.dtype}")
    if tokens.numel() > 0 and check_values(tokens):
        low, high = int(tokens.min()), int(tokens.max())
        if low < 0 or high >= vocab_size:
            raise ValueError(
                f"{name} 中的词元 id 落在 [{low}, {high}]，超出了词表范围 [0, {vocab_size - 1}]"
            )
    return tokens


def broadcast_shape(*shapes: Sequence[int]) -> tuple[int, ...] | None:
    """按 PyTorch 的广播规则合并形状；不能广播时返回 None。

    纯 Python 实现：``torch.broadcast_shapes`` 在 torch 2.13 上每次调用约 1 ms（首次还要导入 sympy），
    而它在每次注意力前向里都要用到。
    """
    ndim = max(len(s) for s in shapes)
    result = [1] * ndim
    for shape in shapes:
        for i, size in enumerate(shape, start=ndim - len(shape)):
            if size != 1:
                if result[i] not in (1, size):
                    return None
                result[i] = size
    return tuple(int(d) for d in result)


def bool_mask(name: str, mask, target_shape: Sequence[int]) -> torch.Tensor:
    """要求 ``mask`` 是布尔张量（True = 可以关注），且能广播到 ``target_shape``。"""
    if not isinstance(mask, torch.Tensor):
        raise TypeError(f"{name} 应是布尔 torch.Tensor（True = 可以关注），收到 {type(mask).__name__}")
    if mask.dtype != torch.bool:
        raise TypeError(
            f"{name} 的 dtype 应是 torch.bool（True = 可以关注），收到 {mask.dtype}；"
            f"若用 1 标记要保留的位置，可用 `{name} = {name} != 0` 转换"
        )
    if broadcast_shape(tuple(mask.shape), tuple(target_shape)) != tuple(target_shape):
        raise ValueError(
            f"{name} 的形状 {tuple(mask.shape)} 无法广播到分数的形状 {tuple(target_shape)}"
        )
    return mask


def attention_inputs(q, k, v) -> None:
    """要求 ``q``/``k``/``v`` 形如 ``(..., T, d)``：q、k 的 d_k 相同，k、v 的长度 T_k 相同，且都非空。"""
    for name, x in (("q", q), ("k", k), ("v", v)):
        if not isinstance(x, torch.Tensor) or x.dim() < 2:
            raise ValueError(f"{name} 应是形状为 (..., T, d) 的张量，收到 {getattr(x, 'shape', type(x))}")
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(f"q 与 k 的最后一维 d_k 应相同，收到 q {tuple(q.shape)} 与 k {tuple(k.shape)}")
    if k.shape[-2] != v.shape[-2]:
        raise ValueError(f"k 与 v 的长度 T_k 应相同，收到 k {tuple(k.shape)} 与 v {tuple(v.shape)}")
    if k.shape[:-2] != v.shape[:-2]:
        raise ValueError(f"k 与 v 的批维度（T 之前的各维）应相同，收到 k {tuple(k.shape)} 与 v {tuple(v.shape)}")
    if broadcast_shape(q.shape[:-2], k.shape[:-2]) is None:
        raise ValueError(
            f"q 与 k 的批维度（T 之前的各维）无法对齐，收到 q {tuple(q.shape)} 与 k {tuple(k.shape)}"
        )
    if not autocast_enabled(q):
        same_dtype(("q", q), ("k", k), ("v", v))
    non_empty_sequence("q", q)
    non_empty_sequence("k", k)


def autocast_enabled(x: torch.Tensor) -> bool:
    """``x`` 所在设备上是否开着自动混合精度（autocast）：那时 dtype 不同是正常的，由 autocast 负责转换。"""
    try:
        return torch.is_autocast_enabled(x.device.type)
    except TypeError:  # 较早的 torch 只有无参数版本（指 CUDA）
        return torch.is_autocast_enabled()


def flag(name: str, value) -> bool:
    """要求 ``value`` 是 ``True`` 或 ``False``：字符串 ``'no'`` 之类的“真值”不算（否则会被当成 True）。"""
    if not isinstance(value, bool):
        raise TypeError(f"{name} 应是 True 或 False，收到 {type(value).__name__} {value!r}")
    return value


def dropout_rate(name: str, value) -> float:
    """要求 ``value`` 是 [0, 1) 内的数：p = 1 会把所有激活清零，训练不动。"""
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not 0 <= value < 1:
        raise ValueError(f"{name} 应是 [0, 1) 内的数，收到 {value!r}")
    return float(value)


def one_of(name: str, value, choices: Sequence) -> None:
    """要求 ``value`` 是 ``choices`` 之一。"""
    if value not in tuple(choices):
        shown = "、".join(repr(c) for c in choices)
        raise ValueError(f"{name} 应是 {shown} 之一，收到 {value!r}")


def same_batch(*named: tuple[str, torch.Tensor]) -> None:
    """要求几个张量的批大小（第 0 维）相同，例如 ``same_batch(("src", src), ("tgt_in", tgt_in))``。"""
    (first, x), *rest = named
    for name, y in rest:
        if y.shape[0] != x.shape[0]:
            raise ValueError(f"{first} 的批大小是 {x.shape[0]}，{name} 的批大小是 {y.shape[0]}：两者必须相同")


def same_dtype(*named: tuple[str, torch.Tensor]) -> None:
    """要求几个浮点张量的 dtype 相同（如注意力的 q、k、v）。"""
    (first, x), *rest = named
    for name, y in rest:
        if y.dtype != x.dtype:
            raise TypeError(
                f"{first} 的 dtype 是 {x.dtype}，{name} 的 dtype 是 {y.dtype}：两者必须相同"
                f"（可用 {name}.to({x.dtype}) 转换）"
            )


def _first_parameter(module: torch.nn.Module):
    """与 ``next(module.parameters(), None)`` 相同（先看自己的参数，再按顺序深入子模块），但不经过生成器与去重集合：
    它在每层的每次前向里都要调用。"""
    for param in module._parameters.values():
        if param is not None:
            return param
    for child in module._modules.values():
        if child is not None and (param := _first_parameter(child)) is not None:
            return param
    return None


def module_dtype(name: str, x: torch.Tensor, module: torch.nn.Module) -> None:
    """要求输入 ``x`` 的 dtype 与模块参数的 dtype 相同（float64 的输入进 float32 的模块会在深处报错）。

    开着 autocast 时不检查：混合精度下输入与参数的 dtype 本来就可以不同。
    """
    param = _first_parameter(module)
    if param is None or autocast_enabled(x):
        return
    if not x.dtype.is_floating_point:
        raise TypeError(f"{name} 应是浮点张量（与模块参数同为 {param.dtype}），收到 dtype {x.dtype}")
    if x.dtype != param.dtype:
        raise TypeError(
            f"{name} 的 dtype 是 {x.dtype}，而 {type(module).__name__} 的参数是 {param.dtype}："
            f"请把输入转成 {name}.to({param.dtype})，或把模块转成 module.to({x.dtype})"
        )


def last_dim(name: str, x: torch.Tensor, expected: int, owner: str) -> None:
    """要求 ``x`` 的最后一维等于 ``expected``（``owner`` 说明是谁的期望，如 ``"这个位置编码模块的 d_model"``）。"""
    if x.shape[-1] != expected:
        raise ValueError(f"{name} 的最后一维是 {x.shape[-1]}，但{owner}={expected}（{name} 的形状 {tuple(x.shape)}）")


def _shown(bound: float) -> str:
    """错误信息里的界：短写法（``0``、``1``）不失真时用它，否则写全（``0.30000000000000004``）。"""
    short = f"{bound:g}"
    return short if float(short) == bound else repr(float(bound))


def finite_real(name: str, value, *, above: float | None = None, at_least: float | None = None) -> float:
    """要求 ``value`` 是有限的实数，可再要求 ``> above``（严格）或 ``≥ at_least``（两者至多给一个）；返回 ``float``。

    不合要求的一律是 ``ValueError``（包括不是数的输入：字符串、``None``、布尔值、张量，以及大到转不成 float 的整数）。
    """
    if above is not None and at_least is not None:
        raise TypeError("finite_real 的 above 与 at_least 至多给一个")
    bound = above if above is not None else at_least
    if bound is not None and (isinstance(bound, bool) or not isinstance(bound, numbers.Real) or not math.isfinite(bound)):
        raise ValueError(f"{name} 的界应是有限的数，收到 {bound!r}")
    try:
        ok = not isinstance(value, bool) and isinstance(value, numbers.Real) and math.isfinite(value)
    except OverflowError:  # 大到转不成 float 的整数
        ok = False
    if ok and bound is not None:
        ok = value > above if above is not None else value >= at_least
    if not ok:
        if bound is None:
            raise ValueError(f"{name} 应是有限的数，收到 {value!r}")
        sign = ">" if above is not None else "≥"
        raise ValueError(f"{name} 应是 {sign} {_shown(bound)} 的有限数，收到 {value!r}")
    return float(value)


def finite_positive(name: str, value) -> float:
    """要求 ``value`` 是有限的正数（排除 0、负数、inf、NaN 与布尔值）。"""
    return finite_real(name, value, above=0)


def check_suppress_ids(suppress_ids, vocab_size: int | None = None) -> tuple[int, ...]:
    """要求 ``suppress_ids`` 是整数 id 的序列（可以为空），例如 ``(PAD, BOS)``；返回元组。一维张量或数组也行。"""
    if hasattr(suppress_ids, "tolist") and getattr(suppress_ids, "ndim", None) == 1:  # torch 张量、NumPy 数组
        suppress_ids = suppress_ids.tolist()
    if isinstance(suppress_ids, (str, bytes)) or not isinstance(suppress_ids, (Sequence, set, frozenset)):
        raise TypeError(f"suppress_ids 应是整数 id 的序列（如 (PAD, BOS) 或 ()），收到 "
                        f"{type(suppress_ids).__name__} {suppress_ids!r:.40}")
    ids = tuple(suppress_ids)
    for t in ids:
        if isinstance(t, bool) or not isinstance(t, numbers.Integral):
            raise TypeError(f"suppress_ids 里应全是整数 id，收到 {t!r}")
        if vocab_size is not None and not 0 <= t < vocab_size:
            raise ValueError(f"suppress_ids 里的 id 应在 [0, {vocab_size}) 内，收到 {t}")
    return tuple(int(t) for t in ids)


def language_model(name: str, model) -> torch.nn.Module:
    """要求 ``model`` 是带 ``config``（``vocab_size``、``max_len``）的语言模型，例如 :class:`~tformer_lib.lm.DecoderOnlyLM`。

    只看“长得像”（duck typing），不导入 ``lm``：这里是包的最底层。
    """
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"{name} 应是语言模型（带 .config 的 DecoderOnlyLM，如 make_lm(config) 的结果），"
                        f"收到 {type(model).__name__}")
    config = getattr(model, "config", None)
    missing = [a for a in ("vocab_size", "max_len") if not hasattr(config, a)]
    if missing:
        what = "没有 .config" if config is None else f"的 .config 缺少 {'、'.join(missing)}"
        raise TypeError(f"{name} 应是语言模型（带 .config 的 DecoderOnlyLM，如 make_lm(config) 的结果），"
                        f"收到的 {type(model).__name__} {what}")
    return model
