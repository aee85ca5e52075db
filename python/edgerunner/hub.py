"""GGUF models named the way the Hugging Face hub names them.

    org/repo              the repo's only GGUF model, or its Q4_K_M one when it has several
    org/repo:Q4_K_M       the GGUF model with that quant tag (case-insensitive)
    org/repo/dir/x.gguf   that file

A split model (``x-00001-of-00003.gguf`` ...) is one model: every shard is fetched, and the
first shard's path is what the loader opens. ``huggingface_hub`` does the talking and owns the
settings: ``HF_ENDPOINT``, ``HF_TOKEN``, ``HF_HOME`` / ``HF_HUB_CACHE``, ``HF_HUB_OFFLINE``.

Resolution, online: one API call lists the repo at the revision (the commit it resolves to,
each file's size and LFS sha256), the model is picked from that listing, and each file missing
from the cache is fetched (a HEAD on ``/{repo}/resolve/{commit}/{file}`` for its ETag and
location, then a GET). Offline (``HF_HUB_OFFLINE=1``), or when the hub cannot be reached, the
same choice is made among the files of the cached snapshot.

Files land in the hub cache's own layout (``blobs/<etag>``, ``snapshots/<commit>/<file>`` linking
to the blob, ``refs/<revision>``), so ``huggingface_hub`` and its tools see them. edgerunner moves
the bytes itself (:mod:`edgerunner.download`, with huggingface_hub's ``http_get``) rather than
through ``hf_hub_download``, because huggingface_hub 2.x downloads into a process-unique temporary
file that it deletes on any failure (an interrupted download starts over) and checks only the
size. Here the partial download stays as ``blobs/<etag>.incomplete`` (the name huggingface_hub's
cache scan reports) and is resumed with a Range request, and the sha256 the hub publishes is
checked before a file is ever returned; a damaged download or cached file is fetched again.
"""

from __future__ import annotations

import os
import pathlib
import re
import shutil
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, urlsplit

from edgerunner.download import Expected, check_cached, download
from edgerunner.errors import IntegrityError, ModelFetchError, ModelNotFoundError

__all__ = ["HubName", "RepoFile", "GGUFModel", "CachedModel", "quant_tag", "gguf_models", "choose", "fetch",
           "cached_models", "partial_downloads", "remove", "cache_dir"]

# (bytes done, bytes in all or None, what is happening)
Report = Callable[[int, "int | None", str], None]

DEFAULT_TAG = "Q4_K_M"  # what a bare "org/repo" picks among several models (llama.cpp's choice too)

_SEGMENT = r"[A-Za-z0-9][A-Za-z0-9._-]*"
_NAME = re.compile(rf"(?P<repo>{_SEGMENT}/{_SEGMENT})(?:(?P<file>(?:/[^/:]+)+\.gguf)|:(?P<tag>[A-Za-z0-9._-]+))?")
_SHARD = re.compile(r"(?P<stem>.+)-(?P<no>\d{5})-of-(?P<count>\d{5})\.gguf")
_QUANT = re.compile(r"(?<![A-Za-z0-9])((?:UD-)?(?:I?Q\d(?:_[A-Z0-9]+)*|TQ\d_\d|B?F16|FP?(?:16|32)|MXFP4(?:_MOE)?))(?![A-Za-z0-9])",
                    re.IGNORECASE)
_SHA256 = re.compile(r"[0-9a-f]{64}")
_GIT_OID = re.compile(r"[0-9a-f]{40}")
_ETAG = re.compile(r"[A-Za-z0-9_-]{1,128}")  # a blob's file name: no dots, no slashes


# ---- names and listings ------------------------------------------------------------------

@dataclass(frozen=True)
class HubName:
    """A parsed hub model name (see the module docstring)."""

    repo_id: str
    tag: str | None = None
    filename: str | None = None  # path inside the repo

    @classmethod
    def parse(cls, text: str) -> HubName | None:
        """The name in ``text``, or None when it is not shaped like one. ``--`` and ``..`` are
        never part of a hub repo name, so text holding them is no hub name."""
        m = _NAME.fullmatch(text)
        if not m or "--" in m["repo"] or ".." in text:
            return None
        return cls(m["repo"], m["tag"], m["file"][1:] if m["file"] else None)

    def __str__(self) -> str:
        if self.filename:
            return f"{self.repo_id}/{self.filename}"
        return f"{self.repo_id}:{self.tag}" if self.tag else self.repo_id


@dataclass(frozen=True)
class RepoFile:
    """A file of a repo at one commit, as the hub lists it (or as the cache holds it)."""

    path: str
    size: int | None = None
    sha256: str | None = None   # LFS files: the content's sha256
    blob_id: str | None = None  # the git blob id


@dataclass(frozen=True)
class GGUFModel:
    """One loadable model of a repo: a ``.gguf`` file, or every shard of a split one in order."""

    files: tuple[RepoFile, ...]
    tag: str | None

    @property
    def path(self) -> str:
        return self.files[0].path

    @property
    def size(self) -> int | None:
        sizes = [f.size for f in self.files]
        return None if None in sizes else sum(sizes)  # type: ignore[arg-type]


def quant_tag(path: str) -> str | None:
    """The quant tag in a GGUF file name (``Llama-3.2-1B-Q4_K_M.gguf`` → ``Q4_K_M``), upper case;
    the last one when several look like tags; None when there is none."""
    name = path.rsplit("/", 1)[-1]
    shard = _SHARD.fullmatch(name)
    stem = shard["stem"] if shard else name[: -len(".gguf")] if name.lower().endswith(".gguf") else name
    found = _QUANT.findall(stem)
    return found[-1].upper() if found else None


def gguf_models(files: Iterable[RepoFile]) -> list[GGUFModel]:
    """The loadable GGUF models among ``files``: shards grouped (only complete splits count),
    vision projectors (``mmproj``) left out. Sorted by path."""
    models: list[GGUFModel] = []
    splits: dict[tuple[str, int], dict[int, RepoFile]] = {}
    for f in files:
        name = f.path.rsplit("/", 1)[-1]
        if not name.lower().endswith(".gguf") or "mmproj" in name.lower():
            continue
        shard = _SHARD.fullmatch(name)
        if shard and int(shard["count"]) > 1:
            folder = f.path[: len(f.path) - len(name)]
            splits.setdefault((folder + shard["stem"], int(shard["count"])), {})[int(shard["no"])] = f
        else:
            models.append(GGUFModel((f,), quant_tag(f.path)))
    for (_, count), parts in splits.items():
        if sorted(parts) == list(range(1, count + 1)):
            models.append(GGUFModel(tuple(parts[i] for i in range(1, count + 1)), quant_tag(parts[1].path)))
    return sorted(models, key=lambda m: m.path)


def _choices(models: list[GGUFModel], repo_id: str) -> list[str]:
    """How to name each model: ``repo:TAG`` where the tag is unique, else ``repo/file``."""
    tags = [m.tag for m in models]
    return [f"{repo_id}:{m.tag}" if m.tag and tags.count(m.tag) == 1 else f"{repo_id}/{m.path}" for m in models]


def choose(models: list[GGUFModel], name: HubName, where: str) -> GGUFModel:
    """The model ``name`` asks for among ``models`` (found at ``where``, for messages)."""
    names = _choices(models, name.repo_id)
    if name.filename:
        for m in models:
            if any(f.path == name.filename for f in m.files):
                return m
        raise ModelNotFoundError(f"{where} has no GGUF file {name.filename!r}" + _listing(names), tuple(names))
    if not models:
        raise ModelNotFoundError(f"{where} has no GGUF model; edgerunner loads .gguf files "
                                 "(repos that have them usually end in -GGUF)")
    if name.tag:
        hits = [m for m in models if m.tag == name.tag.upper()]
        if len(hits) == 1:
            return hits[0]
        if not hits:
            tags = tuple(sorted({m.tag for m in models if m.tag}))
            shown = f"; available tags: {', '.join(tags)}" if tags else ""
            raise ModelNotFoundError(f"{where} has no GGUF model with the tag {name.tag!r}{shown}"
                                     + _listing(names), tags or tuple(names))
        paths = tuple(f"{name.repo_id}/{m.path}" for m in hits)
        raise ModelNotFoundError(f"{where} has {len(hits)} GGUF models with the tag {name.tag!r}; name the file: "
                                 + ", ".join(paths), paths)
    if len(models) == 1:
        return models[0]
    default = [m for m in models if m.tag == DEFAULT_TAG]
    if len(default) == 1:
        return default[0]
    raise ModelNotFoundError(f"{where} has {len(models)} GGUF models; pick one" + _listing(names), tuple(names))


def _listing(names: list[str]) -> str:
    return ("; load one of: " + ", ".join(names)) if names else ""


# ---- where things live ---------------------------------------------------------------------

def _hf() -> Any:
    """huggingface_hub, or an error that names the fix."""
    try:
        import huggingface_hub
        import huggingface_hub.constants
        import huggingface_hub.errors
        import huggingface_hub.utils
    except ImportError as exc:
        raise ModelFetchError("loading models by hub name needs huggingface_hub: "
                              "pip install 'huggingface_hub>=2.4,<3'") from exc
    return huggingface_hub


def cache_dir() -> pathlib.Path:
    """The hub cache (``HF_HUB_CACHE``, else ``$HF_HOME/hub``, else ``~/.cache/huggingface/hub``)."""
    return pathlib.Path(_hf().constants.HF_HUB_CACHE)


def _endpoint() -> str:
    return _hf().constants.ENDPOINT.rstrip("/")


def _repo_folder(repo_id: str) -> pathlib.Path:
    return cache_dir() / ("models--" + repo_id.replace("/", "--"))


# ---- one file into the cache ---------------------------------------------------------------

def _expected(file: RepoFile, etag: str | None = None, size: int | None = None) -> Expected:
    """What the bytes of ``file`` must be: the listing's sha256 (or the ETag, which is the sha256 of
    an LFS file and the git blob id of another) and size."""
    sha256 = file.sha256 or (etag if etag and _SHA256.fullmatch(etag) else None)
    oid = file.blob_id or (etag if etag and _GIT_OID.fullmatch(etag) else None)
    return Expected(size if size is not None else file.size, sha256, None if sha256 else oid)


def _link(blob: pathlib.Path, pointer: pathlib.Path) -> None:
    """``snapshots/<commit>/<file>`` → ``blobs/<etag>``, relative as huggingface_hub makes it."""
    pointer.parent.mkdir(parents=True, exist_ok=True)
    target = os.path.relpath(blob, pointer.parent)
    if pointer.is_symlink() and os.readlink(pointer) == target:
        return
    tmp = pointer.with_name(f".{pointer.name}.{os.getpid()}.link")
    tmp.unlink(missing_ok=True)
    os.symlink(target, tmp)
    os.replace(tmp, pointer)


def _write_ref(repo: pathlib.Path, revision: str, commit: str) -> None:
    if revision == commit:
        return
    ref = repo / "refs" / revision
    ref.parent.mkdir(parents=True, exist_ok=True)
    if not ref.is_file() or ref.read_text() != commit:
        tmp = ref.with_name(f".{ref.name}.{os.getpid()}.tmp")
        tmp.write_text(commit)
        os.replace(tmp, ref)


def _fetch_file(repo_id: str, commit: str, file: RepoFile, progress: Callable[[int, str], None]) -> pathlib.Path:
    """The cached, verified path of ``file`` (``snapshots/<commit>/<path>``), downloading it if
    needed. ``progress(bytes of this file present, message)`` follows it."""
    hf = _hf()
    repo = _repo_folder(repo_id)
    pointer = repo / "snapshots" / commit / file.path
    label = f"{repo_id}/{file.path}"
    message = f"downloading {label}"
    if pointer.exists():
        problem = check_cached(pointer, _expected(file, pointer.resolve().name))
        if problem is None:
            progress(pointer.stat().st_size, f"{label} is in the cache")
            return pointer
        pointer.resolve().unlink(missing_ok=True)
        message = f"the cached {label} has {problem}: downloading it again"
    url = f"{_endpoint()}/{repo_id}/resolve/{commit}/{quote(file.path)}"
    meta = hf.get_hf_file_metadata(url)
    if not (meta.etag and _ETAG.fullmatch(meta.etag)):
        raise ModelFetchError(f"{label}: the hub's answer has no usable ETag ({meta.etag!r}), so the file cannot be "
                              "cached; check that HF_ENDPOINT points to a Hugging Face hub")
    expected = _expected(file, meta.etag, meta.size)
    blob = repo / "blobs" / meta.etag
    blob.parent.mkdir(parents=True, exist_ok=True)
    headers = hf.utils.build_hf_headers()
    if urlsplit(meta.location).netloc != urlsplit(url).netloc:
        headers.pop("authorization", None)  # a signed CDN address: the token stays with the hub
    lock = cache_dir() / ".locks" / repo.name / f"{meta.etag}.lock"
    lock.parent.mkdir(parents=True, exist_ok=True)
    with hf.utils.WeakFileLock(lock):  # the lock huggingface_hub takes for the same blob
        if blob.exists() and check_cached(blob, expected) is not None:
            blob.unlink()
        if blob.exists():
            message = f"{label} is in the cache"
        else:
            progress(0, message)
            download(meta.location, headers, blob, expected, label, lambda size: progress(size, message))
        _link(blob, pointer)
    progress(blob.stat().st_size, message)
    return pointer


# ---- resolution ----------------------------------------------------------------------------

def _safe_path(path: str) -> bool:
    """A repo path that stays inside its snapshot folder."""
    return bool(path) and not path.startswith("/") and ".." not in path.split("/")


def _remote_listing(repo_id: str, revision: str) -> tuple[str, list[RepoFile]]:
    info = _hf().HfApi(endpoint=_endpoint()).model_info(repo_id, revision=revision, files_metadata=True)
    if not (info.sha and _GIT_OID.fullmatch(info.sha)):
        raise ModelFetchError(f"{repo_id}: the hub's listing names no commit ({info.sha!r}); check that HF_ENDPOINT "
                              "points to a Hugging Face hub")
    files = [RepoFile(s.rfilename, s.size, s.lfs.sha256 if s.lfs else None, s.blob_id)
             for s in info.siblings or () if _safe_path(s.rfilename)]
    return info.sha, files


def _cached_listing(repo_id: str, revision: str) -> tuple[str, list[RepoFile]] | None:
    """The commit ``revision`` resolved to when last online, and the files of its cached snapshot."""
    repo = _repo_folder(repo_id)
    commit = revision
    if not _GIT_OID.fullmatch(revision):
        try:
            commit = (repo / "refs" / revision).read_text().strip()
        except OSError:
            return None
    snapshot = repo / "snapshots" / commit
    if not snapshot.is_dir():
        return None
    files = []
    for path in sorted(snapshot.rglob("*")):
        if path.is_file():
            blob = path.resolve().name
            files.append(RepoFile(path.relative_to(snapshot).as_posix(), path.stat().st_size,
                                  blob if _SHA256.fullmatch(blob) else None,
                                  blob if _GIT_OID.fullmatch(blob) else None))
    return commit, files


def _offline(name: HubName, revision: str, why: str, report: Report) -> pathlib.Path:
    """Resolve from the cache alone; ``why`` says why the hub is not asked."""
    listing = _cached_listing(name.repo_id, revision)
    if listing is None:
        raise ModelFetchError(f"{name} (revision {revision}) is not in the hub cache {cache_dir()}, and {why}; "
                              f"once online, fetch it with: edgerunner pull {name}")
    commit, files = listing
    model = choose(gguf_models(files), name, f"the cached snapshot of {name.repo_id} ({why})")
    repo = _repo_folder(name.repo_id)
    for file in model.files:
        pointer = repo / "snapshots" / commit / file.path
        problem = check_cached(pointer, _expected(file, pointer.resolve().name))
        if problem is not None:
            blob = pointer.resolve()
            blob.unlink(missing_ok=True)
            pointer.unlink(missing_ok=True)
            raise IntegrityError(f"the cached {name.repo_id}/{file.path} has {problem}; it was deleted and not "
                                 f"loaded, and {why}: fetch it again online with: edgerunner pull {name}")
    report(model.size or 0, model.size, f"{name}: in the cache ({why})")
    return repo / "snapshots" / commit / model.path


def _hub_error(exc: Exception, name: HubName, revision: str) -> ModelFetchError:
    """A huggingface_hub error as edgerunner's, naming the model and the fix."""
    errors = _hf().errors
    if isinstance(exc, errors.GatedRepoError):
        return ModelFetchError(f"{name.repo_id} is gated: accept its terms at {_endpoint()}/{name.repo_id} and set "
                               "HF_TOKEN to a token of that account")
    if isinstance(exc, errors.RepositoryNotFoundError):
        return ModelNotFoundError(f"no model repo {name.repo_id!r} on {_endpoint()} (and no local file {str(name)!r}); "
                                  "check the name, or set HF_TOKEN if the repo is private")
    if isinstance(exc, errors.RevisionNotFoundError):
        return ModelNotFoundError(f"{name.repo_id} has no revision {revision!r}; give a branch, tag or commit "
                                  "that exists (default: main)")
    if isinstance(exc, errors.RemoteEntryNotFoundError):
        return ModelNotFoundError(f"{name}: a file listed by the hub could not be found when fetched; try again")
    status = getattr(getattr(exc, "response", None), "status_code", None)
    return ModelFetchError(f"{name}: the hub at {_endpoint()} answered {status or 'with an error'}: "
                           f"{str(exc).splitlines()[0] if str(exc) else type(exc).__name__}")


def fetch(name: HubName, *, revision: str | None = None, report: Report | None = None) -> pathlib.Path:
    """The local path of the model ``name`` names (the first shard of a split model), every file
    fetched into the hub cache and verified first.

    ``report(done, total, message)`` follows the download in bytes of the whole model.

    Raises:
        ModelNotFoundError: no such repo, revision, file or tag (``available`` lists the tags).
        IntegrityError: a file's size or hash stayed wrong.
        ModelFetchError: offline (or the hub unreachable) with the model not cached, or any
            other failure to fetch.
    """
    hf = _hf()
    report = report or (lambda done, total, message: None)
    revision = revision or "main"
    if hf.constants.is_offline_mode():
        return _offline(name, revision, "HF_HUB_OFFLINE is set", report)
    import httpx2  # huggingface_hub's HTTP client: its transport errors mean the network failed

    try:
        commit, files = _remote_listing(name.repo_id, revision)
    except hf.errors.HfHubHTTPError as exc:
        status = getattr(getattr(exc, "response", None), "status_code", None)
        if status is not None and (status >= 500 or status == 429):  # the hub is down or busy: try the cache
            return _offline(name, revision, f"{_endpoint()} answered {status}", report)
        raise _hub_error(exc, name, revision) from exc
    except httpx2.TransportError as exc:
        return _offline(name, revision, f"{_endpoint()} cannot be reached ({type(exc).__name__}: {exc})", report)
    model = choose(gguf_models(files), name, f"{name.repo_id} (revision {revision})")
    total = model.size
    done = 0
    try:
        for file in model.files:
            _fetch_file(name.repo_id, commit, file, lambda size, message: report(done + size, total, message))
            done += file.size or 0
    except hf.errors.HfHubHTTPError as exc:
        raise _hub_error(exc, name, revision) from exc
    except httpx2.TransportError as exc:
        raise ModelFetchError(f"{name}: the download was interrupted ({type(exc).__name__}: {exc}); run it again "
                              "to resume where it stopped") from exc
    _write_ref(_repo_folder(name.repo_id), revision, commit)
    return _repo_folder(name.repo_id) / "snapshots" / commit / model.path


# ---- the cache: list and remove ------------------------------------------------------------

@dataclass(frozen=True)
class CachedModel:
    """A GGUF model in the hub cache."""

    name: str            # how to load it: org/repo:TAG or org/repo/file.gguf
    size: int            # bytes on disk
    path: pathlib.Path   # the (first) file
    revision: str        # the commit, with the refs that point to it: "abc1234 (main)"


def _scan() -> Any:
    hf = _hf()
    try:
        return hf.scan_cache_dir(cache_dir())
    except hf.errors.CacheNotFound:
        return None


def _cached_gguf(repo: Any) -> list[tuple[Any, GGUFModel, list[Any]]]:
    """(revision, model, its CachedFileInfos) for every GGUF model of a cached repo."""
    out = []
    for rev in sorted(repo.revisions, key=lambda r: r.commit_hash):
        by_path = {f.file_path.relative_to(rev.snapshot_path).as_posix(): f for f in rev.files}
        files = [RepoFile(path, info.size_on_disk) for path, info in by_path.items()]
        for model in gguf_models(files):
            out.append((rev, model, [by_path[f.path] for f in model.files]))
    return out


def cached_models() -> list[CachedModel]:
    """Every GGUF model in the hub cache, with its size."""
    info = _scan()
    out: list[CachedModel] = []
    for repo in sorted(info.repos if info else (), key=lambda r: r.repo_id):
        if repo.repo_type != "model":
            continue
        entries = _cached_gguf(repo)
        names = _choices([model for _, model, _ in entries], repo.repo_id)
        for (rev, model, infos), name in zip(entries, names):
            refs = f" ({', '.join(sorted(rev.refs))})" if rev.refs else ""
            out.append(CachedModel(name, sum(f.size_on_disk for f in infos), infos[0].file_path,
                                   rev.commit_hash[:7] + refs))
    return out


def remove(name: HubName) -> int:
    """Delete ``name`` from the hub cache: the whole repo for ``org/repo``, else that model's files
    (blobs other snapshots still use are kept), partial downloads included. Returns bytes freed.

    Raises:
        ModelNotFoundError: nothing cached by that name.
    """
    info = _scan()
    repo = next((r for r in (info.repos if info else ()) if r.repo_id == name.repo_id and r.repo_type == "model"),
                None)
    folder = _repo_folder(name.repo_id)
    if repo is None and folder.is_dir() and not (name.tag or name.filename):
        # Only a partial first download (no snapshot yet), which the cache scan does not count.
        freed = sum(f.stat().st_size for f in folder.rglob("*") if f.is_file() and not f.is_symlink())
        shutil.rmtree(folder)
        return freed
    if repo is None:
        raise ModelNotFoundError(f"{name.repo_id} is not in the hub cache {cache_dir()}; `edgerunner list` shows "
                                 "what is")
    partials = [f for f in info.incomplete_files if folder in f.file_path.parents]
    if not (name.tag or name.filename):
        strategy = info.delete_revisions(*(r.commit_hash for r in repo.revisions))
    else:
        chosen = []
        for _, model, infos in _cached_gguf(repo):
            try:
                choose([model], name, name.repo_id)
            except ModelNotFoundError:
                continue
            chosen.extend(infos)
        if not chosen:
            cached = _choices([model for _, model, _ in _cached_gguf(repo)], name.repo_id)
            raise ModelNotFoundError(f"{name} is not in the hub cache; cached from {name.repo_id}: "
                                     + (", ".join(cached) or "no GGUF model"), tuple(cached))
        strategy = info.delete_files(*chosen)
        partials = []
    strategy.execute()
    for partial in partials:
        partial.file_path.unlink(missing_ok=True)
    return strategy.expected_freed_size + sum(p.size_on_disk for p in partials)


def partial_downloads() -> list[tuple[str, int]]:
    """(repo id, bytes) of the interrupted downloads in the hub cache, which the next fetch resumes."""
    sizes: dict[str, int] = {}
    for partial in cache_dir().glob("models--*/blobs/*.incomplete"):
        repo_id = partial.parent.parent.name[len("models--"):].replace("--", "/")
        try:
            sizes[repo_id] = sizes.get(repo_id, 0) + partial.stat().st_size
        except OSError:
            pass
    return sorted(sizes.items())
