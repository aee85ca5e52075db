"""A local stand-in for the Hugging Face hub, enough of its protocol for huggingface_hub.

Two threaded HTTP servers on 127.0.0.1: the hub (point ``HF_ENDPOINT`` at ``hub.url``) and a
"CDN" on another port, so LFS downloads leave the hub's origin as they do for real:

- ``GET /api/models/{repo}/revision/{rev}?blobs=true``: the commit and every file's size,
  git blob id and, for LFS files, ``lfs: {size, sha256, pointerSize}``.
- ``HEAD /{repo}/resolve/{rev}/{path}``: ``X-Repo-Commit``; an LFS file answers 302 to the CDN
  with ``X-Linked-Etag`` (its sha256) and ``X-Linked-Size``; a small file answers 200 with its
  git blob id as ``ETag``.
- ``GET`` of the same, or of ``/cdn/{sha256}`` on the CDN: the bytes, honouring
  ``Range: bytes=N-`` (206 + ``Content-Range``).
- Errors carry ``X-Error-Code`` (RepoNotFound, RevisionNotFound, EntryNotFound, GatedRepo) as
  the hub's do.

Faults for the tests, per file path, each for a number of GETs: ``drop`` (send half the body,
then cut the connection), ``truncate`` (a short body with an honest Content-Length), ``corrupt``
(one byte flipped), ``stall`` (send half the body, then wait for ``release`` to be set);
and ``down``, the hub answering 503. Every request is logged.
"""

from __future__ import annotations

import hashlib
import json
import socket
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import unquote, urlsplit


@dataclass
class Repo:
    files: dict[str, bytes]                      # path -> content, at the current commit
    commit: str = ""
    lfs: set[str] | None = None                  # paths stored with LFS (None: every .gguf)
    gated_token: str | None = None               # a gated repo: this token reads it
    history: dict[str, dict[str, bytes]] = field(default_factory=dict)  # older commit -> files

    def __post_init__(self) -> None:
        if not self.commit:
            self.commit = hashlib.sha1(json.dumps(sorted(self.files)).encode()).hexdigest()

    def is_lfs(self, path: str) -> bool:
        return path in self.lfs if self.lfs is not None else path.endswith(".gguf")

    def files_at(self, revision: str) -> dict[str, bytes] | None:
        if revision in ("main", self.commit):
            return self.files
        return self.history.get(revision)


def git_blob_id(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


@dataclass(frozen=True)
class Request:
    server: str         # "hub" or "cdn"
    method: str
    path: str
    range: str | None
    authorization: str | None


class FakeHub:
    """The two servers and their shared state. Use as a context manager."""

    def __init__(self) -> None:
        self.repos: dict[str, Repo] = {}
        self.requests: list[Request] = []
        self.faults: dict[str, list[str]] = {}   # file path -> faults still to apply, in order
        self.down = False                        # the hub answers 503 to everything
        self.release = threading.Event()         # lets a stalled transfer go on
        self._lock = threading.Lock()
        self._hub = _Server(self, "hub")
        self._cdn = _Server(self, "cdn")
        self.cdn_url = self._cdn.url

    @property
    def url(self) -> str:
        return self._hub.url

    def __enter__(self) -> FakeHub:
        self._hub.start()
        self._cdn.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._hub.stop()
        self._cdn.stop()

    def add(self, repo_id: str, repo: Repo) -> Repo:
        self.repos[repo_id] = repo
        return repo

    def fault(self, path: str, kind: str, times: int = 1) -> None:
        with self._lock:
            self.faults.setdefault(path, []).extend([kind] * times)

    def reset(self) -> None:
        with self._lock:
            self.requests.clear()
            self.faults.clear()
            self.down = False
            self.release.set()
            self.release = threading.Event()

    def gets(self, path_end: str = "") -> list[Request]:
        """The GETs of file bytes (not API calls) whose path ends with ``path_end``."""
        return [r for r in self.requests if r.method == "GET" and not r.path.startswith("/api/")
                and r.path.endswith(path_end)]

    # -- state lookups for the handler --

    def log(self, request: Request) -> None:
        with self._lock:
            self.requests.append(request)

    def take_fault(self, path: str) -> str | None:
        with self._lock:
            queue = self.faults.get(path)
            return queue.pop(0) if queue else None

    def blob(self, sha256: str) -> tuple[str, bytes] | None:
        for repo in self.repos.values():
            for files in (repo.files, *repo.history.values()):
                for path, data in files.items():
                    if hashlib.sha256(data).hexdigest() == sha256:
                        return path, data
        return None


class _Server:
    def __init__(self, hub: FakeHub, role: str):
        handler = type(f"{role}Handler", (_Handler,), {"hub": hub, "role": role})
        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self._httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._httpd.server_address[1]}"
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()


class _Handler(BaseHTTPRequestHandler):
    hub: FakeHub
    role: str

    def log_message(self, *args: object) -> None:  # quiet
        pass

    def do_HEAD(self) -> None:
        self._handle(head=True)

    def do_GET(self) -> None:
        self._handle(head=False)

    # -- routing --

    def _handle(self, head: bool) -> None:
        url = urlsplit(self.path)
        path = unquote(url.path)
        self.hub.log(Request(self.role, "HEAD" if head else "GET", path, self.headers.get("Range"),
                             self.headers.get("Authorization")))
        if self.role == "hub" and self.hub.down:
            return self._error(503, None)
        if self.role == "cdn":
            found = self.hub.blob(path.rsplit("/", 1)[-1]) if path.startswith("/cdn/") else None
            if found is None:
                return self._error(404, "EntryNotFound")
            return self._send_file(found[0], found[1], head, {})
        parts = path.strip("/").split("/")
        if parts[:2] == ["api", "models"] and len(parts) >= 6 and parts[4] == "revision":
            return self._api_info("/".join(parts[2:4]), "/".join(parts[5:]))
        if len(parts) >= 5 and parts[2] == "resolve":
            return self._resolve("/".join(parts[:2]), parts[3], "/".join(parts[4:]), head)
        self._error(404, None)

    def _repo(self, repo_id: str) -> Repo | None:
        repo = self.hub.repos.get(repo_id)
        if repo is None:
            self._error(401, "RepoNotFound")  # the hub answers 401 for missing (or private) repos
            return None
        if repo.gated_token and self.headers.get("Authorization") != f"Bearer {repo.gated_token}":
            self._error(401, "GatedRepo")
            return None
        return repo

    def _api_info(self, repo_id: str, revision: str) -> None:
        repo = self._repo(repo_id)
        if repo is None:
            return
        files = repo.files_at(revision)
        if files is None:
            return self._error(404, "RevisionNotFound")
        commit = repo.commit if files is repo.files else revision
        siblings = []
        for name, data in sorted(files.items()):
            entry = {"rfilename": name, "size": len(data), "blobId": git_blob_id(data)}
            if repo.is_lfs(name):
                entry["lfs"] = {"size": len(data), "sha256": hashlib.sha256(data).hexdigest(), "pointerSize": 134}
            siblings.append(entry)
        body = json.dumps({"id": repo_id, "sha": commit, "siblings": siblings}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _resolve(self, repo_id: str, revision: str, name: str, head: bool) -> None:
        repo = self._repo(repo_id)
        if repo is None:
            return
        files = repo.files_at(revision)
        if files is None:
            return self._error(404, "RevisionNotFound")
        commit = repo.commit if files is repo.files else revision
        if name not in files:
            return self._error(404, "EntryNotFound", {"X-Repo-Commit": commit})
        data = files[name]
        if repo.is_lfs(name):
            sha = hashlib.sha256(data).hexdigest()
            self.send_response(302)
            self.send_header("Location", f"{self.hub.cdn_url}/cdn/{sha}")
            self.send_header("X-Repo-Commit", commit)
            self.send_header("X-Linked-Etag", f'"{sha}"')
            self.send_header("X-Linked-Size", str(len(data)))
            self.send_header("ETag", f'"{git_blob_id(data)}"')  # the pointer file's, as the hub does
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        self._send_file(name, data, head, {"X-Repo-Commit": commit, "ETag": f'"{git_blob_id(data)}"'})

    # -- responses --

    def _send_file(self, name: str, data: bytes, head: bool, headers: dict[str, str]) -> None:
        start = 0
        asked = self.headers.get("Range")
        if asked and asked.startswith("bytes=") and asked.endswith("-"):
            start = int(asked[len("bytes="):-1])
        fault = None if head else self.hub.take_fault(name)
        body = data[start:]
        if fault == "corrupt" and body:
            body = bytes([body[0] ^ 0xFF]) + body[1:]
        if fault == "truncate":
            body = body[: len(body) // 2]
        self.send_response(206 if start else 200)
        for key, value in headers.items():
            self.send_header(key, value)
        if start:
            self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
        self.send_header("Accept-Ranges", "bytes")
        self.send_header("Content-Length", str(len(data) - start if fault == "drop" else len(body)))
        self.end_headers()
        if head:
            return
        if fault == "drop":  # half the body, then the connection dies
            self.wfile.write(body[: len(body) // 2])
            self.wfile.flush()
            self.connection.shutdown(socket.SHUT_RDWR)
            self.close_connection = True
            return
        if fault == "stall":  # half the body, then nothing until released
            self.wfile.write(body[: len(body) // 2])
            self.wfile.flush()
            self.hub.release.wait(60)
            body = body[len(body) // 2:]
        try:
            self.wfile.write(body)
        except (BrokenPipeError, ConnectionResetError):  # the client went away
            pass

    def _error(self, status: int, code: str | None, headers: dict[str, str] | None = None) -> None:
        body = json.dumps({"error": code or "not found"}).encode()
        self.send_response(status)
        if code:
            self.send_header("X-Error-Code", code)
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)
