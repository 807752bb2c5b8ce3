"""OpenAI 补全接口（Completions API）的请求解析、检查与回复格式；HTTP 传输在 :mod:`.server`。

请求 ``POST /v1/completions`` 的字段分四类（其余字段一律 400，点名不认识的字段）：

- **照做**：``model``（必须是本服务的模型名，否则 404）、``prompt``（字符串、字符串列表、id 列表或 id 列表的列表）、
  ``max_tokens``（默认 16，与 OpenAI 相同）、``temperature``（[0, 2]，默认 1；0 = 贪心）、``top_p``（[0, 1]，默认 1）、
  ``stop``（字符串或至多 4 个字符串）、``seed``（同一种子、同一请求，结果相同）、``stream``、
  ``stream_options``（``{"include_usage": true}`` 在 ``[DONE]`` 前多发一块用量）；
- **只接受默认值**（给别的值就 400）：``n=1``、``best_of=1``、``echo=false``、``logprobs=null``、
  ``frequency_penalty=0``、``presence_penalty=0``、``logit_bias={}``、``suffix=null``（``n``、``best_of`` 要整数 1）；
- **接受但忽略**：``user``（调用方的标识字符串，只用于记录）；
- **本库的扩展**：``prompt_ids``（词元 id，等同于 id 形式的 ``prompt``）、``max_new_tokens``（``max_tokens`` 的别名）；
  非流式回复的每个 ``choices[i]`` 多一个 ``token_ids``（生成的词元 id，含结束词元；流式的块里没有）。

``seed`` 交给 ``torch.Generator.manual_seed``：PyTorch 的 CPU 生成器（梅森旋转）只用种子的低 32 位，所以模 2³² 相同的
种子给出相同的结果。

字段值为 ``null`` 等同于没给。错误回复是 OpenAI 的错误对象
``{"error": {"message", "type", "param", "code"}}``，状态码 4xx。
"""

from __future__ import annotations

import json
import math
import numbers
from dataclasses import dataclass

from .detokenize import TextCodec

__all__ = ["MAX_BODY_BYTES", "MAX_JSON_DEPTH", "MAX_PROMPTS", "OpenAIError", "CompletionRequest", "load_json",
           "parse_completion_request", "choice_body", "completion_body", "chunk_body", "models_body"]

MAX_BODY_BYTES = 1 << 20  #: 请求体上限：1 MiB（超过得到 413）
MAX_JSON_DEPTH = 32  #: JSON 嵌套层数上限（合法的补全请求最多 3 层）
MAX_PROMPTS = 128  #: 一个请求里的提示条数上限
MAX_STOP = 4  #: 停止串个数上限（与 OpenAI 相同）
DEFAULT_MAX_TOKENS = 16  #: OpenAI 补全接口 max_tokens 的默认值

_HONOURED = {"model", "prompt", "max_tokens", "temperature", "top_p", "stop", "seed", "stream", "stream_options"}
_DEFAULT_ONLY = {"n": 1, "best_of": 1, "echo": False, "logprobs": None, "frequency_penalty": 0,
                 "presence_penalty": 0, "logit_bias": {}, "suffix": None}
_IGNORED = {"user"}
_EXTENSIONS = {"prompt_ids", "max_new_tokens"}
_SEED_RANGE = (-(1 << 63), (1 << 64) - 1)  # torch.Generator.manual_seed 接受的范围


class OpenAIError(Exception):
    """一个要回给客户端的错误：HTTP 状态码与 OpenAI 错误对象的四个字段。"""

    def __init__(self, message: str, param: str | None = None, status: int = 400,
                 type: str = "invalid_request_error", code: str | None = None):
        super().__init__(message)
        self.message, self.param, self.status, self.type, self.code = message, param, status, type, code

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


@dataclass
class CompletionRequest:
    """检查过的补全请求：每条提示已是词元 id。"""

    prompts: list[list[int]]
    max_tokens: int
    temperature: float
    top_p: float
    stop: tuple[str, ...]
    seed: int | None
    stream: bool
    include_usage: bool
    model: str = ""  # 请求里的模型名（多适配器服务时它选适配器）


def _refuse_constant(name: str):
    raise ValueError(f"JSON 里不允许 {name}（标准 JSON 没有 NaN/Infinity）")


def load_json(raw: bytes):
    """解析请求体：不是 UTF-8、不是合法 JSON、嵌套过深、整数位数超过 Python 的上限，都是 400 而不是 500。"""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise OpenAIError(f"请求体应是 UTF-8 编码的 JSON：{exc}") from None
    try:
        value = json.loads(text, parse_constant=_refuse_constant)
    except RecursionError:
        raise OpenAIError(f"请求体的 JSON 嵌套太深（上限 {MAX_JSON_DEPTH} 层）") from None
    except ValueError as exc:  # JSONDecodeError，以及超过 4300 位的整数（int 的字符串转换上限）
        raise OpenAIError(f"请求体不是可接受的 JSON：{exc}") from None
    stack = [(value, 1)]  # 不用递归地数嵌套层数
    while stack:
        item, depth = stack.pop()
        if depth > MAX_JSON_DEPTH:
            raise OpenAIError(f"请求体的 JSON 嵌套太深（上限 {MAX_JSON_DEPTH} 层）")
        if isinstance(item, dict):
            stack.extend((v, depth + 1) for v in item.values())
            stack.extend((k, depth) for k in item)
        elif isinstance(item, list):
            stack.extend((v, depth + 1) for v in item)
        elif isinstance(item, str):
            _check_unicode(item)
    return value


def _check_unicode(text: str) -> None:
    """JSON 的 ``"\\ud800"`` 转义能解析出不成对的代理码位：它不是 Unicode 字符，连报错的回复都编码不成 UTF-8。"""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise OpenAIError(f"请求体的字符串里有不成对的代理码位 U+{ord(text[exc.start]):04X}（JSON 的 \\u 转义），"
                          "它不是合法的 Unicode 字符") from None


def _short(value) -> str:
    text = json.dumps(value, ensure_ascii=False)
    return text if len(text) <= 60 else text[:57] + "…"


def _number(body: dict, name: str, default: float, lo: float, hi: float) -> float:
    value = body.get(name)
    if value is None:
        return default
    # 先比大小再问有限：一个 400 位的整数比较起来没问题，math.isfinite 却要先把它转成 float（OverflowError → 500）
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not (lo <= value <= hi and math.isfinite(value)):
        raise OpenAIError(f"{name} 应是 [{lo}, {hi}] 内的数，收到 {_short(value)}", name)
    return float(value)


def _int(body: dict, name: str, lo: int, hi: int | None = None) -> int | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < lo or (hi is not None and value > hi):
        expected = f"[{lo}, {hi}] 内的整数" if hi is not None else f"不小于 {lo} 的整数"
        raise OpenAIError(f"{name} 应是{expected}，收到 {_short(value)}", name)
    return value


def _bool(body: dict, name: str) -> bool:
    value = body.get(name, False)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise OpenAIError(f"{name} 应是 true 或 false，收到 {_short(value)}", name)
    return value


def _token_prompts(value, name: str) -> list[list[int]] | None:
    """id 形式的提示：``[1, 2, 3]`` 或 ``[[1, 2], [3]]``；不是这两种形式时返回 None。"""
    def ids(x):
        return isinstance(x, list) and x and all(isinstance(t, int) and not isinstance(t, bool) for t in x)
    if ids(value):
        return [value]
    if isinstance(value, list) and value and all(ids(x) for x in value):
        return value
    return None


def _prompts(body: dict, codec: TextCodec | None) -> list[list[int]]:
    given = [n for n in ("prompt", "prompt_ids") if body.get(n) is not None]
    if len(given) != 1:
        raise OpenAIError("prompt（文字或词元 id）与扩展字段 prompt_ids 必须恰好给一个" if given
                          else "缺少 prompt：应是字符串、字符串列表或词元 id 列表", "prompt")
    name = given[0]
    value = body[name]
    prompts = _token_prompts(value, name)
    if prompts is None:
        texts = [value] if isinstance(value, str) else value
        if name == "prompt_ids" or not isinstance(texts, list) or not texts or not all(isinstance(t, str) for t in texts):
            expected = "id 列表或 id 列表的列表" if name == "prompt_ids" else "字符串、非空的字符串列表、id 列表或 id 列表的列表"
            raise OpenAIError(f"{name} 应是{expected}，收到 {_short(value)}", name)
        if codec is None:
            raise OpenAIError("这个服务没有分词器，不能接受文字提示：请给词元 id（如 \"prompt\": [1, 17, 5]）", name)
        prompts = []
        for i, text in enumerate(texts):
            unknown = codec.unknown_chars(text)
            if unknown:
                raise OpenAIError(f"{name} 第 {i} 条里有模型词表外的字符 {unknown[:10]}，它们会变成 <unk>；请去掉或换掉", name)
            prompts.append(codec.encode(text))
            if not prompts[-1]:
                raise OpenAIError(f"{name} 第 {i} 条编码后没有词元（空字符串）；请至少给一个字", name)
    if len(prompts) > MAX_PROMPTS:
        raise OpenAIError(f"{name} 一次至多 {MAX_PROMPTS} 条，收到 {len(prompts)} 条", name)
    return prompts


def _stop(body: dict) -> tuple[str, ...]:
    value = body.get("stop")
    if value is None:
        return ()
    stops = [value] if isinstance(value, str) else value
    if not isinstance(stops, list) or not 1 <= len(stops) <= MAX_STOP or not all(isinstance(s, str) and s for s in stops):
        raise OpenAIError(f"stop 应是非空字符串或 1–{MAX_STOP} 个非空字符串的列表，收到 {_short(value)}", "stop")
    return tuple(stops)


def parse_completion_request(body, *, model_name, vocab_size: int, max_len: int,
                             codec: TextCodec | None) -> CompletionRequest:
    """检查一个补全请求体（已解析的 JSON），返回 :class:`CompletionRequest`；不合法时抛 :class:`OpenAIError`。

    ``model_name``：本服务的模型名，或几个名字的元组（底座 + 各 LoRA 适配器，见 ``serve --adapter``）。
    """
    names = (model_name,) if isinstance(model_name, str) else tuple(model_name)
    shown = names[0] if len(names) == 1 else list(names)
    if not isinstance(body, dict):
        raise OpenAIError(f"请求体应是 JSON 对象，收到 {type(body).__name__}")
    unknown = sorted(set(body) - _HONOURED - set(_DEFAULT_ONLY) - _IGNORED - _EXTENSIONS)
    if unknown:
        raise OpenAIError(f"不认识的字段：{unknown}；支持的字段见 tformer_lib.serving.openai_api 的说明", unknown[0])
    for name, default in _DEFAULT_ONLY.items():
        value = body.get(name)
        same_kind = isinstance(value, bool) == isinstance(default, bool) and (name not in ("n", "best_of")
                                                                              or isinstance(value, int))
        if value is not None and not (value == default and same_kind):
            raise OpenAIError(f"这个服务只支持 {name}={_short(default)}，收到 {_short(value)}", name, code="unsupported_value")
    if body.get("user") is not None and not isinstance(body["user"], str):
        raise OpenAIError(f"user 应是字符串（调用方的标识），收到 {_short(body['user'])}", "user")
    model = body.get("model")
    if not isinstance(model, str):
        raise OpenAIError(f"model 应是模型名字符串（本服务的是 {shown!r}，见 GET /v1/models），收到 {_short(model)}",
                          "model")
    if model not in names:
        raise OpenAIError(f"没有模型 {model!r}：本服务只有 {shown!r}（见 GET /v1/models）", "model",
                          status=404, code="model_not_found")
    if body.get("max_tokens") is not None and body.get("max_new_tokens") is not None:
        raise OpenAIError("max_tokens 与它的别名 max_new_tokens 只能给一个", "max_tokens")
    length_name = "max_new_tokens" if body.get("max_new_tokens") is not None else "max_tokens"
    max_tokens = _int(body, length_name, 0)
    max_tokens = DEFAULT_MAX_TOKENS if max_tokens is None else max_tokens
    stream = _bool(body, "stream")
    options = body.get("stream_options")
    if options is not None and (not stream or not isinstance(options, dict) or set(options) - {"include_usage"}):
        raise OpenAIError(f"stream_options 只能与 stream=true 一起给，形如 {{\"include_usage\": true}}，收到 {_short(options)}",
                          "stream_options")
    try:
        include_usage = _bool(options or {}, "include_usage")
    except OpenAIError as exc:
        raise OpenAIError(f"stream_options.{exc.message}", "stream_options") from None
    request = CompletionRequest(prompts=_prompts(body, codec), max_tokens=max_tokens,
                                temperature=_number(body, "temperature", 1.0, 0, 2), top_p=_number(body, "top_p", 1.0, 0, 1),
                                stop=_stop(body), seed=_int(body, "seed", *_SEED_RANGE), stream=stream,
                                include_usage=include_usage, model=model)
    if request.stop and codec is None:
        raise OpenAIError("这个服务没有分词器，不能按停止串（stop）停下", "stop")
    for i, ids in enumerate(request.prompts):
        if min(ids) < 0 or max(ids) >= vocab_size:
            raise OpenAIError(f"第 {i} 条提示的词元 id 应在 [0, {vocab_size}) 内，收到范围 [{min(ids)}, {max(ids)}]", "prompt")
        if len(ids) + max_tokens > max_len:
            raise OpenAIError(f"第 {i} 条提示有 {len(ids)} 个词元，加 {length_name}={max_tokens} 超过了模型的上下文长度 "
                              f"max_len={max_len}；请缩短提示或减小 {length_name}", length_name,
                              code="context_length_exceeded")
    return request


# ---------------------------------------------------------------- 回复
def choice_body(index: int, text: str, finish_reason: str | None, token_ids: list[int] | None = None) -> dict:
    choice = {"text": text, "index": index, "logprobs": None, "finish_reason": finish_reason}
    if token_ids is not None:
        choice["token_ids"] = token_ids  # 本库的扩展
    return choice


def _usage(prompt_tokens: int, completion_tokens: int) -> dict:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


def completion_body(completion_id: str, created: int, model_name: str, choices: list[dict],
                    prompt_tokens: int, completion_tokens: int) -> dict:
    return {"id": completion_id, "object": "text_completion", "created": created, "model": model_name,
            "choices": choices, "usage": _usage(prompt_tokens, completion_tokens)}


def chunk_body(completion_id: str, created: int, model_name: str, choices: list[dict],
               usage: tuple[int, int] | None = None, include_usage: bool = False) -> dict:
    """流式回复的一块（``data: {...}``）；``include_usage`` 时每块都有 ``usage`` 字段，只有最后一块不是 null。"""
    chunk = {"id": completion_id, "object": "text_completion", "created": created, "model": model_name,
             "choices": choices}
    if include_usage:
        chunk["usage"] = _usage(*usage) if usage is not None else None
    return chunk


def models_body(model_name, created: int) -> dict:
    """``GET /v1/models`` 的回复：一个名字，或几个名字（底座在前，之后是各适配器）。"""
    names = (model_name,) if isinstance(model_name, str) else tuple(model_name)
    return {"object": "list",
            "data": [{"id": name, "object": "model", "created": created, "owned_by": "tformer"} for name in names]}
