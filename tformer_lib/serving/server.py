"""本地推理服务：``python -m tformer_lib serve`` 在 localhost 上用连续批处理引擎回答 HTTP 请求。

- ``POST /v1/completions``，JSON 体：``{"prompt": "春眠", "max_new_tokens": 24, "stream": false}``；
  也可以直接给 ``"prompt_ids": [..]``。回复 ``{"ids": [...], "text": "..."}``；``"stream": true`` 时回复
  按行分隔的 JSON（NDJSON）：每个新词元一行 ``{"id": 17, "text": "晓"}``，最后一行 ``{"done": true, ...}``。
- ``GET /health`` 回复 ``{"status": "ok"}``。
- 坏请求（不是 JSON、缺少提示、参数不合法、提示太长）得到 4xx 与 ``{"error": "……"}``，服务不受影响。

Web 层用 Starlette + uvicorn（ASGI）；模型只在一个后台线程里运行：HTTP 处理函数把请求放进队列，
线程每一步调度引擎（:class:`~.engine.Engine`），把新词元经事件循环送回各自的响应。只做贪心解码，
所以每个回复都与直接调用 ``generate(..., method="greedy")`` 的结果相同（测试核对）。
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import queue
import threading

import torch
from torch import nn

from .engine import Engine

__all__ = ["EngineWorker", "create_app"]

_DONE = object()


class EngineWorker:
    """在后台线程里运行引擎：``submit`` 线程安全，新词元经 ``loop.call_soon_threadsafe`` 送进 asyncio 队列。"""

    def __init__(self, model: nn.Module, **engine_options):
        self.engine = Engine(model, **engine_options)
        self._inbox: queue.Queue = queue.Queue()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="tformer-engine", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def submit(self, prompt: list[int], max_new_tokens: int, loop: asyncio.AbstractEventLoop) -> asyncio.Queue:
        """排队一个请求；返回的队列依次收到每个新词元 id，最后收到结束标记（或一个异常）。"""
        out: asyncio.Queue = asyncio.Queue()
        self._inbox.put((prompt, max_new_tokens, loop, out))
        return out

    def _loop(self) -> None:
        torch.set_num_threads(max(1, torch.get_num_threads()))
        tracked = []  # (request, 已送出的词元数, loop, queue)
        while not self._stop.is_set():
            try:
                item = self._inbox.get(timeout=0.02 if not self.engine.has_work else 0.0)
            except queue.Empty:
                item = None
            while item is not None:
                prompt, n_new, loop, out = item
                try:
                    tracked.append([self.engine.add_request(prompt, n_new), 0, loop, out])
                except ValueError as exc:  # 处理函数已先检查过；这里兜底
                    loop.call_soon_threadsafe(out.put_nowait, exc)
                try:
                    item = self._inbox.get_nowait()
                except queue.Empty:
                    item = None
            if self.engine.has_work:
                with torch.no_grad():
                    self.engine.step()
            for entry in tracked:
                request, sent, loop, out = entry
                for token in request.output[sent:]:
                    loop.call_soon_threadsafe(out.put_nowait, token)
                entry[1] = len(request.output)
                if request.done:
                    loop.call_soon_threadsafe(out.put_nowait, _DONE)
            tracked = [e for e in tracked if not e[0].done]


def create_app(model: nn.Module, tokenizer=None, **engine_options):
    """建一个 Starlette 应用；``tokenizer``（如随书模型的 CharTokenizer）让请求可以直接用文字。"""
    from starlette.applications import Starlette
    from starlette.responses import JSONResponse, StreamingResponse
    from starlette.routing import Route

    from .ragged import check_prompts

    worker = EngineWorker(model, **engine_options)

    def error(message: str, status: int = 400):
        return JSONResponse({"error": message}, status_code=status)

    def parse(body) -> tuple[list[int], int, bool]:
        if not isinstance(body, dict):
            raise ValueError("请求体应是 JSON 对象")
        unknown = set(body) - {"prompt", "prompt_ids", "max_new_tokens", "stream"}
        if unknown:
            raise ValueError(f"不认识的字段：{sorted(unknown)}；可用 prompt、prompt_ids、max_new_tokens、stream")
        if ("prompt" in body) == ("prompt_ids" in body):
            raise ValueError("prompt（文字）与 prompt_ids（id 列表）必须恰好给一个")
        if "prompt" in body:
            if tokenizer is None:
                raise ValueError("这个服务没有分词器，请用 prompt_ids")
            if not isinstance(body["prompt"], str) or not body["prompt"]:
                raise ValueError(f"prompt 应是非空字符串，收到 {body['prompt']!r:.40}")
            ids = tokenizer.encode(body["prompt"], add_bos=True)
        else:
            ids = body["prompt_ids"]
        n_new = body.get("max_new_tokens", 32)
        stream = body.get("stream", False)
        if not isinstance(stream, bool):
            raise ValueError(f"stream 应是 true/false，收到 {stream!r}")
        (ids,) = check_prompts(model, [ids], [n_new])
        return ids, n_new, stream

    def text_of(ids: list[int]) -> str | None:
        return tokenizer.decode(ids, stop_at_eos=False) if tokenizer is not None else None

    async def completions(request):
        try:
            body = json.loads(await request.body())
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            return error(f"请求体不是合法的 JSON：{exc}")
        try:
            ids, n_new, stream = parse(body)
        except (ValueError, TypeError) as exc:
            return error(str(exc))
        out = worker.submit(ids, n_new, asyncio.get_running_loop())

        async def tokens():
            while True:
                item = await out.get()
                if item is _DONE:
                    return
                if isinstance(item, Exception):
                    raise item
                yield item

        if stream:
            async def lines():
                got = []
                async for token in tokens():
                    got.append(token)
                    yield json.dumps({"id": token, "text": text_of([token])}, ensure_ascii=False) + "\n"
                yield json.dumps({"done": True, "ids": got, "text": text_of(got)}, ensure_ascii=False) + "\n"

            return StreamingResponse(lines(), media_type="application/x-ndjson")
        got = [token async for token in tokens()]
        return JSONResponse({"ids": got, "text": text_of(got)})

    async def health(request):
        return JSONResponse({"status": "ok"})

    @contextlib.asynccontextmanager
    async def lifespan(app):
        worker.start()
        try:
            yield
        finally:
            worker.stop()

    app = Starlette(routes=[Route("/v1/completions", completions, methods=["POST"]),
                            Route("/health", health, methods=["GET"])], lifespan=lifespan)
    app.state.worker = worker
    return app
