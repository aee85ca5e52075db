"""edgerunner serve: the OpenAI-compatible HTTP server, spoken to over real sockets."""

from __future__ import annotations

import http.client
import json
import socket
import threading

import pytest

from edgerunner import Model
from edgerunner.model_builder import write_random_model
from edgerunner.server import Server

MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Name three rivers."}]


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    path = tmp_path_factory.mktemp("serve") / "m.gguf"
    write_random_model(path, arch="llama", preset="tiny", tensor_type="Q8_0", seed=5)
    model = Model.load(path, n_ctx=96, threads=2)
    server = Server(model, "127.0.0.1", 0)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def request(server, method, path, body=None, raw=None):
    host, port = server.server_address[:2]
    conn = http.client.HTTPConnection(host, port, timeout=120)
    data = raw if raw is not None else None if body is None else json.dumps(body).encode()
    conn.request(method, path, body=data, headers={"Content-Type": "application/json"} if data is not None else {})
    response = conn.getresponse()
    payload = response.read().decode()
    conn.close()
    return response.status, response.getheader("Content-Type"), payload


def events(payload):
    """The server-sent events' data fields, [DONE] last."""
    return [line[len("data: "):] for line in payload.split("\n\n") if line.startswith("data: ")]


def test_chat_and_text_completions_are_the_models_own(served):
    """A chat completion is Model.chat's reply for the same messages and sampling (greedy, and
    seeded at temperature 0.9), with its finish reason and token counts; streamed, its deltas
    join into the same text, then a finish chunk, a usage chunk when asked, and [DONE]; a text
    completion is Model.generate's continuation."""
    model = served.model
    for sampling in (dict(temperature=0), dict(temperature=0.9, seed=11)):
        want = model.chat(MESSAGES, max_tokens=12, **sampling)
        n_prompt = len(model.render_chat(MESSAGES))
        status, kind, payload = request(served, "POST", "/v1/chat/completions", dict(messages=MESSAGES, max_tokens=12, **sampling))
        assert status == 200 and kind == "application/json"
        reply = json.loads(payload)
        assert reply["object"] == "chat.completion" and reply["model"] == "m"
        [choice] = reply["choices"]
        assert choice["message"] == {"role": "assistant", "content": want}
        assert choice["finish_reason"] == {"length": "length", "eos": "stop", "context": "length"}[model.last_generation["finish_reason"]]
        assert reply["usage"] == {"prompt_tokens": n_prompt, "completion_tokens": model.last_generation["new_tokens"],
                                  "total_tokens": n_prompt + model.last_generation["new_tokens"]}

        status, kind, payload = request(served, "POST", "/v1/chat/completions",
                                        dict(messages=MESSAGES, max_tokens=12, stream=True, stream_options={"include_usage": True},
                                             **sampling))
        assert status == 200 and kind == "text/event-stream"
        data = events(payload)
        assert data[-1] == "[DONE]"
        chunks = [json.loads(d) for d in data[:-1]]
        assert {c["id"] for c in chunks} == {chunks[0]["id"]} and all(c["object"] == "chat.completion.chunk" for c in chunks)
        assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
        text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks[1:-2])
        assert text == want
        assert chunks[-2]["choices"][0]["finish_reason"] == choice["finish_reason"] and chunks[-2]["choices"][0]["delta"] == {}
        assert chunks[-1]["choices"] == [] and chunks[-1]["usage"] == reply["usage"]

    want = model.generate("the rivers", max_tokens=10, temperature=0)
    status, _, payload = request(served, "POST", "/v1/completions", dict(prompt="the rivers", max_tokens=10, temperature=0))
    reply = json.loads(payload)
    assert status == 200 and reply["object"] == "text_completion" and reply["choices"][0]["text"] == want
    status, _, payload = request(served, "POST", "/v1/completions",
                                 dict(prompt="the rivers", max_tokens=10, temperature=0, stream=True))
    data = events(payload)
    assert data[-1] == "[DONE]" and "".join(json.loads(d)["choices"][0]["text"] for d in data[:-1]) == want


def test_stop_strings_cut_the_reply(served):
    model = served.model
    sampling = dict(max_tokens=24, temperature=0.9, seed=3)
    full = model.chat(MESSAGES, **sampling)
    stop = full[len(full) // 2:len(full) // 2 + 2]
    assert stop.strip(), f"pick another stop string from {full!r}"
    status, _, payload = request(served, "POST", "/v1/chat/completions", dict(messages=MESSAGES, stop=[stop], **sampling))
    [choice] = json.loads(payload)["choices"]
    assert status == 200 and choice["message"]["content"] == full[:full.index(stop)] and choice["finish_reason"] == "stop"


def test_models_and_health(served):
    assert request(served, "GET", "/health")[::2] == (200, '{"status": "ok"}')
    status, _, payload = request(served, "GET", "/v1/models")
    assert status == 200 and [m["id"] for m in json.loads(payload)["data"]] == ["m"]


@pytest.mark.parametrize("path,body,status,message,param", [
    ("/v1/chat/completions", {"messages": []}, 400, "'messages' must be a non-empty list", "messages"),
    ("/v1/chat/completions", {"messages": [{"content": "x"}]}, 400, "has no 'role'", None),
    ("/v1/chat/completions", {"messages": MESSAGES, "temperature": "hot"}, 400, "'temperature' must be a number", "temperature"),
    ("/v1/chat/completions", {"messages": MESSAGES, "temperature": -1}, 400, "'temperature' must be at least 0.0", "temperature"),
    ("/v1/chat/completions", {"messages": MESSAGES, "top_p": 2}, 400, "'top_p' must be between 0.0 and 1.0", "top_p"),
    ("/v1/chat/completions", {"messages": MESSAGES, "max_tokens": 2.5}, 400, "'max_tokens' must be an integer", "max_tokens"),
    ("/v1/chat/completions", {"messages": MESSAGES, "n": 2}, 400, "only 'n': 1 is supported", "n"),
    ("/v1/chat/completions", {"messages": MESSAGES, "stop": [""]}, 400, "'stop' must be a non-empty string", "stop"),
    ("/v1/chat/completions", {"messages": MESSAGES, "logit_bias": {"x": 1}}, 400, "'logit_bias' has 'x'", "logit_bias"),
    ("/v1/chat/completions", {"messages": MESSAGES, "logit_bias": {"99999": 1}}, 400, "outside the vocabulary", None),
    ("/v1/completions", {"prompt": ""}, 400, "'prompt' must be a non-empty string", "prompt"),
    ("/v1/completions", {"prompt": "x " * 400}, 400, "but the context holds 96", None),
    ("/v1/embeddings", {"input": "x"}, 404, "no such path: POST /v1/embeddings", None),
])
def test_bad_requests_say_what_is_wrong(served, path, body, status, message, param):
    got, kind, payload = request(served, "POST", path, body)
    error = json.loads(payload)["error"]
    assert got == status and kind == "application/json" and message in error["message"], error
    assert error["param"] == param
    if "context holds" in message:
        assert error["code"] == "context_length_exceeded"


def test_malformed_bodies_are_refused(served):
    for raw, message in ((b"not json", "the request body is not JSON"), (b"[1, 2]", "must be a JSON object")):
        status, _, payload = request(served, "POST", "/v1/chat/completions", raw=raw)
        assert status == 400 and message in json.loads(payload)["error"]["message"]
    assert request(served, "GET", "/v1/nothing")[0] == 404


def test_a_client_that_leaves_mid_stream_frees_the_model(served):
    """A client that closes its connection after the first event: the generation stops there and
    the next request is served (the model is not left held)."""
    host, port = served.server_address[:2]
    body = json.dumps(dict(messages=MESSAGES, max_tokens=80, temperature=0, stream=True)).encode()
    with socket.create_connection((host, port), timeout=60) as s:
        s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  + f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
        got = b""
        while b"data: " not in got:  # (the headers may come in a segment of their own)
            chunk = s.recv(4096)
            assert chunk, f"the connection closed before the first event: {got!r}"
            got += chunk
    want = served.model.chat(MESSAGES, max_tokens=6, temperature=0)
    status, _, payload = request(served, "POST", "/v1/chat/completions", dict(messages=MESSAGES, max_tokens=6, temperature=0))
    assert status == 200 and json.loads(payload)["choices"][0]["message"]["content"] == want


def test_concurrent_requests_each_get_their_own_reply(served):
    """Requests from several clients at once are served one generation at a time; each gets the
    reply it gets alone."""
    model = served.model
    asks = [[{"role": "user", "content": f"Count to {n}."}] for n in range(4)]
    alone = [model.chat(m, max_tokens=10, temperature=0) for m in asks]
    got = [None] * len(asks)

    def ask(i):
        got[i] = json.loads(request(served, "POST", "/v1/chat/completions", dict(messages=asks[i], max_tokens=10,
                                                                                  temperature=0))[2])
    threads = [threading.Thread(target=ask, args=(i,)) for i in range(len(asks))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert [g["choices"][0]["message"]["content"] for g in got] == alone


def test_the_cli_serves_until_stopped(tmp_path):
    """`edgerunner serve MODEL --port 0` says where it listens, answers there, logs each request,
    and stops cleanly on SIGTERM, as on Ctrl-C (SIGINT, which a shell's background jobs ignore:
    so not the signal sent here)."""
    import os
    import re
    import signal
    import subprocess
    import sys

    path = tmp_path / "m.gguf"
    write_random_model(path, arch="llama", preset="tiny", seed=1)
    proc = subprocess.Popen([sys.executable, "-m", "edgerunner", "serve", str(path), "--port", "0", "--n-ctx", "64"],
                            stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True,
                            env=dict(os.environ, PYTHONUNBUFFERED="1"))
    try:
        lines = []
        while not any("serving" in line for line in lines):
            line = proc.stderr.readline()
            assert line, "".join(lines)
            lines.append(line)
        url = re.search(r"on (http://127\.0\.0\.1:(\d+))", lines[-1])
        assert url and "(cpu)" in lines[-1], lines[-1]
        conn = http.client.HTTPConnection("127.0.0.1", int(url.group(2)), timeout=60)
        conn.request("POST", "/v1/completions", body=json.dumps({"prompt": "hi", "max_tokens": 3, "temperature": 0}))
        response = conn.getresponse()
        assert response.status == 200 and len(json.loads(response.read())["choices"]) == 1
        conn.close()
        assert '"POST /v1/completions HTTP/1.1" 200' in proc.stderr.readline()
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0 and "edgerunner: stopped" in err and "Traceback" not in err


def test_one_connection_serves_request_after_request(served):
    """Keep-alive: an error (a 404 with a body, a bad field) leaves the connection usable, and the
    replies come in order on it."""
    host, port = served.server_address[:2]
    conn = http.client.HTTPConnection(host, port, timeout=60)
    for path, body, status in (("/v1/embeddings", {"input": "x"}, 404), ("/v1/chat/completions", {"messages": []}, 400),
                               ("/v1/completions", {"prompt": "hi", "max_tokens": 2, "temperature": 0}, 200)):
        conn.request("POST", path, body=json.dumps(body), headers={"Content-Type": "application/json"})
        response = conn.getresponse()
        assert response.status == status, response.read()
        response.read()
    conn.close()


def test_an_api_key_is_required_where_set(served):
    """With an API key, /v1 requests without it (or with another) get a 401; /health stays open."""
    served.api_key = "sesame"
    try:
        for headers in ({}, {"Authorization": "Bearer nope"}, {"Authorization": "sesame"}):
            host, port = served.server_address[:2]
            conn = http.client.HTTPConnection(host, port, timeout=60)
            conn.request("GET", "/v1/models", headers=headers)
            response = conn.getresponse()
            error = json.loads(response.read())["error"]
            assert response.status == 401 and error["code"] == "invalid_api_key" and "Bearer" in error["message"]
            conn.close()
        assert request(served, "GET", "/health")[0] == 200
        conn = http.client.HTTPConnection(host, port, timeout=60)
        conn.request("GET", "/v1/models", headers={"Authorization": "Bearer sesame"})
        assert conn.getresponse().status == 200
        conn.close()
    finally:
        served.api_key = None
