"""An OpenAI-compatible HTTP server for one loaded model (``edgerunner serve``), standard library only.

    POST /v1/chat/completions   messages → a reply (``stream: true``: server-sent events)
    POST /v1/completions        prompt → its continuation (raw text, no chat template)
    GET  /v1/models             the one model served
    GET  /health                {"status": "ok"}

Requests take the OpenAI fields ``max_tokens`` (or ``max_completion_tokens``; default: until the
model ends its turn or the context is full), ``temperature`` (default 1), ``top_p``, ``seed``,
``stop`` (a string or a list), ``presence_penalty``, ``frequency_penalty``, ``logit_bias`` and
``stream``, and llama.cpp's ``top_k``, ``min_p`` and ``repeat_penalty``. One generation runs at a
time: the model has one KV cache, and a request waits for the one before it (each then reuses the
prefix it shares with the last). Errors come back as ``{"error": {"message", "type", "param",
"code"}}`` with status 400 (the request), 401 (no or a wrong API key, where the server has one),
404 (the path) or 500 (the engine).
"""

from __future__ import annotations

import hmac
import json
import os
import sys
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Iterator

from edgerunner.chat_template import ChatTemplateError
from edgerunner.errors import ContextLengthError
from edgerunner.model import Model

_MAX_BODY = 16 << 20  # bytes of a request body


class RequestError(ValueError):
    """A request the server refuses (400), naming the field at fault."""

    def __init__(self, message: str, param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.param = param
        self.code = code


def _number(body: dict[str, Any], name: str, kind: type, default: Any, low: float | None = None,
            high: float | None = None) -> Any:
    value = body.get(name, default)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (kind is int and not float(value).is_integer()):
        raise RequestError(f"'{name}' must be {'an integer' if kind is int else 'a number'}, got {value!r}", name)
    value = kind(value)
    if (low is not None and value < low) or (high is not None and value > high):
        bounds = f"at least {low}" if high is None else f"between {low} and {high}"
        raise RequestError(f"'{name}' must be {bounds}, got {value}", name)
    return value


def generation_options(body: dict[str, Any], model: Model, n_prompt: int) -> dict[str, Any]:
    """Model.generate's keywords from an OpenAI request body (validated, RequestError otherwise)."""
    if _number(body, "n", int, 1) != 1:
        raise RequestError("only 'n': 1 is supported (one choice a request)", "n")
    room = max(model.n_ctx - n_prompt, 0)
    limit = body.get("max_completion_tokens", body.get("max_tokens"))
    max_tokens = room if limit is None else _number({"max_tokens": limit}, "max_tokens", int, room, 0)
    stop = body.get("stop") or []
    if isinstance(stop, str):
        stop = [stop]
    if not isinstance(stop, list) or not all(isinstance(s, str) and s for s in stop):
        raise RequestError("'stop' must be a non-empty string or a list of them", "stop")
    bias = body.get("logit_bias") or {}
    if not isinstance(bias, dict):
        raise RequestError("'logit_bias' must map token ids to numbers", "logit_bias")
    logit_bias = {}
    for token, value in bias.items():
        try:
            logit_bias[int(token)] = float(value)
        except (TypeError, ValueError):
            raise RequestError(f"'logit_bias' has {token!r}: {value!r}; it maps token ids to numbers", "logit_bias") from None
    return dict(max_tokens=max_tokens, stop=stop, logit_bias=logit_bias,
                temperature=_number(body, "temperature", float, 1.0, 0.0),
                top_p=_number(body, "top_p", float, 1.0, 0.0, 1.0),
                top_k=_number(body, "top_k", int, 0, 0),
                min_p=_number(body, "min_p", float, 0.0, 0.0, 1.0),
                repetition_penalty=_number(body, "repeat_penalty", float, 1.0, 0.0),
                presence_penalty=_number(body, "presence_penalty", float, 0.0, -2.0, 2.0),
                frequency_penalty=_number(body, "frequency_penalty", float, 0.0, -2.0, 2.0),
                seed=_number(body, "seed", int, None, 0))


_FINISH = {"eos": "stop", "stop": "stop", "length": "length", "context": "length"}


class Server(ThreadingHTTPServer):
    """Serves `model` (named `name` in responses) on (host, port); port 0 picks a free one."""

    daemon_threads = True

    def __init__(self, model: Model, host: str = "127.0.0.1", port: int = 8080, name: str | None = None,
                 log: bool = False, api_key: str | None = None):
        self.model = model
        self.log = log  # a line per request on stderr
        self.api_key = api_key  # where set, every /v1 request must carry "Authorization: Bearer <key>"
        self.name = name or os.path.splitext(os.path.basename(model.path))[0]
        self.fallback = model.chat_template is None  # (a generic ChatML template then)
        self.generating = threading.Lock()  # one generation at a time: the model has one KV cache
        super().__init__((host, port), _Handler)

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        return f"http://{host}:{port}"


class _Handler(BaseHTTPRequestHandler):
    server: Server
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 (the base class's name)
        if self.server.log:
            print(f"edgerunner: {self.address_string()} {format % args}", file=sys.stderr, flush=True)

    # ---- plumbing -------------------------------------------------------------------------

    def _send_json(self, status: int, payload: dict[str, Any]) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _error(self, status: int, message: str, kind: str = "invalid_request_error", param: str | None = None,
               code: str | None = None) -> None:
        self._send_json(status, {"error": {"message": message, "type": kind, "param": param, "code": code}})

    def _body(self) -> dict[str, Any]:
        length = self.headers.get("Content-Length")
        if length is None or not length.isdigit():
            raise RequestError("the request needs a JSON body with a Content-Length")
        if int(length) > _MAX_BODY:
            raise RequestError(f"the request body is {length} bytes; at most {_MAX_BODY} are taken")
        try:
            body = json.loads(self.rfile.read(int(length)) or b"null")
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise RequestError(f"the request body is not JSON: {e}") from None
        if not isinstance(body, dict):
            raise RequestError("the request body must be a JSON object")
        return body

    def _authorized(self) -> bool:
        """Whether the request may go on (an API key set and not given: a 401 is sent)."""
        key = self.server.api_key
        if not key or not self.path.startswith("/v1/"):
            return True
        given = self.headers.get("Authorization", "")
        if given.startswith("Bearer ") and hmac.compare_digest(given[len("Bearer "):].encode(), key.encode()):
            return True
        self._error(401, "this server needs an API key: send 'Authorization: Bearer <key>'", code="invalid_api_key")
        return False

    # ---- routes ---------------------------------------------------------------------------

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        if not self._authorized():
            return
        if self.path == "/health":
            self._send_json(200, {"status": "ok"})
        elif self.path == "/v1/models":
            self._send_json(200, {"object": "list", "data": [{"id": self.server.name, "object": "model", "created": 0,
                                                              "owned_by": "edgerunner"}]})
        else:
            self._error(404, f"no such path: GET {self.path} (GET /v1/models, /health; POST /v1/chat/completions, "
                             "/v1/completions)", code="not_found")

    def do_POST(self) -> None:  # noqa: N802
        chat = self.path == "/v1/chat/completions"
        try:
            body = self._body()  # (read whatever the path: the connection's next request starts after it)
        except RequestError as e:
            self.close_connection = True  # (a body not read, or not all of it)
            self._error(400, str(e), param=e.param, code=e.code)
            return
        if not self._authorized():
            return
        if not chat and self.path != "/v1/completions":
            self._error(404, f"no such path: POST {self.path} (POST /v1/chat/completions, /v1/completions)", code="not_found")
            return
        try:
            self._complete(body, chat)
        except RequestError as e:
            self._error(400, str(e), param=e.param, code=e.code)
        except ContextLengthError as e:
            self._error(400, str(e), code="context_length_exceeded")
        except (ChatTemplateError, ValueError) as e:
            self._error(400, str(e))
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client left
        except Exception as e:  # noqa: BLE001 (an engine failure is the server's error, named, not a dropped connection)
            self._error(500, f"{type(e).__name__}: {e}", kind="server_error")

    def _complete(self, body: dict[str, Any], chat: bool) -> None:
        model = self.server.model
        if chat:
            messages = body.get("messages")
            if not isinstance(messages, list) or not messages:
                raise RequestError("'messages' must be a non-empty list of {role, content}", "messages")
            ids = model.render_chat(messages, template_fallback=self.server.fallback)
        else:
            prompt = body.get("prompt")
            if not isinstance(prompt, str) or not prompt:
                raise RequestError("'prompt' must be a non-empty string", "prompt")
            ids = model.tokenize(prompt)
        options = generation_options(body, model, len(ids))
        stream = bool(body.get("stream", False))
        usage = isinstance(body.get("stream_options"), dict) and bool(body["stream_options"].get("include_usage"))
        ident = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:24]
        with self.server.generating:
            pieces = model.generate(ids, stream=True, **options)
            info = model.last_generation  # (this generation's facts, filled as it runs)
            if stream:
                self._stream(pieces, info, ident, chat, usage)
            else:
                self._whole(pieces, info, ident, chat)

    def _usage(self, info: dict[str, Any]) -> dict[str, int]:
        prompt, new = info.get("prompt_tokens", 0), info.get("new_tokens", 0)
        return {"prompt_tokens": prompt, "completion_tokens": new, "total_tokens": prompt + new}

    def _whole(self, pieces: Iterator[str], info: dict[str, Any], ident: str, chat: bool) -> None:
        text = "".join(pieces)
        finish = _FINISH.get(info.get("finish_reason", "length"), "length")
        choice: dict[str, Any] = ({"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": finish}
                                  if chat else {"index": 0, "text": text, "logprobs": None, "finish_reason": finish})
        self._send_json(200, {"id": ident, "object": "chat.completion" if chat else "text_completion",
                              "created": int(time.time()), "model": self.server.name, "choices": [choice],
                              "usage": self._usage(info)})

    def _stream(self, pieces: Iterator[str], info: dict[str, Any], ident: str, chat: bool, usage: bool) -> None:
        """Server-sent events, as OpenAI sends them: a chunk a text piece (chat: a first one with
        the role), one with the finish reason, one with the usage where stream_options asks,
        then [DONE]; each event one HTTP chunk."""
        created = int(time.time())
        kind = "chat.completion.chunk" if chat else "text_completion"

        def send(payload: dict[str, Any] | str) -> None:
            data = f"data: {payload if isinstance(payload, str) else json.dumps(payload)}\n\n".encode()
            self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
            self.wfile.flush()

        def chunk(piece: str | None, finish: str | None, first: bool = False) -> dict[str, Any]:
            if chat:
                delta = {"role": "assistant", "content": ""} if first else {} if piece is None else {"content": piece}
                choice = {"index": 0, "delta": delta, "finish_reason": finish}
            else:
                choice = {"index": 0, "text": piece or "", "logprobs": None, "finish_reason": finish}
            return {"id": ident, "object": kind, "created": created, "model": self.server.name, "choices": [choice]}

        first = next(pieces, None)  # (an error before the first piece still gets its own status)
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        try:
            if chat:
                send(chunk(None, None, first=True))
            piece = first
            try:
                while piece is not None:
                    send(chunk(piece, None))
                    piece = next(pieces, None)
            except (BrokenPipeError, ConnectionResetError):
                raise
            except Exception as e:  # noqa: BLE001 (the status is sent: the error goes into the stream)
                send({"error": {"message": f"{type(e).__name__}: {e}", "type": "server_error", "param": None, "code": None}})
            else:
                send(chunk(None, _FINISH.get(info.get("finish_reason", "length"), "length")))
                if usage:
                    send({"id": ident, "object": kind, "created": created, "model": self.server.name, "choices": [],
                          "usage": self._usage(info)})
            send("[DONE]")
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()
        finally:
            close = getattr(pieces, "close", None)
            if close is not None:
                close()  # (a client that left ends the generation here)
