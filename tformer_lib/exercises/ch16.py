"""第 16 章（模型在规模上的形状：混合专家、专家并行、上下文并行、RoPE 缩放）的练习检查器，
和“找错”题里那个会上溢的合并函数。

- :func:`check_capacity_keep`（实现）：容量与丢弃（capacity, token dropping）——给定每个词元的 k 个专家选择，
  哪些任务（assignment）排得进每个专家的容量：先是全体的第一选择、再是第二选择，同一选择里按词元顺序（GShard 的顺序）。
  与 :func:`~tformer_lib.moe.within_capacity` 比较，``tformer_lib.moe`` 里的函数与类禁用；
- :func:`check_ring_attention_bytes`（推导并核对）：环形注意力（ring attention）一次前向、一次反向里每个进程发出多少字节——
  与 :func:`~tformer_lib.parallel.ring_attention.ring_attention_payload`（库的测试里它与真实的通信逐字节对过）比较，库里的公式禁用；
- :func:`buggy_merge_partials` + :func:`check_merge_partials`（找错）：把两块键各自算出的部分结果——已按本块归一的输出与
  本块的 log-sum-exp（LSE）——合并成一块。有错的版本直接 ``exp(lse)``，分数大时上溢。检查器在有大分数（LSE 到 ±1000 上下，
  float64 里也会上溢、下溢）、整块被屏蔽的情形上两两合并，再像环形注意力那样沿环一块块并入，与整条序列一次 softmax 注意力比较；
- :func:`check_predict_dropped`（预测再验证）：只看每个专家分到的任务数，预测容量因子（capacity factor）为 c 时一共丢掉几份任务——
  检查器真的跑一个路由器、按容量分派，数出丢掉的任务与读者的预测对照；``expert_capacity`` 等禁用；
- :func:`check_scaled_rope_frequencies`（实现）：位置插值（position interpolation, PI）与 NTK-aware 缩放后的 RoPE 频率——
  与 :func:`~tformer_lib.parts.rope_scaling.rope_frequencies` 比较，库里的函数禁用。

每个检查器都在多组随机情形上调用读者的函数，桩（stub）→ “⏳ 尚未完成”，不抛异常。

“禁用”的意思：读者的函数全部检查都通过、但用到了禁用的库对象 → ❌ ``library_call``。两道关：静态地看函数的代码
（名字、属性、函数体里的 import、默认参数、闭包、可调用对象的方法、用禁用函数的 ``__code__`` 造的副本），
以及运行时（``run_checks(..., trace_forbidden=True)``）记下读者的函数每次运行时实际执行到的禁用代码——所以
``getattr(moe, "within_" + "capacity")``、``vars(sys.modules[…])[…]``、``importlib.import_module(…).__dict__[…]``、
可调用对象的 ``__call__``、或经由另一个库函数（``make_lm(cfg).rope_tables(…)`` → ``rope_frequencies``）都算。
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from typing import Any

import torch

from tformer_lib.exercises._core import (
    CheckResult,
    Mistake,
    Variant,
    as_int,
    as_tensor,
    compare,
    compare_number,
    draw_choice,
    draw_int,
    raised_by_student,
    random_cases,
    run_checks,
)

__all__ = ["check_capacity_keep", "check_ring_attention_bytes", "buggy_merge_partials", "check_merge_partials",
           "check_predict_dropped", "check_scaled_rope_frequencies"]


def _distinct(variants: list[Variant], want: Any) -> list[Variant]:
    """只留与正确答案不同、也与其他错误写法不同的那些：两种错误在某组情形里同值时，提示说不清是哪一种，这组不用它们。"""

    def same(a, b):
        if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
            a, b = torch.as_tensor(a), torch.as_tensor(b)
            if a.dtype == torch.bool or b.dtype == torch.bool:
                return a.shape == b.shape and bool((a == b).all())
            a, b = a.to(torch.float64), b.to(torch.float64)
            return a.shape == b.shape and bool(torch.allclose(a, b, rtol=1e-4, atol=1e-5, equal_nan=True))
        return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-9)

    return [v for v in variants if not same(v.value, want)
            and not any(same(v.value, o.value) for o in variants if o is not v)]


# ---- 实现：容量与丢弃 ---------------------------------------------------------------------------------


def _places(choices: torch.Tensor, n_experts: int, *, token_major: bool = False, per_column: bool = False,
            latest_first: bool = False) -> torch.Tensor:
    """每份任务在它的专家队里排第几（从 0 数），``(N, k)``。默认是正确的顺序（先全体第一选择，再第二选择，同一选择按词元）；
    其余参数给出常见的错法：按词元逐个排（``token_major``）、每一列各自计数（``per_column``）、后到的先排（``latest_first``）。"""
    n, k = choices.shape
    place = torch.zeros(n, k, dtype=torch.int64)
    seen = [0] * n_experts
    tokens = range(n - 1, -1, -1) if latest_first else range(n)
    order = [(t, j) for t in tokens for j in range(k)] if token_major else [(t, j) for j in range(k) for t in tokens]
    last_column = None
    for t, j in order:
        if per_column and j != last_column:
            seen, last_column = [0] * n_experts, j
        e = int(choices[t, j])
        place[t, j] = seen[e]
        seen[e] += 1
    return place


def _routing_choices(g: torch.Generator, n: int, n_experts: int, k: int, skew: float) -> torch.Tensor:
    """``(N, k)`` 的专家选择：每个词元 k 个不同的专家，按偏斜的概率抽（``skew`` 越大，越挤向编号小的专家）。"""
    weights = torch.exp(-skew * torch.arange(n_experts, dtype=torch.float64))  # (E,)
    rows = [torch.multinomial(weights, k, replacement=False, generator=g) for _ in range(n)]  # N 个 (k,)
    return torch.stack(rows) if rows else torch.zeros(0, k, dtype=torch.int64)  # (N, k)


def check_capacity_keep(fn: Callable[..., Any], *, verbose: bool = True) -> CheckResult:
    """检查 ``fn(choices, n_experts, capacity) -> keep``：``choices`` 是整数张量 ``(N, k)``（dtype 可能是 int64，也可能是
    int32；``F.one_hot``、``torch.take_along_dim`` 只收 int64 的下标，用之前先 ``.long()``），
    第 n 行是第 n 个词元选中的 k 个专家（第 0 列是第一选择）；返回布尔张量 ``(N, k)``，True = 这份任务排得进它的专家的
    容量 ``capacity``。排队的顺序：所有词元的第一选择先排（按词元顺序），再排第二选择……；每个专家最多收 ``capacity`` 份，
    后来的丢弃。读者的函数因为 int32 的下标出错时给出 ❌ ``index_dtype``（提示 ``.long()``），不是一条原样的错误。

    禁用（❌ ``library_call``）：``tformer_lib.moe`` 里的所有函数与类（``within_capacity``、``plan_dispatch``、
    ``expert_capacity``、``TopKRouter``、``MoEFeedForward``……），不论直接调用、经由别名/``getattr``/默认参数/可调用对象/
    代码副本，还是经由别的库代码（如 ``ExpertParallelMoE``）执行到它们。"""
    from tformer_lib import moe

    def cases(f):
        for i, g in enumerate(random_cases(10, seed=161)):
            if i == 0:  # 手算得出的小例子：6 个词元、3 个专家、k = 2、容量 2（专家 0 收到 3 份第一选择，第 3 份丢弃）
                choices, n_experts, capacity = torch.tensor([[0, 1], [0, 2], [0, 1], [1, 0], [2, 0], [1, 2]]), 3, 2
            else:
                n_experts = draw_choice(g, (2, 3, 4, 8))
                k = draw_int(g, 1, 2)
                n = draw_int(g, 1, 24)
                choices = _routing_choices(g, n, n_experts, k, skew=draw_choice(g, (0.0, 0.7, 2.0, 6.0)))
                if i == 1:
                    capacity = 0  # 容量 0：全部丢弃
                elif i == 2:
                    capacity = n + draw_int(g, 0, 3)  # 容量 ≥ N：一份也不丢
                else:
                    capacity = draw_int(g, 1, max(1, math.ceil(1.25 * n * k / n_experts)))
                if i % 3 == 0:
                    choices = choices.to(torch.int32)
            n, k = choices.shape
            want = moe.within_capacity(choices.long(), n_experts, capacity)  # (N, k)
            call = f"keep(choices={choices.tolist()}, n_experts={n_experts}, capacity={capacity})" if n <= 8 else \
                f"keep(choices 形状 {(n, k)}, n_experts={n_experts}, capacity={capacity})"
            try:
                got = f(choices.clone(), n_experts, capacity)
            except (RuntimeError, IndexError, TypeError, ValueError) as exc:
                if (raised_by_student(exc) and choices.dtype != torch.int64
                        and re.search(r"\bLong(Tensor)?\b|int64", str(exc))):
                    raise Mistake(f"{call}：这组的 choices 是 {choices.dtype}，你的函数出错了（{type(exc).__name__}："
                                  f"{str(exc).strip()[:120]}）。F.one_hot、torch.take_along_dim 等只收 int64（Long）的下标："
                                  "先 choices = choices.long()", key="index_dtype") from None
                raise
            if not isinstance(got, torch.Tensor):
                raise Mistake(f"{call}：应返回布尔张量 (N, k)，你返回的是 {type(got).__name__}", key="type")
            if got.dtype != torch.bool:
                raise Mistake(f"{call}：结果的 dtype 应是 torch.bool（True = 保留），你的是 {got.dtype}：比较运算"
                              "（place < capacity）本身就给出布尔张量，或者 .bool()", key="dtype")
            if tuple(got.shape) != (n, k):
                hint = "。你的像是转置过的 (k, N)：最后要 .t() 回来" if tuple(got.shape) == (k, n) and n != k else ""
                raise Mistake(f"{call}：结果的形状应为 {(n, k)}，与 choices 相同，你的是 {tuple(got.shape)}{hint}", key="shape")
            place = _places(choices, n_experts)  # (N, k)
            variants = [
                Variant("token_major", f"{call}：排队的顺序不对——不是把词元 0 的 k 个选择排完再排词元 1，而是先排所有词元的"
                        "第一选择、再排第二选择（GShard：第一选择优先，choices.t().reshape(-1) 的顺序）",
                        _places(choices, n_experts, token_major=True) < capacity),
                Variant("off_by_one", f"{call}：差一：排第 place 位（从 0 数）的任务在 place < capacity 时保留，"
                        f"每个专家恰好收 {capacity} 份", place <= capacity),
                Variant("per_column", f"{call}：第二选择排队时，专家队里已经有了第一选择的任务：计数要接着第一选择往下数，"
                        "不是每一列从 0 重新数", _places(choices, n_experts, per_column=True) < capacity),
                Variant("latest_first", f"{call}：同一选择里按词元顺序先到先得：词元编号小的先排",
                        _places(choices, n_experts, latest_first=True) < capacity),
                Variant("no_drop", f"{call}：容量是 {capacity}：超出的任务要丢掉（False），不能全部保留",
                        torch.ones(n, k, dtype=torch.bool)),
            ]
            bad = (got != want).nonzero()
            hint = None
            if len(bad):
                t, j = (int(x) for x in bad[0])
                e = int(choices[t, j])
                hint = (f"{call}：词元 {t} 的第 {j + 1} 选择（专家 {e}）应{'保留' if want[t, j] else '丢弃'}，你的是"
                        f"{'保留' if got[t, j] else '丢弃'}——按“先全体第一选择、再第二选择，同一选择按词元顺序”排队，"
                        f"它前面已有 {int(place[t, j])} 份任务排进专家 {e}，容量 {capacity}")
            compare(got, want, variants=_distinct(variants, want), what=f"{call}的结果", default_hint=hint)

    forbidden = tuple(getattr(moe, name) for name in moe.__all__)
    return run_checks("容量与丢弃", fn, [("10 组随机的路由（k = 1 与 2、偏斜的负载、容量从 0 到 ≥ N，int64 与 int32 的 choices）",
                                       cases)], verbose=verbose, forbidden=forbidden, trace_forbidden=True)


# ---- 推导并核对：环形注意力每个进程发出的字节 -------------------------------------------------------------


def _pair(x: Any, what: str) -> tuple[Any, Any]:
    if isinstance(x, dict) and {"forward", "backward"} <= set(x):
        x = (x["forward"], x["backward"])
    if not isinstance(x, (tuple, list)) or len(x) != 2:
        raise Mistake(f"{what}应是 (前向的字节, 反向的字节) 两个数，你返回的是 {type(x).__name__}", key="type")
    return x[0], x[1]


def check_ring_attention_bytes(fn: Callable[..., Any], *, verbose: bool = True) -> CheckResult:
    """检查 ``fn(batch, heads, local_len, d_head, world_size, element_bytes) -> (forward, backward)``：p = ``world_size``
    个进程做环形注意力，每个进程持有 ``local_len`` = T/p 个位置的 q、k、v ``(batch, heads, T/p, d_head)``（每个元素
    ``element_bytes`` 字节），一次前向、一次反向里**每个进程发出**多少字节。也可以返回 ``{"forward": …, "backward": …}``。
    与 :func:`~tformer_lib.parallel.ring_attention.ring_attention_payload` 比较（它与真实运行里记下的通信逐字节相同）。

    禁用（❌ ``library_call``，直接、经由别名/``getattr``/可调用对象，或经由别的库代码如
    ``tformer_lib.scale.ledger`` 执行到都算）：``ring_attention_payload``、``ring_attention_saved_bytes``、
    ``ring_attention``、``RingAttention``，以及真的跑一次、数出字节的 ``run_context_parallel``。"""
    from tformer_lib.parallel import context_parallel
    from tformer_lib.parallel import ring_attention as ring

    def sizes(f):
        for i, g in enumerate(random_cases(8, seed=162)):
            if i == 0:  # 环上只有自己
                b, h, n, d, p, e = 2, 4, 16, 8, 1, 4
            elif i == 1:  # 5 个进程、float32；B、h、b 互不相同，各种错法的结果也两两不同：漏乘哪一个都认得出
                b, h, n, d, p, e = 3, 8, 1000, 64, 5, 4
            elif i == 2:  # 一个 8 卡、128K 上下文的 LLaMA 式注意力层（bf16）
                b, h, n, d, p, e = 1, 8, 131072 // 8, 128, 8, 2
            else:
                b, h, d = draw_int(g, 1, 4), draw_choice(g, (1, 2, 4, 8, 32)), draw_choice(g, (16, 64, 128))
                p, n, e = draw_int(g, 2, 16), draw_int(g, 1, 4096), draw_choice(g, (2, 4))
            want = ring.ring_attention_payload(b, h, n, d, p, element_bytes=e)
            block = b * h * n * d * e
            call = (f"ring_attention_bytes(batch={b}, heads={h}, local_len={n}, d_head={d}, world_size={p}, "
                    f"element_bytes={e})")
            forward, backward = _pair(f(b, h, n, d, p, e), f"{call} 的返回值")
            fv = [
                Variant("forward_p", f"{call}：前向 K、V 各传 p − 1 = {p - 1} 次，不是 p 次——第 p 步算的是最后收到的块，"
                        "算完就结束，不用再往下传", 2 * p * block),
                Variant("kv_one", f"{call}：每一步要传 K 和 V 两块（各 B·h·(T/p)·d 个元素），不是一块", (p - 1) * block),
                Variant("full_length", f"{call}：环上传的一块是本进程那片 T/p = local_len 个位置，不是整条序列的 T",
                        2 * (p - 1) * block * p),
                Variant("elements", f"{call}：算出的是元素个数，还要乘每个元素的 {e} 字节", 2 * (p - 1) * block // e),
                Variant("no_heads", f"{call}：一块 K 有 B·h·(T/p)·d 个元素——每个头各有一份 K、V，别忘了乘头数 h = {h}",
                        2 * (p - 1) * block // h),
                Variant("no_batch", f"{call}：一块 K 有 B·h·(T/p)·d 个元素——批里每个序列各有一份，别忘了乘批大小 B = {b}",
                        2 * (p - 1) * block // b),
            ]
            compare_number(as_int(forward, f"{call} 的前向字节"), want["forward"], variants=_distinct(fv, want["forward"]),
                           what=f"{call} 的前向字节", rtol=0, atol=0,
                           default_hint=f"{call} 的前向应为 {want['forward']} 字节：一块 B·h·(T/p)·d·b = {block} 字节，"
                                        "K、V 两块各传几次？")
            bv = [
                Variant("backward_p_minus_1", f"{call}：反向 K、V、dK、dV 各传 p = {p} 次，不是 p − 1 次——第 p 次把每块和它"
                        "累加满的 dK、dV 送回主人手里", 4 * (p - 1) * block),
                Variant("grads_only", f"{call}：反向不只传 dK、dV：K、V 本身也要再绕一圈（每个进程要用它们重算分数），每步 4 块",
                        2 * p * block),
                Variant("backward_like_forward", f"{call}：反向每步传 4 块（K、V、dK、dV），共 p 次", 2 * (p - 1) * block),
                Variant("p1_backward", f"{call}：p = 1 时环上只有自己，K、V 和梯度都不用传：前向、反向都是 0", 4 * block),
                Variant("elements", f"{call}：算出的是元素个数，还要乘每个元素的 {e} 字节", 4 * p * block // e),
                Variant("no_heads", f"{call}：一块 K 有 B·h·(T/p)·d 个元素——每个头各有一份 K、V，别忘了乘头数 h = {h}",
                        4 * p * block // h),
                Variant("no_batch", f"{call}：一块 K 有 B·h·(T/p)·d 个元素——批里每个序列各有一份，别忘了乘批大小 B = {b}",
                        4 * p * block // b),
            ]
            compare_number(as_int(backward, f"{call} 的反向字节"), want["backward"],
                           variants=_distinct(bv, want["backward"]), what=f"{call} 的反向字节", rtol=0, atol=0,
                           default_hint=f"{call} 的反向应为 {want['backward']} 字节：一块 {block} 字节，"
                                        "反向每步传哪几块、一共传几次？")

    return run_checks("环形注意力的通信字节", fn, [("8 组随机的形状与进程数（含 p = 1 与 128K 上下文）", sizes)],
                      verbose=verbose, forbidden=(ring.ring_attention_payload, ring.ring_attention_saved_bytes,
                                                  ring.ring_attention, ring.RingAttention,
                                                  context_parallel.run_context_parallel), trace_forbidden=True)


# ---- 找错：合并两块的部分结果 ----------------------------------------------------------------------------


def buggy_merge_partials(out_a: torch.Tensor, lse_a: torch.Tensor, out_b: torch.Tensor,
                         lse_b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """一个有错的合并（找错练习用，不要在别处使用）：``out_a``、``out_b`` ``(n, d)`` 是两块键各自的注意力输出
    （已按本块的 softmax 分母归一），``lse_a``、``lse_b`` ``(n,)`` 是各块分数的 log Σ e^s；返回合并后的 ``(out, lse)``。"""
    lse = torch.log(torch.exp(lse_a) + torch.exp(lse_b))  # (n,)：两块合起来的 log Σ e^s
    w_a = torch.exp(lse_a - lse)  # (n,)：块 a 在合并后的 softmax 里所占的份额
    w_b = torch.exp(lse_b - lse)  # (n,)
    return out_a * w_a[:, None] + out_b * w_b[:, None], lse


def _partial(s: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """一块键的部分结果：``s`` ``(n, b)``（被屏蔽处为 -inf）、``v`` ``(b, d)`` → 本块归一的输出 ``(n, d)`` 与 LSE ``(n,)``。
    整行都被屏蔽（或 b = 0）时输出 0、LSE = -inf——与环形注意力里整块被因果掩码挡住的查询相同。"""
    lse = torch.logsumexp(s, dim=-1) if s.shape[-1] else torch.full(s.shape[:-1], float("-inf"))  # (n,)
    empty = torch.isneginf(lse)  # (n,)
    weights = torch.exp(s - torch.where(empty, torch.zeros_like(lse), lse)[:, None])  # (n, b)：本块的 softmax
    return (weights @ v).masked_fill(empty[:, None], 0.0), lse  # (n, d), (n,)


def _safe_merge(out_a, lse_a, out_b, lse_b, *, normalise: bool = True, swap: bool = False):
    """参考的合并（float64），``normalise=False`` / ``swap=True`` 给出两种错法的输出。"""
    out_a, lse_a, out_b, lse_b = (x.double() for x in (out_a, lse_a, out_b, lse_b))
    m = torch.maximum(lse_a, lse_b)  # (n,)
    m = torch.where(torch.isneginf(m), torch.zeros_like(m), m)  # 两块都空时避免 -inf − (-inf)
    w_a, w_b = torch.exp(lse_a - m), torch.exp(lse_b - m)  # (n,)
    if swap:
        w_a, w_b = w_b, w_a
    total = w_a + w_b
    out = out_a * w_a[:, None] + out_b * w_b[:, None]  # (n, d)
    if normalise:
        out = out / torch.where(total == 0, torch.ones_like(total), total)[:, None]
    return out, m + torch.log(total)


def _merged_pair(got: Any, call: str, n: int, d: int) -> tuple[torch.Tensor, torch.Tensor]:
    if not isinstance(got, (tuple, list)) or len(got) != 2:
        raise Mistake(f"{call}：应返回两个张量 (out, lse)——合并后的输出和合并后的 LSE（下一块还要用它来合并），"
                      f"你返回的是 {type(got).__name__}", key="type")
    out, lse = as_tensor(got[0], f"{call}返回的 out"), as_tensor(got[1], f"{call}返回的 lse")
    if tuple(out.shape) != (n, d):
        raise Mistake(f"{call}：out 的形状应为 {(n, d)}，你的是 {tuple(out.shape)}", key="shape")
    if lse.numel() != n or lse.dim() > 2:  # (n,)，也接受 (n, 1)
        raise Mistake(f"{call}：lse 的形状应为 ({n},)，你的是 {tuple(lse.shape)}", key="shape")
    return out, lse.reshape(n)  # (n, d), (n,)


def _finite_where_needed(out, lse, want_lse, both_empty, call: str, level: float) -> None:
    """合并后的 out、lse 在该有限的地方有没有 NaN/inf：分数大时多半是 e^lse 上溢（或下溢），两块都空时多半是 -inf − (-inf)。
    ``level``：这组分数的量级（0 = 普通的分数）。"""
    finite = ~torch.isneginf(want_lse)  # (n,)：至少一块不空的行
    bad_rows = ~torch.isfinite(out).all(dim=-1) | (torch.isnan(lse) | torch.isposinf(lse))  # (n,)
    bad_rows |= finite & ~torch.isfinite(lse)
    if not bad_rows.any():
        return
    live = bad_rows & finite  # (n,)：本该有限的行坏了——分数大时先说上溢，它比“两块都空”的 NaN 更要紧
    r = int((live if level and live.any() else bad_rows & both_empty if (bad_rows & both_empty).any()
             else bad_rows).nonzero()[0, 0])
    if bool(finite[r]) and level > _FLOAT64_EXP_MAX:
        raise Mistake(f"{call}：第 {r} 行合并后出现了 inf 或 NaN（out 或 lse）。这组的 LSE 在 ±{level:g} 上下：e^lse 在 float32 里"
                      " lse > 88 就上溢成 inf、lse < −103 下溢成 0，float64 也只到 709 与 −745——换成更宽的类型救不了。"
                      "先减去 m = max(lse_a, lse_b)：lse = m + log(e^(lse_a − m) + e^(lse_b − m))，两个指数都 ≤ 0，"
                      "不会上溢，较大的那个恰好是 e^0 = 1，也不会全都下溢", key="overflow")
    if bool(finite[r]) and level:
        raise Mistake(f"{call}：第 {r} 行合并后出现了 inf 或 NaN（out 或 lse）。这组的分数很大（LSE 在几百），float32 的 e^lse "
                      "在 lse > 88 时就上溢成 inf。先减去 m = max(lse_a, lse_b)：lse = m + log(e^(lse_a − m) + e^(lse_b − m))，"
                      "两个指数都 ≤ 0，不会上溢", key="overflow")
    if bool(both_empty[r]):
        raise Mistake(f"{call}：第 {r} 行两块都被整块屏蔽（lse_a = lse_b = -inf），你的结果里有 NaN。m = -inf 时 "
                      "lse_a − m = -inf − (-inf) = NaN：像第 8 章 flash.py 的 _safe_max 那样，m 是 -inf 时用 0 代替；"
                      "两块都空时合并结果也是空的：out = 0，lse = -inf", key="both_empty")
    raise Mistake(f"{call}：第 {r} 行合并后出现了 NaN 或 inf", key="nonfinite")


def _compare_merge(got, want_out, want_lse, out_a, lse_a, out_b, lse_b, call: str, level: float) -> None:
    n, d = want_out.shape
    out, lse = _merged_pair(got, call, n, d)
    both_empty = torch.isneginf(lse_a) & torch.isneginf(lse_b)  # (n,)
    _finite_where_needed(out, lse, want_lse, both_empty, call, level)
    unnorm, lse_max = _safe_merge(out_a, lse_a, out_b, lse_b, normalise=False)
    swapped, _ = _safe_merge(out_a, lse_a, out_b, lse_b, swap=True)
    out_variants = [
        Variant("unweighted_mean", f"{call}：两块的输出不能直接平均：块 a 的权重是它在合并后的 softmax 里所占的份额 "
                "e^(lse_a − lse)，块 b 同理（两者和为 1）", (out_a.double() + out_b.double()) / 2),
        Variant("not_normalised", f"{call}：out_a·e^(lse_a − m) + out_b·e^(lse_b − m) 还要除以 e^(lse_a − m) + e^(lse_b − m)"
                "（即乘 e^(m − lse)）：两块的权重之和应为 1", unnorm),
        Variant("swapped", f"{call}：权重配反了：out_a 乘的是块 a 的份额 e^(lse_a − lse)", swapped),
    ]
    compare(out, want_out, variants=_distinct(out_variants, want_out), what=f"{call}合并后的 out", atol=1e-4, rtol=1e-4,
            default_hint=f"{call}：合并后的 out 应为 out_a·e^(lse_a − lse) + out_b·e^(lse_b − lse)")
    lse_variants = [
        Variant("lse_max", f"{call}：合并后的 LSE 不是 max(lse_a, lse_b)：log(e^a + e^b) = m + log(e^(a − m) + e^(b − m))，"
                "比最大值还多一项 log(…)", lse_max),
        Variant("lse_sum", f"{call}：LSE 是 log Σ e^s：两块合并是 e^lse 相加（log-add），不是 lse 相加",
                lse_a.double() + lse_b.double()),
    ]
    compare(lse, want_lse, variants=_distinct(lse_variants, want_lse), what=f"{call}合并后的 lse", atol=1e-3, rtol=1e-5,
            default_hint=f"{call}：合并后的 lse 应为 log(e^lse_a + e^lse_b)（用最大值稳住）")


_FLOAT64_EXP_MAX = 709.78  # e^x 在 float64 里 x 超过它就上溢（float32 是 88.7）


def _row_levels(g: torch.Generator, n: int, level: float) -> torch.Tensor:
    """每个查询（行）的分数量级 ``(n, 1)``：``level`` 超过 float64 的上溢界时正负各半（第 0 行为正、第 1 行为负）——
    ``exp`` 在 float64 里正的上溢、负的下溢，减一个常数也救不了；否则所有行都是 ``level``（0 = 普通的分数）。"""
    if level <= _FLOAT64_EXP_MAX:
        return torch.full((n, 1), level)
    signs = torch.where(torch.rand(n, generator=g) < 0.5, -1.0, 1.0)  # (n,)
    signs[0], signs[1 % n] = 1.0, -1.0
    return (signs * level)[:, None]  # (n, 1)


def _level_text(level: float, sep: str) -> str:
    if not level:
        return ""
    return f"{sep}分数在 ±{level:g} 上下（正负各半）" if level > _FLOAT64_EXP_MAX else f"{sep}分数在 {level:g} 上下"


def _huge_level(g: torch.Generator) -> float:
    """一个 float64 里也放不下 e^lse 的量级（> 709），又不到 1024：float32 在这里的舍入误差（6e-5）还小于检查的容差。"""
    return float(draw_choice(g, (760.0, 850.0, 940.0, 1000.0)))


def _positions(seq_len: int, world_size: int, layout: str) -> list[torch.Tensor]:
    """与 :func:`~tformer_lib.parallel.ring_attention.sequence_positions` 相同的切法（这里自己写，免得检查器依赖并行包）。"""
    pieces = world_size if layout == "contiguous" else 2 * world_size
    chunks = torch.arange(seq_len).chunk(pieces)
    if layout == "contiguous":
        return list(chunks)
    return [torch.cat([chunks[r], chunks[pieces - 1 - r]]) for r in range(world_size)]


def check_merge_partials(fn: Callable[..., Any], *, verbose: bool = True) -> CheckResult:
    """检查改好的 ``fn(out_a, lse_a, out_b, lse_b) -> (out, lse)``：``out_a``、``out_b`` ``(n, d)`` 是 n 个查询对两块键
    各自的注意力输出（各按本块的 softmax 归一），``lse_a``、``lse_b`` ``(n,)`` 是各块分数的 :math:`\\log\\sum e^{s}`；
    返回合并后的输出 ``(n, d)`` 与合并后的 LSE ``(n,)``，与对两块键一起做一次 softmax 注意力相同。
    整块被屏蔽的行给出的是 ``out = 0``、``lse = -inf``；两块都空时也返回 ``0`` 与 ``-inf``（环形注意力从这个“空”的状态开始）。
    输入都是 float32；有几组的 LSE 在 ±760…1000（同一组里正负各半）：``e^lse`` 在 float64 里也上溢、下溢，
    所以“换成 float64 再照原样算”或“减去一个常数”都不算改好（❌ ``overflow``）。

    禁用（❌ ``library_call``，直接、经由别名/``getattr``/默认参数/可调用对象/代码副本都算）：
    ``buggy_merge_partials`` 本身（题目给的错版本），``tformer_lib.parts.flash`` 的 ``tiled_attention``、``online_softmax``，
    ``F.scaled_dot_product_attention``，以及检查器自己的参考实现。``torch.logsumexp``、``torch.logaddexp`` 可以用。"""
    import torch.nn.functional as F

    def pairs(f):
        for i, g in enumerate(random_cases(6, seed=163)):
            n, d = draw_int(g, 2, 8), draw_int(g, 1, 8)
            b_a, b_b = draw_int(g, 1, 6), draw_int(g, 1, 6)
            # 第 0 组分数在 400 上下（e^lse 在 float32 里上溢）；第 1、4 组 LSE 在 ±760…1000（float64 里也上溢、下溢）
            level = 400.0 if i == 0 else _huge_level(g) if i in (1, 4) else 0.0
            s = torch.randn(n, b_a + b_b, generator=g) * (5.0 if level else 1.5) + _row_levels(g, n, level)  # (n, b_a + b_b)
            v = torch.randn(b_a + b_b, d, generator=g)  # (b_a + b_b, d)
            masked = torch.rand(n, b_a + b_b, generator=g) < 0.3  # (n, b_a + b_b)：随机屏蔽一些键
            if i >= 1:
                masked[0, :b_a] = True  # 第 0 行：块 a 整块被屏蔽
                masked[1, b_a:] = True  # 第 1 行：块 b 整块被屏蔽
            if i >= 2:
                masked[-1] = True  # 最后一行：两块都空
            s = s.masked_fill(masked, float("-inf"))
            out_a, lse_a = _partial(s[:, :b_a], v[:b_a])
            out_b, lse_b = _partial(s[:, b_a:], v[b_a:])
            want_out, want_lse = _partial(s.double(), v.double())  # 两块键一起做一次 softmax 注意力
            call = (f"合并 {n} 个查询对 {b_a} 个与 {b_b} 个键的两块部分结果（d={d}"
                    f"{_level_text(level, '，')}{'，有整块被屏蔽的行' if i >= 1 else ''}"
                    f"{'，最后一行两块都空' if i >= 2 else ''}）时")
            got = f(out_a.clone(), lse_a.clone(), out_b.clone(), lse_b.clone())
            _compare_merge(got, want_out, want_lse, out_a, lse_a, out_b, lse_b, call, level)

    def ring(f):
        for i, g in enumerate(random_cases(6, seed=164)):
            p, layout = draw_int(g, 2, 5), ("contiguous", "zigzag")[i % 2]
            n, d = 2 * draw_int(g, 1, 3), draw_int(g, 1, 8)
            rank = 0 if i == 0 else draw_int(g, 0, p - 1)
            # 第 1 组分数在 300 上下（float32 上溢）；第 3、4 组（之字形与顺序切法）LSE 在 ±760…1000（float64 也上溢、下溢）
            level = 300.0 if i == 1 else _huge_level(g) if i in (3, 4) else 0.0
            t = n * p
            positions = _positions(t, p, layout)
            scores = torch.randn(t, t, generator=g) * (5.0 if level else 1.0) + _row_levels(g, t, level)  # (T, T)
            scores = scores.masked_fill(torch.ones(t, t, dtype=torch.bool).triu(1), float("-inf"))  # 因果
            v = torch.randn(t, d, generator=g)  # (T, d)
            q_pos = positions[rank]
            out = torch.zeros(n, d)  # (n, d)：还没见过任何键
            lse = torch.full((n,), float("-inf"))  # (n,)
            for step in range(p):
                source = (rank - step) % p  # 这一步手里是进程 source 的 K/V 块
                s_blk = scores[q_pos][:, positions[source]]  # (n, n)
                out_b, lse_b = _partial(s_blk, v[positions[source]])
                call = (f"环形注意力（p={p}、{layout} 切法、进程 {rank}、每进程 {n} 个位置、d={d}"
                        f"{_level_text(level, '、')}）第 {step + 1} 步并入进程 {source} 的块时")
                want_out, want_lse = _safe_merge(out, lse, out_b, lse_b)
                got = f(out.clone(), lse.clone(), out_b.clone(), lse_b.clone())
                _compare_merge(got, want_out, want_lse, out.double(), lse.double(), out_b, lse_b, call, level)
                out, lse = (x.detach().to(torch.float32) for x in _merged_pair(got, call, n, d))
            want = torch.softmax(scores[q_pos].double(), dim=-1) @ v.double()  # (n, d)：整条序列一次注意力
            compare(out, want, what=f"p={p}、{layout} 切法的进程 {rank} 沿环并完全部 {p} 块之后的输出", atol=1e-4, rtol=1e-4,
                    default_hint="一块块合并的结果应与整条序列一次 softmax 注意力的对应行相同")

    from tformer_lib.parts.flash import online_softmax, tiled_attention

    return run_checks("合并两块注意力的部分结果", fn,
                      [("6 组随机的两块（含 LSE 在几百与 ±1000 上下的大分数、整块被屏蔽、两块都空的行）", pairs),
                       ("6 次沿环逐块合并（顺序与之字形切法、因果掩码、含大分数），与整条序列的注意力相同", ring)],
                      verbose=verbose, forbidden=(buggy_merge_partials, tiled_attention, online_softmax,
                                                  F.scaled_dot_product_attention, _partial, _safe_merge),
                      trace_forbidden=True)


# ---- 预测再验证：容量因子为 c 时丢掉几份任务 -------------------------------------------------------------


def _dropped_with(loads: list[int], capacity: int) -> int:
    return sum(max(0, load - capacity) for load in loads)


def check_predict_dropped(fn: Callable[..., Any], *, verbose: bool = True) -> CheckResult:
    """检查 ``fn(loads, top_k, capacity_factor) -> int``：``loads`` 是长度 E 的 Python 整数列表，``loads[e]`` = 路由器分给
    专家 e 的任务数（每个词元 ``top_k`` 份，所以 ``sum(loads) = N·k``）；预测容量因子为 ``capacity_factor`` 时，
    按容量分派一共丢掉几份任务。检查器真的跑一个（有偏斜的）路由器，用 ``within_capacity`` 与 ``plan_dispatch`` 分派，
    把数出的丢弃数与读者的预测对照。

    禁用（❌ ``library_call``）：``tformer_lib.moe`` 里的所有函数与类（``expert_capacity``、``within_capacity``、
    ``plan_dispatch``、``TopKRouter``……），直接、经由别名/``getattr``/可调用对象/代码副本，或经由别的库代码执行到都算。"""
    from tformer_lib import moe

    def runs(f):
        for i, g in enumerate(random_cases(8, seed=165)):
            n_experts = 8 if i < 2 else draw_choice(g, (2, 4, 8, 16))
            k = 2 if i < 2 else draw_int(g, 1, 2)
            n = (64, 32)[i] if i < 2 else draw_int(g, 8, 160)
            c = (1.25, 1.0)[i] if i < 2 else draw_choice(g, (0.5, 1.0, 1.25, 1.5, 2.0))  # 二进制里精确的数，免得舍入
            skew = (0.0, 8.0)[i] if i < 2 else draw_choice(g, (0.0, 1.0, 2.0, 4.0))  # 第二组：几乎全挤向专家 0
            d = 16
            router = moe.TopKRouter(d, n_experts, k)
            with torch.no_grad():
                router.gate.weight.copy_(torch.randn(n_experts, d, generator=g) * 0.5)  # (E, d)
                hot = torch.randn(d, generator=g)
                hot = hot / hot.norm()  # (d,)：专家 0 偏爱的方向
                router.gate.weight[0] += skew * hot
                x = torch.randn(n, d, generator=g) + skew * hot  # (N, d)：词元也偏向那个方向
                routing = router(x)
            loads = torch.bincount(routing.experts.flatten(), minlength=n_experts).tolist()  # E 个整数
            capacity = moe.expert_capacity(n, n_experts, k, c)
            plan = moe.plan_dispatch(routing, moe.within_capacity(routing.experts, n_experts, capacity))
            want = plan.dropped  # 真的分派时丢掉的任务数
            assert want == _dropped_with(loads, capacity)  # 参考答案的自检：丢弃数只取决于负载与容量
            total = sum(loads)
            call = f"predict_dropped(loads={loads}, top_k={k}, capacity_factor={c})"
            variants = [
                Variant("floor", f"{call}：容量向上取整：C = ⌈c·N·k/E⌉（{c}·{total}/{n_experts} 不是整数时多留一个位置）",
                        _dropped_with(loads, math.floor(c * total / n_experts))),
                Variant("extra_k", f"{call}：sum(loads) 已经是 N·k 份任务（每个词元 {k} 份）：C = ⌈c·N·k/E⌉ = ⌈c·sum(loads)/E⌉，"
                        "不要再乘一次 k", _dropped_with(loads, math.ceil(c * total * k / n_experts))),
                Variant("no_top_k", f"{call}：容量按任务算，不按词元算：C = ⌈c·N·k/E⌉，N = sum(loads)/k = {total // k} 个词元、"
                        f"每个 {k} 份", _dropped_with(loads, math.ceil(c * total / k / n_experts))),
                Variant("total_excess", f"{call}：空闲专家的余量不能让给别的专家：每个专家单独算 max(0, load_e − C) 再相加，"
                        "不是 max(0, 总任务数 − E·C)", max(0, total - n_experts * capacity)),
                Variant("kept", f"{call}：要的是丢掉的任务数，不是保留下来的", total - want),
            ]
            compare_number(as_int(f(list(loads), k, c), f"{call} 的返回值"), want, variants=_distinct(variants, want),
                           what=f"{call} 的返回值", rtol=0, atol=0,
                           default_hint=f"{call} 应为 {want}：先求每个专家的容量 C = ⌈c·N·k/E⌉，"
                                        "再把每个专家超出 C 的任务数加起来")

    forbidden = tuple(getattr(moe, name) for name in moe.__all__)
    return run_checks("容量因子与丢弃的任务", fn,
                      [("8 次真实的路由与分派（随机的 E、k、N、容量因子与偏斜，含几乎全挤向一个专家的路由）", runs)],
                      verbose=verbose, forbidden=forbidden, trace_forbidden=True)


# ---- 实现：缩放后的 RoPE 频率 -------------------------------------------------------------------------------


def check_scaled_rope_frequencies(fn: Callable[..., Any], *, verbose: bool = True) -> CheckResult:
    """检查 ``fn(d, base, kind, factor) -> theta``：每头维度 ``d``（偶数）、RoPE 的 ``base``，``kind`` 为 ``"linear"``
    （位置插值：所有频率除以 s）或 ``"ntk"``（NTK-aware：base 换成 :math:`b\\,s^{d/(d-2)}`），``factor`` = s；
    返回缩放后的 d/2 个频率 :math:`\\theta'_i` ``(d/2,)``（未缩放时 :math:`\\theta_i = b^{-2i/d}`）。
    与 :func:`~tformer_lib.parts.rope_scaling.rope_frequencies` 比较。

    禁用（❌ ``library_call``）：``tformer_lib.parts.rope_scaling`` 里的 ``rope_frequencies``、``scaled_rope_angles``、
    ``yarn_attention_factor``、``RopeScaling``，``tformer_lib.parts.positional`` 的 ``rope_angles``、``apply_rope``、
    ``RopeTables``——直接、经由别名/``getattr``/默认参数/可调用对象/代码副本，或经由别的库代码执行到它们都算：
    ``LMConfig(rope_scaling=…)``（它构造 ``RopeScaling``、调用 ``rope_frequencies``）、``make_lm(cfg).rope_tables(…)``、
    注意力层里的 RoPE 表都走这几条路。"""
    from tformer_lib.parts import rope_scaling

    def cases(f):
        for i, g in enumerate(random_cases(8, seed=166)):
            if i < 2:  # LLaMA 式的 d = 128、base = 10000，上下文拉长 4 倍
                d, base, kind, s = 128, 10000.0, ("linear", "ntk")[i], 4.0
            else:
                d = 2 * draw_int(g, 2, 64)
                base = draw_choice(g, (10000.0, 500000.0, 1000000.0, 100.0))
                kind = ("linear", "ntk")[i % 2]
                s = draw_choice(g, (1.0, 1.5, 2.0, 8.0, 16.0))
            want, _ = rope_scaling.rope_frequencies(d, base, rope_scaling.RopeScaling(kind, s))  # (d/2,)
            theta = base ** -(torch.arange(0, d, 2, dtype=torch.float64) / d)  # (d/2,)
            exps = torch.arange(0, d, 2, dtype=torch.float64) / d  # (d/2,)：2i/d
            call = f"scaled_frequencies(d={d}, base={base:g}, kind={kind!r}, factor={s:g})"
            got = f(d, base, kind, s)
            if isinstance(got, torch.Tensor) and tuple(got.shape) == (d,):
                raise Mistake(f"{call}：应返回 d/2 = {d // 2} 个频率（每对维度一个），你的是 {d} 个", key="shape")
            variants = [
                Variant("linear_multiplied", f"{call}：位置插值把位置 t 当作 t/s，频率要除以 s，不是乘以 s", theta * s),
                Variant("ntk_is_pi", f"{call}：NTK-aware 不是把所有频率除以 s（那是位置插值）：它只换 base，"
                        "b' = b·s^(d/(d−2))，最高频（i = 0）不变", theta / s),
                Variant("ntk_no_exponent", f"{call}：NTK-aware 的新 base 是 b·s^(d/(d−2))，不是 b·s——指数 d/(d−2) 让最低频"
                        "恰好被除以 s", (base * s) ** -exps),
                Variant("ntk_exponent_inverted", f"{call}：指数是 d/(d−2)，不是 (d−2)/d", (base * s ** ((d - 2) / d)) ** -exps),
                Variant("exponent", f"{call}：第 i 对维度的频率是 b^(−2i/d)（i = 0 … d/2−1），指数里的 2i 别写成 i",
                        want.sqrt() * (s ** -0.5 if kind == "linear" else 1.0)),
                Variant("unscaled", f"{call}：这是没有缩放的频率 b^(−2i/d)：还要按 kind 缩放", theta),
            ]
            compare(got, want, variants=_distinct(variants, want), what=f"{call}的结果", atol=1e-12, rtol=1e-5,
                    default_hint=f"{call}：linear 是 θ_i / s；ntk 是 (b·s^(d/(d−2)))^(−2i/d)")

    from tformer_lib.parts.positional import RopeTables, apply_rope, rope_angles

    return run_checks("缩放后的 RoPE 频率", fn, [("8 组随机的 d、base、缩放方式与倍数（含 d = 128、s = 4）", cases)],
                      verbose=verbose, forbidden=(rope_scaling.rope_frequencies, rope_scaling.scaled_rope_angles,
                                                  rope_scaling.yarn_attention_factor, rope_scaling.RopeScaling,
                                                  rope_angles, apply_rope, RopeTables), trace_forbidden=True)
