"""真实的 HTTP 测试：起 ``python -m tformer_lib serve`` 子进程，几个客户端并发请求，回复与直接生成相同；
坏请求得到 4xx 和 JSON 错误，服务照常工作；最后干净地停下。"""

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

import pytest
import torch

from tformer_lib.lm import LMConfig, generate, make_lm
from tformer_lib.lm.training import load_lm, save_lm_checkpoint


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _post(port, body, timeout=30):
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", data=data,
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    torch.manual_seed(0)
    model = make_lm(LMConfig(vocab_size=30, d_model=32, n_heads=4, n_layers=2, d_ff=48, max_len=40, positional="rope"))
    path = tmp_path_factory.mktemp("serve") / "lm.pt"
    save_lm_checkpoint(path, model)
    port = _free_port()
    env = dict(os.environ, TFORMER_THREADS="1", OMP_NUM_THREADS="1")
    proc = subprocess.Popen([sys.executable, "-m", "tformer_lib", "serve", "--checkpoint", str(path), "--port", str(port),
                             "--max-batch", "3"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 60
    while time.time() < deadline:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as resp:
                if json.loads(resp.read())["status"] == "ok":
                    break
        except OSError:
            if proc.poll() is not None:
                pytest.fail(f"服务没能启动：{proc.stderr.read()}")
            time.sleep(0.2)
    else:
        proc.kill()
        pytest.fail("服务 60 秒内没有就绪")
    loaded, _, _ = load_lm(path)
    yield port, loaded, proc
    proc.send_signal(signal.SIGINT)
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()
        pytest.fail("服务收到 SIGINT 后 20 秒内没有退出")


def test_concurrent_clients_get_direct_generation(server):
    port, model, _ = server
    prompts = [[4 + i, 5 + 2 * i, 6] for i in range(8)]
    lengths = [3 + 2 * i for i in range(8)]
    results = [None] * 8

    def client(i):
        results[i] = _post(port, {"prompt_ids": prompts[i], "max_new_tokens": lengths[i]})

    threads = [threading.Thread(target=client, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    for i, (status, body) in enumerate(results):
        assert status == 200, body
        assert json.loads(body)["ids"] == generate(model, prompts[i], lengths[i], method="greedy").tolist()


def test_streaming_sends_one_line_per_token(server):
    port, model, _ = server
    status, body = _post(port, {"prompt_ids": [7, 8], "max_new_tokens": 6, "stream": True})
    assert status == 200
    lines = [json.loads(line) for line in body.splitlines()]
    expected = generate(model, [7, 8], 6, method="greedy").tolist()
    assert [line["id"] for line in lines[:-1]] == expected
    assert lines[-1]["done"] is True and lines[-1]["ids"] == expected


@pytest.mark.parametrize("body, needle", [
    (b"{not json", "JSON"),
    ({"max_new_tokens": 3}, "prompt"),
    ({"prompt_ids": [5], "max_new_tokens": -1}, "max_new_tokens"),
    ({"prompt_ids": [5] * 30, "max_new_tokens": 20}, "max_len"),
    ({"prompt_ids": [5, 99]}, "prompts[0]"),
    ({"prompt_ids": [5], "stream": "yes"}, "stream"),
    ({"prompt": "春"}, "分词器"),
    ({"prompt_ids": [5], "temperature": 2}, "temperature"),
])
def test_bad_requests_get_4xx_and_server_survives(server, body, needle):
    port, model, proc = server
    status, text = _post(port, body)
    assert 400 <= status < 500
    assert needle in json.loads(text)["error"]
    assert proc.poll() is None
    status, text = _post(port, {"prompt_ids": [9], "max_new_tokens": 2})
    assert status == 200 and json.loads(text)["ids"] == generate(model, [9], 2, method="greedy").tolist()
