"""``python -m tformer_lib serve``：在本机起一个说 OpenAI 补全接口的 HTTP 推理服务（见 :mod:`tformer_lib.serving.server`）。

例子::

    python -m tformer_lib serve                          # 随书唐诗模型，http://127.0.0.1:8000，模型名 tformer-poem
    python -m tformer_lib serve --model run.pt           # 本库的语言模型检查点（lm-train 的输出）
    python -m tformer_lib serve --model ./Qwen2.5-0.5B   # Hugging Face 模型目录（config.json + safetensors）
    python -m tformer_lib serve --adapter dufu=dufu.lora.pt  # 随书模型 + LoRA 适配器：model 字段给 "dufu" 就用它（第 17 章）
    curl -s localhost:8000/v1/completions -H 'Content-Type: application/json' \\
         -d '{"model": "tformer-poem", "prompt": "五言绝句《春晓》", "max_tokens": 24, "temperature": 0}'

也可以用官方客户端：``openai.OpenAI(base_url="http://127.0.0.1:8000/v1", api_key="x").completions.create(...)``。
收到 SIGTERM 或 Ctrl-C（SIGINT）时不再接新连接，等进行中的请求至多 ``--shutdown-timeout`` 秒，然后退出（退出码 0）。
端口被占用时在打印“推理服务：http://…”之前就报错退出（退出码 1）。

由 :mod:`tformer_lib.commands.cli` 的一个挂钩（:func:`register_serve_command`）注册。
"""

from __future__ import annotations

import math
import os
import signal
import socket
import sys
from pathlib import Path

__all__ = ["register_serve_command", "load_served_model", "bind_socket", "parse_adapters"]

POEM_MODEL_NAME = "tformer-poem"  #: 随书唐诗模型在 /v1/models 里的名字


def register_serve_command(sub) -> None:
    """往 ``python -m tformer_lib`` 的子命令表里加 ``serve``。"""
    s = sub.add_parser("serve", help="在 localhost 上起一个连续批处理、说 OpenAI 补全接口的 HTTP 推理服务（第 13 章）",
                       description="POST /v1/completions（OpenAI 补全接口，stream=true 时为 SSE）、GET /v1/models、"
                                   "GET /health。temperature=0 为贪心。")
    s.add_argument("--model", "--checkpoint", dest="model", default=None,
                   help="本库的语言模型检查点文件，或 Hugging Face 模型目录（含 config.json）；默认：随书唐诗模型")
    s.add_argument("--served-model-name", default=None,
                   help=f"客户端在 model 字段里给的名字（默认：随书模型为 {POEM_MODEL_NAME}，否则为 --model 路径的最后一段）")
    s.add_argument("--adapter", action="append", default=[], metavar="NAME=PATH",
                   help="加一个 LoRA 适配器（lm-finetune --adapter-out 的输出）：客户端在 model 字段里给 NAME 就用它，"
                        "同一批里可以混着不同适配器的请求；可以给几次")
    s.add_argument("--host", default="127.0.0.1", help="监听地址（默认只在本机）")
    s.add_argument("--port", type=int, default=8000)
    s.add_argument("--max-batch", type=int, default=8, help="同时运行的序列上限")
    s.add_argument("--body-timeout", type=float, default=30.0, help="收完一个请求体的时限（秒），超时回 408")
    s.add_argument("--shutdown-timeout", type=float, default=5.0,
                   help="收到 SIGTERM/SIGINT 后等进行中的请求的时限（秒），之后强行结束它们")
    s.set_defaults(run=_cmd_serve)


def load_served_model(path: str | os.PathLike | None):
    """按路径读要服务的模型：``(model, tokenizer, 默认模型名, eos_ids, suppress_ids)``。

    ``None`` → 随书唐诗模型；含 ``config.json`` 的目录 → Hugging Face 模型（:func:`tformer_lib.lm.load_hf`，
    结束词元取自 ``generation_config.json``/``config.json``，可以有几个；不屏蔽任何词元，与 ``transformers`` 相同，
    除非目录里是本书的字符分词器）；文件 → 本库的检查点（:func:`tformer_lib.lm.training.load_lm`）。
    """
    from ..specials import BOS, EOS, PAD
    from ..text import CharTokenizer

    if path is None:
        from ..lm.pretrained import load_poem_model

        model, tokenizer, _ = load_poem_model()
        return model, tokenizer, POEM_MODEL_NAME, (EOS,), (PAD, BOS)
    p = Path(path)
    name = p.resolve().name
    if p.is_dir():
        if not (p / "config.json").is_file():
            raise ValueError(f"--model 目录 {str(p)!r} 里没有 config.json：它不是 Hugging Face 模型目录")
        from ..lm import load_hf
        from ..lm.hf_tokenizer import special_token_ids

        model, tokenizer = load_hf(p)
        ours = isinstance(tokenizer, CharTokenizer)  # save_hf 写出的随书模型：与本库的检查点一样屏蔽 PAD/BOS
        return model, tokenizer, name, special_token_ids(p)["eos_token_id"], (PAD, BOS) if ours else ()
    if not p.exists():
        raise ValueError(f"--model 路径 {str(p)!r} 不存在（应是检查点文件或 Hugging Face 模型目录）")
    from ..lm.training import load_lm

    model, tokenizer, _ = load_lm(p)
    return model, tokenizer, name, (EOS,), (PAD, BOS)


def bind_socket(host: str, port: int) -> socket.socket:
    """先绑定并监听端口：端口被占用时在这里报错（还没打印“推理服务：…”），成功后交给 uvicorn。"""
    try:
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
    except socket.gaierror as exc:
        raise ValueError(f"--host {host!r} 不是可用的地址：{exc.strerror}") from None
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # 与 uvicorn 相同：只容许 TIME_WAIT 的旧连接
    try:
        sock.bind((host, port))
        sock.listen(2048)
    except OSError as exc:
        sock.close()
        raise OSError(f"无法在 {host}:{port} 上监听（{exc.strerror}）：端口可能已被占用，请换一个 --port") from None
    return sock


def parse_adapters(values) -> dict[str, str]:
    """``["dufu=dufu.pt", …]`` → ``{"dufu": "dufu.pt", …}``；格式不对、名字含空白或重复时报错。"""
    if isinstance(values, str) or not all(isinstance(v, str) for v in values):
        raise TypeError(f"values 应是 NAME=PATH 字符串的列表，收到 {values!r}")
    out: dict[str, str] = {}
    for value in values:
        name, sep, path = value.partition("=")
        if not sep or not name or not path or any(c.isspace() for c in name):
            raise ValueError(f"--adapter 应写成 NAME=PATH（如 dufu=dufu.lora.pt；名字里不能有空白），收到 {value!r}")
        if name in out:
            raise ValueError(f"--adapter 的名字 {name!r} 给了两次")
        out[name] = path
    return out


def _check_args(args) -> None:
    parse_adapters(args.adapter)  # 格式不对时在占端口、读模型之前就报错
    if not 0 < args.port < 65536:
        raise ValueError(f"--port 应在 1–65535 之间，收到 {args.port}")
    if args.max_batch < 1:
        raise ValueError(f"--max-batch 应为正整数，收到 {args.max_batch}")
    for name in ("body_timeout", "shutdown_timeout"):
        value = getattr(args, name)
        if not (math.isfinite(value) and value > 0):
            raise ValueError(f"--{name.replace('_', '-')} 应是正的秒数，收到 {value}")


def _server_class(uvicorn):
    """uvicorn 的 ``Server``，关闭时多做一件事：宽限期快到时还没写完的请求都以 503 错误结束。

    uvicorn 在宽限期（``--shutdown-timeout``）结束时直接取消还在跑的处理函数：普通请求收到纯文本的 500，
    流式回复被拦腰截断、没有 ``data: [DONE]``。这里在宽限期的最后一小段（至多 0.5 秒）之前让引擎把在跑的请求
    全部以 OpenAI 的错误对象结束，处理函数就来得及把错误（流式时再加 ``data: [DONE]``）写完。
    """
    import asyncio

    from ..serving.openai_api import OpenAIError

    class Server(uvicorn.Server):
        worker = None
        grace = 0.0

        async def shutdown(self, sockets=None):
            error = OpenAIError("服务正在关闭，这个请求没能写完", status=503, type="server_error", code="server_shutting_down")
            margin = min(0.5, self.grace / 4)
            handle = asyncio.get_running_loop().call_later(self.grace - margin, self.worker.abort_all, error)
            try:
                await super().shutdown(sockets)
            finally:
                handle.cancel()

    return Server


def _cmd_serve(args) -> int:
    import uvicorn

    from ..serving.server import create_app

    _check_args(args)
    sock = bind_socket(args.host, args.port)  # 先占端口：被占用时马上失败，不必等模型读完
    try:
        model, tokenizer, name, eos_ids, suppress_ids = load_served_model(args.model)
        adapters = None
        if args.adapter:
            from ..finetune import AdapterSet, load_adapter, quantize_base_for

            loaded = {k: load_adapter(v) for k, v in parse_adapters(args.adapter).items()}
            adapters = AdapterSet(quantize_base_for(model, loaded.values()), loaded)  # QLoRA：底座先量化成训练时的格式
        app = create_app(model, tokenizer, model_name=args.served_model_name or name, body_timeout=args.body_timeout,
                         stop_token_ids=eos_ids[1:], max_batch=args.max_batch, eos_id=eos_ids[0] if eos_ids else None,
                         suppress_ids=suppress_ids, adapters=adapters)
        config = uvicorn.Config(app, log_level="warning", timeout_graceful_shutdown=args.shutdown_timeout)
        server = _server_class(uvicorn)(config)
        server.worker, server.grace = app.state.worker, args.shutdown_timeout
        # uvicorn 处理完信号、优雅退出后会把信号再发给自己一次（好让默认处理函数结束进程）；这里装上只记一笔的
        # 处理函数，退出码就是 0，而不是被 SIGTERM 杀死或 KeyboardInterrupt 的回溯。
        received = []
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda number, frame: received.append(number))
        print(f"推理服务：http://{args.host}:{args.port}（模型名 {args.served_model_name or name}；Ctrl-C 停止）",
              flush=True)
        server.run(sockets=[sock])
    finally:
        sock.close()
    if not server.started:
        print("错误：推理服务没能启动（见上面 uvicorn 的日志）", file=sys.stderr)
        return 1
    print("推理服务已停止", flush=True)
    return 0
