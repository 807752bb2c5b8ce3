"""服务里的文字与词元互转：把各种分词器统一成 :class:`TextCodec`，把逐个到来的词元拼成文字（:class:`TextStream`）。

流式回复每来一个新词元就要送出“新增的文字”。两件事让这一步不能只解码新词元本身：

- 字节级 BPE（如 GPT-2、LLaMA-3 的分词器）的一个汉字常常跨两三个词元，只解码前一半得到替换字符 ``\\ufffd``；
  所以每次解码*全部*已生成的词元，末尾是 ``\\ufffd`` 的部分先扣着，等字凑齐再送；
- 停止串（stop sequences，OpenAI 的 ``stop``）命中时，回复里不含停止串本身；而停止串可能跨几个词元到来，
  所以文字末尾若可能是某个停止串的开头，也先扣着，确定不是了再送。

非流式回复走同一条路（把各段拼起来），所以两种回复的文字逐字相同（测试核对）。
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence

__all__ = ["TextCodec", "TextStream"]


def _is_tokenizers_object(obj) -> bool:
    return type(obj).__module__.split(".")[0] == "tokenizers"


class TextCodec:
    """一个模型自己的分词器的统一接口：``encode(text) -> ids``（按模型的习惯加开头词元），``decode(ids) -> str``。

    - 本库的分词器（``CharTokenizer`` 等）：``encode(text, add_bos=True)``，与训练时一样以 BOS 开头；
    - 包着 ``tokenizers.Tokenizer`` 的 :class:`~tformer_lib.lm.hf_tokenizer.HFTokenizer`，以及
      ``tokenizers.Tokenizer`` 本身：按 ``tokenizer.json`` 自己的后处理模板加特殊词元（LLaMA 加 ``<s>``，
      GPT-2、Qwen2 什么也不加），与 ``transformers`` 的分词器默认的做法相同；
    - ``transformers`` 的分词器：``encode(text)``（默认加特殊词元）。

    解码时特殊词元不进文字。
    """

    def __init__(self, tokenizer):
        if not (callable(getattr(tokenizer, "encode", None)) and callable(getattr(tokenizer, "decode", None))):
            raise TypeError(f"tokenizer 应有 encode 与 decode 方法（如 CharTokenizer 或 tokenizers.Tokenizer），"
                            f"收到 {type(tokenizer).__name__}")
        self.tokenizer = tokenizer
        inner = getattr(tokenizer, "tokenizer", None)
        if _is_tokenizers_object(tokenizer):
            self._kind, self._template = "tokenizers", tokenizer
        elif inner is not None and _is_tokenizers_object(inner):
            self._kind, self._template = "wrapped", inner  # HFTokenizer：用它的 decode（藏起 BOS/PAD）
        elif "add_bos" in inspect.signature(tokenizer.encode).parameters:
            self._kind, self._template = "ours", None
        else:
            self._kind, self._template = "transformers", None

    def encode(self, text: str) -> list[int]:
        if self._kind == "ours":
            return list(self.tokenizer.encode(text, add_bos=True))
        if self._template is not None:
            return list(self._template.encode(text).ids)  # add_special_tokens=True：按模板加特殊词元
        return list(self.tokenizer.encode(text))

    def decode(self, ids: Sequence[int]) -> str:
        if self._kind in ("ours", "wrapped"):
            return self.tokenizer.decode(list(ids), stop_at_eos=False)
        return self.tokenizer.decode(list(ids), skip_special_tokens=True)

    def unknown_chars(self, text: str) -> list[str]:
        """``text`` 里分词器表示不了（会变成未登录词 UNK）的字符，按首次出现的顺序；字节级分词器永远为空。"""
        count = getattr(self.tokenizer, "count_unknown", None)
        if count is None:
            return []
        return [c for c in dict.fromkeys(text) if count(c)]


class TextStream:
    """把一个请求逐个生成的词元拼成文字。:meth:`push` 返回可以送出的新文字；命中停止串或 EOS 后 ``stopped`` 为真。

    ``decode``：id 列表 → 文字；``stop``：停止串（回复不含停止串本身）；``eos_id``：结束词元（不进文字），
    可以是一个 id 或几个 id（如 LLaMA-3 的 ``<|end_of_text|>`` 与 ``<|eot_id|>``）。
    """

    def __init__(self, decode: Callable[[Sequence[int]], str], stop: Sequence[str] = (),
                 eos_id: int | Sequence[int] | None = None):
        self.decode, self.stop = decode, tuple(stop)
        self.eos_ids = frozenset() if eos_id is None else frozenset([eos_id] if isinstance(eos_id, int) else eos_id)
        self.ids: list[int] = []  # 进入文字的词元（不含 EOS）
        self.tokens: list[int] = []  # 停下之前收到的全部词元（含 EOS）：计入 usage.completion_tokens
        self.text = ""  # 已送出的文字
        self.stopped = False

    def push(self, token: int) -> str:
        """收下一个新词元，返回这一步可以送出的文字（可能为空）。停下之后再来的词元被忽略。"""
        if self.stopped:
            return ""
        self.tokens.append(token)
        if token in self.eos_ids:
            self.stopped = True
            return self._send(self._full(), final=True)
        self.ids.append(token)
        return self._send(self._full(), final=False)

    def finish(self) -> str:
        """生成结束（到了长度上限）：送出扣着的文字（末尾不完整的字也照原样送出）。"""
        if self.stopped:
            return ""
        return self._send(self._full(), final=True)

    def _full(self) -> str:
        return self.decode(self.ids) if self.ids else ""

    def _send(self, full: str, final: bool) -> str:
        start = max(0, len(self.text) - max((len(s) for s in self.stop), default=0))
        # 末尾的 \ufffd 可能只是还没收全的字（下一个词元来了会变成真正的字）：没结束时只在定下来的文字里找停止串
        settled = full if final else full.rstrip("\ufffd")
        hits = [i for i in (settled.find(s, start) for s in self.stop) if i >= 0]
        if hits:  # 命中停止串：文字到最早的停止串为止
            self.stopped = True
            end = min(hits)
        elif final:
            end = len(full)
        else:
            end = len(full) - self._hold_back(full)
        delta = full[len(self.text) : end] if end > len(self.text) else ""
        self.text += delta
        return delta

    def _hold_back(self, full: str) -> int:
        """末尾要先扣着的字符数：不完整的字（``\\ufffd``），以及可能是某个停止串开头的后缀。"""
        held = len(full) - len(full.rstrip("\ufffd"))
        tail = full[: len(full) - held]
        for s in self.stop:
            for k in range(min(len(s) - 1, len(tail)), 0, -1):
                if tail.endswith(s[:k]):
                    held = max(held, len(full) - len(tail) + k)
                    break
        return held
