"""Moving one file's bytes from the hub into its cache, resumably, and proving them right.

The bytes go to ``<blob>.incomplete`` through huggingface_hub's ``http_get`` (its retries, its
Range resume after a dropped connection). That file stays when the transfer stops (a network
failure, Ctrl-C), and the next attempt continues it with an HTTP Range request. The hash the
hub publishes for the file (the LFS sha256; the git blob id for a small file stored in git) is
computed as the bytes are written, so a finished download needs no second pass: a wrong size
or hash deletes the file and fetches it once more from the start, and a second failure raises
:class:`IntegrityError`. Only a file that matched is renamed to its blob name.

A file found in the cache is checked the same way, by size and then by hash, except that a
match is remembered (``<edgerunner cache>/verified/``: path, size, mtime, digest) so that it is
hashed once, not at every load.
"""

from __future__ import annotations

import hashlib
import json
import os
import pathlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, BinaryIO

from edgerunner.errors import IntegrityError

__all__ = ["Expected", "check_cached", "download"]

_CHUNK = 1 << 20


def _records_dir() -> pathlib.Path:
    from edgerunner.builtin_models import cache_dir as edgerunner_cache

    return edgerunner_cache() / "verified"


@dataclass(frozen=True)
class Expected:
    """What a file's bytes must be: its size, and its sha256 or git blob id where published."""

    size: int | None
    sha256: str | None = None
    git_oid: str | None = None

    @property
    def digest_name(self) -> str | None:
        return "sha256" if self.sha256 else "git blob id" if self.git_oid and self.size is not None else None

    @property
    def digest_value(self) -> str | None:
        return self.sha256 or (self.git_oid if self.digest_name else None)

    def new_digest(self) -> Any:
        if self.sha256:
            return hashlib.sha256()
        if self.digest_name:  # git hashes "blob <size>\0" + content
            digest = hashlib.sha1()
            digest.update(b"blob %d\0" % self.size)
            return digest
        return None

    def problem(self, size: int, digest: Any) -> str | None:
        """Why bytes of this size and digest are not the file, or None when they are."""
        if self.size is not None and size != self.size:
            return f"{size} bytes where the hub lists {self.size}"
        if digest is not None and digest.hexdigest() != self.digest_value:
            return f"{self.digest_name} {digest.hexdigest()} where the hub lists {self.digest_value}"
        return None


def _hash_file(path: pathlib.Path, expected: Expected) -> Any:
    digest = expected.new_digest()
    if digest is not None:
        with path.open("rb") as f:
            while block := f.read(_CHUNK):
                digest.update(block)
    return digest


def _record_path(blob: pathlib.Path) -> pathlib.Path:
    return _records_dir() / (hashlib.sha256(str(blob.resolve()).encode()).hexdigest()[:32] + ".json")


def _record(blob: pathlib.Path, expected: Expected) -> dict[str, Any]:
    st = blob.stat()
    return {"path": str(blob.resolve()), "size": st.st_size, "mtime_ns": st.st_mtime_ns,
            "digest": expected.digest_value}


def _remember_verified(blob: pathlib.Path, expected: Expected) -> None:
    """Record that ``blob`` was hashed and matched (best effort: without the record it is hashed again)."""
    path = _record_path(blob)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(_record(blob, expected)))
        os.replace(tmp, path)
    except OSError:
        pass


def check_cached(blob: pathlib.Path, expected: Expected) -> str | None:
    """None when the cached ``blob`` holds the expected bytes, else what is wrong with it."""
    size = blob.stat().st_size
    if expected.size is not None and size != expected.size:
        return f"{size} bytes where the hub lists {expected.size}"
    if expected.digest_name is None:
        return None
    try:
        if json.loads(_record_path(blob).read_text()) == _record(blob, expected):
            return None
    except (OSError, ValueError):
        pass
    problem = expected.problem(size, _hash_file(blob, expected))
    if problem is None:
        _remember_verified(blob, expected)
    return problem


class _HashingFile:
    """The partial download as ``http_get`` writes it: appended, counted and hashed as the bytes
    arrive. Bytes already there from an earlier attempt are hashed first; a seek or truncate
    backwards (``http_get`` restarting because the server ignored the Range) re-hashes the kept
    prefix."""

    def __init__(self, path: pathlib.Path, expected: Expected, on_size: Callable[[int], None]):
        self._file: BinaryIO = path.open("r+b" if path.exists() else "w+b")
        self._expected = expected
        self._on_size = on_size
        self.size = 0
        self.digest: Any = None
        self._rehash(self._file.seek(0, os.SEEK_END))

    def _rehash(self, upto: int) -> None:
        self._file.flush()
        self.digest = self._expected.new_digest()
        if self.digest is not None:
            self._file.seek(0)
            left = upto
            while left and (block := self._file.read(min(_CHUNK, left))):
                self.digest.update(block)
                left -= len(block)
        self._file.seek(upto)
        self.size = upto
        self._on_size(upto)

    def write(self, data: bytes) -> int:
        n = self._file.write(data)
        if self.digest is not None:
            self.digest.update(data)
        self.size += len(data)
        self._on_size(self.size)
        return n

    def tell(self) -> int:
        return self._file.tell()

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        position = self._file.seek(offset, whence)
        if position != self.size:
            self._rehash(position)
        return position

    def truncate(self, size: int | None = None) -> int:
        end = self._file.truncate(size)
        if end < self.size:
            self._rehash(end)
        return end

    def close(self) -> None:
        self._file.close()


def download(url: str, headers: dict[str, str], blob: pathlib.Path, expected: Expected, label: str,
              on_size: Callable[[int], None]) -> None:
    """Fetch ``url`` into ``blob``: resume ``<blob>.incomplete``, verify, rename. A result with the
    wrong size or hash is deleted and fetched once more from the start; a second failure raises
    IntegrityError. Network failures raise with the partial file kept for the next attempt."""
    from huggingface_hub.file_download import http_get
    from huggingface_hub.utils import silent_tqdm

    partial = blob.with_name(blob.name + ".incomplete")
    for attempt in (1, 2):
        sink = _HashingFile(partial, expected, on_size)
        try:
            if expected.size is not None and sink.size > expected.size:
                sink.truncate(0)
            http_get(url, sink, resume_size=sink.size, headers=headers, expected_size=expected.size,
                     tqdm_class=silent_tqdm)
        except OSError as exc:
            # http_get's own size check raises a bare OSError (no errno): judged below with the
            # hash. Everything else (network, disk) propagates and keeps the partial file.
            if exc.errno is not None or type(exc) is not OSError:
                raise
        finally:
            sink.close()
        problem = expected.problem(sink.size, sink.digest)
        if problem is None:
            os.chmod(partial, 0o644)
            os.replace(partial, blob)
            _remember_verified(blob, expected)
            return
        partial.unlink(missing_ok=True)
        if attempt == 2:
            raise IntegrityError(f"{label}: the download has {problem}, twice; it was deleted and not loaded. "
                                 "The file on the hub may be changing or damaged: try again later")
