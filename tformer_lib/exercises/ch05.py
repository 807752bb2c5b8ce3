"""第 5 章练习的检查器（checker）：交叉注意力的形状（预测再验证）、交叉注意力方向的找错、整个模型的参数量（推导并核对）、
错位的解码器输入/目标、解码器的合并掩码、贪心解码循环（无缓存 / 有 K/V 缓存）。

用 :mod:`tformer_lib.exercises._core` 的框架：桩 → “⏳ 尚未完成”（不抛异常）；通过 → ✅；
未通过 → ❌ 加一句点名常见错误的提示（忘了 BOS 或 EOS、因果掩码与填充掩码只用了一个或用“或”合并、
每一步都重跑编码器、没把新词接回输入、取了 BOS 位置的输出、不在 EOS 处停下、有缓存却仍送入整个前缀……）。

贪心解码的两个检查器在一个很小的、随机初始化的 :class:`~tformer_lib.translation.model.Transformer` 上运行（建模型时
不动读者的全局随机状态），参考答案是库里的 :func:`~tformer_lib.translation.decoding.greedy_decode`。
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from tformer_lib.exercises._core import (
    CheckResult,
    Mistake,
    Variant,
    as_int,
    compare,
    draw_int,
    expect_dtype,
    raised_by_student,
    random_cases,
    run_checks,
)
from tformer_lib.parts.masks import causal_mask, padding_mask
from tformer_lib.specials import BOS, EOS, PAD, UNK

__all__ = [
    "check_shift_targets",
    "check_decoder_mask",
    "check_greedy_decode",
    "check_cached_greedy_decode",
    "check_cross_attention_shapes",
    "check_cross_attention_fix",
    "check_transformer_params",
    "transformer_params_formula",
]


def _id_list(x: Any, what: str) -> list[int]:
    """读者返回的 id 序列 → Python 整数列表（接受 list/tuple、一维张量或 (1, L) 张量）。"""
    if isinstance(x, torch.Tensor):
        if x.dim() == 2 and x.shape[0] == 1:
            x = x[0]
        if x.dim() != 1:
            raise Mistake(f"{what}应是一串 id（列表或一维张量），你返回的张量形状是 {tuple(x.shape)}", key="type")
        x = x.tolist()
    if not isinstance(x, (list, tuple)):
        raise Mistake(f"{what}应是 id 列表，你返回的是 {type(x).__name__}", key="type")
    out = []
    for t in x:
        if isinstance(t, str):
            raise Mistake(f"{what}里应全是整数 id，你返回的是字符串 {t!r}：用 int，不要把 id 转成文字", key="string")
        try:
            out.append(as_int(t, what))
        except Mistake:
            raise Mistake(f"{what}里应全是整数 id，你返回的是 {list(x)!r}", key="type") from None
    return out


# ---- 练习：错开一位的解码器输入与目标 -------------------------------------------------------------------

_SHIFT_CASES = ([34, 35], [6, 4, 24, 62, 13], [7], [])


def _shift_inputs() -> list[list[int]]:
    """书里的例子、几个边界情形，再加几句随机长度、随机 id 的译文（写死的答案过不了）。"""
    extra = []
    for g in random_cases(4, seed=51):
        n = draw_int(g, 1, 9)
        extra.append([draw_int(g, 4, 80) for _ in range(n)])
    return [list(y) for y in _SHIFT_CASES] + extra


def _shift_values(f: Callable) -> None:
    for y in _shift_inputs():
        call = f"my_shift_targets({y})"
        out = f(list(y))
        if not isinstance(out, (tuple, list)) or len(out) != 2:
            raise Mistake(f"{call} 应返回两个列表 (tgt_in, tgt_out)，你返回的是 {out!r}", key="type")
        got_in, got_out = _id_list(out[0], "tgt_in "), _id_list(out[1], "tgt_out ")
        want_in, want_out = [BOS] + y, y + [EOS]
        if (got_in, got_out) == (want_in, want_out):
            continue
        got = (got_in, got_out)
        if got == (want_out, want_in):
            raise Mistake(f"{call}：tgt_in 与 tgt_out 放反了。解码器的输入以 BOS 开头（它是“开始写”的信号），"
                          "要预测的目标以 EOS 结尾。", key="swapped")
        if got_in == [BOS] + y + [EOS] or got_out == [BOS] + y + [EOS]:
            raise Mistake(f"{call}：你把 BOS 和 EOS 都放进了同一个序列。输入只加 BOS（EOS 从来不必喂给解码器），"
                          "目标只加 EOS（BOS 是给定的，不需要预测）；两者都是 n + 1 个词元。", key="both_specials")
        if got_in == want_in and got_out == y:
            raise Mistake(f"{call}：tgt_out 少了 EOS。模型必须学会预测“翻译完了”，否则推理时永远停不下来；"
                          f"目标应为 {want_out}。", key="no_eos")
        if got_in == y and got_out == want_out:
            raise Mistake(f"{call}：tgt_in 少了 BOS。第一个词要由 BOS 这个“开始信号”来预测；输入应为 {want_in}。",
                          key="no_bos")
        if got_in == y and got_out == y:
            raise Mistake(f"{call}：没有错开一位。位置 t 的输入是第 t 个词时，它要预测的是第 t+1 个词；"
                          f"应为 tgt_in={want_in}、tgt_out={want_out}。", key="not_shifted")
        if len(got_in) != len(y) + 1 or len(got_out) != len(y) + 1:
            raise Mistake(f"{call}：n = {len(y)} 个词应得到长度都为 n + 1 = {len(y) + 1} 的 tgt_in 与 tgt_out，"
                          f"你的长度是 {len(got_in)} 和 {len(got_out)}。", key="length")
        raise Mistake(f"{call} 返回 ({got_in}, {got_out})，应为 ({want_in}, {want_out})。", key="values")


def check_shift_targets(fn: Callable[[list[int]], tuple[list[int], list[int]]], *, verbose: bool = True) -> CheckResult:
    """检查 ``fn(y)`` 是否返回 ``([BOS] + y, y + [EOS])``（y 为不含特殊词元的目标 id 列表）。"""
    return run_checks("解码器的输入与目标（错开一位）", fn,
                      [("书里的例子、边界情形（含空句）与 4 句随机长度的译文", _shift_values)], verbose=verbose)


# ---- 练习：解码器自注意力的合并掩码 ---------------------------------------------------------------------


def _mask_cases() -> list[tuple[torch.Tensor, int]]:
    a = torch.tensor([[1, 5, 0, 7, 8], [1, 5, 6, 9, 9], [1, 7, 9, 9, 9]])  # pad_id = 9（右侧补齐），0 在这里是普通词
    b = torch.tensor([[1, 4, 4, 0, 0, 0], [1, 5, 6, 7, 8, 3]])  # PAD = 0
    cases = [(a, 9), (b, PAD)]
    for g in random_cases(3, seed=52):  # 随机的批大小、长度与 pad_id
        B, T, pad_id = draw_int(g, 1, 4), draw_int(g, 2, 8), draw_int(g, 0, 3)
        lengths = [draw_int(g, 1, T) for _ in range(B)]
        tgt = torch.full((B, T), pad_id, dtype=torch.long)
        for i, n in enumerate(lengths):
            tgt[i, :n] = torch.randint(4, 30, (n,), generator=g)
        cases.append((tgt, pad_id))
    return cases


def _mask_values(f: Callable) -> None:
    for tgt, pad_id in _mask_cases():
        B, T = tgt.shape
        got = f(tgt.clone(), pad_id)
        expect_dtype(got, torch.bool, "掩码", hint="掩码应是 bool 张量（True = 可以关注），不要转成 0/1 的整数或浮点数")
        keep = tgt != pad_id  # (B, T)
        causal = torch.ones(T, T, dtype=torch.bool).tril()  # (T, T)
        want = keep[:, None, None, :] & causal  # (B, 1, T, T)
        if tuple(got.shape) == (B, T, T):
            raise Mistake(f"掩码形状是 (B, T, T) = {tuple(got.shape)}：它和分数 (B, h, T, T) 右对齐广播时，B 会对到 h 那一维上。"
                          "在第 1 维留一个给“头”的 1：(B, 1, T, T)。", key="no_head_dim")
        if tuple(got.shape) == (T, T):
            raise Mistake(f"掩码形状是 (T, T) = {tuple(got.shape)}：只有因果部分，每句话各自的填充信息丢了。"
                          "应为 (B, 1, T, T)。", key="causal_only")
        pad_as_other = tgt != (PAD if pad_id != PAD else 9)
        compare(got, want, what="掩码", variants=[
            Variant("causal_only", "只有因果掩码：<pad> 所在的列没有挡住。两种掩码要同时生效（逻辑“与”）。",
                    causal.expand(B, 1, T, T)),
            Variant("padding_only", "只有填充掩码：没有挡住“未来”的位置，解码器训练时可以直接抄下一个词。"
                    "还要与下三角的因果掩码做逻辑“与”。", keep[:, None, None, :].expand(B, 1, T, T)),
            Variant("or", "两种掩码用了逻辑“或”（|）：只要一种允许就放行，结果既能偷看未来又能看到 <pad>。应使用“与”（&）。",
                    keep[:, None, None, :] | causal),
            Variant("polarity", "极性反了：本书约定 True = 可以关注（不是“被屏蔽”）。", ~want),
            Variant("upper", "因果掩码用了上三角：应是 tril（下三角，含对角线），位置 i 只能看 j ≤ i。",
                    keep[:, None, None, :] & causal.T),
            Variant("no_diagonal", "因果掩码漏了对角线：位置 i 应能看自己（j ≤ i，含 j = i），用 tril() 而不是 tril(-1)。",
                    keep[:, None, None, :] & torch.ones(T, T, dtype=torch.bool).tril(-1)),
            Variant("query_axis", "填充信息放在了查询（行）维：应挡住 <pad> 所在的“列”（键），形状 (B, 1, 1, T) 再与 (T, T) 相与。",
                    keep[:, None, :, None] & causal),
            Variant("pad_id_ignored", "没有使用传入的 pad_id（检查器这次用的 pad_id 不是 0）。",
                    pad_as_other[:, None, None, :] & causal),
        ], default_hint="应为 padding_mask(tgt_in, pad_id) & causal_mask(T)，形状 (B, 1, T, T)。")


def check_decoder_mask(fn: Callable[[torch.Tensor, int], torch.Tensor], *, verbose: bool = True) -> CheckResult:
    """检查 ``fn(tgt_in, pad_id)`` 是否返回解码器自注意力的掩码：填充 & 因果，bool，形状 ``(B, 1, T, T)``。"""
    return run_checks("解码器自注意力的合并掩码", fn,
                      [("5 批长短不一的译文（2 批书里的、3 批随机的批大小、长度与 pad_id）", _mask_values)], verbose=verbose)


# ---- 练习：贪心解码循环 ---------------------------------------------------------------------------------

_MAX_LEN = 8


def _tiny_model():
    """检查器用的小模型：随机初始化（固定种子，不动全局随机状态），词表 12 → 10，不会生成 PAD/BOS/UNK。"""
    from tformer_lib.translation.config import TransformerConfig
    from tformer_lib.translation.model import make_model

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(3)
        model = make_model(TransformerConfig(12, 10, d_model=16, n_heads=2, d_ff=32, n_encoder_layers=1,
                                             n_decoder_layers=2, dropout=0.0, max_len=32))
    with torch.no_grad():
        bias = model.generator.proj.bias
        bias[[PAD, BOS, UNK]] = -1e4  # 只让它生成普通词和 EOS
    return model.eval()


_SOURCES = ([4, 5, 6, 7], [8, 9, 10], [11, 4, 9, 5, 6], [7, 7], [10, 6, 4, 11, 8, 9], [5])


def _reference(model, src: torch.Tensor) -> list[int]:
    from tformer_lib.translation.decoding import greedy_decode

    return [t for t in greedy_decode(model, src, max_len=_MAX_LEN)[0].tolist() if t != PAD]


def _repeat_bos_variant(model, src: torch.Tensor) -> list[int]:
    """常见错误：每一步都只把 [BOS] 送进解码器（或总取 BOS 位置的输出）。"""
    with torch.no_grad():
        memory = model.encode(src)
        out: list[int] = []
        for _ in range(_MAX_LEN):
            tok = int(model.generator(model.decode(memory, torch.tensor([[BOS]])))[0, -1].argmax())
            out.append(tok)
            if tok == EOS:
                break
    return out


class _Spy:
    """临时替换模型的 encode/decode，记录调用次数、每次送入解码器的长度和缓存参数。"""

    def __init__(self, model):
        self.model = model
        self.encode_calls = 0
        self.decode_calls: list[tuple[int, Any, int]] = []  # (tgt_in 的长度 T, cache, 调用前 cache.length)
        self._encode, self._decode = model.encode, model.decode

        def encode(src, *args, **kwargs):
            self.encode_calls += 1
            return self._encode(src, *args, **kwargs)

        def decode(memory, tgt_in, *args, **kwargs):
            cache = kwargs.get("cache", args[2] if len(args) > 2 else None)
            length = getattr(cache, "length", 0)
            self.decode_calls.append((int(tgt_in.shape[-1]), cache, length))
            return self._decode(memory, tgt_in, *args, **kwargs)

        model.encode, model.decode = encode, decode

    def restore(self) -> None:
        del self.model.encode, self.model.decode  # 实例属性删掉后，类上的方法重新可见


def _run_greedy(f: Callable, cached: bool) -> None:
    model = _tiny_model()
    name = "my_cached_greedy_decode" if cached else "my_greedy_decode"
    refs = [_reference(model, torch.tensor([s])) for s in _SOURCES]
    assert any(r[-1] == EOS and len(r) > 2 for r in refs) and any(len(r) == _MAX_LEN and EOS not in r for r in refs)
    for s, ref in zip(_SOURCES, refs):
        src = torch.tensor([s])  # (1, S)
        call = f"{name}(model, src={s}, max_len={_MAX_LEN})"
        spy = _Spy(model)
        try:
            with torch.no_grad():
                got = _id_list(f(model, src.clone(), _MAX_LEN), f"{name} 的返回值")
        finally:
            spy.restore()
        if spy.encode_calls == 0:
            raise Mistake(f"{call} 没有调用 model.encode：先把源句编码一次得到 memory，再在循环里调用 model.decode。",
                          key="no_encode")
        if spy.encode_calls > 1:
            raise Mistake(f"{call} 调用了 {spy.encode_calls} 次 model.encode（或 model(src, …)）。源句在解码过程中不变，"
                          "编码器只需跑一次：循环之前算好 memory，每一步只调用 model.decode。", key="encode_each_step")
        if cached:
            _check_cache_use(spy, call)
        if got == ref:
            if len(spy.decode_calls) != len(ref):
                raise Mistake(f"{call} 调用了 {len(spy.decode_calls)} 次 model.decode，生成了 {len(ref)} 个词元："
                              "每一步恰好调用一次，预测一个词元（最后一步预测的是 EOS）。", key="decode_calls")
            continue
        if got and got[0] == BOS and got[1:] == ref:
            raise Mistake(f"{call}：返回值里多了开头的 BOS。BOS 是给定的开始信号，不是生成的词，不要放进结果。",
                          key="includes_bos")
        if ref[-1] == EOS and got == ref[:-1]:
            raise Mistake(f"{call}：结果少了最后的 EOS。约定返回生成的每一个词元，包括表示“翻译完了”的 EOS"
                          "（它是最后一步的预测，步数 = 词数 + 1）。", key="drops_eos")
        if ref[-1] == EOS and len(got) > len(ref) and got[: len(ref)] == ref:
            raise Mistake(f"{call}：生成 EOS 之后没有停下。预测出 EOS 就要跳出循环。", key="no_stop")
        if EOS not in ref and EOS not in got and got[: len(ref)] == ref[: len(got)] and len(got) != len(ref):
            raise Mistake(f"{call}：一直没有 EOS 时应恰好生成 max_len = {_MAX_LEN} 个词元，你生成了 {len(got)} 个。",
                          key="max_len")
        if got == _repeat_bos_variant(model, src):
            raise Mistake(f"{call}：每一步都在用 BOS 位置的输出。要么没把新预测的词接到解码器输入的末尾，"
                          "要么取了 hidden[:, 0]（第一个位置）而不是 hidden[:, -1]（最后一个位置）。", key="no_feedback")
        raise Mistake(f"{call} 返回 {got}，库里的 greedy_decode 得到 {ref}。每一步：decode 当前前缀 → generator → "
                      "取最后一个位置 logits 的 argmax → 接到前缀末尾。", key="values")


def _check_cache_use(spy: _Spy, call: str) -> None:
    calls = spy.decode_calls
    if any(cache is None for _, cache, _ in calls):
        raise Mistake(f"{call}：调用 model.decode 时没有传 cache。先 cache = model.new_cache()，"
                      "每一步 model.decode(memory, 新词, cache=cache)。", key="no_cache")
    if len({id(cache) for _, cache, _ in calls}) > 1:
        raise Mistake(f"{call}：每一步都新建了一个缓存。缓存要在循环之前建好一次，之后每步都传同一个。",
                      key="new_cache_each_step")
    if any(T != 1 for T, _, _ in calls):
        raise Mistake(f"{call}：有缓存时每步只送入最新的一个词元，形状 (1, 1)；你送入了长度 "
                      f"{[T for T, _, _ in calls]} 的前缀，已缓存的位置会被重复计算、位置编号也错了。",
                      key="full_prefix_with_cache")


def check_greedy_decode(fn: Callable, *, verbose: bool = True) -> CheckResult:
    """检查 ``fn(model, src, max_len)``：编码一次、每步 decode 整个前缀，返回生成的 id（不含 BOS，含 EOS）。"""
    return run_checks("贪心解码循环", fn,
                      [("编码器只跑一次、结果与 greedy_decode 一致", lambda f: _run_greedy(f, cached=False))], verbose=verbose)


def check_cached_greedy_decode(fn: Callable, *, verbose: bool = True) -> CheckResult:
    """检查 ``fn(model, src, max_len)``：用 K/V 缓存，每步只把最新的一个词元送进 ``model.decode``。"""
    return run_checks("带 K/V 缓存的贪心解码", fn,
                      [("每步只送一个词元、共用一个缓存、结果与 greedy_decode 一致",
                        lambda f: _run_greedy(f, cached=True))], verbose=verbose)


# ---- 练习：预测交叉注意力里每个张量的形状（预测再验证） ------------------------------------------------

_SHAPE_KEYS = ("Q", "K", "V", "weights", "output")


def _shape_of(x: Any, what: str) -> tuple[int, ...]:
    """读者写下的一个形状 → 整数元组（接受 tuple/list/torch.Size，元素可以是 NumPy 整数或 0 维张量）。"""
    if isinstance(x, str):
        raise Mistake(f"{what}应是整数元组，例如 (2, 4, 6, 16)；你写的是字符串 {x!r}", key="string")
    if not isinstance(x, (tuple, list, torch.Size)):
        raise Mistake(f"{what}应是整数元组，例如 (2, 4, 6, 16)；你写的是 {type(x).__name__}", key="type")
    return tuple(as_int(v, what) for v in x)


def _measured_cross_shapes(B: int, S: int, T: int, d_model: int, h: int) -> dict[str, tuple[int, ...]]:
    """真正运行一次库里的 MultiHeadAttention（查询来自解码器、键值来自 memory），量出各张量的形状。"""
    from tformer_lib.parts.attention import MultiHeadAttention

    mha = MultiHeadAttention(d_model, h).eval()
    dec = torch.zeros(B, T, d_model)  # 解码器一侧 (B, T, d_model)
    memory = torch.zeros(B, S, d_model)  # 编码器输出 (B, S, d_model)
    with torch.no_grad():
        q = mha.split_heads(mha.w_q(dec))  # (B, h, T, d_k)
        k = mha.split_heads(mha.w_k(memory))  # (B, h, S, d_k)
        v = mha.split_heads(mha.w_v(memory))  # (B, h, S, d_k)
        out = mha(dec, memory, memory)  # (B, T, d_model)
    return {"Q": tuple(q.shape), "K": tuple(k.shape), "V": tuple(v.shape),
            "weights": tuple(mha.attn_weights.shape), "output": tuple(out.shape)}


def _cross_shape_values(f: Callable) -> None:
    sizes = [(1, 3, 6, 64, 4)]  # 本章的例子：1 句、原文 3 个词、译文前缀 6 个、d_model 64、4 个头
    for g in random_cases(5, seed=53):
        h = draw_int(g, 1, 4)
        S = draw_int(g, 2, 7)
        sizes.append((draw_int(g, 1, 4), S, S + draw_int(g, 1, 5), h * 2 * draw_int(g, 1, 4), h))
    for B, S, T, d_model, h in sizes:
        call = f"predict_cross_attention_shapes(B={B}, S={S}, T={T}, d_model={d_model}, n_heads={h})"
        got = f(B, S, T, d_model, h)
        if not isinstance(got, dict):
            raise Mistake(f"{call} 应返回一个字典 {{'Q': …, 'K': …, 'V': …, 'weights': …, 'output': …}}，"
                          f"你返回的是 {type(got).__name__}", key="type")
        missing = [k for k in _SHAPE_KEYS if k not in got]
        if missing:
            raise Mistake(f"{call} 返回的字典缺少键 {missing}：需要 {list(_SHAPE_KEYS)} 五个", key="keys")
        pred = {k: _shape_of(got[k], f"{call} 的 {k!r}") for k in _SHAPE_KEYS}
        real = _measured_cross_shapes(B, S, T, d_model, h)
        if pred == real:
            continue
        d_k = d_model // h
        if pred["Q"] == (B, h, S, d_k) and pred["K"] == (B, h, T, d_k):
            raise Mistake(f"{call}：Q 和 K/V 的来源弄反了——这正是文章 B §4.2 的说法（它让中文词的 Q 去匹配英文词的 K）。"
                          f"交叉注意力里查询来自解码器（译文前缀，T = {T} 个位置），键和值来自编码器的 memory"
                          f"（原文，S = {S} 个词）：Q 是 {real['Q']}，K、V 是 {real['K']}。", key="direction")
        if pred["weights"] == (B, h, S, T):
            raise Mistake(f"{call}：权重的形状是 (B, h, T_q, T_k)：每一行是一个查询（解码器的位置），每一列是一个键"
                          f"（原文的词），所以是 {real['weights']}，不是 (B, h, S, T)。", key="direction")
        if any(p[-1] == d_model for k, p in pred.items() if k in ("Q", "K", "V") and len(p) == 4) and h > 1:
            raise Mistake(f"{call}：拆成 h 个头以后每个头只有 d_k = d_model / h = {d_k} 维，不是 d_model = {d_model}。",
                          key="d_k")
        if len(pred["output"]) == 4:
            raise Mistake(f"{call}：输出要把各头拼回去（merge_heads）再经 W^O，形状回到 (B, T, d_model) = "
                          f"{real['output']}，不是每个头一份。", key="output_heads")
        bad = [k for k in _SHAPE_KEYS if pred[k] != real[k]]
        raise Mistake(f"{call}：{bad[0]} 的形状应为 {real[bad[0]]}，你写的是 {pred[bad[0]]}"
                      f"（共 {len(bad)} 项不对：{bad}）。", key="values")


def check_cross_attention_shapes(fn: Callable[[int, int, int, int, int], dict], *, verbose: bool = True
                                 ) -> CheckResult:
    """检查 ``fn(B, S, T, d_model, n_heads)``：预测交叉注意力里 Q、K、V、权重与输出的形状。

    检查器在几组随机大小（T ≠ S）上**真正运行**库里的 :class:`~tformer_lib.parts.attention.MultiHeadAttention`
    （查询 = 解码器一侧的 ``(B, T, d_model)``，键/值 = memory ``(B, S, d_model)``），把量到的形状与预测对照。
    """
    return run_checks("交叉注意力的形状", fn,
                      [("6 组大小（书里的例子与 5 组随机的），与实际运行时量到的形状比较", _cross_shape_values)], verbose=verbose)


# ---- 练习：找错——交叉注意力的方向（找错） -----------------------------------------------------------------


def _decoder_case(g: torch.Generator, S: int, T: int):
    """一个随机的 post-LN 解码器层（不带 dropout）和一组输入：x (B, T, d)、memory (B, S, d) 与两个掩码。"""
    from tformer_lib.parts.layers import DecoderLayer

    h = draw_int(g, 1, 3)
    d_model = 4 * h * draw_int(g, 1, 2)
    B = draw_int(g, 1, 3)
    layer = DecoderLayer(d_model, h, 2 * d_model).eval()
    with torch.no_grad():
        for p in layer.parameters():  # 用检查器自己的生成器初始化，不动全局随机状态
            p.copy_(torch.randn(p.shape, generator=g) * (0.3 if p.dim() > 1 else 0.1))
    x = torch.randn(B, T, d_model, generator=g)
    memory = torch.randn(B, S, d_model, generator=g)
    src = torch.randint(4, 20, (B, S), generator=g)
    src[0, S - 1] = PAD  # 第一句原文最后一个位置是 <pad>
    src_mask = padding_mask(src, PAD)  # (B, 1, 1, S)
    tgt_mask = causal_mask(T)  # (T, T)
    return layer, x, memory, src_mask, tgt_mask


def _swapped_cross(layer, x, memory, src_mask, tgt_mask):
    """文章 B 的方向：查询来自 memory、键值来自解码器（只在 S == T 时能算出结果）。"""
    x = layer.residual_self.norm(x + layer.self_attn(x, x, x, tgt_mask))
    x = layer.residual_cross.norm(x + layer.cross_attn(memory, x, x, src_mask))
    return layer.residual_ffn.norm(x + layer.feed_forward(x))


def _cross_fix_values(f: Callable) -> None:
    cases = []
    for k, g in enumerate(random_cases(4, seed=54)):
        S = draw_int(g, 2, 6)
        T = S if k < 2 else S + draw_int(g, 1, 4)  # 先 S == T（方向错了也能算出结果），再 S ≠ T
        cases.append(_decoder_case(g, S, T))
    for layer, x, memory, src_mask, tgt_mask in cases:
        with torch.no_grad():
            want = layer(x, memory, src_mask, tgt_mask)  # (B, T, d_model)
            wrong = _swapped_cross(layer, x, memory, src_mask, tgt_mask) if x.shape[1] == memory.shape[1] else None

        def no_shortcut(*args, **kwargs):
            raise Mistake("直接调用了 layer(...)：这道题要你把每个子层写出来、改正其中的错误，"
                          "不要把整层交给 DecoderLayer.forward", key="shortcut")

        layer.forward = no_shortcut  # 只在检查期间挡住整层调用；子层照常可用
        try:
            with torch.no_grad():
                try:
                    got = f(layer, x.clone(), memory.clone(), src_mask, tgt_mask)
                except RuntimeError as exc:
                    if raised_by_student(exc) and memory.shape[1] != x.shape[1]:
                        raise Mistake(f"原文 S = {memory.shape[1]}、译文前缀 T = {x.shape[1]} 个位置时你的函数出错"
                                      f"（{type(exc).__name__}）：多半是交叉注意力的查询给成了 memory。查询来自解码器"
                                      "自己（x），键和值来自 memory：cross_attn(x, memory, memory, src_mask)。",
                                      key="direction") from None
                    raise
        finally:
            del layer.forward
        variants = [Variant("direction", "交叉注意力的方向反了（文章 B §4.2 的说法）：查询 Q 应来自解码器自己的 x，"
                            "键 K 和值 V 来自编码器的 memory——cross_attn(x, memory, memory, src_mask)。"
                            "反过来时每个输出位置对应的是原文的词，而不是译文的位置。", wrong)] if wrong is not None else []
        compare(got, want, what="解码器层的输出", variants=variants,
                default_hint="结果与 DecoderLayer 不一致：三个子层依次是带因果掩码的自注意力、交叉注意力（x 查 memory，"
                             "用 src_mask）、前馈网络，每个子层之后 x = norm(x + 子层输出)（post-LN）")


def check_cross_attention_fix(fn: Callable, *, verbose: bool = True) -> CheckResult:
    """检查改正后的 ``fn(layer, x, memory, src_mask, tgt_mask)``：与 ``layer(x, memory, src_mask, tgt_mask)`` 相同。

    在几个随机初始化的 post-LN :class:`~tformer_lib.parts.layers.DecoderLayer` 上比较，原文长度 S 与译文前缀长度 T
    先相等（方向写反也能算出数，只是错的）、再不等。
    """
    return run_checks("找错：交叉注意力的方向", fn,
                      [("与 DecoderLayer 的输出一致（S = T 与 S ≠ T）", _cross_fix_values)], verbose=verbose)


# ---- 练习：整个模型有多少参数（推导并核对） ---------------------------------------------------------------


def transformer_params_formula(src_vocab: int, tgt_vocab: int, d_model: int, d_ff: int, n_layers: int) -> int:
    """post-LN、不共享嵌入、编码器和解码器各 ``n_layers`` 层的 Transformer 参数量的闭式解。

    两张嵌入表 (V_src + V_tgt)·d；正弦位置编码没有参数；编码器层 = 一套注意力 4(d² + d) + 前馈 2·d·d_ff + d_ff + d
    + 两个 LayerNorm 4d；解码器层多一套注意力和一个 LayerNorm；输出层 d·V_tgt + V_tgt。
    """
    d = d_model
    attn, ffn, ln = 4 * d * d + 4 * d, 2 * d * d_ff + d_ff + d, 2 * d
    enc_layer, dec_layer = attn + ffn + 2 * ln, 2 * attn + ffn + 3 * ln
    return (src_vocab + tgt_vocab) * d + n_layers * (enc_layer + dec_layer) + d * tgt_vocab + tgt_vocab


def _counted_params(src_vocab: int, tgt_vocab: int, d_model: int, d_ff: int, n_layers: int) -> int:
    """真正建一个模型数参数（只用于小尺寸；建模型时不动全局随机状态）。"""
    from tformer_lib.translation.config import TransformerConfig
    from tformer_lib.translation.model import count_parameters, make_model

    with torch.random.fork_rng(devices=[]):
        model = make_model(TransformerConfig(src_vocab, tgt_vocab, d_model=d_model, n_heads=2, d_ff=d_ff,
                                             n_encoder_layers=n_layers, n_decoder_layers=n_layers, max_len=16))
    return count_parameters(model)


def _model_param_values(f: Callable) -> None:
    sizes = [(51, 77, 64, 128, 2)]  # 本章的玩具模型
    for g in random_cases(4, seed=55):
        sizes.append((draw_int(g, 5, 60), draw_int(g, 5, 60), 2 * draw_int(g, 1, 12), draw_int(g, 1, 64),
                      draw_int(g, 1, 3)))
    big = [(37000, 37000, 512, 2048, 6), (32000, 32000, 1024, 4096, 6)]  # 论文基础模型与“大”模型的宽度（不共享嵌入）
    for k, (vs, vt, d, d_ff, n) in enumerate(sizes + big):
        call = f"transformer_params(src_vocab={vs}, tgt_vocab={vt}, d_model={d}, d_ff={d_ff}, n_layers={n})"
        got = as_int(f(vs, vt, d, d_ff, n), f"{call} 的结果")
        want = _counted_params(vs, vt, d, d_ff, n) if k < len(sizes) else transformer_params_formula(vs, vt, d, d_ff, n)
        if got == want:
            continue
        attn, ffn, ln = 4 * d * d + 4 * d, 2 * d * d_ff + d_ff + d, 2 * d
        enc, dec = attn + ffn + 2 * ln, 2 * attn + ffn + 3 * ln
        known = {
            want - vt: ("漏了输出层的偏置：generator 是 nn.Linear(d_model, V_tgt)，还有 V_tgt 个偏置", "no_generator_bias"),
            want - d * vt - vt: ("漏了输出层 generator：d_model·V_tgt 个权重加 V_tgt 个偏置", "no_generator"),
            want - n * (dec - enc): ("解码器层按编码器层算了：每个解码器层多一套交叉注意力（4(d² + d)）和一个 LayerNorm（2d）",
                                     "decoder_as_encoder"),
            want - vs * d: ("漏了源端词嵌入 src_embed（V_src × d_model）", "one_embedding"),
            want - vt * d: ("少了 V_tgt × d_model 个：漏了目标端词嵌入 tgt_embed，或者把输出层的权重当成与它共享了"
                            "（本题不共享，tie_embeddings=False）", "one_embedding"),
            (vs + vt) * d + enc + dec + d * vt + vt: ("只数了一层：编码器和解码器各有 n_layers 个层，每层参数各自独立",
                                                     "one_layer"),
        }
        if got in known:
            hint, key = known[got]
            raise Mistake(f"{call}：{hint}。", key=key)
        raise Mistake(f"{call} 应为 {want:,}，你的是 {got:,}。按部件分开数：两张嵌入表、n_layers 个编码器层、"
                      "n_layers 个解码器层、输出层；正弦位置编码是固定的表，不算参数。", key="values")


def check_transformer_params(fn: Callable[[int, int, int, int, int], Any], *, verbose: bool = True) -> CheckResult:
    """检查 ``fn(src_vocab, tgt_vocab, d_model, d_ff, n_layers) -> int``：整个编码器–解码器的参数个数
    （post-LN，编码器、解码器各 ``n_layers`` 层，不共享嵌入）。

    小尺寸时检查器真的建一个模型用 ``count_parameters`` 数（几组随机大小），论文尺寸时用闭式解；
    认得把位置编码算成参数、漏了输出层或它的偏置、解码器层按编码器层算、只数一层等错误。
    """
    from tformer_lib.translation.config import TransformerConfig
    from tformer_lib.parts.layers import DecoderLayer, EncoderLayer
    from tformer_lib.translation.model import count_parameters, make_model

    # 推导题：建模型去数（小尺寸时）、或借用检查器自己的闭式解，都绕过了推导，检查器不收
    return run_checks("整个模型的参数量", fn,
                      [("5 个小尺寸与 count_parameters(make_model(...)) 一致，论文的 2 个尺寸与闭式公式一致", _model_param_values)],
                      verbose=verbose, forbidden=(make_model, TransformerConfig, EncoderLayer, DecoderLayer,
                                                  count_parameters, transformer_params_formula))
