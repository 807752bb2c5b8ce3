"""第 14 章（解码的极限：编译与量化）的练习检查器，和“找错”题里那个有错的逐通道量化。

- :func:`check_int4_weight_bytes`（推导并核对）：一个分组 int4 线性层的权重占多少字节——与真实的
  :class:`~tformer_lib.quant.Int4Linear` 张量的 ``nbytes`` 比较，库里的字节公式禁用；
- :func:`buggy_quantize_per_channel` + :func:`check_quantize_per_channel`（找错）：比例因子用了每行的最大值而不是
  最大绝对值——检查器逐元素核对 ``|w − s·q| ≤ s/2``、取值范围、比例因子的形状与大小；
- :func:`check_pack_int4`（实现）：两个 int4 装一个字节，约定与 :func:`~tformer_lib.quant.pack_int4` 相同
  （加 8 移到 [0, 15]，偶数下标在低 4 位），长度为奇数时补半个字节；
- :func:`check_break_even_alpha`（推导并核对）：把“验证一次比目标走一步贵 r 倍”加进第 13 章的期望加速比，
  再反过来求：要达到给定的加速比，接受率 α 至少要多高。

每个检查器都在多组随机情形上调用读者的函数，桩（stub）→ “⏳ 尚未完成”，不抛异常。
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from tformer_lib.exercises._core import (
    CheckResult,
    Mistake,
    Variant,
    as_int,
    compare,
    compare_number,
    draw_choice,
    draw_int,
    random_cases,
    run_checks,
)

__all__ = ["check_int4_weight_bytes", "buggy_quantize_per_channel", "check_quantize_per_channel", "check_pack_int4",
           "check_break_even_alpha"]


# ---- 推导并核对：分组 int4 线性层的字节 ------------------------------------------------------------------


def _int4_layer_bytes(out_features: int, in_features: int, group_size: int) -> int:
    """造一个真的 Int4Linear，数它的整数权重与比例因子各占多少字节（不含偏置）。"""
    from tformer_lib.quant import Int4Linear

    layer = Int4Linear.from_linear(nn.Linear(in_features, out_features, bias=False), group_size)
    return layer.packed.nbytes + layer.scale.nbytes


def check_int4_weight_bytes(fn: Callable[..., Any], *, verbose: bool = True) -> CheckResult:
    """检查 ``fn(out_features, in_features, group_size) -> int``：一个无偏置 ``(out, in)`` 线性层量化成分组 int4
    （每行每 ``group_size`` 个相邻输入一组，比例因子 float32）之后，权重一共占多少字节。"""

    def sizes(f):
        for i, g in enumerate(random_cases(8, seed=141)):
            if i == 0:  # LLaMA-2-7B 的一个注意力投影的大小
                group, out_f, in_f = 128, 4096, 4096
            else:
                group, out_f = draw_choice(g, (32, 64, 128)), draw_int(g, 1, 300)
                in_f = group * draw_int(g, 1, 8)
            want = _int4_layer_bytes(out_f, in_f, group)
            call = f"int4_weight_bytes({out_f}, {in_f}, {group})"
            n_groups = out_f * in_f // group
            variants = [
                Variant("no_scales", "只算了整数权重：每组还有一个 float32 比例因子（4 字节），反量化时要用它",
                        out_f * in_f // 2),
                Variant("byte_per_weight", "int4 是两个数装一个字节：整数权重占 out·in/2 字节，不是 out·in",
                        out_f * in_f + 4 * n_groups),
                Variant("bits", "算出来的是位（bit）数，题目要字节：除以 8", out_f * in_f * 4 + 32 * n_groups),
                Variant("half_scales", "本书的比例因子存成 float32（4 字节），不是 float16", out_f * in_f // 2 + 2 * n_groups),
                Variant("scale_per_row", "分组量化是每行每 group_size 个输入一个比例因子（共 out·in/g 个），不是每行一个",
                        out_f * in_f // 2 + 4 * out_f),
                Variant("scale_per_group_column", "比例因子的个数是 out·in/g（每行 in/g 组），不是 in/g",
                        out_f * in_f // 2 + 4 * (in_f // group)),
            ]
            variants = [Variant(v.key, f"{call} 应为 {want} 字节。{v.hint}", v.value) for v in variants if v.value != want]
            compare_number(as_int(f(out_f, in_f, group), f"{call} 的返回值"), want, variants=variants,
                           what=f"{call} 的返回值", rtol=0, atol=0,
                           default_hint=f"{call} 应为 {want} 字节（整数权重 + 比例因子）")

    from tformer_lib.quant import Int4Linear, linear_weight_bytes, tensor_bytes, weight_bytes

    return run_checks("分组 int4 线性层的字节", fn, [("8 组随机的形状与组大小（含 4096×4096）", sizes)],
                      verbose=verbose, forbidden=(linear_weight_bytes, weight_bytes, tensor_bytes, Int4Linear))


# ---- 找错：逐通道对称 int8 量化 ---------------------------------------------------------------------------


def buggy_quantize_per_channel(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """一个有错的逐通道 int8 量化（找错练习用，不要在别处使用）：``w`` ``(out, in)`` → ``(q int8 (out, in), scale (out, 1))``。"""
    scale = w.amax(dim=1, keepdim=True) / 127.5  # (out, 1)：每行一个比例因子
    q = torch.round(w / scale).clamp(-128, 127)  # (out, in)
    return q.to(torch.int8), scale


def _weights(g: torch.Generator, i: int) -> torch.Tensor:
    """第 i 组权重 ``(out, in)``：有的行最大绝对值来自负数，有全零的行，有一个离群值。"""
    out_f, in_f = draw_int(g, 2, 12), draw_int(g, 3, 40)
    w = torch.randn(out_f, in_f, generator=g) * draw_choice(g, (0.02, 1.0, 30.0))
    w[0, draw_int(g, 0, in_f - 1)] = -6.0 * float(w.abs().max())  # 第 0 行：最大绝对值是个负数
    if i % 2 == 1:
        w[-1] = 0.0  # 全零的一行：比例因子不能是 0（否则 0/0）
    if i == 2:
        w[1] = -w[1].abs()  # 一整行都是负数
    return w


def check_quantize_per_channel(fn: Callable[..., Any], *, verbose: bool = True) -> CheckResult:
    """检查改好的 ``fn(w) -> (q, scale)``：``w`` float32 ``(out, in)``；``q`` 是 int8 ``(out, in)``，取值 [−128, 127]；
    ``scale`` 是每行（每个输出通道）一个的正比例因子，形状 ``(out, 1)`` 或 ``(out,)``；每个元素满足
    ``|w − scale·q| ≤ scale/2``，而且比例因子不比 ``max|w| / 127`` 粗（整数的取值范围要用满）。
    直接调用库里的量化函数（``quantize_symmetric`` 等）不算数（❌ ``library_call``）：这道题要你自己改好它。"""

    def rows(f):
        for i, g in enumerate(random_cases(6, seed=142)):
            w = _weights(g, i)
            out_f, in_f = w.shape
            call = f"在 {out_f}×{in_f} 的权重上"
            got = f(w.clone())
            if not isinstance(got, (tuple, list)) or len(got) != 2:
                raise Mistake(f"{call}：应返回两个值 (q, scale)，你返回的是 {type(got).__name__}", key="type")
            q, scale = got
            if not isinstance(q, torch.Tensor) or q.dtype != torch.int8:
                raise Mistake(f"{call}：q 应是 int8 张量（.to(torch.int8)），你的是 {getattr(q, 'dtype', type(q).__name__)}",
                              key="dtype")
            if tuple(q.shape) != (out_f, in_f):
                raise Mistake(f"{call}：q 的形状应为 {(out_f, in_f)}，你的是 {tuple(q.shape)}", key="shape")
            if not isinstance(scale, torch.Tensor) or not scale.dtype.is_floating_point:
                raise Mistake(f"{call}：scale 应是浮点张量，你的是 {getattr(scale, 'dtype', type(scale).__name__)}",
                              key="type")
            if tuple(scale.shape) == (1, in_f) or tuple(scale.shape) == (in_f,) and in_f != out_f:
                raise Mistake(f"{call}：scale 的形状是 {tuple(scale.shape)}——那是每列（每个输入）一个比例因子。"
                              "逐通道量化是每个输出通道，也就是 W 的每一行一个：沿 dim=1 取最大绝对值", key="wrong_axis")
            if scale.numel() == 1 and out_f > 1:
                raise Mistake(f"{call}：整个矩阵只有一个比例因子（逐张量量化）。题目要逐通道：每行一个，形状 ({out_f}, 1)",
                              key="per_tensor")
            if tuple(scale.shape) not in ((out_f, 1), (out_f,)):
                raise Mistake(f"{call}：scale 的形状应为 ({out_f}, 1) 或 ({out_f},)，你的是 {tuple(scale.shape)}", key="shape")
            s = scale.detach().double().reshape(out_f, 1)  # (out, 1)
            if not bool(torch.isfinite(s).all()) or not bool((s > 0).all()):
                bad = int((~(torch.isfinite(s) & (s > 0))).nonzero()[0, 0])
                if float(w[bad].abs().max()) == 0:
                    raise Mistake(f"{call}：第 {bad} 行全是 0，比例因子成了 {float(s[bad]):.4g}：它也要是正数"
                                  "（例如下限截在 float32 的 eps），否则 w / s 是 0/0", key="zero_row")
                raise Mistake(f"{call}：第 {bad} 行的比例因子是 {float(s[bad]):.4g}，应是正数。这一行的数全不大于 0："
                              "用最大值 max(w) 而不是最大绝对值 max|w| 时就会这样", key="no_abs")
            err = (w.double() - s * q.double()).abs()  # (out, in)
            amax = w.double().abs().amax(dim=1, keepdim=True)  # (out, 1)
            over = err - s / 2 - 1e-6 * amax  # 余量：float32 的 w / s 在恰好半步处的舍入
            if bool((over > 0).any()):
                r, c = over.argmax().item() // in_f, over.argmax().item() % in_f
                clipped = int(q[r, c]) in (-128, 127)
                hint = (f"{call}：第 {r} 行第 {c} 列 w = {float(w[r, c]):.4g}，还原成 s·q = {float(s[r, 0] * q[r, c]):.4g}，"
                        f"误差 {float(err[r, c]):.3g} 超过了半个台阶 s/2 = {float(s[r, 0] / 2):.3g}。")
                if clipped and float(w[r, c]) < 0 and float(w[r].abs().max()) > float(w[r].max()):
                    raise Mistake(hint + "这个负数被截在了 −128：比例因子只照顾了最大的正数。对称量化要用最大绝对值 max|w|",
                                  key="no_abs")
                if clipped:
                    raise Mistake(hint + "它被截到了取值范围的边上：比例因子太小了，用 max|w| / 127.5（或 /127）", key="clipped")
                raise Mistake(hint + "取整要四舍五入（torch.round），不是截断（.to(torch.int8) 或 floor 会丢掉最多一整个台阶）",
                              key="truncates")
            coarse = (s > amax / 127 * (1 + 1e-6)) & (amax > 0)  # 全零的行用什么比例因子都行
            if bool(coarse.any()):
                r = int(coarse.nonzero()[0, 0])
                raise Mistake(f"{call}：第 {r} 行的比例因子 {float(s[r]):.4g} 比 max|w|/127 = "
                              f"{float(w[r].abs().max()) / 127:.4g} 还粗：整数的取值范围没有用满，白白多了误差", key="too_coarse")

    from tformer_lib.quant import Int8Linear, quantize_symmetric, symmetric_scale

    return run_checks("逐通道 int8 量化", fn, [("6 组随机权重（有负的离群值、全负的行、全零的行）", rows)],
                      verbose=verbose, forbidden=(quantize_symmetric, symmetric_scale, Int8Linear))


# ---- 实现：两个 int4 装一个字节 --------------------------------------------------------------------------


def _pack_with(q: torch.Tensor, offset: int = 8, *, mask: int = 0xFF, pad: int | None = None) -> torch.Tensor:
    """按偏移 ``offset`` 打包，每个数先截成 ``mask`` 的位数：默认的 ``offset=8`` 就是正确答案；其他参数给出常见的错法
    （``offset=0`` = 直接 ``q.to(uint8)``，``mask=0x0F`` = 补码的低 4 位，``pad`` = 奇数长度时先在 q 上补这个值再加偏移）。"""
    if pad is not None and q.shape[-1] % 2:
        q = torch.cat([q, torch.full_like(q[..., :1], pad)], dim=-1)
    u = (q.to(torch.int16) + offset) & mask  # (..., n)
    if u.shape[-1] % 2:
        u = torch.cat([u, torch.zeros_like(u[..., :1])], dim=-1)  # (..., n + 1)：补半个字节
    return ((u[..., 0::2] | (u[..., 1::2] << 4)) & 0xFF).to(torch.uint8)  # (..., ⌈n/2⌉)


def check_pack_int4(fn: Callable[..., Any], *, verbose: bool = True) -> CheckResult:
    """检查 ``fn(q) -> packed``：``q`` 是取值在 [−8, 7] 的 int8 张量 ``(..., n)``；``packed`` 是 uint8 ``(..., ⌈n/2⌉)``，
    每个数先加 8，偶数下标放低 4 位、奇数下标放高 4 位；n 为奇数时最后一个字节的高 4 位是 0。
    直接调用库里的 ``pack_int4`` 不算数（❌ ``library_call``）。"""

    def values(f):
        from tformer_lib.quant import unpack_int4

        for i, g in enumerate(random_cases(6, seed=143)):
            shape = [draw_int(g, 1, 4) for _ in range(draw_int(g, 0, 2))]
            n = (7, 8)[i] if i < 2 else draw_int(g, 1, 33)
            q = torch.randint(-8, 8, (*shape, n), generator=g, dtype=torch.int8)
            q[..., 0] = -8  # 两端的值都出现
            if n > 1:
                q[..., 1] = 7
            call = f"在形状 {tuple(q.shape)} 的 q 上"
            got = f(q.clone())
            if not isinstance(got, torch.Tensor):
                raise Mistake(f"{call}：应返回 uint8 张量，你返回的是 {type(got).__name__}", key="type")
            want = _pack_with(q)
            if got.dtype != torch.uint8:
                raise Mistake(f"{call}：结果的 dtype 应是 torch.uint8（一个字节装两个 4 位数），你的是 {got.dtype}", key="dtype")
            if got.shape[-1] == n // 2 and n % 2:
                raise Mistake(f"{call}：n = {n} 是奇数，应有 ⌈n/2⌉ = {(n + 1) // 2} 个字节：最后一个数没有伙伴，"
                              "补一个 0 再打包（它占最后一个字节的低 4 位）", key="odd_length")
            if tuple(got.shape) != tuple(want.shape):
                raise Mistake(f"{call}：结果的形状应为 {tuple(want.shape)}，你的是 {tuple(got.shape)}", key="shape")
            swapped = (want >> 4) | ((want & 0x0F) << 4)
            variants = [
                Variant("pad_nibble", f"{call}：n = {n} 是奇数，补的应是一个 0 的半字节（最后一个字节的高 4 位为 0）；"
                        "先补 q = 0 再加 8，高 4 位就成了 8", _pack_with(q, pad=0)),
                Variant("offset", f"{call}：偏移应是 8（[−8, 7] + 8 = [0, 15]），不是 7 或 16", _pack_with(q, 7)),
                Variant("cast_without_offset", f"{call}：q.to(torch.uint8) 把负数变成了 256 + q（−8 → 248），"
                        "高位溢出、左移后也装不进 4 位。先加 8 把取值移到 [0, 15]", _pack_with(q, 0)),
                Variant("swapped", f"{call}：高低 4 位放反了——约定是偶数下标在低 4 位（u[2i] | u[2i+1] << 4）", swapped),
                Variant("no_offset", f"{call}：直接取了补码的低 4 位（q & 0xF）。这也是一种编码，但本书（和 unpack_int4）"
                        "的约定是先加 8 把 [−8, 7] 移到 [0, 15]", _pack_with(q, 0, mask=0x0F)),
            ]
            compare(got.double(), want.double(), variants=[Variant(v.key, v.hint, v.value.double()) for v in variants
                                                          if not torch.equal(v.value.to(torch.uint8), want)],
                    what=f"{call}打包的字节", atol=0, rtol=0)
            if not torch.equal(unpack_int4(got, n), q):
                raise Mistake(f"{call}：unpack_int4 解不回原来的 q", key="values")

    from tformer_lib.quant import Int4Linear, pack_int4

    return run_checks("int4 打包", fn, [("6 组随机形状（含奇数长度与 −8、7 两端）", values)],
                      verbose=verbose, forbidden=(pack_int4, Int4Linear))


# ---- 推导并核对：要多高的接受率，推测解码才达到给定的加速比 -----------------------------------------------


def _reference_speedup(alpha: float, k: int, c: float, r: float) -> float:
    tokens = k + 1 if alpha == 1 else (1 - alpha ** (k + 1)) / (1 - alpha)
    return tokens / (k * c + r)


def _solve_alpha(speedup: Callable[[float], float], target: float) -> float:
    """``speedup`` 在 [0, 1] 上单调增：最小的 α 使 ``speedup(α) ≥ target``（二分到 1e-12）。"""
    if speedup(0.0) >= target:
        return 0.0
    lo, hi = 0.0, 1.0
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (lo, mid) if speedup(mid) >= target else (mid, hi)
    return hi


def check_break_even_alpha(fn: Callable[..., Any], *, verbose: bool = True) -> CheckResult:
    """检查 ``fn(k, c, r, target) -> float``：草稿每次猜 ``k`` 个、草稿一步是目标一步的 ``c`` 倍、目标验证一次是目标一步的
    ``r`` 倍时，推测解码的期望加速比 :math:`\\frac{1-α^{k+1}}{(1-α)(kc+r)}` 至少达到 ``target`` 所需的**最小**接受率 α
    （精确到 0.001；α = 0 就够时返回 0）。每组情形都保证 α = 1 时达得到。直接调用库里的 ``expected_speedup`` 不算数。"""

    def values(f):
        for i, g in enumerate(random_cases(8, seed=145)):
            k = draw_int(g, 1, 6)
            c = draw_int(g, 0, 50) / 100
            r = 1 + draw_int(g, 0, 60) / 100
            best = _reference_speedup(1.0, k, c, r)
            low = _reference_speedup(0.0, k, c, r)
            if i == 0:  # 便宜的草稿（c = 0.1）、几乎免费的验证（r = 1.1）下要 1.5×：GPU 上大模型常见的样子
                k, c, r, target = 2, 0.1, 1.1, 1.5
            elif i == 1:  # α = 0 就已经够了
                target = round(low * 0.9, 3)
            else:
                target = round(low + (best - low) * draw_int(g, 10, 95) / 100, 3)
            want = _solve_alpha(lambda a: _reference_speedup(a, k, c, r), target)
            call = f"break_even_alpha(k={k}, c={c}, r={r}, target={target})"
            variants = [
                Variant("no_r", "验证一次比目标走一步贵 r 倍：加速比的分母是 k·c + r，不是 k·c + 1",
                        _solve_alpha(lambda a: _reference_speedup(a, k, c, 1.0), target)),
                Variant("no_draft_cost", "草稿走 k 步也要时间：分母里要有 k·c",
                        _solve_alpha(lambda a: _reference_speedup(a, k, 0.0, r), target)),
                Variant("untruncated", "每轮最多产出 k + 1 个词元：平均产出是 (1 − α^(k+1)) / (1 − α)，不是 1 / (1 − α)",
                        _solve_alpha(lambda a: (1 / (1 - a) if a < 1 else math.inf) / (k * c + r), target)),
                Variant("speedup_not_alpha", "要返回的是接受率 α（0 到 1 之间），不是加速比", target),
            ]
            variants = [Variant(v.key, f"{call} 应为 {want:.4f}。{v.hint}", v.value) for v in variants
                        if abs(v.value - want) > 2e-3]
            compare_number(f(k, c, r, target), want, variants=variants, what=f"{call} 的返回值", atol=1e-3, rtol=0,
                           default_hint=f"{call} 应为 {want:.4f}：加速比随 α 单调增，找它第一次达到 target 的地方"
                                        "（二分或足够细的网格）；α = 0 就够时返回 0")

    from tformer_lib.serving.speculative import expected_speedup, expected_tokens_per_pass

    return run_checks("推测解码的盈亏接受率", fn, [("8 组随机的 k、c、r 与目标加速比（含 α = 0 就够的情形）", values)],
                      verbose=verbose, forbidden=(expected_speedup, expected_tokens_per_pass))
