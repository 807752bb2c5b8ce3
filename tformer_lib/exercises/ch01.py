"""第 1 章练习的检查器（checker）：编码与 UNK、one-hot 查表、×√d_model 缩放、补齐与掩码。

每个 ``check_*`` 接收读者写的函数，运行若干测试用例并打印结论，返回可当布尔值用的 :class:`CheckResult`：

* 函数里还是 ``raise NotImplementedError``（或什么也不返回）→ 打印“尚未完成”，结果为假，**不抛异常**；
* 结果正确 → 打印 ✅；
* 结果不对 → 打印 ❌，并对常见错误（忘了 BOS/EOS、把未知词丢掉、one-hot 没给 num_classes、
  忘了乘 √d_model、掩码极性反了……）给出针对性的提示。
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch

from ..embedding import TokenEmbedding
from ..masks import padding_mask
from ..specials import BOS, EOS, PAD, SPECIAL_TOKENS, UNK

__all__ = ["CheckResult", "check_encode", "check_one_hot_lookup", "check_token_embedding", "check_pad_batch"]


class CheckResult:
    """检查结果：可以当布尔值用（``if check_encode(f): …``）。

    结论已经打印出来了，所以它作为笔记本单元格的最后一个表达式时什么也不显示（不会多出一行 ``True``）。
    """

    __slots__ = ("passed",)

    def __init__(self, passed: bool):
        self.passed = bool(passed)

    def __bool__(self) -> bool:
        return self.passed

    def __eq__(self, other: object) -> bool:
        if isinstance(other, (bool, CheckResult)):
            return self.passed == bool(other)
        return NotImplemented

    def __hash__(self) -> int:
        return hash(self.passed)

    def __repr__(self) -> str:
        return f"CheckResult(passed={self.passed})"

    def _ipython_display_(self) -> None:  # 结论已打印，不再显示
        return None


class _Fail(Exception):
    """检查不通过；消息就是给读者的提示。"""


class _NotDone(Exception):
    """读者的函数返回了 None：视为尚未完成。"""


def _run(title: str, fn: Callable, body: Callable[[Callable], None]) -> CheckResult:
    """统一的检查流程：未完成 → 提示；异常 → 报错类型 + 提示；不通过 → 提示；通过 → ✅。"""
    if not callable(fn):
        print(f"❌ {title}：请传入一个函数，收到的是 {type(fn).__name__}")
        return CheckResult(False)
    def guarded(*args: Any) -> Any:
        out = fn(*args)
        if out is None:
            raise _NotDone
        return out

    try:
        with torch.random.fork_rng(devices=[]):  # 检查器不改变读者的全局随机状态
            body(guarded)
    except (NotImplementedError, _NotDone):
        print(f"⏳ {title}：尚未完成——把 raise NotImplementedError 换成你的实现，再运行这个单元。")
        return CheckResult(False)
    except _Fail as fail:
        print(f"❌ {title}：{fail}")
        return CheckResult(False)
    except Exception as exc:  # 读者代码里的任何错误都转成提示，不让单元格报错
        print(f"❌ {title}：运行出错 {type(exc).__name__}: {exc}")
        return CheckResult(False)
    print(f"✅ {title}：全部测试通过！")
    return CheckResult(True)


# ---- 练习 1：编码 ----------------------------------------------------------------------------
_VOCAB_TOKENS = ["狗", "咬", "人", "猫", "追"]
_ENCODE_CASES = [
    ["狗", "咬", "人"],
    ["人", "咬", "狗"],
    ["狗", "咬", "熊"],  # 熊 不在词表里
    ["熊", "追", "狼", "猫"],  # 两个未登录词
    [],
]


def _stoi() -> dict[str, int]:
    itos = list(SPECIAL_TOKENS) + _VOCAB_TOKENS
    return {t: i for i, t in enumerate(itos)}


def _as_int_list(result: Any, what: str) -> list[int]:
    if isinstance(result, torch.Tensor):
        result = result.tolist()
    if not isinstance(result, (list, tuple)):
        raise _Fail(f"{what} 应返回 id 列表，收到 {type(result).__name__}")
    try:
        return [int(x) for x in result]
    except (TypeError, ValueError) as exc:
        raise _Fail(f"{what} 返回的列表里应全是整数 id，收到 {list(result)!r}") from exc


def _encode_hint(got: list[int], tokens: list[str], stoi: dict[str, int]) -> str:
    known = [stoi[t] for t in tokens if t in stoi]
    with_unk = [stoi.get(t, UNK) for t in tokens]
    if got == with_unk:
        return "忘了在开头加 BOS、结尾加 EOS。"
    if got == [BOS] + with_unk or got == with_unk + [EOS]:
        return "BOS 和 EOS 两端都要加：开头 BOS，结尾 EOS。"
    if got == [EOS] + with_unk + [BOS]:
        return "BOS 与 EOS 放反了：BOS（序列开始）在最前，EOS（序列结束）在最后。"
    if got == [BOS] + known + [EOS]:
        return "未登录词被丢掉了；它们应当变成 UNK，句子长度不变。"
    if got == [BOS] + [stoi.get(t, PAD) for t in tokens] + [EOS]:
        return "未登录词应映射为 UNK，不是 PAD——PAD 只用于补齐，模型会忽略它。"
    return f"期望 {[BOS] + with_unk + [EOS]}，得到 {got}。"


def check_encode(fn: Callable[[list[str], dict[str, int]], list[int]]) -> CheckResult:
    """练习 1：``fn(tokens, stoi)`` 应返回 ``[BOS] + [stoi.get(t, UNK) …] + [EOS]``。"""

    def body(f: Callable) -> None:
        stoi = _stoi()
        for tokens in _ENCODE_CASES:
            try:
                got = _as_int_list(f(list(tokens), dict(stoi)), "my_encode")
            except KeyError as exc:
                raise _Fail(
                    f"查到词表外的词元 {exc} 时出现 KeyError；用 stoi.get(token, UNK) 把未登录词映射为 UNK。"
                ) from exc
            expected = [BOS] + [stoi.get(t, UNK) for t in tokens] + [EOS]
            if got != expected:
                raise _Fail(f"输入 {tokens}：{_encode_hint(got, tokens, stoi)}")

    return _run("练习 1 编码（BOS/EOS 与 UNK）", fn, body)


# ---- 练习 2：one-hot 查表 ------------------------------------------------------------------------
def check_one_hot_lookup(fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]) -> CheckResult:
    """练习 2：``fn(ids (B, T), weight (V, d))`` 应返回 ``weight[ids]``，形状 ``(B, T, d)``。"""

    def body(f: Callable) -> None:
        g = torch.Generator().manual_seed(1)
        V, d = 11, 6
        weight = torch.randn(V, d, generator=g)
        # 批次里最大的 id 是 7 < V-1：不给 num_classes 的 one_hot 会少几列
        cases = [torch.tensor([[4, 5, 6], [6, 5, 4]]), torch.tensor([[7, PAD, UNK, 4]])]
        for ids in cases:
            try:
                got = f(ids.clone(), weight.clone())
            except RuntimeError as exc:
                if "shape" in str(exc) or "size" in str(exc) or "match" in str(exc):
                    raise _Fail(
                        "矩阵乘法的形状对不上（RuntimeError）。one-hot 的长度必须等于词表大小 V："
                        "F.one_hot(ids, num_classes=weight.shape[0])，再与 weight (V, d_model) 相乘。"
                    ) from exc
                raise
            if not isinstance(got, torch.Tensor):
                raise _Fail(f"应返回张量，收到 {type(got).__name__}")
            expected = weight[ids]  # (B, T, d)
            if tuple(got.shape) != tuple(expected.shape):
                raise _Fail(f"ids 形状 {tuple(ids.shape)}：输出形状应为 (B, T, d_model) = {tuple(expected.shape)}，"
                            f"得到 {tuple(got.shape)}。")
            if not torch.allclose(got.to(expected.dtype), expected, atol=1e-6):
                raise _Fail("形状对了但数值不对：one-hot 向量 e_i 乘 weight 应恰好取出第 i 行（检查是否用了 weight 的转置）。")

    return _run("练习 2 one-hot 乘法 = 查表", fn, body)


# ---- 练习 3：×√d_model ------------------------------------------------------------------------
def check_token_embedding(fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]) -> CheckResult:
    """练习 3：``fn(ids, weight)`` 应与 ``TokenEmbedding``（查表后 ×√d_model）输出相同。"""

    def body(f: Callable) -> None:
        for V, d in ((10, 16), (9, 64)):
            g = torch.Generator().manual_seed(d)
            weight = torch.randn(V, d, generator=g) * d**-0.5
            emb = TokenEmbedding(V, d)
            with torch.no_grad():
                emb.lut.weight.copy_(weight)
            ids = torch.tensor([[4, 5, 6, PAD], [8, 7, BOS, EOS]])
            with torch.no_grad():
                expected = emb(ids)  # (B, T, d)
            got = f(ids.clone(), weight.clone())
            if not isinstance(got, torch.Tensor):
                raise _Fail(f"应返回张量，收到 {type(got).__name__}")
            if tuple(got.shape) != tuple(expected.shape):
                raise _Fail(f"输出形状应为 (B, T, d_model) = {tuple(expected.shape)}，得到 {tuple(got.shape)}")
            got = got.detach().to(expected.dtype)
            if torch.allclose(got, expected, atol=1e-5):
                continue
            base = weight[ids]
            hints = [
                (base, "忘了缩放：查表之后还要乘以 √d_model。"),
                (base / math.sqrt(d), "缩放方向反了：是乘以 √d_model，不是除以。"),
                (base * d, "缩放因子是 √d_model，不是 d_model。"),
                (base * math.sqrt(V), "缩放因子用的是 d_model（weight.shape[1]），不是词表大小 V（weight.shape[0]）。"),
            ]
            for wrong, hint in hints:
                if torch.allclose(got, wrong, atol=1e-5):
                    raise _Fail(f"d_model={d}：{hint}")
            raise _Fail(f"d_model={d}：结果与 TokenEmbedding 不同（应为 weight[ids] * √d_model）。")

    return _run("练习 3 词嵌入乘 √d_model", fn, body)


# ---- 练习 4：补齐与掩码 ----------------------------------------------------------------------------
_PAD_CASES = [
    [[4, 5, 6], [7, 8], [9]],
    [[5], [4, 6, 7, 8, 9], [10, 11]],
    [[4, 5], [6, 7]],  # 等长：不需要补齐
]


def check_pad_batch(fn: Callable[[list[list[int]]], tuple[torch.Tensor, torch.Tensor]]) -> CheckResult:
    """练习 4：``fn(seqs)`` 应返回右侧补 PAD 的 ``ids (B, T_max)`` 与布尔掩码 ``keep``（True = 真实词元）。"""

    def body(f: Callable) -> None:
        for seqs in _PAD_CASES:
            out = f([list(s) for s in seqs])
            if not (isinstance(out, tuple) and len(out) == 2):
                raise _Fail("应返回两个张量组成的元组 (ids, keep)。")
            ids, keep = out
            if not isinstance(ids, torch.Tensor) or not isinstance(keep, torch.Tensor):
                raise _Fail("ids 和 keep 都应是 torch 张量。")
            t_max = max(len(s) for s in seqs)
            exp_ids = torch.full((len(seqs), t_max), PAD, dtype=torch.long)
            for b, s in enumerate(seqs):
                exp_ids[b, : len(s)] = torch.tensor(s)
            exp_keep = padding_mask(exp_ids, PAD)[:, 0, 0, :]  # (B, T_max)
            if tuple(ids.shape) != tuple(exp_ids.shape):
                raise _Fail(f"ids 形状应为 (B, T_max) = {tuple(exp_ids.shape)}（补到本批最长句），"
                            f"得到 {tuple(ids.shape)}。")
            if ids.dtype != torch.long:
                raise _Fail(f"ids 的 dtype 应为 torch.long（嵌入层只接受整数 id），得到 {ids.dtype}。")
            if not torch.equal(ids, exp_ids):
                left = torch.full_like(exp_ids, PAD)
                for b, s in enumerate(seqs):
                    left[b, t_max - len(s):] = torch.tensor(s)
                if torch.equal(ids, left):
                    raise _Fail("句子应放在左侧、在右侧补 PAD（本书的批处理约定），而不是在左侧补。")
                if torch.equal(ids != exp_ids, exp_ids == PAD):
                    raise _Fail("补齐位置用的值不对：应填 PAD，而不是别的 id。")
                raise _Fail(f"输入 {seqs}：ids 应为 {exp_ids.tolist()}，得到 {ids.tolist()}。")
            if tuple(keep.shape) != tuple(exp_keep.shape):
                raise _Fail(f"keep 形状应为 (B, T_max) = {tuple(exp_keep.shape)}，得到 {tuple(keep.shape)}。")
            if keep.dtype != torch.bool:
                raise _Fail(f"keep 应是布尔张量（dtype=torch.bool），得到 {keep.dtype}。")
            if not torch.equal(keep, exp_keep):
                if torch.equal(keep, ~exp_keep):
                    raise _Fail("掩码极性反了：本书约定 True = 可以关注（真实词元），False = 填充。")
                raise _Fail(f"keep 应为 {exp_keep.int().tolist()}（1 = 真实词元），得到 {keep.int().tolist()}。")

    return _run("练习 4 补齐批次与填充掩码", fn, body)
