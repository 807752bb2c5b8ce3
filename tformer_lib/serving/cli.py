"""``python -m tformer_lib serve``：在本机起一个 HTTP 推理服务（见 :mod:`tformer_lib.serving.server`）。

例子::

    python -m tformer_lib serve                       # 随书唐诗模型，http://127.0.0.1:8000
    curl -s localhost:8000/v1/completions -d '{"prompt": "五言绝句《春晓》", "max_new_tokens": 24}'

由 :mod:`tformer_lib.cli` 的一个挂钩（:func:`register_serve_command`）注册。
"""

from __future__ import annotations

__all__ = ["register_serve_command"]


def register_serve_command(sub) -> None:
    """往 ``python -m tformer_lib`` 的子命令表里加 ``serve``。"""
    sub.metavar = sub.metavar[:-1] + ",serve}" if sub.metavar else None
    s = sub.add_parser("serve", help="在 localhost 上起一个连续批处理的 HTTP 推理服务（第 13 章）",
                       description="POST /v1/completions（JSON：prompt 或 prompt_ids、max_new_tokens、stream），"
                                   "GET /health。只做贪心解码。")
    s.add_argument("--checkpoint", default=None, help="语言模型检查点（默认：随书唐诗模型）")
    s.add_argument("--host", default="127.0.0.1", help="监听地址（默认只在本机）")
    s.add_argument("--port", type=int, default=8000)
    s.add_argument("--max-batch", type=int, default=8, help="同时运行的序列上限")
    s.set_defaults(run=_cmd_serve)


def _cmd_serve(args) -> int:
    import uvicorn

    from ..lm.pretrained import load_poem_model
    from ..lm.training import load_lm
    from ..specials import EOS
    from .server import create_app

    if not 0 < args.port < 65536:
        raise ValueError(f"--port 应在 1–65535 之间，收到 {args.port}")
    if args.max_batch < 1:
        raise ValueError(f"--max-batch 应为正整数，收到 {args.max_batch}")
    model, tokenizer, _ = load_lm(args.checkpoint) if args.checkpoint else load_poem_model()
    app = create_app(model, tokenizer, max_batch=args.max_batch, eos_id=EOS)
    print(f"推理服务：http://{args.host}:{args.port}（Ctrl-C 停止）", flush=True)
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning")
    return 0
