"""第 8 章练习的检查器（checker）：在线 softmax、FlashAttention 的一步更新、QKᵀ 的 FLOPs、KV 缓存的字节数。

用 :mod:`tformer_lib.exercises._core` 的框架：每个 ``check_*`` 接收读者写的函数，运行若干测试用例，
打印结论并返回 :class:`~tformer_lib.exercises._core.CheckResult`：

* 函数里还是 ``raise NotImplementedError`` → 打印“尚未完成”，返回 False，**不抛异常**；
* 结果正确 → 打印 ✅；
* 结果不对 → 打印 ❌，并对常见错误（没减最大值而溢出、新最大值出现时忘了修正旧的分母、
  漏了乘加的因子 2、漏了头数 h、忘了 K 和 V 是两份……）给出针对性的提示。
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from ..config import TransformerConfig
from ..costs import attention_flops, kv_cache_bytes_per_token
from ._core import CheckResult, Mistake, run_checks

__all__ = ["check_online_softmax", "check_flash_step", "check_qk_flops", "check_kv_cache_bytes"]


def _tensor(result, what: str, shape: tuple[int, ...]) -> torch.Tensor:
    if not isinstance(result, torch.Tensor):
        raise Mistake(f"{what} 应返回张量，收到 {type(result).__name__}", key="type")
    if tuple(result.shape) != shape:
        raise Mistake(f"{what} 的形状应为 {shape}，得到 {tuple(result.shape)}", key="shape")
    return result.detach().to(torch.float64)


# ---- 练习 1：在线 softmax ------------------------------------------------------------------------
def check_online_softmax(fn: Callable[[torch.Tensor, int], torch.Tensor]) -> CheckResult:
    """练习 1：``fn(x (n,), block_size)`` 应返回 ``softmax(x)``，且只靠运行最大值与运行分母扫一遍。

    用例含很大的分数（不减最大值会溢出成 nan/inf）、块宽不整除 n、最大值出现在后面的块里
    （忘了用 e^{m_old − m_new} 修正旧分母就会算错）。
    """

    def body(f: Callable) -> None:
        g = torch.Generator().manual_seed(8)
        cases = [
            (torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0, 6.0]), 2),  # 最大值在最后一块：必须修正旧分母
            (torch.randn(10, generator=g), 3),  # 块宽不整除 n
            (torch.randn(7, generator=g), 7),  # 只有一块
            (torch.randn(5, generator=g), 1),  # 每块一个数
            (torch.tensor([1000.0, 1001.0, 998.0, 1002.0, 990.0]), 2),  # 大数：必须减最大值
        ]
        for x, b in cases:
            got = _tensor(f(x.clone(), b), f"my_online_softmax(x, block_size={b})", tuple(x.shape))
            expected = x.double().softmax(-1)
            if torch.allclose(got, expected, atol=1e-5):
                continue
            if not torch.isfinite(got).all():
                raise Mistake(f"x = {x.tolist()} 时出现 nan/inf：e^x 溢出了。每块里用“减去运行最大值 m”的 e^{{x − m}}，"
                            "不要直接算 e^x。", key="no_max_subtraction")
            no_rescale = _online_without_rescale(x.double(), b)
            if torch.allclose(got, no_rescale, atol=1e-5):
                raise Mistake(f"block_size={b}：新最大值出现时，旧的分母 l 要乘以 e^{{m_old − m_new}} 再加上新块的贡献；"
                            "否则前面几块的项是以旧的 m 为基准的，和后面的项对不齐。", key="no_rescale")
            if torch.allclose(got.sum(), torch.tensor(1.0, dtype=torch.float64), atol=1e-5):
                raise Mistake(f"x = {x.tolist()}，block_size={b}：和为 1，但各项不对；最后输出应是 e^{{x − m}} / l，"
                            "其中 m、l 是扫完所有块后的运行最大值与分母。", key="values")
            raise Mistake(f"x = {x.tolist()}，block_size={b}：期望 {expected.round(decimals=4).tolist()}，"
                        f"得到 {got.round(decimals=4).tolist()}", key="values")

    return run_checks("练习 1 在线 softmax（运行最大值 + 运行分母）", fn, [("与 torch.softmax 一致（含大数、不整除的块宽）", body)])


def _online_without_rescale(x: torch.Tensor, b: int) -> torch.Tensor:
    """常见错误：更新 m 但不修正旧的 l。"""
    m, l = torch.tensor(float("-inf"), dtype=x.dtype), torch.tensor(0.0, dtype=x.dtype)
    for s in range(0, x.numel(), b):
        tile = x[s:s + b]
        m = torch.maximum(m, tile.max())
        l = l + torch.exp(tile - m).sum()
    return torch.exp(x - m) / l


# ---- 练习 2：FlashAttention 的一步 ----------------------------------------------------------------
def check_flash_step(fn: Callable) -> CheckResult:
    """练习 2：``fn(m, l, acc, s, v) -> (m_new, l_new, acc_new)``，读入一块键/值后的更新。

    形状：``m``、``l`` ``(T_q,)``，``acc`` ``(T_q, d_v)``，``s`` 是这一块的分数 ``(T_q, b)``（已除以 √d_k），
    ``v`` 是这一块的值 ``(b, d_v)``。反复调用它读完所有块后，``acc / l`` 应等于注意力输出。
    """

    def body(f: Callable) -> None:
        g = torch.Generator().manual_seed(88)
        t_q, t_k, d, b = 4, 10, 3, 4
        q = torch.randn(t_q, d, generator=g, dtype=torch.float64)
        k = torch.randn(t_k, d, generator=g, dtype=torch.float64)
        v = torch.randn(t_k, d, generator=g, dtype=torch.float64)
        k[7] = 3 * q.sum(0)  # 让最后一块里出现更大的分数，逼出修正因子
        scores = q @ k.T / math.sqrt(d)  # (T_q, T_k)
        m = torch.full((t_q,), float("-inf"), dtype=torch.float64)
        l = torch.zeros(t_q, dtype=torch.float64)
        acc = torch.zeros(t_q, d, dtype=torch.float64)
        for start in range(0, t_k, b):
            out = f(m.clone(), l.clone(), acc.clone(), scores[:, start:start + b].clone(), v[start:start + b].clone())
            if not (isinstance(out, tuple) and len(out) == 3):
                raise Mistake("应返回三个张量组成的元组 (m_new, l_new, acc_new)。", key="type")
            m_ref, l_ref, acc_ref = _flash_step_reference(m, l, acc, scores[:, start:start + b], v[start:start + b])
            m_new = _tensor(out[0], "m_new", (t_q,))
            l_new = _tensor(out[1], "l_new", (t_q,))
            acc_new = _tensor(out[2], "acc_new", (t_q, d))
            where = f"读入第 {start // b + 1} 块（键 {start}–{min(start + b, t_k) - 1}）后"
            if not torch.allclose(m_new, m_ref):
                raise Mistake(f"{where}：m_new 应是 max(m, 这一块每行的最大分数)。", key="running_max")
            if not torch.allclose(l_new, l_ref, atol=1e-8):
                if start > 0 and torch.allclose(l_new, l + torch.exp(scores[:, start:start + b] - m_ref[:, None]).sum(-1)):
                    raise Mistake(f"{where}：l_new 不对——旧的 l 要先乘修正因子 e^{{m − m_new}}。", key="no_l_rescale")
                raise Mistake(f"{where}：l_new 应为 l·e^{{m − m_new}} + Σ_j e^{{s_j − m_new}}。", key="values")
            if not torch.allclose(acc_new, acc_ref, atol=1e-8):
                p = torch.exp(scores[:, start:start + b] - m_ref[:, None])
                if start > 0 and torch.allclose(acc_new, acc + p @ v[start:start + b]):
                    raise Mistake(f"{where}：acc_new 不对——l 修正了，但累加器 acc 也要乘同一个修正因子 e^{{m − m_new}}。", key="no_acc_rescale")
                raise Mistake(f"{where}：acc_new 应为 acc·e^{{m − m_new}} + P·v，P = e^{{s − m_new}}（不要在这里除以 l）。", key="normalised_acc")
            m, l, acc = m_new, l_new, acc_new
        expected = scores.softmax(-1) @ v
        if not torch.allclose(acc / l[:, None], expected, atol=1e-8):
            raise Mistake("每一步都对，但 acc / l 与注意力输出不一致——请检查返回值的顺序 (m, l, acc)。", key="order")

    return run_checks("练习 2 FlashAttention 的一步更新", fn, [("逐块更新 m、l、acc，最后 acc / l 等于注意力输出", body)])


def _flash_step_reference(m, l, acc, s, v):
    m_new = torch.maximum(m, s.max(-1).values)  # (T_q,)
    p = torch.exp(s - m_new[:, None])  # (T_q, b)
    corr = torch.exp(m - m_new)  # (T_q,)
    return m_new, l * corr + p.sum(-1), acc * corr[:, None] + p @ v


# ---- 练习 3：QKᵀ 的 FLOPs ------------------------------------------------------------------------
_FLOP_CASES = [(1, 4, 4, 16, 4), (2, 10, 10, 512, 8), (3, 7, 13, 64, 4), (1, 1, 100, 256, 16)]


def check_qk_flops(fn: Callable[[int, int, int, int, int], int]) -> CheckResult:
    """练习 3：``fn(batch, t_q, t_k, d_model, n_heads)`` 应返回多头注意力里 QKᵀ 这一步的 FLOPs
    （一次乘加 = 2 FLOPs），即 ``2·B·h·T_q·T_k·d_k``。"""

    def body(f: Callable) -> None:
        for B, tq, tk, d, h in _FLOP_CASES:
            got = f(B, tq, tk, d, h)
            try:
                got = int(got)
            except (TypeError, ValueError) as exc:
                raise Mistake(f"应返回一个整数，收到 {got!r}", key="type") from exc
            expected = attention_flops(B, tq, tk, d, h)["scores"]
            if got == expected:
                continue
            d_k = d // h
            where = f"(B={B}, T_q={tq}, T_k={tk}, d_model={d}, h={h})"
            hints = [
                (expected // 2, "no_factor_2", "少了因子 2：一次乘加（multiply-add）算 2 次浮点运算。"),
                (2 * B * tq * tk * d_k, "no_heads", "少乘了头数 h：每个头各做一次 (T_q × d_k) @ (d_k × T_k)。"),
                (2 * B * h * tq * tq * d_k, "t_q_squared", "分数表是 T_q × T_k，不是 T_q × T_q（交叉注意力时两者不同）。"),
                (2 * B * h * tq * tk * d, "d_model_per_head", "每个头的向量长度是 d_k = d_model / h，不是 d_model。"),
            ]
            for wrong, key, hint in hints:
                if got == wrong:
                    raise Mistake(f"{where}：{hint}", key=key)
            raise Mistake(f"{where}：期望 {expected}，得到 {got}。", key="values")

    return run_checks("练习 3 QKᵀ 的 FLOPs", fn, [("多组 (B, T_q, T_k, d_model, h)，含交叉注意力", body)])


# ---- 练习 4：KV 缓存每个词元的字节数 -----------------------------------------------------------------
def check_kv_cache_bytes(fn: Callable[[TransformerConfig, int], int]) -> CheckResult:
    """练习 4：``fn(config, bytes_per_element)`` 应返回解码器每多生成一个词元时，
    自注意力 K/V 缓存增加的字节数（一条序列），即 ``2 · N_dec · d_model · bytes``。"""

    def body(f: Callable) -> None:
        configs = [
            TransformerConfig(100, 100, d_model=512, n_heads=8, n_encoder_layers=6, n_decoder_layers=6),
            TransformerConfig(100, 100, d_model=64, n_heads=4, n_encoder_layers=3, n_decoder_layers=2),
            TransformerConfig(100, 100, d_model=256, n_heads=16, n_encoder_layers=1, n_decoder_layers=4),
        ]
        for c in configs:
            for e in (4, 2):
                got = f(c, e)
                try:
                    got = int(got)
                except (TypeError, ValueError) as exc:
                    raise Mistake(f"应返回一个整数（字节数），收到 {got!r}", key="type") from exc
                expected = kv_cache_bytes_per_token(c, e)
                if got == expected:
                    continue
                n, d = c.n_decoder_layers, c.d_model
                where = f"(N_dec={n}, N_enc={c.n_encoder_layers}, d_model={d}, h={c.n_heads}, 每个数 {e} 字节)"
                hints = [
                    (expected // 2, "no_factor_2", "K 和 V 是两份，要乘 2。"),
                    (2 * d * e, "no_layers", "每个解码器层都有自己的 K/V 缓存，要乘层数 N_dec。"),
                    (2 * c.n_encoder_layers * d * e, "encoder_layers",
                     "缓存在解码器里：层数用 n_decoder_layers，不是 n_encoder_layers。"),
                    (2 * n * c.d_k * e, "d_k", "每层缓存全部 h 个头的 K、V，合起来是 d_model 维，不是 d_k。"),
                    (2 * n * d, "no_bytes", "忘了乘每个数的字节数 bytes_per_element。"),
                    (4 * n * d * e, "cross_attention",
                     "交叉注意力的 K/V 来自编码器输出，只算一次、不随生成的词元增长，不要计入。"),
                ]
                for wrong, key, hint in hints:
                    if got == wrong:
                        raise Mistake(f"{where}：{hint}", key=key)
                raise Mistake(f"{where}：期望 {expected}，得到 {got}。", key="values")

    return run_checks("练习 4 KV 缓存每个词元的字节数", fn, [("与 kv_cache_bytes_per_token 一致", body)])
