"""第 13 章（推理服务）练习的检查器，和“找错”题里那段有错的代码。

- :func:`check_prefix_cache_blocks`（推导并核对）：开着前缀缓存依次接纳几条提示，一共占几块——
  与真的 :class:`~tformer_lib.serving.BlockManager` 分配出的块数比较；
- :func:`check_linear_intensity`（推导并核对）：批大小为 B 的一个线性层的算术强度（FLOP/字节）——
  FLOPs 用 ``FlopCounterMode`` 实测，字节数取真实张量的大小；
- :func:`check_tokens_per_pass_distribution`（推导并核对）：接受率 α、每次猜 k 个时，一次验证产出 n 个词元的概率；
- :func:`buggy_accept` + :func:`check_accept`（找错）：推测解码的接受规则在第一个分歧之后还接着接受——
  用读者改好的规则在一个小的随机模型上跑推测解码，逐词元对照只用目标模型的贪心生成；

每个检查器都在多组随机情形上调用读者的函数（写死的答案过不了），接受任何正确的数值类型，
桩（stub）→ “⏳ 尚未完成”，不抛异常。
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from tformer_lib.exercises._core import (
    CheckResult,
    Mistake,
    Variant,
    as_int,
    as_number,
    as_tensor,
    compare_number,
    draw_choice,
    draw_int,
    random_cases,
    run_checks,
)
from tformer_lib.lm.config import LMConfig

__all__ = [
    "check_prefix_cache_blocks",
    "check_linear_intensity",
    "check_tokens_per_pass_distribution",
    "buggy_accept",
    "check_accept",
]


# ---- 推导并核对：前缀缓存下一共占几块 --------------------------------------------------------------------


def _measured_prefix_blocks(prompts: Sequence[Sequence[int]], block_size: int) -> int:
    """真的用 :class:`~tformer_lib.serving.BlockManager` 依次接纳 ``prompts``（像引擎那样：先分配，再登记前缀块），
    返回此刻占用的块数。"""
    from tformer_lib.serving.block_manager import BlockManager

    manager = BlockManager(num_blocks=sum(-(-len(p) // block_size) for p in prompts) + 1, block_size=block_size,
                           prefix_caching=True)
    for seq_id, prompt in enumerate(prompts):
        manager.allocate(seq_id, list(prompt))
        manager.register_prefix(seq_id, list(prompt))
    return manager.used_blocks


def _common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def _shared_by(p: list[int], b: int, seen) -> int:
    """从第 0 块起，``seen(j, 第 j 块的词元)`` 为真的块一直共用到第一次为假（至多 ⌊(L−1)/b⌋ 块）。"""
    n = 0
    while n < (len(p) - 1) // b and seen(n, tuple(p[n * b:(n + 1) * b])):
        n += 1
    return n


def _prefix_variants(prompts: list[list[int]], b: int) -> list[tuple[str, str, int]]:
    """几种错误的规则各会得到多少块（检查器据此给提示）。"""
    def total(shared_blocks) -> int:
        return sum(-(-len(p) // b) - shared_blocks(i, p) for i, p in enumerate(prompts))

    def best(i, p, how) -> int:
        return max((how(p, q) for q in prompts[:i]), default=0)

    def same_blocks(p, q) -> int:  # 按块的内容比，不管它前面的块是否相同
        return sum(1 for j in range(min(len(p), len(q)) // b) if p[j * b:(j + 1) * b] == q[j * b:(j + 1) * b])

    return [
        ("no_sharing", "这是不共用任何块的块数：后接纳的请求若与先前的提示开头相同，写满的那几块直接共用，不再分配",
         total(lambda i, p: 0)),
        ("partial_block", "只有**写满**的块才共用：相同的开头没写满的最后一块里，后面的位置各写各的字，要各自分配一块",
         total(lambda i, p: min((len(p) - 1) // b, -(-best(i, p, _common_prefix) // b)))),
        ("last_token", "提示的最后一个词元总要自己算一遍（它的输出是第一个新词元的 logits）：与先前某条提示完全相同、"
         "长度又恰好是块大小的倍数时，最后那一块也要新分配",
         total(lambda i, p: best(i, p, _common_prefix) // b)),
        ("block_content", "共用按**整段前缀**查找，不是按单独一块的内容：一块只有在它前面的所有块也相同时才能共用"
         "（同样几个字，前文不同，算出的 K/V 也不同）",
         total(lambda i, p: min((len(p) - 1) // b, best(i, p, same_blocks)))),
        ("content_anywhere", "块不是按内容查找的：同样几个字出现在另一条提示的别的位置（或同一位置但前文不同），算出的 K/V 都不同。"
         "登记的键是从开头到这一块末尾的整段词元",
         total(lambda i, p: _shared_by(p, b, lambda j, blk: any(blk == tuple(q[k * b:(k + 1) * b])
                                                               for q in prompts[:i] for k in range(len(q) // b))))),
        ("mixed_prefixes", "前缀不能东拼西凑：第 0 块与一条提示相同、第 1 块与另一条相同，合起来的这段前缀谁也没算过。"
         "共用的几块必须来自同一条先前提示的同一段开头",
         total(lambda i, p: _shared_by(p, b, lambda j, blk: any(blk == tuple(q[j * b:(j + 1) * b])
                                                               for q in prompts[:i] if len(q) >= (j + 1) * b)))),
        ("previous_only", "不只和紧挨着的前一条比：先前接纳的任何一条提示登记过的前缀块都能共用",
         total(lambda i, p: min((len(p) - 1) // b, _common_prefix(p, prompts[i - 1]) // b) if i else 0)),
    ]


def _prefix_cases(g: torch.Generator, i: int) -> tuple[list[list[int]], int]:
    """第 0–5 组是专门设计的（完全相同的提示、前文不同而某一块相同、没写满的相同开头、与更早的一条共用得更多、
    同样的内容换了位置、两条提示的块拼成的前缀），其余随机。"""
    b = draw_choice(g, (2, 3, 4, 8))

    def tokens(n: int) -> list[int]:
        return torch.randint(4, 60, (n,), generator=g).tolist()

    if i == 0:  # 完全相同、长度恰为块大小的整数倍
        p = tokens(b * draw_int(g, 2, 3))
        return [p, list(p), tokens(b)], b
    if i == 1:  # 第二块相同、第一块不同
        second = tokens(b)
        return [tokens(b) + second + tokens(1), tokens(b) + second + tokens(2)], b
    if i == 2:  # 相同的开头没写满一块；第三条与第一条（不是第二条）开头相同
        head = tokens(b + b // 2)
        return [head + tokens(b), tokens(2 * b), head + tokens(b)], b
    if i == 3:  # 第三条与第一条共用两块、与紧挨着的第二条只共用一块
        first, a, c = tokens(b), tokens(b), tokens(b)
        return [first + a + tokens(1), first + c + tokens(1), first + a + tokens(2)], b
    if i == 4:  # 第一条第 1 块的内容，正是第二条的第 0 块
        a, c = tokens(b), tokens(b)
        return [tokens(b) + a + tokens(1), a + c + tokens(1)], b
    if i == 5:  # 第三条的第 0 块同第一条、第 1 块同第二条：拼起来的前缀谁也没算过
        a, c, d, e = tokens(b), tokens(b), tokens(b), tokens(b)
        c[0], d[0], e[0] = a[0] + 1, a[0] + 2, a[0] + 3  # 各块开头互不相同：相同的开头只有整块 a
        return [a + c + tokens(1), d + e + tokens(1), a + e + tokens(1)], b
    stems = [tokens(draw_int(g, 1, 3 * b)) for _ in range(2)]
    prompts = []
    for _ in range(draw_int(g, 2, 5)):
        if prompts and draw_int(g, 0, 3) == 0:
            prompts.append(list(prompts[draw_int(g, 0, len(prompts) - 1)]))  # 与先前某条完全相同
        else:
            prompts.append(draw_choice(g, stems) + tokens(draw_int(g, 0, 2 * b)))
    return prompts, b


def check_prefix_cache_blocks(fn: Callable[..., Any], *, verbose: bool = True) -> CheckResult:
    """检查 ``fn(prompts, block_size) -> int``：开着前缀缓存，依次接纳 ``prompts``（每条是词元 id 的列表，
    都还没生成新词元）之后一共占几块。与真的 :class:`~tformer_lib.serving.BlockManager` 分配出的块数比较。"""

    def cases(f):
        rows = []
        for i, g in enumerate(random_cases(10, seed=131)):
            prompts, b = _prefix_cases(g, i)
            want = _measured_prefix_blocks(prompts, b)
            shown = [len(p) for p in prompts]
            call = f"prefix_cache_blocks(prompts, block_size={b})（第 {i} 组，{len(prompts)} 条提示，长度 {shown}）"
            variants = [Variant(key, f"{call} 实测占 {want} 块。{hint}", value)
                        for key, hint, value in _prefix_variants(prompts, b)]
            rows.append((call, want, variants, f([list(p) for p in prompts], b)))
        # 一个错误规则在某一组里可能碰巧与另一种同值：只给在*每一组*都与读者的答案吻合的那种规则的提示
        # （读者答对的组里，那种规则也必须给出对的数）
        consistent = None
        for call, want, variants, raw in rows:
            try:
                got = as_number(raw, call)
            except Mistake:
                continue
            keys = {v.key for v in variants if got == v.value}
            consistent = keys if consistent is None else consistent & keys
        for call, want, variants, raw in rows:
            compare_number(as_int(raw, f"{call} 的返回值"), want,
                           variants=[v for v in variants if v.value != want and v.key in (consistent or ())],
                           what=f"{call} 的返回值", default_hint=f"{call} 实测占 {want} 块")

    return run_checks("前缀缓存下一共占几块", fn, [("10 组提示（6 组专门设计、4 组随机）与块大小", cases)],
                      verbose=verbose, forbidden=_cache_answers(), trace_forbidden=True)


def _cache_answers() -> tuple:
    """推导题要读者自己数出来：真的建一个块管理器（或缓存、引擎）再去量就绕过了推导，检查器不收。"""
    from tformer_lib.serving.block_manager import BlockManager
    from tformer_lib.serving.engine import Engine
    from tformer_lib.serving.paged_cache import PagedKVCache

    return (PagedKVCache, BlockManager, Engine)


# ---- 推导并核对：一个线性层的算术强度 --------------------------------------------------------------------


def _measured_linear(batch: int, d_in: int, d_out: int, dtype: torch.dtype) -> tuple[int, int]:
    """``Y = X Wᵀ``（``nn.Linear``，无偏置）：FlopCounterMode 数出的 FLOPs，和 X、W、Y 三个张量的字节数之和。"""
    from torch.utils.flop_counter import FlopCounterMode

    layer = torch.nn.Linear(d_in, d_out, bias=False, device="meta", dtype=dtype)  # meta：只有形状，不真的算
    x = torch.empty(batch, d_in, device="meta", dtype=dtype)
    with FlopCounterMode(display=False) as counter:
        y = layer(x)
    n_bytes = layer.weight.nbytes + x.nbytes + y.nbytes
    return int(counter.get_total_flops()), n_bytes


def check_linear_intensity(fn: Callable[..., Any], *, verbose: bool = True) -> CheckResult:
    """检查 ``fn(batch, d_in, d_out, bytes_per_element) -> float``：``batch`` 个词元一起过一个无偏置线性层
    ``(d_in → d_out)`` 的算术强度 = FLOPs ÷（读权重 + 读输入 + 写输出的字节数）。FLOPs 由 ``FlopCounterMode`` 实测。"""
    dtypes = {4: torch.float32, 2: torch.bfloat16}

    def cases(f):
        for i, g in enumerate(random_cases(8, seed=132)):
            batch = (1, 1024)[i] if i < 2 else 2 ** draw_int(g, 0, 8)
            d_in, d_out = 64 * draw_int(g, 1, 16), 64 * draw_int(g, 1, 16)
            e = draw_choice(g, (4, 2))
            flops, n_bytes = _measured_linear(batch, d_in, d_out, dtypes[e])
            want = flops / n_bytes
            weights = d_in * d_out * e
            call = f"linear_intensity(batch={batch}, d_in={d_in}, d_out={d_out}, bytes_per_element={e})"
            variants = [
                Variant("weights_only", "只算了读权重的字节：输入 X 与输出 Y 也要在内存里走一趟（批大时它们不可忽略）",
                        flops / weights),
                Variant("no_weights", "权重也要从内存里读一遍：解码时它正是字节数的大头", flops / (n_bytes - weights)),
                Variant("flops_without_2", "一次乘加算 2 次浮点运算：FLOPs = 2·B·d_in·d_out", want / 2),
                Variant("per_element", f"分母要的是字节：元素个数还要乘每个元素的 {e} 字节", want * e),
                Variant("bytes_per_token", "分母是整批一次前向搬动的总字节，不是每个词元的", flops / (n_bytes / batch)),
            ]
            variants = [Variant(v.key, f"{call} 应为 {want:.6g} FLOP/字节。{v.hint}", v.value) for v in variants]
            compare_number(f(batch, d_in, d_out, e), want, variants=[v for v in variants if abs(v.value - want) > 1e-9],
                           what=f"{call} 的返回值", rtol=1e-6,
                           default_hint=f"{call} 应为 {want:.6g} FLOP/字节（FLOPs {flops}，字节 {n_bytes}）")

    from torch.utils.flop_counter import FlopCounterMode

    from tformer_lib.measurement.costs import measure_flops
    from tformer_lib.measurement.profiling import count_training_flops

    return run_checks("线性层的算术强度", fn, [("8 组随机的批大小、维度与精度（含 B=1 与 B=1024）", cases)],
                      verbose=verbose, forbidden=(FlopCounterMode, measure_flops, count_training_flops))


# ---- 推导并核对：一次验证产出 n 个词元的概率 -------------------------------------------------------------


def _tolerance(x: Any) -> float:
    """读者返回的数的精度：float16/bfloat16/float32 的张量或数组本身就只能精确到那么多位，按它的 eps 放宽比较。"""
    eps = 0.0
    if isinstance(x, torch.Tensor) and x.is_floating_point():
        eps = torch.finfo(x.dtype).eps
    elif getattr(getattr(x, "dtype", None), "kind", None) == "f":  # NumPy 数组
        eps = float(__import__("numpy").finfo(x.dtype).eps)
    return max(1e-9, 8 * eps) if eps > 1e-12 else 1e-9


def _as_vector(x: Any, what: str) -> torch.Tensor:
    if isinstance(x, str):
        raise Mistake(f"{what}应是 k+1 个概率组成的列表（或张量），你返回的是字符串 {x!r:.40}：直接 return 数值本身",
                      key="string")
    if isinstance(x, (list, tuple)):
        return torch.tensor([as_number(v, f"{what}的第 {i} 项") for i, v in enumerate(x)], dtype=torch.float64)
    return as_tensor(x, what).to(torch.float64).flatten()


def _distribution(alpha: float, k: int) -> torch.Tensor:
    """P(n) = α^{n−1}(1−α)（n = 1…k），P(k+1) = α^k。"""
    p = [alpha ** (n - 1) * (1 - alpha) for n in range(1, k + 1)] + [alpha**k]
    return torch.tensor(p, dtype=torch.float64)


def check_tokens_per_pass_distribution(fn: Callable[..., Any], *, verbose: bool = True) -> CheckResult:
    """检查 ``fn(alpha, k) -> 长 k+1 的序列``：第 n−1 项是“一次验证恰好产出 n 个词元”的概率（n = 1 … k+1），
    设每个草稿词元各自以概率 α 与目标一致（相互独立）。列表、元组、张量、数组都行。"""

    def cases(f):
        for i, g in enumerate(random_cases(8, seed=133)):
            k = draw_int(g, 1, 7)
            alpha = {6: 0.0, 7: 1.0}.get(i, round(0.05 + 0.9 * float(torch.rand((), generator=g)), 3))  # 两端放在最后
            want = _distribution(alpha, k)
            call = f"tokens_per_pass_distribution(alpha={alpha}, k={k})"
            raw = f(alpha, k)
            got, tol = _as_vector(raw, f"{call} 的返回值"), _tolerance(raw)
            if got.shape != want.shape:
                extra = "（n 从 1 到 k+1：最少 1 个——第一个分歧处目标自己的词元；最多 k+1 个——全部接受再白得一个）"
                raise Mistake(f"{call} 应有 k+1 = {k + 1} 项，你的有 {got.numel()} 项{extra}", key="length")
            if torch.allclose(got, want, atol=tol, rtol=max(1e-7, tol)):
                continue
            geometric = torch.tensor([alpha ** (n - 1) * (1 - alpha) for n in range(1, k + 2)], dtype=torch.float64)
            shifted = torch.tensor([alpha**n * (1 - alpha) for n in range(1, k + 1)] + [alpha ** (k + 1)],
                                   dtype=torch.float64)
            swapped = _distribution(1 - alpha, k)
            for value, key, hint in (
                (geometric, "untruncated", "全部 k 个草稿都被接受时验证就停了（再白得目标的 1 个）：最后一项是 α^k，"
                                            "不是 α^k(1−α)——否则概率之和不到 1"),
                (shifted, "off_by_one", "即使第一个草稿就被拒绝，也会产出 1 个词元（目标自己的选择）：P(1) = 1 − α"),
                (swapped, "swapped", "α 是“接受”的概率：接受 n−1 个再在第 n 个拒绝，概率 α^{n−1}(1−α)"),
            ):
                if torch.allclose(got, value, atol=tol, rtol=max(1e-7, tol)) and not torch.allclose(value, want):
                    raise Mistake(f"{call} 返回 {[round(float(v), 4) for v in got]}。{hint}", key=key)
            total = float(got.sum())
            if abs(total - 1) > max(1e-6, len(got) * tol):
                raise Mistake(f"{call} 的各项之和是 {total:.6g}，概率分布之和应为 1", key="not_normalized")
            raise Mistake(f"{call} 应为 {[round(float(v), 4) for v in want]}，你的是 {[round(float(v), 4) for v in got]}",
                          key="values")

    def mean(f):
        for g in random_cases(3, seed=134):
            k, alpha = draw_int(g, 1, 6), round(0.1 + 0.8 * float(torch.rand((), generator=g)), 3)
            raw = f(alpha, k)
            p, tol = _as_vector(raw, f"tokens_per_pass_distribution(alpha={alpha}, k={k}) 的返回值"), _tolerance(raw)
            got = float((torch.arange(1, k + 2, dtype=torch.float64) * p).sum())
            want = (1 - alpha ** (k + 1)) / (1 - alpha)
            compare_number(got, want, what=f"α={alpha}、k={k} 时你的分布的均值", rtol=max(1e-7, (k + 1) * tol),
                           default_hint=f"均值 Σ n·P(n) 应等于 (1−α^(k+1))/(1−α) = {want:.6g}，你的是 {got:.6g}")

    return run_checks("一次验证产出几个词元", fn,
                      [("8 组随机的 α 与 k（含 α = 0 与 α = 1）", cases), ("3 组随机的 α（0.1–0.9）与 k：均值与闭式公式 (1−α^(k+1))/(1−α) 一致", mean)],
                      verbose=verbose)


# ---- 找错：推测解码的接受规则 ----------------------------------------------------------------------------


def buggy_accept(proposal: Sequence[int], choices: Sequence[int]) -> list[int]:
    """一个有错的接受规则（第 13 章“找错”练习用，不要在别处使用）。

    ``proposal``：草稿猜的 k 个词元 d_1 … d_k；``choices``：目标模型一次前向在 k+1 个位置上的贪心选择 t_1 … t_{k+1}。
    应返回这次验证确认的新词元。
    """
    accepted = [d for d, t in zip(proposal, choices) if d == t]  # 与目标一致的草稿词元都接受
    return accepted + [choices[len(accepted)]]  # 再接上目标自己的下一个词元


def _tokens(x: Any, what: str) -> list[int]:
    if isinstance(x, torch.Tensor):
        x = x.flatten().tolist()
    if isinstance(x, (str, bytes)) or not isinstance(x, (list, tuple)):
        try:
            import numpy as np

            if isinstance(x, np.ndarray):
                return [as_int(v, f"{what}的第 {i} 项") for i, v in enumerate(x.flatten().tolist())]
        except ImportError:  # pragma: no cover
            pass
        raise Mistake(f"{what}应是词元 id 的列表，你返回的是 {type(x).__name__}", key="type")
    return [as_int(v, f"{what}的第 {i} 项") for i, v in enumerate(x)]


def _reference_accept(proposal, choices):
    n = 0
    while n < len(proposal) and proposal[n] == choices[n]:
        n += 1
    return list(proposal[:n]) + [choices[n]]


def _accept_variants(proposal, choices) -> list[Variant]:
    n = len(_reference_accept(proposal, choices)) - 1
    return [
        Variant("keeps_after_mismatch", "第一个分歧之后的草稿词元是在错误的前文上猜的，即使与目标的选择碰巧相同也不能接受："
                "从头数连续相同的最长前缀，到第一个分歧为止", buggy_accept(proposal, choices)),
        Variant("no_bonus", "全部 k 个草稿都被接受时，目标在第 k+1 个位置的选择也是对的，白得一个词元：别丢了它",
                list(proposal[:n]) + ([choices[n]] if n < len(proposal) else [])),
        Variant("no_correction", "接受的前缀之后还要接上目标自己在那个位置的选择 t_{n+1}（改正，或全部接受时白得的一个）："
                "每次验证至少前进 1 个词元", list(proposal[:n])),
        Variant("wrong_index", "接在接受的 n 个词元后面的是目标在第 n+1 个位置的选择 choices[n]（下标从 0 数）",
                list(proposal[:n]) + [choices[min(n + 1, len(choices) - 1)]]),
    ]


def _list_cases(g: torch.Generator, first: bool) -> tuple[list[int], list[int]]:
    k = draw_int(g, 2, 6)
    choices = [draw_int(g, 4, 30) for _ in range(k + 1)]
    proposal = list(choices[:k])
    kind = 1 if first else draw_int(g, 0, 2)  # 第一组总有分歧：全部接受时“忘了改正”与“忘了白得的词元”分不清
    if kind > 0:  # 在某处分歧（kind == 2：分歧之后又碰巧一致）
        at = draw_int(g, 0, k - 2) if kind == 2 else draw_int(g, 0, k - 1)
        proposal[at] = choices[at] + 31
    return proposal, choices


def _speculate(accept, target, draft, prompt: list[int], n_new: int, k: int) -> list[int]:
    """不带缓存的贪心推测解码（检查器用的最小版本）：每轮草稿猜 k 个，目标一次前向，交给 ``accept`` 决定前进几个。"""
    from tformer_lib.lm.generate import next_token_distribution

    def greedy(logits):  # 与 generate(method="greedy") 相同：屏蔽 PAD、BOS 后取最大
        return next_token_distribution(logits, 1.0, None, None).argmax(dim=-1).tolist()

    seq = list(prompt)
    while len(seq) - len(prompt) < n_new:
        n_draft = min(k, n_new - (len(seq) - len(prompt)) - 1)
        proposal: list[int] = []
        for _ in range(n_draft):
            proposal += greedy(draft(torch.tensor([seq + proposal]))[:, -1])
        choices = greedy(target(torch.tensor([seq + proposal]))[0, -(n_draft + 1):])
        new = _tokens(accept(list(proposal), list(choices)), f"accept(proposal={proposal}, choices={choices}) 的返回值")
        want = _reference_accept(proposal, choices)
        if new != want:
            raise Mistake(f"在模型上跑推测解码时，accept(proposal={proposal}, choices={choices}) 返回 {new}，"
                          f"而目标模型逐个贪心生成会接着产出 {want}", key="model_mismatch")
        seq += new
    return seq[len(prompt):][:n_new]


def check_accept(fn: Callable[..., Any], *, verbose: bool = True) -> CheckResult:
    """检查改好的 ``fn(proposal, choices) -> list[int]``：先在随机的草稿/目标选择上与正确规则比较，再在小的随机
    目标模型（草稿 = 它的前几块）上跑推测解码，输出必须与只用目标模型的贪心生成逐词元相同。"""

    def lists(f):
        for i, g in enumerate(random_cases(10, seed=135)):
            proposal, choices = _list_cases(g, i == 0)
            call = f"accept(proposal={proposal}, choices={choices})"
            got = _tokens(f(list(proposal), list(choices)), f"{call} 的返回值")
            want = _reference_accept(proposal, choices)
            if got == want:
                continue
            for v in _accept_variants(proposal, choices):
                if got == v.value and v.value != want:
                    raise Mistake(f"{call} 返回 {got}，应为 {want}。{v.hint}", key=v.key)
            raise Mistake(f"{call} 返回 {got}，应为 {want}", key="values")

    def model(f):
        from tformer_lib.lm.generate import generate
        from tformer_lib.lm.model import make_lm
        from tformer_lib.serving.speculative import layer_skip_draft

        for g in random_cases(3, seed=136):
            config = LMConfig(vocab_size=32, d_model=16, n_heads=2, n_layers=3, d_ff=32, max_len=48)
            torch.manual_seed(draw_int(g, 0, 10_000))
            target = make_lm(config).eval()
            draft = layer_skip_draft(target, draw_int(g, 1, 2))
            prompt = [draw_int(g, 4, 31) for _ in range(draw_int(g, 2, 6))]
            k, n_new = draw_int(g, 2, 5), draw_int(g, 10, 20)
            with torch.no_grad():
                want = generate(target, prompt, n_new, method="greedy").tolist()
                got = _speculate(f, target, draft, prompt, n_new, k)
            if got != want:
                raise Mistake(f"提示 {prompt}、k={k}：推测解码的输出 {got} 与只用目标模型的贪心生成 {want} 不同",
                              key="model_mismatch")

    return run_checks("推测解码的接受规则", fn,
                      [("10 组随机的草稿与目标选择", lists), ("3 个随机小模型上与贪心生成逐词元相同", model)],
                      verbose=verbose, forbidden=(_reference_accept,))
