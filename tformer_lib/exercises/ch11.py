"""第 11 章（显存与混合精度）练习的检查器，和“找错”题里那段有错的代码。

- :func:`check_model_state_bytes`（预测再验证）：fp32 与混合精度、三种优化器，每个参数各占几个字节的模型状态；
- :func:`check_ffn_activation_bytes`（推导并核对）：前馈网络为反向保存的 ``(B, T, d_ff)`` 张量一共多少字节；
- :func:`buggy_accumulated_loss` + :func:`check_accumulated_loss`（找错）：梯度累积时“各微批平均再平均”≠ 大批；
- :func:`check_fp16_overflow`（预测再验证）：一个点积在 float16 里会不会上溢。

每个检查器都在多组随机尺寸上调用读者的函数（写死的答案过不了），并与 PyTorch 实测的结果比较；
接受任何正确的数值类型，桩（stub）→ “⏳ 尚未完成”，不抛异常。
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn

from tformer_lib.measurement.costs import saved_tensor_bytes
from tformer_lib.exercises._core import (
    CheckResult,
    Mistake,
    TorchCalls,
    Variant,
    as_bool,
    as_int,
    code_objects,
    compare_number,
    draw_choice,
    draw_int,
    random_cases,
    run_checks,
)
from tformer_lib.parts.feedforward import PositionwiseFeedForward
from tformer_lib.measurement.memory import BYTES_PER_PARAMETER, measured_model_state_bytes

__all__ = [
    "check_model_state_bytes",
    "check_ffn_activation_bytes",
    "buggy_accumulated_loss",
    "check_accumulated_loss",
    "check_fp16_overflow",
]


# ---- 预测再验证：模型状态每个参数几个字节 ----------------------------------------------------------------


#: 优化器给每个参数存几个 float32 的矩：AdamW 两个（m 与 v），带动量的 SGD 一个（动量），朴素 SGD 没有
_MOMENTS = {"adamw": 2, "sgd_momentum": 1, "sgd": 0}


def _optimizer(name: str, params) -> torch.optim.Optimizer:
    if name == "adamw":
        return torch.optim.AdamW(params, lr=1e-3)
    return torch.optim.SGD(params, lr=1e-3, momentum=0.9 if name == "sgd_momentum" else 0.0)


def _measured_fp32_states(n_in: int, n_out: int, optimizer: str) -> tuple[int, int]:
    """一个 ``nn.Linear`` 用真实的优化器走一步之后，参数 + 梯度 + 优化器状态的实测字节数（不含 0 维的步数）与参数个数。"""
    model = nn.Linear(n_in, n_out)
    opt = _optimizer(optimizer, model.parameters())
    model(torch.ones(1, n_in)).sum().backward()
    opt.step()
    m = measured_model_state_bytes(model, opt)
    return m["total"] - m["step"], sum(p.numel() for p in model.parameters())


def _state_items(n: int, precision: str, optimizer: str) -> dict[str, int]:
    """逐项的账（字节）：fp32 的参数与梯度各 4；混合精度是 16 位的参数与梯度各 2、float32 主权重 4；每个矩 4。"""
    table = BYTES_PER_PARAMETER["fp32" if precision == "fp32" else "mixed"]
    return {"params": table["params"] * n, "grads": table["grads"] * n, "master": table["master"] * n,
            "optimizer": 4 * _MOMENTS[optimizer] * n}


def check_model_state_bytes(fn: Callable[..., Any], *, verbose: bool = True) -> CheckResult:
    """检查 ``fn(n_params, precision, optimizer) -> int``：训练时模型状态（参数、梯度、优化器状态，混合精度另加 float32
    主权重）一共多少字节。``precision`` 是 ``"fp32"`` 或 ``"mixed"``（16 位参数与梯度）；``optimizer`` 是 ``"adamw"``、
    ``"sgd_momentum"`` 或 ``"sgd"``，优化器状态总是 float32。fp32 与一步真实优化器之后实测的字节数比较。"""

    def cases(f):
        combos = [(p, o) for o in _MOMENTS for p in ("fp32", "mixed")]
        for i, g in enumerate(random_cases(12, seed=111)):
            precision, optimizer = combos[i % len(combos)]
            measured, n = _measured_fp32_states(draw_int(g, 2, 40), draw_int(g, 1, 30), optimizer)
            items = _state_items(n, precision, optimizer)
            want = measured if precision == "fp32" else sum(items.values())
            call = f"state_bytes(n_params={n}, precision={precision!r}, optimizer={optimizer!r})"
            got = as_int(f(n, precision, optimizer), f"{call} 的返回值")
            if got == want:
                continue
            known: dict[int, tuple[str, str]] = {}
            if optimizer != "adamw":
                known[16 * n] = ("adam_states", f"{optimizer} 没有 Adam 的 m 与 v：带动量的 SGD 每个参数存一个 float32 的动量，"
                                                "朴素的 SGD 不存优化器状态")
            if precision == "mixed":
                fp32 = sum(_state_items(n, "fp32", optimizer).values())
                known.setdefault(fp32 // 2, ("halved", "混合精度并不把模型状态减半：16 位的参数与梯度之外，还有 float32 的"
                                                       "主权重和优化器状态"))
                known.setdefault(want - items["master"], ("no_master", "别忘了 float32 的主权重（master weights）："
                                                                       "更新要在 float32 里做"))
            if items["optimizer"]:
                known.setdefault(want - items["optimizer"], ("no_optimizer_state", "别忘了优化器状态：每个矩每个参数一个 float32"))
            known.setdefault(want - items["grads"], ("no_grads", "梯度也要占内存：每个参数一份梯度"))
            known.setdefault(items["params"], ("params_only", "只算了参数本身：训练还要梯度和优化器状态"))
            known.setdefault(n, ("elements", "算出的是参数个数，还要乘每个参数占的字节数"))
            key, hint = known.get(got, ("values", "按每个参数几个字节逐项加起来：参数、梯度、（混合精度的）主权重、优化器的每个矩"))
            raise Mistake(f"{call} 返回 {got}，应为 {want}。{hint}", key=key)

    from tformer_lib.measurement.memory import model_state_bytes

    return run_checks("训练的模型状态字节数", fn, [("12 个随机大小的模型：fp32 与混合精度 × AdamW、带动量的 SGD、SGD", cases)],
                      verbose=verbose, forbidden=(model_state_bytes, measured_model_state_bytes))


# ---- 推导并核对：前馈网络保存的激活 ---------------------------------------------------------------------


def _measured_ffn_bytes(batch: int, length: int, d_model: int, d_ff: int, activation: str) -> int:
    ffn = PositionwiseFeedForward(d_model, d_ff, activation=activation).train()
    x = torch.randn(batch, length, d_model, requires_grad=True)
    return saved_tensor_bytes(lambda: ffn(x), exclude=(*ffn.parameters(), x))  # 不计参数与 FFN 的输入


def check_ffn_activation_bytes(fn: Callable[..., Any], *, verbose: bool = True) -> CheckResult:
    """检查 ``fn(batch, length, d_ff, activation) -> int``：float32 的前馈网络（``activation`` 是
    ``"relu"``/``"gelu"``/``"swiglu"``）为反向传播保存的 ``(B, T, d_ff)`` 形状张量一共多少字节（不含 FFN 的输入）。
    与 ``saved_tensors_hooks`` 实测的字节数比较。"""

    def cases(f):
        seen = set()
        for g in random_cases(9, seed=112):
            activation = ("relu", "gelu", "swiglu")[len(seen) % 3] if len(seen) < 3 else draw_choice(
                g, ("relu", "gelu", "swiglu"))
            seen.add(activation)
            B, T, d_ff = draw_int(g, 1, 4), draw_int(g, 1, 9), draw_int(g, 2, 24)
            want = _measured_ffn_bytes(B, T, draw_int(g, 2, 8), d_ff, activation)
            call = f"ffn_activation_bytes(batch={B}, length={T}, d_ff={d_ff}, activation={activation!r})"
            one = B * T * d_ff * 4
            variants = [
                Variant("elements", "算出的是元素个数，还要乘每个 float32 的 4 字节", want // 4),
                Variant("one_copy", "GELU 的反向要用它的输入，W_2 的反向要用 GELU 的输出：两份"
                        if activation == "gelu" else "SwiGLU 要存 SiLU 的输入与输出、门 W_3 x 和两者之积：四份", one),
                Variant("gelu_as_relu", "ReLU 的输出本身就够反向用（也是 W_2 的输入）：只存一份", 2 * one),
            ]
            compare_number(f(B, T, d_ff, activation), want, variants=[v for v in variants if v.value != want],
                           what=f"{call} 的返回值", default_hint=f"{call} 实测为 {want} 字节")

    from tformer_lib.measurement.memory import lm_activation_bytes, measure_activation_bytes

    return run_checks("前馈网络保存的激活字节数", fn, [("9 个随机尺寸，三种激活函数", cases)], verbose=verbose,
                      forbidden=(saved_tensor_bytes, lm_activation_bytes, measure_activation_bytes, PositionwiseFeedForward))


# ---- 找错：梯度累积的损失 --------------------------------------------------------------------------------


def buggy_accumulated_loss(sums: Sequence[float], counts: Sequence[int]) -> float:
    """一个有错的梯度累积损失（第 11 章“找错”练习用，不要在别处使用）。

    ``sums[i]``：第 i 个微批的交叉熵总和；``counts[i]``：它的非 PAD 目标数。应返回与“整批一次算”相同的平均损失。
    """
    means = [s / c for s, c in zip(sums, counts)]  # 每个微批先求平均
    return sum(means) / len(means)  # 再对微批平均


def check_accumulated_loss(fn: Callable[..., Any], *, verbose: bool = True) -> CheckResult:
    """检查改好的 ``fn(sums, counts) -> float``：等于整批的平均交叉熵 Σsums / Σcounts（各微批的目标数不同时也对）。"""

    def cases(f):
        for i, g in enumerate(random_cases(6, seed=113)):
            k = draw_int(g, 2, 5)
            counts = [draw_int(g, 1, 60) for _ in range(k)]
            if i == 0:
                counts = [counts[0]] * k  # 目标数都相同时，错的写法碰巧也对
            sums = [round(c * (2 + 3 * float(torch.rand((), generator=g))), 4) for c in counts]
            want = sum(sums) / sum(counts)
            means = [s / c for s, c in zip(sums, counts)]
            variants = [
                Variant("mean_of_means", "各微批先平均再平均，等于给每个微批同样的权重；目标（词元）多的微批应占更大的份量",
                        sum(means) / k),
                Variant("sum_of_means", "把各微批的平均损失直接相加，没有除以微批数，更没有按目标数加权", sum(means)),
                Variant("sum_over_k", "总和应除以整批的目标数 Σcounts，而不是微批数", sum(sums) / k),
            ]
            compare_number(f(list(sums), list(counts)), want, variants=[v for v in variants if abs(v.value - want) > 1e-9],
                           what=f"accumulated_loss(sums={sums}, counts={counts}) 的返回值", rtol=1e-6)

    return run_checks("梯度累积的损失", fn, [("6 组随机微批（目标数有同有异）", cases)], verbose=verbose)


# ---- 预测再验证：float16 的点积会不会上溢 ----------------------------------------------------------------


#: 读者的函数里出现这些名字，就是在 float16 里算（torch、NumPy 都算），或者绕过了记录 torch 调用的办法
_FP16_NAMES = frozenset({"float16", "half", "HalfTensor", "DisableTorchFunction", "Thread", "subprocess"})


def _names_in(fn) -> set[str]:
    """读者的函数（及其中嵌套的函数）代码里用到的名字与字符串常量。"""
    import inspect

    code = getattr(inspect.unwrap(fn), "__code__", None)
    found: set[str] = set()
    for c in code_objects(code) if code is not None else ():
        found.update(c.co_names)
        found.update(k for k in c.co_consts if isinstance(k, str))
    return found


def _fp16_cases(g) -> list[tuple[float, int, bool]]:
    """24 组 (value, d_k, scale_first)，两种顺序各 12 组。结果里最大的数与 65504 之比分四档：远低于（0.2–0.8）、
    略低于（0.85–0.93）、略高于（1.08–1.18）、远高于（1.3–5）；先缩放的组里至少 3 组不缩放就会上溢。"""
    bands = [(0.2, 0.8), (0.85, 0.93), (1.08, 1.18), (1.3, 5.0)]
    out = []
    for i in range(24):
        scale_first = i % 2 == 1
        low, high = bands[draw_int(g, 0, 3)] if i >= 8 else bands[(i // 2) % 4]
        while True:
            d_k = draw_choice(g, (16, 32, 64, 128, 256))
            value = float(draw_int(g, 2, 160))
            ratio = value * value * (math.sqrt(d_k) if scale_first else d_k) / 65504
            order_matters = value * value * d_k > 65504 * 1.05
            if low <= ratio <= high and (not scale_first or i not in (1, 3, 5) or order_matters):
                break
        out.append((value, d_k, scale_first))
    return out


def check_fp16_overflow(fn: Callable[..., Any], *, verbose: bool = True) -> CheckResult:
    """检查 ``fn(value, d_k, scale_first) -> bool``：两个分量都是 ``value`` 的 ``d_k`` 维 float16 向量 q、k，
    算缩放后的注意力分数 q·k/√d_k 时会不会上溢成 inf。``scale_first=False``：先在 float16 里算点积、再除以 √d_k
    （本书显式路径的做法）；``True``：先把 q 除以 √d_k、再与 k 做点积。
    与 PyTorch 在 float16 里真的按这个顺序算出的结果比较：24 组，两种顺序各 12 组，有的离 65504 的边界很近（8%–18%）。
    读者的函数在 float16 里算（torch 的调用被记录；代码里出现 ``float16``、``half`` 等名字也算）→ ❌ ``computed``。
    答错时按读者全部的回答找出是哪一种常见的错（忽略顺序、以为先缩放总能避免、两种顺序都按缩放后的分数算……）。"""

    def cases(f):
        rows = []
        for value, d_k, scale_first in _fp16_cases(random_cases(1, seed=114)[0]):
            q = torch.full((d_k,), value, dtype=torch.float16)
            scale = torch.tensor(1 / math.sqrt(d_k), dtype=torch.float16)
            score = (q * scale) @ q if scale_first else (q @ q) * scale  # 0 维，都在 float16 里
            rows.append((value, d_k, scale_first, not bool(torch.isfinite(score))))
        names = _names_in(f)
        mentioned = sorted(names & _FP16_NAMES - ({"float16"} if "finfo" in names else set()))  # 查 finfo(float16) 的表不算
        got = []
        for value, d_k, scale_first, _ in rows:
            call = f"fp16_overflows({value:g}, {d_k}, scale_first={scale_first})"
            with TorchCalls() as calls:
                returned = f(value, d_k, scale_first)
            used = calls.producing(torch.float16) or mentioned
            if used:
                raise Mistake(f"{call} 在 float16 里算了（{'、'.join(used)}）：这是预测题，想清楚计算过程中出现的数有多大、"
                              "再与 float16 的最大值比，不要真的在 float16 里算（torch、NumPy 都不行）", key="computed")
            got.append(as_bool(returned, f"{call} 的返回值"))
        wrong = [(row, g) for row, g in zip(rows, got) if g != row[3]]
        if not wrong:
            return
        # 按全部回答的样子找出是哪一种错：某个常见的错误规则与读者的每一个回答都一致，就说它
        patterns = {
            "order_ignored": (lambda v, d, s: v * v * d > 65504,
                              "两种顺序你都按点积 value²·d_k 判断。先把 q 除以 √d_k 时，每个乘积是 value²/√d_k，"
                              "计算过程中最大的数是最后的分数 value²·√d_k——不缩放时的点积根本没有出现过"),
            "scaled_still_overflows": (lambda v, d, s: (not s) and v * v * d > 65504,
                                       "你以为先缩放就一定不会上溢。它只把上限放宽了 √d_k 倍：value²·√d_k 超过 65504 时照样上溢"),
            "scaled_either_way": (lambda v, d, s: v * v * math.sqrt(d) > 65504,
                                  "两种顺序你都按缩放后的分数 value²·√d_k 判断。先算点积时，value²·d_k 要先在 float16 里存下来，"
                                  "还没除以 √d_k 就可能已经是 inf，除法来得太晚"),
            "missed_overflow": (lambda v, d, s: False,
                                "float16 能表示的最大数是 65504（3.4·10³⁸ 是 bfloat16 与 float32 的上限）"),
        }
        for key, (rule, hint) in patterns.items():
            if all(rule(v, d, s) == g for (v, d, s, _), g in zip(rows, got)):
                (value, d_k, scale_first, want), _ = wrong[0]
                raise Mistake(f"fp16_overflows({value:g}, {d_k}, scale_first={scale_first})：float16 里"
                              f"{'上溢成 inf' if want else '没有上溢'}，你预测{'不会' if want else '会'}。{hint}", key=key)
        (value, d_k, scale_first, want), _ = wrong[0]
        largest = value * value * (math.sqrt(d_k) if scale_first else d_k)
        what = "先除后乘：最大的数是分数 value²·√d_k" if scale_first else "先乘后除：最大的数是点积 value²·d_k"
        raise Mistake(f"fp16_overflows({value:g}, {d_k}, scale_first={scale_first})：float16 里"
                      f"{'上溢成 inf' if want else '没有上溢'}，你预测{'不会' if want else '会'}（{len(wrong)}/{len(rows)} 组答错）。"
                      f"{what} = {largest:g}，与 65504 比", key="values")

    from tformer_lib.measurement.precision import fp16_overflow

    return run_checks("float16 的注意力分数会不会上溢", fn, [("24 组随机的值与维度（先乘后除、先除后乘各 12 组，有的离边界只差 8%）", cases)],
                      verbose=verbose,
                      forbidden=(fp16_overflow,))
