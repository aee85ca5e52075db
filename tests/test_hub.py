"""Models by hub name, lifecycle events and the pull / list / rm commands, against a local
stand-in for the Hugging Face hub (tests/hub_server.py) serving generated GGUFs. Nothing here
reaches the real hub: huggingface_hub's endpoint, cache and token paths point at the fake hub
and temporary folders."""

from __future__ import annotations

import hashlib
import os
import pathlib
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

import edgerunner
from edgerunner import IntegrityError, LoadEvent, Model, ModelFetchError, ModelNotFoundError, Stage, hub
from edgerunner.cli import LoadProgress
from edgerunner.model_builder import write_random_model
from hub_server import FakeHub, Repo

hf_constants = pytest.importorskip("huggingface_hub.constants")

OLD_COMMIT = "0123456789abcdef0123456789abcdef01234567"


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, pathlib.Path]:
    """Tiny random-weight GGUFs (about 380 KB each), one per seed, and a split one."""
    out = tmp_path_factory.mktemp("gguf")
    made = {f"seed{s}": write_random_model(out / f"seed{s}.gguf", seed=s) for s in range(1, 7)}
    (out / "split").mkdir()
    made["split"] = write_random_model(out / "split" / "tiny-Q8_0.gguf", seed=4, split_max_tensors=8)
    return made


@pytest.fixture(scope="module")
def server(files):
    data = {name: path.read_bytes() for name, path in files.items()}
    shards = sorted(files["split"].parent.glob("*.gguf"))
    assert [p.name for p in shards] == [f"tiny-Q8_0-0000{i}-of-00003.gguf" for i in (1, 2, 3)]
    with FakeHub() as fake:
        fake.add("acme/tiny-GGUF", Repo({
            "tiny-Q4_K_M.gguf": data["seed1"], "tiny-Q8_0.gguf": data["seed2"], "fp16/tiny-F16.gguf": data["seed3"],
            "mmproj-tiny-F16.gguf": b"GGUF projector, not a language model", "README.md": b"# tiny\n"}))
        fake.add("acme/split-GGUF", Repo({p.name: p.read_bytes() for p in shards}))
        fake.add("acme/gated-GGUF", Repo({"model-Q4_0.gguf": data["seed5"]}, gated_token="hf_secret"))
        fake.add("acme/history-GGUF", Repo({"m-Q8_0.gguf": data["seed1"]},
                                           history={OLD_COMMIT: {"m-Q8_0.gguf": data["seed6"]}}))
        fake.add("acme/small-GGUF", Repo({"small.gguf": data["seed6"]}, lfs=set()))  # no LFS: git blob id
        yield fake


@pytest.fixture
def caches(server, tmp_path, monkeypatch):
    """huggingface_hub and edgerunner pointed at the fake hub and empty temporary caches.

    huggingface_hub reads its environment once, at import, into huggingface_hub.constants, and
    reads the constants at call time: so the constants are patched (the CLI test uses the
    environment variables themselves, in a fresh process). Small download chunks make a cut
    connection leave bytes to resume from (10 MiB by default, more than these files)."""
    for key, value in {"ENDPOINT": server.url, "HF_HUB_CACHE": str(tmp_path / "hf" / "hub"),
                       "HF_HUB_OFFLINE": False, "HF_TOKEN_PATH": str(tmp_path / "hf" / "token"),
                       "HF_STORED_TOKENS_PATH": str(tmp_path / "hf" / "stored_tokens"),
                       "AGENT_HARNESSES_PATH": str(tmp_path / "hf" / "agents.json"),
                       "DOWNLOAD_CHUNK_SIZE": 64 * 1024}.items():
        monkeypatch.setattr(hf_constants, key, value)
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.delenv("HUGGING_FACE_HUB_TOKEN", raising=False)
    monkeypatch.setenv("EDGERUNNER_CACHE", str(tmp_path / "edgerunner"))
    server.reset()
    return tmp_path / "hf" / "hub"


def load(source: str, events: list[LoadEvent] | None = None, **kw) -> Model:
    return Model.load(source, threads=1, on_event=events.append if events is not None else None, **kw)


def sha256(path: pathlib.Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def stages(events: list[LoadEvent]) -> list[str]:
    """The stage sequence with repeats collapsed."""
    out: list[str] = []
    for e in events:
        if not out or out[-1] != e.stage.value:
            out.append(e.stage.value)
    return out


def check_progress(events: list[LoadEvent]) -> None:
    """Within each stage: done never decreases, never passes total, and total never changes."""
    for stage in Stage:
        mine = [e for e in events if e.stage is stage]
        dones = [e.done for e in mine]
        assert dones == sorted(dones), (stage, dones)
        totals = {e.total for e in mine if e.total is not None}
        assert len(totals) <= 1, (stage, totals)
        assert all(e.total is None or e.done <= e.total for e in mine)


# ---- download, cache, selection --------------------------------------------------------------

def test_download_then_cache_hit(caches, server, files):
    events: list[LoadEvent] = []
    model = load("acme/tiny-GGUF:Q8_0", events)
    path = pathlib.Path(model.path)
    assert path.is_relative_to(caches) and path.name == "tiny-Q8_0.gguf"
    assert path.resolve().name == sha256(files["seed2"])  # blobs/<sha256>, huggingface_hub's layout
    assert sha256(path) == sha256(files["seed2"])
    assert len(server.gets("tiny-Q8_0.gguf")) == 0 and len(server.gets()) == 1  # one GET, on the CDN
    cdn = server.gets()[0]
    assert cdn.server == "cdn" and cdn.range is None

    assert stages(events) == ["idle", "downloading", "loading", "ready"]
    check_progress(events)
    downloads = [e for e in events if e.stage is Stage.DOWNLOADING]
    assert downloads[0].done < downloads[-1].done == downloads[-1].total == files["seed2"].stat().st_size
    assert len({e.done for e in downloads}) > 2  # progress as the bytes arrived, not one jump
    assert events[-1].model is model and events[-1].done == events[-1].total

    server.reset()
    events.clear()
    again = load("acme/tiny-GGUF:Q8_0", events)
    assert again.path == model.path
    assert server.gets() == [] and not [r for r in server.requests if r.method == "HEAD"]  # listing only
    downloads = [e for e in events if e.stage is Stage.DOWNLOADING]
    assert downloads and all(e.done == e.total for e in downloads)  # a cache hit: complete at once
    np.testing.assert_array_equal(again.logits([1, 2, 3]), Model.load(str(files["seed2"]), threads=1).logits([1, 2, 3]))

    import huggingface_hub

    scan = huggingface_hub.scan_cache_dir(caches)  # huggingface_hub reads what edgerunner wrote
    assert not scan.warnings and [r.repo_id for r in scan.repos] == ["acme/tiny-GGUF"]
    assert [(m.name, m.size) for m in hub.cached_models()] == [("acme/tiny-GGUF:Q8_0", files["seed2"].stat().st_size)]


def test_quant_tag_selection(caches, server, files):
    assert sha256(pathlib.Path(load("acme/tiny-GGUF").path)) == sha256(files["seed1"])  # several: Q4_K_M
    assert sha256(pathlib.Path(load("acme/tiny-GGUF:q8_0").path)) == sha256(files["seed2"])  # any case
    by_file = load("acme/tiny-GGUF/fp16/tiny-F16.gguf")
    assert by_file.path.endswith("fp16/tiny-F16.gguf") and sha256(pathlib.Path(by_file.path)) == sha256(files["seed3"])
    assert sha256(pathlib.Path(load("acme/tiny-GGUF:F16").path)) == sha256(files["seed3"])
    assert not server.gets("mmproj-tiny-F16.gguf")
    assert hub.quant_tag("Llama-3.2-1B-Instruct-UD-Q4_K_XL-00001-of-00002.gguf") == "UD-Q4_K_XL"
    assert hub.quant_tag("tinyllama-1.1b-chat-v1.0.Q5_K_M.gguf") == "Q5_K_M"
    assert hub.quant_tag("Qwen2.5-7B-Instruct.gguf") is None


def test_missing_tag_lists_the_available_ones(caches, server):
    events: list[LoadEvent] = []
    with pytest.raises(ModelNotFoundError) as caught:
        load("acme/tiny-GGUF:Q3_K_S", events)
    message = str(caught.value)
    assert "acme/tiny-GGUF" in message and "'Q3_K_S'" in message and "available tags: F16, Q4_K_M, Q8_0" in message
    assert "acme/tiny-GGUF:Q8_0" in message  # how to ask for one
    assert caught.value.available == ("F16", "Q4_K_M", "Q8_0")
    assert stages(events) == ["idle", "failed"] and events[-1].error is caught.value
    assert server.gets() == []


def test_unknown_repo_revision_and_file(caches, server):
    with pytest.raises(ModelNotFoundError, match=r"no model repo 'acme/nope' on http://127\.0\.0\.1.*HF_TOKEN"):
        load("acme/nope")
    with pytest.raises(ModelNotFoundError, match="acme/tiny-GGUF has no revision 'v9'"):
        load("acme/tiny-GGUF", revision="v9")
    with pytest.raises(ModelNotFoundError, match="no GGUF file 'nope.gguf'.*acme/tiny-GGUF:Q4_K_M"):
        load("acme/tiny-GGUF/nope.gguf")
    with pytest.raises(FileNotFoundError, match="no such file: models/x.gguf"):
        load("models/x.gguf")  # a relative path that does not exist is no hub name
    with pytest.raises(ValueError, match="revision='v1' applies to Hugging Face hub models"):
        load("smollm2-135m-instruct", revision="v1")


def test_revision_pinning(caches, server, files):
    latest = load("acme/history-GGUF:Q8_0")
    pinned = load("acme/history-GGUF:Q8_0", revision=OLD_COMMIT)
    assert sha256(pathlib.Path(latest.path)) == sha256(files["seed1"])
    assert sha256(pathlib.Path(pinned.path)) == sha256(files["seed6"])
    assert f"/snapshots/{OLD_COMMIT}/" in pinned.path
    assert (caches / "models--acme--history-GGUF" / "refs" / "main").read_text() == server.repos[
        "acme/history-GGUF"].commit


def test_split_gguf(caches, server, files):
    events: list[LoadEvent] = []
    model = load("acme/split-GGUF:Q8_0", events)
    assert model.path.endswith("tiny-Q8_0-00001-of-00003.gguf")
    assert len(server.gets()) == 3 and len(model.file.shards) == 3  # every shard fetched and mapped
    total = sum(p.stat().st_size for p in files["split"].parent.glob("*.gguf"))
    assert [e.total for e in events if e.stage is Stage.DOWNLOADING][-1] == total  # the whole model's bytes
    assert [e.total for e in events if e.stage is Stage.LOADING][-1] == total
    check_progress(events)
    whole = Model.load(str(files["seed4"]), threads=1)  # the same weights in one file
    np.testing.assert_array_equal(model.logits([5, 6, 7]), whole.logits([5, 6, 7]))
    # Naming a later shard loads the model it belongs to.
    assert load("acme/split-GGUF/tiny-Q8_0-00002-of-00003.gguf").path == model.path


def test_gated_repo_needs_hf_token(caches, server, monkeypatch):
    with pytest.raises(ModelFetchError, match="acme/gated-GGUF is gated.*HF_TOKEN"):
        load("acme/gated-GGUF")
    monkeypatch.setenv("HF_TOKEN", "hf_secret")
    load("acme/gated-GGUF")
    hub_calls = [r for r in server.requests if r.server == "hub" and "gated" in r.path]
    assert hub_calls and all(r.authorization == "Bearer hf_secret" for r in hub_calls[-2:])
    assert [r.authorization for r in server.gets()] == [None]  # the token never leaves the hub


# ---- interrupted and bad downloads -------------------------------------------------------------

def test_resume_after_dropped_connection(caches, server, files):
    size = files["seed2"].stat().st_size
    server.fault("tiny-Q8_0.gguf", "drop")  # half the body, then the connection is cut
    model = load("acme/tiny-GGUF:Q8_0")
    first, second = server.gets()
    assert first.range is None
    resumed_at = int(second.range.removeprefix("bytes=").removesuffix("-"))
    assert 0 < resumed_at < size  # huggingface_hub's retry continued from the bytes it had
    assert sha256(pathlib.Path(model.path)) == sha256(files["seed2"])


def test_resume_after_interrupted_run(caches, server, files):
    """A run killed mid-download leaves blobs/<sha256>.incomplete; the next one continues it."""
    data = files["seed2"].read_bytes()
    blob = caches / "models--acme--tiny-GGUF" / "blobs" / hashlib.sha256(data).hexdigest()
    blob.parent.mkdir(parents=True)
    pathlib.Path(str(blob) + ".incomplete").write_bytes(data[:100_000])
    assert hub.partial_downloads() == [("acme/tiny-GGUF", 100_000)]
    model = load("acme/tiny-GGUF:Q8_0")
    assert [r.range for r in server.gets()] == ["bytes=100000-"]
    assert sha256(pathlib.Path(model.path)) == hashlib.sha256(data).hexdigest()
    assert hub.partial_downloads() == []

    partial = caches / "models--acme--split-GGUF" / "blobs" / ("ab" * 32 + ".incomplete")  # a first download cut short
    partial.parent.mkdir(parents=True)
    partial.write_bytes(b"x" * 1000)
    assert hub.partial_downloads() == [("acme/split-GGUF", 1000)]
    assert hub.remove(hub.HubName("acme/split-GGUF")) == 1000 and not partial.parent.exists()


def test_damaged_partial_download_is_fetched_again(caches, server, files):
    """Resumed bytes that do not hash to the published sha256 are thrown away, not loaded."""
    data = files["seed2"].read_bytes()
    blob = caches / "models--acme--tiny-GGUF" / "blobs" / hashlib.sha256(data).hexdigest()
    blob.parent.mkdir(parents=True)
    pathlib.Path(str(blob) + ".incomplete").write_bytes(b"\0" * 100_000)
    model = load("acme/tiny-GGUF:Q8_0")
    assert [r.range for r in server.gets()] == ["bytes=100000-", None]
    assert sha256(pathlib.Path(model.path)) == hashlib.sha256(data).hexdigest()


@pytest.mark.parametrize("fault", ["truncate", "corrupt"])
def test_bad_download_is_fetched_again(caches, server, files, fault):
    server.fault("tiny-Q8_0.gguf", fault)
    model = load("acme/tiny-GGUF:Q8_0")
    assert len(server.gets()) == 2
    assert sha256(pathlib.Path(model.path)) == sha256(files["seed2"])


@pytest.mark.parametrize("fault, problem", [("truncate", "bytes where the hub lists"), ("corrupt", "sha256 ")])
def test_bad_download_is_never_loaded(caches, server, fault, problem, monkeypatch):
    server.fault("tiny-Q8_0.gguf", fault, times=2)
    from edgerunner import _core

    monkeypatch.setattr(_core.Model, "load", lambda *a, **k: pytest.fail("a bad file reached the loader"))
    events: list[LoadEvent] = []
    with pytest.raises(IntegrityError, match=f"tiny-Q8_0.gguf: the download has .*{problem}.*not loaded"):
        load("acme/tiny-GGUF:Q8_0", events)
    assert stages(events) == ["idle", "downloading", "failed"]
    repo = caches / "models--acme--tiny-GGUF"
    assert not list(repo.glob("blobs/*")) and not list(repo.glob("snapshots/*/*.gguf"))


def test_small_file_checked_by_git_blob_id(caches, server, files):
    """A file the hub stores without LFS is checked against its git blob id."""
    server.fault("small.gguf", "corrupt")
    model = load("acme/small-GGUF")
    assert [r.server for r in server.gets()] == ["hub", "hub"]  # no CDN; fetched twice
    assert sha256(pathlib.Path(model.path)) == sha256(files["seed6"])


def test_damaged_cache_is_fetched_again(caches, server, files):
    path = pathlib.Path(load("acme/tiny-GGUF:Q8_0").path)
    blob = path.resolve()
    with blob.open("r+b") as f:  # truncated on disk
        f.truncate(1000)
    server.reset()
    assert sha256(pathlib.Path(load("acme/tiny-GGUF:Q8_0").path)) == sha256(files["seed2"])
    assert len(server.gets()) == 1
    with blob.open("r+b") as f:  # same size, one byte changed: the sha256 catches it
        f.seek(5000)
        f.write(b"\xff")
    server.reset()
    assert sha256(pathlib.Path(load("acme/tiny-GGUF:Q8_0").path)) == sha256(files["seed2"])
    assert len(server.gets()) == 1


# ---- offline ---------------------------------------------------------------------------------

def test_offline_mode(caches, server, files, monkeypatch):
    cached = load("acme/tiny-GGUF:Q8_0").path
    server.reset()
    monkeypatch.setattr(hf_constants, "HF_HUB_OFFLINE", True)
    events: list[LoadEvent] = []
    assert load("acme/tiny-GGUF:Q8_0", events).path == cached
    assert server.requests == []  # not one request
    assert stages(events) == ["idle", "downloading", "loading", "ready"]
    assert load("acme/tiny-GGUF").path == cached  # the only cached model of the repo
    with pytest.raises(ModelNotFoundError, match=r"cached snapshot of acme/tiny-GGUF \(HF_HUB_OFFLINE is set\) has "
                                                 r"no GGUF model with the tag 'Q4_K_M'; available tags: Q8_0"):
        load("acme/tiny-GGUF:Q4_K_M")
    with pytest.raises(ModelFetchError, match="acme/split-GGUF .* is not in the hub cache .*HF_HUB_OFFLINE is set.*"
                                              "edgerunner pull acme/split-GGUF"):
        load("acme/split-GGUF")
    with pathlib.Path(cached).resolve().open("r+b") as f:  # offline, a damaged file is refused
        f.write(b"\0\0\0\0")
    with pytest.raises(IntegrityError, match="deleted and not loaded.*HF_HUB_OFFLINE"):
        load("acme/tiny-GGUF:Q8_0")
    assert not pathlib.Path(cached).exists()
    assert server.requests == []


def test_unreachable_hub_falls_back_to_the_cache(caches, server, monkeypatch):
    cached = load("acme/tiny-GGUF:Q8_0").path
    server.down = True  # 503
    assert load("acme/tiny-GGUF:Q8_0").path == cached
    with pytest.raises(ModelFetchError, match=r"not in the hub cache .*answered 503"):
        load("acme/split-GGUF")
    monkeypatch.setattr(hf_constants, "ENDPOINT", "http://127.0.0.1:9")  # nothing listens there
    assert load("acme/tiny-GGUF:Q8_0").path == cached
    with pytest.raises(ModelFetchError, match=r"not in the hub cache .*http://127\.0\.0\.1:9 cannot be reached"):
        load("acme/split-GGUF")


# ---- lifecycle events ------------------------------------------------------------------------

def test_event_order_and_prewarm(caches, server, files):
    events: list[LoadEvent] = []
    model = load("acme/split-GGUF", events)
    assert stages(events) == ["idle", "downloading", "loading", "ready"]
    check_progress(events)
    assert [e.stage for e in events].count(Stage.READY) == 1 and events[-1].stage is Stage.READY
    assert "preparing the kernels" in " ".join(e.message for e in events if e.stage is Stage.LOADING)
    assert model._session.tokens == []  # the warm-up step was forgotten
    model.generate([1, 2], max_tokens=2)
    assert model.last_generation["mode"] == "reset"

    cold: list[LoadEvent] = []
    load("acme/split-GGUF", cold, prewarm=False)
    loading = [e for e in cold if e.stage is Stage.LOADING]
    assert [e.done for e in loading] == [0, loading[-1].total]  # built, nothing paged in or warmed
    assert not any("preparing the kernels" in e.message for e in loading)

    local: list[LoadEvent] = []
    load(str(files["seed1"]), local)  # a local file has nothing to download
    assert stages(local) == ["idle", "loading", "ready"]


def test_load_events_iterator(caches, server):
    seen = list(edgerunner.load_events("acme/tiny-GGUF:Q8_0", threads=1))
    assert stages(seen) == ["idle", "downloading", "loading", "ready"]
    check_progress(seen)
    assert isinstance(seen[-1].model, Model)

    failed: list[LoadEvent] = []
    with pytest.raises(ModelNotFoundError) as caught:
        for event in edgerunner.load_events("acme/tiny-GGUF:Q2_K", threads=1):
            failed.append(event)
    assert stages(failed) == ["idle", "failed"] and failed[-1].error is caught.value


def test_callback_errors_stop_the_load(caches, server):
    def stop(event: LoadEvent) -> None:
        if event.stage is Stage.DOWNLOADING:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        Model.load("acme/tiny-GGUF:Q8_0", on_event=stop)


# ---- command line ----------------------------------------------------------------------------

def run_cli(*args: str, env: dict[str, str], tty: bool = False) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "edgerunner", *args]
    if not tty:
        return subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)
    import fcntl
    import pty
    import struct
    import termios

    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 120, 0, 0))  # a 120-column terminal
    proc = subprocess.Popen(command, env=env, stdin=slave, stdout=slave, stderr=slave)
    os.close(slave)
    out = b""
    while True:
        try:
            chunk = os.read(master, 65536)
        except OSError:  # the terminal closed with the process
            break
        if not chunk:
            break
        out += chunk
    os.close(master)
    return subprocess.CompletedProcess(command, proc.wait(timeout=120), out.decode(errors="replace"), "")


def test_cli_pull_list_rm(server, tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGING"))}
    env.update(HF_ENDPOINT=server.url, HF_HOME=str(tmp_path / "hf"), EDGERUNNER_CACHE=str(tmp_path / "er"),
               HF_HUB_DISABLE_UPDATE_CHECK="1")

    pulled = run_cli("pull", "acme/tiny-GGUF:Q8_0", env=env)
    assert pulled.returncode == 0, pulled.stderr
    assert pulled.stdout.startswith("acme/tiny-GGUF:Q8_0\t376.7 KiB\t" + str(tmp_path / "hf" / "hub"))
    assert "downloading acme/tiny-GGUF/tiny-Q8_0.gguf" in pulled.stderr and "B/s" not in pulled.stderr  # no bars

    bars = run_cli("pull", "acme/tiny-GGUF:Q4_K_M", env=env, tty=True)  # a terminal: bars with rate
    assert bars.returncode == 0 and "downloading:" in bars.stdout and "B/s" in bars.stdout, bars.stdout

    listed = run_cli("list", env=env)
    assert listed.returncode == 0
    lines = listed.stdout.splitlines()
    assert lines[0].split() == ["MODEL", "SIZE", "SOURCE"]
    assert [line.split()[:3] for line in lines[1:]] == [["acme/tiny-GGUF:Q4_K_M", "376.7", "KiB"],
                                                         ["acme/tiny-GGUF:Q8_0", "376.7", "KiB"]]

    missing = run_cli("pull", "acme/tiny-GGUF:Q3_K", env=env)
    assert missing.returncode == 1 and "Traceback" not in missing.stderr
    assert "no GGUF model with the tag 'Q3_K'; available tags: F16, Q4_K_M, Q8_0" in missing.stderr

    unknown = run_cli("run", "acme/nope", "hi", env=env)
    assert unknown.returncode == 1 and "no model repo 'acme/nope'" in unknown.stderr

    offline = run_cli("pull", "acme/split-GGUF", env={**env, "HF_HUB_OFFLINE": "1"})
    assert offline.returncode == 1 and "Traceback" not in offline.stderr
    assert "acme/split-GGUF (revision main) is not in the hub cache" in offline.stderr
    assert "HF_HUB_OFFLINE is set" in offline.stderr
    cached_offline = run_cli("info", "acme/tiny-GGUF:Q8_0", env={**env, "HF_HUB_OFFLINE": "1"})
    assert cached_offline.returncode == 0 and "architecture  llama" in cached_offline.stdout

    removed = run_cli("rm", "acme/tiny-GGUF:Q8_0", env=env)
    assert removed.returncode == 0 and removed.stdout.strip() == "removed acme/tiny-GGUF:Q8_0 (376.7 KiB)"
    assert [line.split()[0] for line in run_cli("list", env=env).stdout.splitlines()[1:]] == ["acme/tiny-GGUF:Q4_K_M"]
    removed = run_cli("rm", "acme/tiny-GGUF", env=env)
    assert removed.returncode == 0
    empty = run_cli("list", env=env)
    assert empty.stdout == "" and "no models cached yet" in empty.stderr
    again = run_cli("rm", "acme/tiny-GGUF", env=env)
    assert again.returncode == 1 and "not in the hub cache" in again.stderr


def test_cli_interrupted_pull_resumes(server, tmp_path, files):
    """Ctrl-C during `edgerunner pull` keeps the partial download; the next pull continues it."""
    # 21 MB: the half sent before the stall holds one whole 10 MiB write of huggingface_hub's http_get
    big = write_random_model(tmp_path / "big.gguf", seed=7, dim=512, ffn_dim=1024, n_heads=8, n_kv_heads=8)
    server.add("acme/big-GGUF", Repo({"big-Q8_0.gguf": big.read_bytes()}))
    server.reset()
    server.fault("big-Q8_0.gguf", "stall")  # half the bytes, then the transfer hangs
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGING"))}
    # a read timeout longer than the stall: the transfer must not time out, retry and finish
    # before the interrupt (a loaded CI machine can take seconds to deliver it)
    env.update(HF_ENDPOINT=server.url, HF_HOME=str(tmp_path / "hf"), EDGERUNNER_CACHE=str(tmp_path / "er"),
               HF_HUB_DOWNLOAD_TIMEOUT="120")
    # SIGINT at its default in the child: a test run started in the background (nohup, `cmd &`)
    # has it ignored, and Python then keeps ignoring it
    proc = subprocess.Popen([sys.executable, "-m", "edgerunner", "pull", "acme/big-GGUF"], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    blobs = tmp_path / "hf" / "hub" / "models--acme--big-GGUF" / "blobs"
    deadline = time.monotonic() + 60
    while not any(p.stat().st_size for p in blobs.glob("*.incomplete")):  # the first 10 MiB are on disk
        assert time.monotonic() < deadline and proc.poll() is None, proc.stderr.read() if proc.poll() else "timeout"
        time.sleep(0.02)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    server.release.set()
    assert proc.returncode == 130 and "Traceback" not in err, (proc.returncode, err, server.gets())
    assert "interrupted; a partial download is kept and the same command resumes it" in err
    (partial,) = blobs.glob("*.incomplete")
    kept = partial.stat().st_size
    assert 0 < kept < big.stat().st_size

    again = run_cli("pull", "acme/big-GGUF", env=env)
    assert again.returncode == 0, again.stderr
    assert server.gets()[-1].range == f"bytes={kept}-"
    assert sha256(pathlib.Path(again.stdout.split("\t")[2].strip())) == sha256(big)


def test_progress_display(capsys):
    progress = LoadProgress(bars=False)
    for done in (0, 100, 200):
        progress(LoadEvent(Stage.DOWNLOADING, done, 200, "downloading a/b/x.gguf"))
    progress(LoadEvent(Stage.LOADING, 200, 200, "paging in"))
    progress(LoadEvent(Stage.READY, 200, 200, "ready"))
    assert capsys.readouterr().err == "edgerunner: downloading a/b/x.gguf\n"  # one line, no bar

    progress = LoadProgress(bars=True)
    for done in (0, 1 << 20, 2 << 20):
        progress(LoadEvent(Stage.DOWNLOADING, done, 2 << 20, "downloading a/b/x.gguf"))
    progress(LoadEvent(Stage.READY, 2 << 20, 2 << 20, "ready"))
    err = capsys.readouterr().err
    assert "downloading: 100%" in err and "2.00M/2.00M" in err and "B/s" in err
