"""第 5 章练习的检查器（checker）：错位的解码器输入/目标、解码器的合并掩码、贪心解码循环（无缓存 / 有 K/V 缓存）。

用 :mod:`tformer_lib.exercises._core` 的框架：桩 → “⏳ 尚未完成”（不抛异常）；通过 → ✅；
未通过 → ❌ 加一句点名常见错误的提示（忘了 BOS 或 EOS、因果掩码与填充掩码只用了一个或用“或”合并、
每一步都重跑编码器、没把新词接回输入、取了 BOS 位置的输出、不在 EOS 处停下、有缓存却仍送入整个前缀……）。

贪心解码的两个检查器在一个很小的、随机初始化的 :class:`~tformer_lib.model.Transformer` 上运行（建模型时
不动读者的全局随机状态），参考答案是库里的 :func:`~tformer_lib.decoding.greedy_decode`。
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from tformer_lib.exercises._core import CheckResult, Mistake, Variant, compare, expect_dtype, run_checks
from tformer_lib.masks import causal_mask, padding_mask
from tformer_lib.specials import BOS, EOS, PAD, UNK

__all__ = ["check_shift_targets", "check_decoder_mask", "check_greedy_decode", "check_cached_greedy_decode"]


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
    if not all(isinstance(t, int) and not isinstance(t, bool) for t in x):
        raise Mistake(f"{what}里应全是整数 id，你返回的是 {list(x)!r}", key="type")
    return list(x)


# ---- 练习：错开一位的解码器输入与目标 -------------------------------------------------------------------

_SHIFT_CASES = ([34, 35], [6, 4, 24, 62, 13], [7], [])


def _shift_values(f: Callable) -> None:
    for y in _SHIFT_CASES:
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
                      [("tgt_in = [BOS] + y，tgt_out = y + [EOS]", _shift_values)], verbose=verbose)


# ---- 练习：解码器自注意力的合并掩码 ---------------------------------------------------------------------


def _mask_cases() -> list[tuple[torch.Tensor, int]]:
    a = torch.tensor([[1, 5, 0, 7, 8], [1, 5, 6, 9, 9], [1, 7, 9, 9, 9]])  # pad_id = 9（右侧补齐），0 在这里是普通词
    b = torch.tensor([[1, 4, 4, 0, 0, 0], [1, 5, 6, 7, 8, 3]])  # PAD = 0
    return [(a, 9), (b, PAD)]


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
                      [("与 padding_mask(tgt_in, pad_id) & causal_mask(T) 一致", _mask_values)], verbose=verbose)


# ---- 练习：贪心解码循环 ---------------------------------------------------------------------------------

_MAX_LEN = 8


def _tiny_model():
    """检查器用的小模型：随机初始化（固定种子，不动全局随机状态），词表 12 → 10，不会生成 PAD/BOS/UNK。"""
    from tformer_lib.config import TransformerConfig
    from tformer_lib.model import make_model

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
    from tformer_lib.decoding import greedy_decode

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
