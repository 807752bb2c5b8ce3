"""编译的静态缓存解码（gpt-fast 的配方）：预填充一次（eager），之后每步调用同一张 ``torch.compile`` 捕获的图。

每步的形状全都固定——``tokens (B, 1)``、槽位 ``(1,)``、缓存 ``(B, h_kv, L, d_k)``——所以编译一次就能一直用；
CPU 上 TorchInductor 把整步（嵌入、N 块、输出层）生成一个 C++ 函数，省掉的是每个小算子的 Python 与分派开销
（dispatch overhead），而不是 FLOPs。

采样（``torch.multinomial``）留在图外、与 :func:`tformer_lib.lm.generate` 调用同一段代码：同一个 ``generator``
按同样的次序抽同样的随机数，所以种子相同的采样也逐词元相同（测试核对）。贪心的 argmax 放进图里（屏蔽特殊词后取
最大者，与 ``generate`` 的 :func:`~tformer_lib.lm.generate.greedy_tokens` 是同一个算法）。

CPU 上另外三招，都只在编译时打开（``StaticDecoder`` 的参数）：

- ``freeze=True``：Inductor 的冻结（freezing）把权重当作常量编进图里（常量可以提前折叠；有 oneDNN 的构建里线性层还可能
  换成预先重排过权重的内核——本书用的 torch 2.13 CPU 构建的剖析里线性层仍是 ``aten::addmm``，没有换）。代价：之后再改
  模型的权重，图可能不知道——改了权重就新建一个 ``StaticDecoder``；
- ``cpp_wrapper=True``：Inductor 生成的图平时由一段 Python 包装代码（wrapper）逐个调用其中的内核与矩阵乘法；这个选项把
  包装也生成成 C++，每步少几十次 Python 调用（编译多花几秒）；
- ``skip_guards=True``：每次调用编译函数前，Dynamo 要检查一遍“守卫”（guard：输入的形状、模块的 training 标志……
  是否与编译时相同），小模型上这一检查是每步固定开销里不小的一份。解码循环里这些条件我们自己保证不变（形状固定、
  ``model.eval()``），所以第一步之后用 ``torch.compiler.set_stance(skip_guard_eval_unsafe=True)`` 跳过它。
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Sequence

import torch
from torch import nn

from .._checks import check_suppress_ids, flag, language_model, non_negative_int, positive_int
from ..lm.generate import check_eos_id, check_top_k, check_top_p, greedy_tokens, next_token_distribution
from ..temperature import check_temperature, is_greedy_temperature
from ..serving.ragged import left_pad
from ..specials import BOS, PAD
from .static_cache import StaticKVCache
from .step import static_forward

__all__ = ["StaticDecoder", "generate_static"]

COMPILE_MODES = (None, "default", "reduce-overhead", "max-autotune-no-cudagraphs")


def _prompt_rows(prompt, vocab_size: int) -> tuple[list[list[int]], bool]:
    """提示：id 列表或 1-D 张量（一条）、2-D 张量 ``(B, T)``、或长短不一的 id 列表的列表（参差批次，左侧填充）。"""
    if isinstance(prompt, torch.Tensor):
        if prompt.dtype.is_floating_point or prompt.dtype == torch.bool:
            raise TypeError(f"prompt 应是整数 id，收到 dtype {prompt.dtype}")
        if prompt.dim() not in (1, 2) or prompt.shape[-1] == 0:
            raise ValueError(f"prompt 应是非空的 (T,) 或 (B, T)，收到形状 {tuple(prompt.shape)}")
        rows, single = (prompt[None] if prompt.dim() == 1 else prompt).tolist(), prompt.dim() == 1
    elif isinstance(prompt, (list, tuple)) and prompt and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        rows, single = [list(prompt)], True
    elif isinstance(prompt, (list, tuple)) and prompt and all(isinstance(r, (list, tuple)) and r for r in prompt):
        rows, single = [list(r) for r in prompt], False
    else:
        raise TypeError(f"prompt 应是 id 列表、LongTensor (T,) / (B, T) 或 id 列表的列表，收到 {type(prompt).__name__}")
    if not rows:
        raise ValueError("prompt 是空批次（0 行）：至少要有一条提示")
    for i, row in enumerate(rows):
        if not all(isinstance(t, int) and not isinstance(t, bool) for t in row) or min(row) < 0 or max(row) >= vocab_size:
            raise ValueError(f"prompt 第 {i} 行应全是 [0, {vocab_size}) 内的整数 id，收到 {row!r:.60}")
    return rows, single


def inductor_options(freeze: bool, cpp_wrapper: bool) -> dict | None:
    """``torch.compile(options=…)`` 里本模块用到的两项 Inductor 选项（都不开时 None）。"""
    return {key: True for key, on in (("freezing", freeze), ("cpp_wrapper", cpp_wrapper)) if on} or None


class StaticDecoder:
    """围绕一个 :class:`~tformer_lib.lm.DecoderOnlyLM` 的快速生成器：静态 K/V 缓存 + （可选的）编译解码步。

    - 不复制模型：它只持有 ``model`` 的引用，每步调用模型自己的模块与权重；
    - ``compile=False`` 时解码步是 eager 的——与编译版同一段代码，测试用它核对词元；
    - ``mode``：``torch.compile`` 的模式（None/"default" 或 "reduce-overhead"；CPU 上没有 CUDA 图，后者效果相同）；
    - 每个批大小一个缓存、一张图（``dynamic=False``：形状全固定）；``compile_seconds[B]`` 记下该批大小的
      首次解码步（含编译）用了多少秒。
    """

    def __init__(self, model: nn.Module, *, compile: bool = True, mode: str | None = None, max_len: int | None = None,
                 freeze: bool = False, skip_guards: bool = False, cpp_wrapper: bool = False):
        language_model("model", model)
        if not hasattr(model, "embed") or not hasattr(model, "blocks"):
            raise TypeError(f"model 应是 DecoderOnlyLM（有 embed 与 blocks），收到 {type(model).__name__}")
        for name, value in (("compile", compile), ("freeze", freeze), ("skip_guards", skip_guards),
                            ("cpp_wrapper", cpp_wrapper)):
            flag(name, value)
        if mode not in COMPILE_MODES:
            raise ValueError(f"mode 应是 {COMPILE_MODES} 之一，收到 {mode!r}")
        self.model, self.compile, self.mode = model, compile, mode
        self.skip_guards = compile and skip_guards
        if max_len is not None and positive_int("max_len", max_len) > model.config.max_len:
            raise ValueError(f"max_len 应是 [1, config.max_len={model.config.max_len}] 内的整数（缓存的槽位数），收到 {max_len!r}")
        self.max_len = model.config.max_len if max_len is None else int(max_len)
        self._caches: dict[int, StaticKVCache] = {}
        self.compile_seconds: dict[int, float] = {}
        step = self._decode_step
        if mode is not None and (freeze or cpp_wrapper):
            raise ValueError("mode 与 freeze/cpp_wrapper 不能同时给：torch.compile 的 mode 与 options 只能二选一")
        options = inductor_options(freeze, cpp_wrapper)
        self._step = torch.compile(step, mode=mode, fullgraph=True, dynamic=False, options=options) if compile else step

    def cache(self, batch: int) -> StaticKVCache:
        """批大小 ``batch`` 的静态缓存（第一次用到时分配，之后复用）。"""
        if batch not in self._caches:
            self._caches[batch] = StaticKVCache(self.model, batch, self.max_len)
        return self._caches[batch]

    def _decode_step(self, cache: StaticKVCache, tokens: torch.Tensor, slot: torch.Tensor,
                     pads: torch.Tensor, banned: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """固定形状的一步：``tokens (B, 1)`` 写进槽位 ``slot (1,)`` → 下一个词元的 logits ``(B, V)`` 与贪心选择 ``(B,)``。

        ``banned`` ``(V,)`` 布尔：不许生成的词（PAD、BOS），贪心选择时屏蔽。
        """
        logits = static_forward(self.model, cache, tokens, slot, pads)[:, -1]  # (B, V)
        return logits, logits.masked_fill(banned, float("-inf")).argmax(dim=-1)  # (B, V), (B,)

    def prefill(self, cache: StaticKVCache, tokens: torch.Tensor, pads: torch.Tensor) -> torch.Tensor:
        """整段（左填充的）提示 ``(B, T)`` 写进槽位 0..T-1（eager：每个提示长度不同，不值得编译），返回最后位置的 logits ``(B, V)``。"""
        slots = torch.arange(tokens.shape[1], device=tokens.device)  # (T,)
        return static_forward(self.model, cache, tokens, slots, pads)[:, -1]  # (B, V)

    def decode_step(self, cache: StaticKVCache, tokens: torch.Tensor, slot: torch.Tensor, pads: torch.Tensor,
                    banned: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """调用（编译过的）解码步，返回 ``(logits (B, V), 贪心选择 (B,))``；某批大小的第一次调用计时，记入 :attr:`compile_seconds`。"""
        if banned is None:
            banned = torch.zeros(self.model.config.vocab_size, dtype=torch.bool, device=tokens.device)
        batch = tokens.shape[0]
        if batch in self.compile_seconds:
            if self.skip_guards:  # 形状与 eval 模式由我们保证不变（见模块说明）
                with torch.compiler.set_stance("default", skip_guard_eval_unsafe=True):
                    return self._step(cache, tokens, slot, pads, banned)
            return self._step(cache, tokens, slot, pads, banned)
        start = time.perf_counter()
        out = self._step(cache, tokens, slot, pads, banned)
        self.compile_seconds[batch] = time.perf_counter() - start
        return out

    @torch.no_grad()
    def generate(
        self,
        prompt,
        max_new_tokens: int | None = None,
        *,
        method: str = "sample",
        temperature: float = 1.0,
        top_k: int | None = None,
        top_p: float | None = None,
        generator: torch.Generator | None = None,
        eos_id: int | None = None,
        suppress_ids: Sequence[int] = (PAD, BOS),
    ) -> torch.Tensor:
        """参数与返回值同 :func:`tformer_lib.lm.generate`（返回新词元 ``(B, L)``，1-D 提示时 ``(L,)``），逐词元相同；
        没有 ``use_cache``（静态缓存总是开着），也不接受空批次。

        另外支持长短不一的提示（id 列表的列表）：左侧填充后一起生成，每行与单独生成它相同（贪心时；
        采样时整批共用一个 generator，抽数的次序与逐条生成不同）。
        """
        model = self.model
        if method not in ("greedy", "sample"):
            raise ValueError(f"method 应是 'greedy' 或 'sample'，收到 {method!r}")
        if method == "sample" and is_greedy_temperature(check_temperature("temperature", temperature)):
            method = "greedy"  # 温度 0（或小到 float32 里就是 0）：贪心，与 lm.generate 相同
        check_top_k(top_k)
        check_top_p(top_p)
        suppress_ids = check_suppress_ids(suppress_ids)
        check_eos_id(eos_id, model.config.vocab_size, suppress_ids)
        rows, single = _prompt_rows(prompt, model.config.vocab_size)
        width = max(len(r) for r in rows)
        if width > self.max_len:
            raise ValueError(f"最长的提示有 {width} 个词元，超过了缓存的槽位数 L={self.max_len}")
        if max_new_tokens is None:
            max_new_tokens = self.max_len - width
        max_new_tokens = non_negative_int("max_new_tokens", max_new_tokens)
        if width + max_new_tokens > self.max_len:
            raise ValueError(f"最长的提示 {width} 加 max_new_tokens={max_new_tokens} 超过了缓存的槽位数 L={self.max_len}")
        device = model.lm_head.weight.device
        tokens, _, key_mask = (t.to(device) for t in left_pad(rows))  # (B, T)、(B, T)
        pads = (~key_mask).sum(dim=1)  # (B,)：每行左侧填充了几个
        batch = tokens.shape[0]
        was_training = model.training
        model.eval()
        try:
            cache = self.cache(batch)
            chosen: list[torch.Tensor] = []  # 每步选出的词 (B,)，最后拼成 (B, L)
            done = torch.zeros(batch, dtype=torch.bool, device=device)
            # 第 i 步（i ≥ 1）写进的槽位 (1,)：事先切好，循环里不再为它启动一个加法算子
            slots = torch.arange(width, width + max_new_tokens, device=device).split(1)
            banned = torch.zeros(model.config.vocab_size, dtype=torch.bool, device=device)  # (V,)
            banned[[t for t in suppress_ids if 0 <= t < model.config.vocab_size]] = True
            with contextlib.ExitStack() as stance:  # 第二个解码步起跳过守卫：整个循环只进出一次 set_stance（出错时也退出）
                for i in range(max_new_tokens):
                    if i == 0:
                        logits = self.prefill(cache, tokens, pads)  # (B, V)
                        greedy = None
                    elif i == 1 or not self.skip_guards:
                        logits, greedy = self.decode_step(cache, nxt[:, None], slots[i - 1], pads, banned)  # (B, V), (B,)
                    else:
                        if i == 2:
                            stance.enter_context(torch.compiler.set_stance("default", skip_guard_eval_unsafe=True))
                        logits, greedy = self._step(cache, nxt[:, None], slots[i - 1], pads, banned)  # (B, V), (B,)
                    # 选词：与 lm.generate 相同（贪心时解码步已在图里选好；采样用同样的分布、同样的随机数次序）
                    if method == "greedy":
                        if greedy is None:  # 预填充之后的第一个词：与 generate 同一个函数（顺带检查 logits 有限）
                            greedy = greedy_tokens(logits, suppress_ids)
                        nxt = greedy  # (B,)
                    else:
                        probs = next_token_distribution(logits, temperature, top_k, top_p, suppress_ids)
                        nxt = torch.multinomial(probs, 1, generator=generator).squeeze(-1)  # (B,)
                    if eos_id is not None:  # 已经结束的行只补 PAD（没有 eos_id 时没有行会结束，省掉这两个算子）
                        nxt = nxt.masked_fill(done, PAD)
                        done |= nxt == eos_id
                    chosen.append(nxt)
                    if eos_id is not None and bool(done.all()):
                        break
        finally:
            model.train(was_training)
        out = torch.stack(chosen, dim=1) if chosen else torch.full((batch, 0), PAD, dtype=torch.long, device=device)
        return out[0] if single else out


def generate_static(model: nn.Module, prompt, max_new_tokens: int | None = None, **kwargs) -> torch.Tensor:
    """不编译的静态缓存生成（一次性的便捷函数）：``StaticDecoder(model, compile=False).generate(...)``。"""
    return StaticDecoder(model, compile=False).generate(prompt, max_new_tokens, **kwargs)
