"""官方 ``openai`` 客户端对着真的 uvicorn 服务（同一进程里的线程、空闲端口）：补全、流式、temperature=0 与直接
贪心生成相同、提示列表、停止串、种子、坏请求得到客户端的 BadRequestError、models.list()、32 个并发客户端；
以及原始 HTTP 的坏请求体（嵌套 10 万层、5000 位整数、超过 1 MiB……）都是 4xx 的 OpenAI 错误对象。"""

import http.client
import json
import socket
import threading
import time
import urllib.error
import urllib.request

import pytest
import torch

openai = pytest.importorskip("openai")
pytest.importorskip("uvicorn")

from tformer_lib.lm import generate  # noqa: E402
from tformer_lib.lm.pretrained import load_poem_model  # noqa: E402
from tformer_lib.serving import create_app  # noqa: E402
from tformer_lib.serving.detokenize import TextStream  # noqa: E402
from tformer_lib.serving.openai_api import _DEFAULT_ONLY, _EXTENSIONS, _HONOURED, _IGNORED, MAX_BODY_BYTES  # noqa: E402
from tformer_lib.specials import EOS  # noqa: E402

NAME = "poem-test"
SERVED = {}  # 夹具里建的应用：测试可以看它的引擎
PROMPTS = ["五言绝句《春晓》", "七言绝句《送别》", "五言律诗《山居》", "七言律诗《秋兴》"]


@pytest.fixture(scope="module")
def served(serve_in_thread):
    model, tokenizer, _ = load_poem_model()
    app = create_app(model, tokenizer, model_name=NAME, max_batch=8, eos_id=EOS, body_timeout=2.0)
    SERVED["app"] = app
    with serve_in_thread(app) as port:
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="x", timeout=60, max_retries=0)
        yield client, port, model, tokenizer


def _greedy(model, tokenizer, prompt, n):
    """直接用库生成：(文字, 词元 id 含 EOS, finish_reason)。"""
    ids = generate(model, tokenizer.encode(prompt, add_bos=True), n, method="greedy", eos_id=EOS).tolist()
    if EOS in ids:
        ids = ids[: ids.index(EOS) + 1]
    return tokenizer.decode(ids), ids, "stop" if ids and ids[-1] == EOS else "length"


def test_models_list_names_the_served_model(served):
    client, *_ = served
    models = client.models.list().data
    assert [m.id for m in models] == [NAME]
    assert models[0].object == "model" and models[0].owned_by == "tformer" and models[0].created > 0


def test_temperature_zero_equals_direct_greedy_generation(served):
    client, _, model, tokenizer = served
    reply = client.completions.create(model=NAME, prompt=PROMPTS[0], max_tokens=24, temperature=0)
    text, ids, finish = _greedy(model, tokenizer, PROMPTS[0], 24)
    assert reply.object == "text_completion" and reply.model == NAME and reply.id.startswith("cmpl-")
    assert [c.text for c in reply.choices] == [text] and text
    assert reply.choices[0].finish_reason == finish and reply.choices[0].index == 0
    assert reply.choices[0].logprobs is None and reply.choices[0].token_ids == ids  # token_ids：本库的扩展
    prompt_len = len(tokenizer.encode(PROMPTS[0], add_bos=True))
    assert (reply.usage.prompt_tokens, reply.usage.completion_tokens, reply.usage.total_tokens) == (
        prompt_len, len(ids), prompt_len + len(ids))


def test_default_max_tokens_is_openais_16_and_zero_gives_empty_text(served):
    client, _, model, tokenizer = served
    reply = client.completions.create(model=NAME, prompt=PROMPTS[1], temperature=0)
    assert reply.choices[0].text == _greedy(model, tokenizer, PROMPTS[1], 16)[0]
    assert reply.usage.completion_tokens == 16
    empty = client.completions.create(model=NAME, prompt=PROMPTS[1], max_tokens=0)
    assert empty.choices[0].text == "" and empty.choices[0].finish_reason == "length"
    assert empty.usage.completion_tokens == 0


def test_streaming_chunks_add_up_to_the_plain_reply(served):
    client, _, model, tokenizer = served
    chunks = list(client.completions.create(model=NAME, prompt=PROMPTS[2], max_tokens=30, temperature=0, stream=True,
                                            stream_options={"include_usage": True}))
    text, ids, finish = _greedy(model, tokenizer, PROMPTS[2], 30)
    with_choices = [c for c in chunks if c.choices]
    assert len(with_choices) > 5  # 真的是一段一段来的
    assert "".join(c.choices[0].text for c in with_choices) == text
    assert [c.choices[0].finish_reason for c in with_choices] == [None] * (len(with_choices) - 1) + [finish]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == len(ids)
    assert all(c.usage is None for c in with_choices)


def test_sse_wire_format_ends_with_done(served):
    _, port, *_ = served
    body = json.dumps({"model": NAME, "prompt": PROMPTS[0], "max_tokens": 5, "temperature": 0, "stream": True})
    request = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", data=body.encode(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as reply:
        assert reply.headers["Content-Type"].startswith("text/event-stream")
        raw = reply.read().decode()
    events = raw.split("\n\n")
    assert events[-1] == "" and events[-2] == "data: [DONE]"
    for event in events[:-2]:
        assert event.startswith("data: ")
        assert json.loads(event[len("data: "):])["object"] == "text_completion"


def test_list_of_prompts_gets_one_choice_each_in_order(served):
    client, _, model, tokenizer = served
    reply = client.completions.create(model=NAME, prompt=PROMPTS, max_tokens=20, temperature=0)
    assert [c.index for c in reply.choices] == list(range(len(PROMPTS)))
    assert [c.text for c in reply.choices] == [_greedy(model, tokenizer, p, 20)[0] for p in PROMPTS]
    assert reply.usage.prompt_tokens == sum(len(tokenizer.encode(p, add_bos=True)) for p in PROMPTS)


def test_token_id_prompts_are_accepted(served):
    client, _, model, tokenizer = served
    ids = tokenizer.encode(PROMPTS[3], add_bos=True)
    reply = client.completions.create(model=NAME, prompt=ids, max_tokens=10, temperature=0)
    assert reply.choices[0].text == _greedy(model, tokenizer, PROMPTS[3], 10)[0]


@pytest.mark.parametrize("stream", [False, True])
def test_stop_strings_cut_the_text_before_the_stop(served, stream):
    client, _, model, tokenizer = served
    full = _greedy(model, tokenizer, PROMPTS[0], 30)[0]
    two_chars = full[7:9]  # 一个跨两个词元的停止串：第一个字到来时必须先扣着
    stops = [two_chars, "不存在的串"]
    expected = full[: full.index(two_chars)]
    reply = client.completions.create(model=NAME, prompt=PROMPTS[0], max_tokens=30, temperature=0, stop=stops,
                                      stream=stream)
    if stream:
        chunks = [c.choices[0] for c in reply]
        text, finish = "".join(c.text for c in chunks), chunks[-1].finish_reason
        assert all(two_chars[0] not in c.text for c in chunks[:-1] if c.text.endswith(two_chars[0]))
    else:
        text, finish = reply.choices[0].text, reply.choices[0].finish_reason
    assert text == expected and finish == "stop"


def test_seed_makes_sampling_reproducible_and_equal_to_generate(served):
    client, _, model, tokenizer = served
    kwargs = dict(model=NAME, prompt=PROMPTS[1], max_tokens=16, temperature=0.9, top_p=0.95)
    a = client.completions.create(seed=7, **kwargs).choices[0]
    b = client.completions.create(seed=7, **kwargs).choices[0]
    prompt = tokenizer.encode(PROMPTS[1], add_bos=True)
    direct = generate(model, prompt, 16, method="sample", temperature=0.9, top_p=0.95, eos_id=EOS,
                      generator=torch.Generator().manual_seed(7)).tolist()
    direct = direct[: direct.index(EOS) + 1] if EOS in direct else direct
    assert a.text == b.text and a.token_ids == direct
    others = {client.completions.create(seed=s, **kwargs).choices[0].text for s in range(8, 11)}
    assert len(others | {a.text}) > 1  # 不同的种子确实给出不同的诗


@pytest.mark.parametrize("kwargs, param", [
    (dict(n=2), "n"),
    (dict(temperature=3), "temperature"),
    (dict(top_p=1.5), "top_p"),
    (dict(max_tokens=-1), "max_tokens"),
    (dict(max_tokens=5000), "max_tokens"),
    (dict(logprobs=2), "logprobs"),
    (dict(echo=True), "echo"),
    (dict(stop=["", "。"]), "stop"),
    (dict(prompt="春眠😀"), "prompt"),
    (dict(prompt=[]), "prompt"),
    (dict(extra_body={"beam_width": 3}), "beam_width"),
    (dict(extra_body={"max_new_tokens": 3}, max_tokens=3), "max_tokens"),
    (dict(n=1.0), "n"),  # 与 max_tokens 一样要整数
    (dict(user=5), "user"),
    (dict(stream=True, stream_options={"include_usage": "yes"}), "stream_options"),
])
def test_bad_requests_raise_bad_request_error_and_the_server_keeps_working(served, kwargs, param):
    client, _, model, tokenizer = served
    kwargs = {"model": NAME, "prompt": PROMPTS[0], **kwargs}
    with pytest.raises(openai.BadRequestError) as info:
        client.completions.create(**kwargs)
    error = info.value.body
    assert info.value.status_code == 400 and error["param"] == param and error["type"] == "invalid_request_error"
    assert param in error["message"] or "prompt" in error["message"]
    reply = client.completions.create(model=NAME, prompt=PROMPTS[0], max_tokens=4, temperature=0)
    assert reply.choices[0].text == _greedy(model, tokenizer, PROMPTS[0], 4)[0]


def test_unknown_model_is_404_not_found(served):
    client, *_ = served
    with pytest.raises(openai.NotFoundError) as info:
        client.completions.create(model="gpt-3.5-turbo-instruct", prompt="春")
    assert info.value.body["code"] == "model_not_found" and NAME in info.value.body["message"]


def test_32_concurrent_clients_each_get_their_own_greedy_result(served):
    client, _, model, tokenizer = served
    chars = "春夏秋冬山水风月花雪江河云雨天地"
    prompts = [f"五言绝句《{chars[i % 16]}{chars[(3 * i + 1) % 16]}》" for i in range(32)]
    lengths = [4 + i % 5 for i in range(32)]
    results, errors = [None] * 32, []

    def one(i):
        try:
            results[i] = client.completions.create(model=NAME, prompt=prompts[i], max_tokens=lengths[i],
                                                   temperature=0, stream=i % 2 == 1)
            if i % 2 == 1:
                results[i] = "".join(c.choices[0].text for c in results[i])
            else:
                results[i] = results[i].choices[0].text
        except Exception as exc:  # 线程里的异常带回主线程
            errors.append((i, exc))

    threads = [threading.Thread(target=one, args=(i,)) for i in range(32)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors and not any(t.is_alive() for t in threads)
    assert results == [_greedy(model, tokenizer, p, n)[0] for p, n in zip(prompts, lengths)]


def test_a_client_that_hangs_up_mid_stream_frees_its_sequence(served):
    """流式读了两块就断开：服务取消这个请求，引擎里不再有运行中的序列（块都还回去了）。"""
    _, port, *_ = served
    engine = SERVED["app"].state.worker.engine
    free_before, steps_before = len(engine.cache.manager.free_blocks), engine.steps
    # 七言律诗：贪心生成 48 个字后才出 EOS
    body = json.dumps({"model": NAME, "prompt": PROMPTS[3], "max_tokens": 100, "temperature": 0, "stream": True})
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     f"Content-Length: {len(body.encode())}\r\n\r\n{body}".encode())
        got = b""
        while got.count(b"data: ") < 2:
            chunk = sock.recv(4096)
            assert chunk, got.decode()
            got += chunk
    deadline = time.time() + 20
    while (engine.running or engine.waiting) and time.time() < deadline:
        time.sleep(0.05)
    assert not engine.running and not engine.waiting
    assert len(engine.cache.manager.free_blocks) == free_before
    assert engine.steps - steps_before < 30  # 没有取消的话要跑到 EOS：49 步（每步一个词元）


def test_a_client_that_hangs_up_before_a_plain_reply_frees_its_sequences(served):
    """不是流式的请求也一样：客户端在回复之前断开，服务取消它的全部提示，不再替没人收的回复算下去。"""
    _, port, *_ = served
    engine = SERVED["app"].state.worker.engine
    free_before, steps_before = len(engine.cache.manager.free_blocks), engine.steps
    body = json.dumps({"model": NAME, "prompt": [PROMPTS[3]] * 6, "max_tokens": 100, "temperature": 1, "seed": 3})
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     f"Content-Length: {len(body.encode())}\r\n\r\n{body}".encode())
        deadline = time.time() + 20
        while engine.steps - steps_before < 3 and time.time() < deadline:  # 等它真的开始生成
            time.sleep(0.01)
    deadline = time.time() + 20
    while (engine.running or engine.waiting) and time.time() < deadline:
        time.sleep(0.05)
    assert not engine.running and not engine.waiting
    assert len(engine.cache.manager.free_blocks) == free_before
    assert engine.steps - steps_before < 30  # 没有取消的话要跑到 EOS：这个种子下 49 步


# ---------------------------------------------------------------- 原始 HTTP 的坏请求体
def _raw_post(port, data: bytes, headers=None, path="/v1/completions", method="POST"):
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=data, method=method,
                                     headers={"Content-Type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(request, timeout=30) as reply:
            return reply.status, json.loads(reply.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def _chunked(body: bytes):
    yield body[: len(body) // 2]
    yield body[len(body) // 2:]


@pytest.mark.parametrize("data, status, needle", [
    (b"[" * 100_000 + b"]" * 100_000, 400, "嵌套"),
    (b'{"model": "poem-test", "prompt": [1, 5], "max_tokens": ' + b"9" * 5000 + b"}", 400, "JSON"),
    (b'{"model": "poem-test", "prompt": [1, 5], "seed": ' + b"9" * 4000 + b"}", 400, "seed"),
    (b'{"model": "poem-test", "prompt": [1, 5], "temperature": NaN}', 400, "NaN"),
    (b'{"model": "poem-test", "prompt": [1, 5], "temperature": 1e999}', 400, "temperature"),
    (b"\xff\xfe{}", 400, "UTF-8"),
    (b'{"model": "poem-test", "prompt": [1, 5], "temperature": "\\ud800"}', 400, "U+D800"),  # 被拒的值要回显
    (b'{"model": "poem-test", "prompt": [1, 5], "\\udfff": 1}', 400, "U+DFFF"),  # 不认识的字段名也回显
    (b'{"model": "poem-test", "prompt": "\\ud83d", "stop": ["\\ud800"]}', 400, "代理码位"),
    (b"{not json", 400, "JSON"),
    (b"[1, 2]", 400, "JSON 对象"),
    (b'{"prompt": "a"}', 400, "model"),
])
def test_bad_bodies_answer_4xx_openai_error_objects(served, data, status, needle):
    _, port, *_ = served
    got, body = _raw_post(port, data)
    assert got == status and needle in body["error"]["message"], body
    assert set(body["error"]) == {"message", "type", "param", "code"}


@pytest.mark.parametrize("value", [10 ** 400, -(10 ** 400), 1e308, [1, 10 ** 400]], ids=["big", "-big", "1e308", "list"])
@pytest.mark.parametrize("field", sorted(_HONOURED | set(_DEFAULT_ONLY) | _IGNORED | _EXTENSIONS))
def test_every_field_refuses_huge_numbers_with_400_naming_it(served, field, value):
    # 一类错：Python 的整数没有上限，转成 float（math.isfinite、float()）或 C 的整数时才溢出成 500；每个字段都要 400
    _, port, *_ = served
    body = {"model": NAME, "prompt": [1, 5], field: value}
    got, reply = _raw_post(port, json.dumps(body).encode())
    assert got == 400 and reply["error"]["param"] in (field, "prompt"), reply
    assert set(reply["error"]) == {"message", "type", "param", "code"}


def test_declared_body_over_the_limit_is_413_before_the_body_is_read(served):
    # 原始套接字：服务器看到 Content-Length 超过上限就回 413、不读请求体。用 urllib 整个发出去时，服务器回完就关连接，
    # 客户端还在写剩下的字节，会碰上 BrokenPipe（快的机器上时有发生），所以这里只发头和一小段请求体
    _, port, *_ = served
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     + f"Content-Length: {MAX_BODY_BYTES + 1}\r\n\r\n".encode() + b" " * 1024)
        reply = http.client.HTTPResponse(sock)
        reply.begin()
        body = json.loads(reply.read())
    assert reply.status == 413 and "上限" in body["error"]["message"], body
    assert set(body["error"]) == {"message", "type", "param", "code"}


def test_body_over_the_limit_without_content_length_is_413(served):
    _, port, *_ = served
    got, body = _raw_post(port, _chunked(b" " * (MAX_BODY_BYTES + 10)), headers={"Transfer-Encoding": "chunked"})
    assert got == 413 and body["error"]["code"] == "request_too_large"


def test_unknown_path_and_method_are_openai_errors(served):
    _, port, *_ = served
    assert _raw_post(port, b"{}", path="/v1/chat/nope")[0] == 404
    got, body = _raw_post(port, None, method="GET")
    assert got == 405 and "GET /v1/completions" in body["error"]["message"]


def test_a_stalled_body_gets_408_after_the_body_timeout(served):
    _, port, *_ = served
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: 100\r\n\r\n{\"model\": ")
        start = time.monotonic()
        reply = b""
        while not reply.endswith(b"}}") and (chunk := sock.recv(4096)):  # 读到错误对象结束
            reply += chunk
        reply = reply.decode()
        assert reply.startswith("HTTP/1.1 408") and "request_timeout" in reply
        assert 1.5 < time.monotonic() - start < 8  # body_timeout=2 秒


# ---------------------------------------------------------------- 拼文字：不完整的字与停止串的开头先扣着
def test_text_stream_holds_back_partial_characters_and_stop_prefixes():
    pieces = {5: "春", 6: "\ufffd", 7: "眠", 8: "不", 9: "觉"}

    def decode(ids):  # 6 与 7 合起来才是“眠”：只有 6 时解码出替换字符
        text = "".join(pieces[i] for i in ids)
        return text.replace("\ufffd眠", "眠")

    stream = TextStream(decode, stop=["不觉"], eos_id=2)
    assert [stream.push(t) for t in (5, 6, 7, 8)] == ["春", "", "眠", ""]  # “不”可能是停止串的开头
    assert stream.push(9) == "" and stream.stopped and stream.text == "春眠"
    assert stream.push(5) == "" and stream.tokens == [5, 6, 7, 8, 9]
    other = TextStream(decode, stop=["不觉"], eos_id=2)
    assert [other.push(t) for t in (5, 8, 5)] == ["春", "", "不春"]  # 不是停止串：扣着的字照样送出
    assert other.push(2) == "" and other.stopped and other.text == "春不春"
    last = TextStream(decode, stop=["不觉"])
    assert [last.push(t) for t in (5, 8)] == ["春", ""] and last.finish() == "不" and not last.stopped


def test_text_stream_stops_at_any_of_several_end_tokens():
    """LLaMA-3 之类的模型有几个结束词元：任何一个都让回复停下，且不进文字。"""
    stream = TextStream(lambda ids: "".join(chr(0x4e00 + i) for i in ids), eos_id=[2, 9])
    assert stream.push(5) == chr(0x4e05) and not stream.stopped
    assert stream.push(9) == "" and stream.stopped and stream.tokens == [5, 9]


def test_a_stop_string_is_not_matched_against_an_unfinished_character():
    """字节级 BPE 里一个字可能跨几个词元：没收全时它解码成 \ufffd，但那不是真的文字，停止串 "\ufffd" 不能匹配它。"""
    pieces = {5: "春", 6: "\ufffd", 7: "眠"}

    def decode(ids):  # 6 与 7 合起来才是“眠”
        return "".join(pieces[i] for i in ids).replace("\ufffd眠", "眠")

    stream = TextStream(decode, stop=["\ufffd"])
    assert [stream.push(t) for t in (5, 6, 7)] == ["春", "", "眠"] and not stream.stopped
    broken = TextStream(decode, stop=["\ufffd"])  # 生成到此为止：那个 \ufffd 真的留在了文字里
    assert [broken.push(t) for t in (5, 6)] == ["春", ""] and broken.finish() == "" and broken.stopped
