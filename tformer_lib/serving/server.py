"""本地推理服务的传输层：``python -m tformer_lib serve`` 用连续批处理引擎回答 OpenAI 补全接口的 HTTP 请求。

- ``POST /v1/completions``：OpenAI 的补全请求与回复（字段、默认值与扩展见 :mod:`.openai_api`）；
  ``"stream": true`` 时回复是服务器推送事件（server-sent events, SSE）：每段新文字一块 ``data: {…}``，
  最后一行 ``data: [DONE]``。所以官方的 ``openai`` 客户端可以直接用（测试核对）。
- ``GET /v1/models`` 列出本服务的模型；``GET /health`` 回复 ``{"status": "ok"}``。
- 坏请求得到 4xx 与 OpenAI 的错误对象 ``{"error": {"message", "type", "param", "code"}}``，服务不受影响：
  请求体超过 1 MiB（:data:`~.openai_api.MAX_BODY_BYTES`）→ 413；``body_timeout`` 秒内没收完请求体 → 408
  （只发了一半就不动的客户端不会一直占着处理函数）；不是 JSON、嵌套过深、整数过长 → 400。
- 客户端在回复写完之前断开（流式与否都一样）：它的提示从引擎里取消，槽位与块立即让给别的请求。
- ``serve`` 的宽限期结束时还没写完的请求（:meth:`EngineWorker.abort_all`）：普通请求得到 503 与错误对象，
  流式回复以一块错误事件和 ``data: [DONE]`` 结束。

Web 层用 Starlette + uvicorn（ASGI）；模型只在一个后台线程里运行：HTTP 处理函数把请求放进队列，
线程每一步调度引擎（:class:`~.engine.Engine`），把新词元经事件循环送回各自的响应。``temperature=0`` 的回复
与直接调用 ``generate(..., method="greedy")`` 逐词元相同；带 ``seed`` 的采样与同一种子的
``generate(..., method="sample")`` 相同（测试核对）。
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import queue
import threading
import time
import uuid
from dataclasses import dataclass

import torch
from torch import nn

from .detokenize import TextCodec, TextStream
from .engine import Engine, Request
from .openai_api import (MAX_BODY_BYTES, CompletionRequest, OpenAIError, choice_body, chunk_body, completion_body,
                         load_json, models_body, parse_completion_request)
from .sampling import Sampling

__all__ = ["EngineWorker", "Ticket", "create_app"]

_DONE = object()


@dataclass(eq=False)
class Ticket:
    """一个已提交的请求：新词元以 ``(tag, 词元)`` 送进 ``out``，最后是 ``(tag, 结束标记)``（或 ``(tag, 异常)``）。"""

    tag: int
    out: asyncio.Queue
    loop: asyncio.AbstractEventLoop
    request: Request | None = None  # 引擎线程接纳后填上


class EngineWorker:
    """在后台线程里运行引擎：``submit``/``cancel`` 线程安全，新词元经 ``loop.call_soon_threadsafe`` 送进 asyncio 队列。"""

    def __init__(self, model: nn.Module, **engine_options):
        self.engine = Engine(model, **engine_options)
        self._model, self._options = model, engine_options
        self._inbox: queue.Queue = queue.Queue()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="tformer-engine", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def submit(self, prompt: list[int], max_new_tokens: int, loop: asyncio.AbstractEventLoop, *,
               sampling: Sampling | None = None, out: asyncio.Queue | None = None, tag: int = 0,
               adapter: str | None = None) -> Ticket:
        """排队一个请求；几个请求可以共用一个 ``out`` 队列，用 ``tag`` 区分。``adapter``：LoRA 适配器名（None = 底座）。"""
        ticket = Ticket(tag, asyncio.Queue() if out is None else out, loop)
        self._inbox.put(("add", ticket, prompt, max_new_tokens, sampling, adapter))
        return ticket

    def cancel(self, ticket: Ticket) -> None:
        """让请求提前结束（停止串命中、客户端断开）；它的块由引擎线程归还。"""
        self._inbox.put(("cancel", ticket))

    def abort_all(self, exc: Exception) -> None:
        """让此刻所有在跑与排队的请求都以 ``exc`` 结束（服务要强制关闭时：客户端收到一个错误，而不是被掐断的连接）。"""
        self._inbox.put(("abort", exc))

    def _send(self, ticket: Ticket, item) -> None:
        ticket.loop.call_soon_threadsafe(ticket.out.put_nowait, (ticket.tag, item))

    def _take_inbox(self, tracked: list) -> None:
        timeout = 0.0 if self.engine.has_work else 0.02
        while True:
            try:
                kind, ticket, *args = self._inbox.get(timeout=timeout) if timeout else self._inbox.get_nowait()
            except queue.Empty:
                return
            timeout = 0.0
            if kind == "abort":
                for entry in tracked:
                    self.engine.cancel(entry[0].request)
                    self._send(entry[0], ticket)  # 这里的 ticket 是要送出的异常
                tracked.clear()
                continue
            if kind == "cancel":
                if ticket.request is not None and any(ticket is t for t, _ in tracked):  # 仍在这个引擎里
                    self.engine.cancel(ticket.request)
                continue
            prompt, n_new, sampling, adapter = args
            try:
                ticket.request = self.engine.add_request(prompt, n_new, sampling=sampling, adapter=adapter)
            except (ValueError, TypeError) as exc:  # 处理函数已先检查过；这里兜底
                self._send(ticket, exc)
                continue
            tracked.append([ticket, 0])

    def _loop(self) -> None:
        torch.set_num_threads(max(1, torch.get_num_threads()))
        tracked = []  # [ticket, 已送出的词元数]
        while not self._stop.is_set():
            self._take_inbox(tracked)
            try:
                if self.engine.has_work:
                    with torch.no_grad():
                        self.engine.step()
            except Exception as exc:  # 引擎出错：告诉所有等着的请求，换一个新引擎继续服务
                for ticket, _ in tracked:
                    self._send(ticket, exc)
                tracked = []
                self.engine = Engine(self._model, **self._options)
                continue
            for entry in tracked:
                ticket, sent = entry
                for token in ticket.request.output[sent:]:
                    self._send(ticket, token)
                entry[1] = len(ticket.request.output)
                if ticket.request.done:
                    self._send(ticket, _DONE)
            tracked = [e for e in tracked if not e[0].request.done]


async def _read_body(request, limit: int, timeout: float) -> bytes:
    """读请求体：超过 ``limit`` 字节 → 413，``timeout`` 秒内没读完 → 408。"""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and (len(declared) > 15 or int(declared) > limit):
        raise OpenAIError(f"请求体有 {declared if len(declared) <= 15 else '超过 10^15'} 字节，上限 {limit} 字节",
                          status=413, code="request_too_large")

    async def read() -> bytes:
        chunks, size = [], 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise OpenAIError(f"请求体超过上限 {limit} 字节", status=413, code="request_too_large")
            chunks.append(chunk)
        return b"".join(chunks)

    try:
        return await asyncio.wait_for(read(), timeout)
    except asyncio.TimeoutError:
        raise OpenAIError(f"{timeout:g} 秒内没有收完请求体", status=408, code="request_timeout") from None


async def _disconnected(http_request) -> None:
    """等到客户端断开（请求体已经读完，之后 ASGI 的 receive 只会送来 ``http.disconnect``）。"""
    while (await http_request.receive())["type"] != "http.disconnect":
        pass


def _sampling(request: CompletionRequest) -> Sampling | None:
    if request.temperature == 0 or request.top_p == 0:
        return None
    generator = torch.Generator()
    if request.seed is None:
        generator.seed()  # 不可预测的种子（默认种子对所有请求都一样）
    else:
        generator.manual_seed(request.seed)  # 每条提示都用这个种子：与它单独请求时的结果相同
    return Sampling(request.temperature, request.top_p if request.top_p < 1 else None, generator)


async def _events(worker: EngineWorker, request: CompletionRequest, codec: TextCodec | None, eos_ids: set[int],
                  adapter: str | None = None):
    """提交请求的每条提示，依次产生 ``(提示序号, 新文字, finish_reason 或 None, TextStream)``。"""
    loop, out = asyncio.get_running_loop(), asyncio.Queue()
    tickets = [worker.submit(ids, request.max_tokens, loop, sampling=_sampling(request), out=out, tag=i, adapter=adapter)
               for i, ids in enumerate(request.prompts)]
    decode = codec.decode if codec is not None else (lambda ids: "")
    streams = [TextStream(decode, request.stop, eos_ids) for _ in tickets]
    finished: set[int] = set()
    try:
        while len(finished) < len(tickets):
            tag, item = await out.get()
            if tag in finished:
                continue
            stream = streams[tag]
            if isinstance(item, Exception):
                raise item
            delta = stream.finish() if item is _DONE else stream.push(item)
            if item is _DONE or stream.stopped:
                finished.add(tag)
                if stream.stopped:
                    worker.cancel(tickets[tag])
                yield tag, delta, "stop" if stream.stopped else "length", stream
            elif delta:
                yield tag, delta, None, stream
    finally:
        for tag, ticket in enumerate(tickets):
            if tag not in finished:
                worker.cancel(ticket)


def create_app(model: nn.Module, tokenizer=None, *, model_name: str = "tformer", body_limit: int = MAX_BODY_BYTES,
               body_timeout: float = 30.0, stop_token_ids=(), **engine_options):
    """建一个 Starlette 应用。``tokenizer``（模型自己的分词器）让请求可以直接用文字；``model_name`` 是客户端
    在 ``model`` 字段里要给的名字；``engine_options`` 交给 :class:`~.engine.Engine`（如 ``max_batch``、``eos_id``）；
    ``stop_token_ids``：``eos_id`` 之外也表示结束的词元（如 LLaMA-3 的 ``<|eot_id|>``），生成到它就停下。
    ``engine_options`` 里有 ``adapters``（:class:`~tformer_lib.finetune.multi_lora.AdapterSet`）时，每个适配器名
    也是一个模型名（与 vLLM 的 LoRA 服务相同）：``model`` 字段选哪个适配器，``model_name`` 本身是底座。"""
    from starlette.applications import Starlette
    from starlette.exceptions import HTTPException
    from starlette.responses import JSONResponse, Response, StreamingResponse
    from starlette.routing import Route

    worker = EngineWorker(model, **engine_options)
    codec = None if tokenizer is None else tokenizer if isinstance(tokenizer, TextCodec) else TextCodec(tokenizer)
    eos_ids = {int(t) for t in stop_token_ids} | ({worker.engine.eos_id} - {None})
    created = int(time.time())
    vocab_size, max_len = model.config.vocab_size, model.config.max_len
    adapters = engine_options.get("adapters")
    names = (model_name, *(adapters.names if adapters is not None else ()))
    if len(set(names)) != len(names):
        raise ValueError(f"模型名与适配器名重复了：{list(names)}")

    def error(exc: OpenAIError):
        return JSONResponse(exc.body(), status_code=exc.status)

    def as_openai_error(exc: Exception) -> OpenAIError:
        if isinstance(exc, OpenAIError):
            return exc
        if isinstance(exc, (ValueError, TypeError)):
            return OpenAIError(str(exc))
        return OpenAIError(f"服务内部错误：{type(exc).__name__}: {exc}", status=500, type="server_error")

    async def completions(http_request):
        try:
            body = load_json(await _read_body(http_request, body_limit, body_timeout))
            request = parse_completion_request(body, model_name=names, vocab_size=vocab_size, max_len=max_len,
                                               codec=codec)
        except OpenAIError as exc:
            return error(exc)
        completion_id, now = f"cmpl-{uuid.uuid4().hex}", int(time.time())
        adapter, served = (None if request.model == model_name else request.model), request.model
        prompt_tokens = sum(len(ids) for ids in request.prompts)
        if request.stream:
            async def sse():
                completion_tokens = 0
                try:
                    async for tag, delta, finish, stream in _events(worker, request, codec, eos_ids, adapter):
                        completion_tokens += len(stream.tokens) if finish else 0
                        chunk = chunk_body(completion_id, now, served, [choice_body(tag, delta, finish)],
                                           include_usage=request.include_usage)
                        yield f"data: {json.dumps(chunk, ensure_ascii=False)}\n\n"
                    if request.include_usage:
                        chunk = chunk_body(completion_id, now, served, [], (prompt_tokens, completion_tokens), True)
                        yield f"data: {json.dumps(chunk, ensure_ascii=False)}\n\n"
                except Exception as exc:  # 头已经发出：错误作为一块事件送出（openai 客户端会抛出它）
                    yield f"data: {json.dumps(as_openai_error(exc).body(), ensure_ascii=False)}\n\n"
                yield "data: [DONE]\n\n"

            return StreamingResponse(sse(), media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
        texts, finishes, streams = [""] * len(request.prompts), [None] * len(request.prompts), [None] * len(request.prompts)

        async def collect():
            async for tag, delta, finish, stream in _events(worker, request, codec, eos_ids, adapter):
                texts[tag] += delta
                finishes[tag], streams[tag] = finish, stream

        work, gone = asyncio.ensure_future(collect()), asyncio.ensure_future(_disconnected(http_request))
        try:
            await asyncio.wait({work, gone}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (work, gone):
                task.cancel()  # 客户端走了：_events 退出时取消这些请求，它们的槽位与块立即让给别人
            results = await asyncio.gather(work, gone, return_exceptions=True)
        if isinstance(results[0], asyncio.CancelledError):
            return Response(status_code=499)  # 客户端已断开，这个回复没人收
        if isinstance(results[0], Exception):
            return error(as_openai_error(results[0]))
        choices = [choice_body(i, texts[i], finishes[i], streams[i].tokens) for i in range(len(texts))]
        completion_tokens = sum(len(s.tokens) for s in streams)
        return JSONResponse(completion_body(completion_id, now, served, choices, prompt_tokens, completion_tokens))

    async def models(http_request):
        return JSONResponse(models_body(names, created))

    async def health(http_request):
        return JSONResponse({"status": "ok"})

    async def http_error(http_request, exc: HTTPException):  # 404 路径不存在、405 方法不对：也用 OpenAI 的错误对象
        return error(OpenAIError(f"{http_request.method} {http_request.url.path}：{exc.detail}", status=exc.status_code))

    async def server_error(http_request, exc: Exception):
        return error(as_openai_error(exc))

    @contextlib.asynccontextmanager
    async def lifespan(app):
        worker.start()
        try:
            yield
        finally:
            worker.stop()

    app = Starlette(routes=[Route("/v1/completions", completions, methods=["POST"]),
                            Route("/v1/models", models, methods=["GET"]),
                            Route("/health", health, methods=["GET"])],
                    exception_handlers={HTTPException: http_error, Exception: server_error}, lifespan=lifespan)
    app.state.worker = worker
    return app
