"""Lifecycle events of loading a model, for progress bars and status lines.

One load goes ``idle → downloading* → loading* → ready``, or ends in ``failed`` from any
stage (the seeds' Butter "Model loading flow"):

- ``idle``: the load has started; ``message`` names the source.
- ``downloading``: only for a hub or built-in name; ``done``/``total`` count the model's bytes
  (all shards) present in the cache, so a cache hit is one event with ``done == total``.
- ``loading``: the file is mapped and the engine built; then, with prewarm, every page of the
  mapped weights is touched in chunks (``done``/``total`` in bytes) and a warm-up step prepares
  the kernels.
- ``ready``: the model can generate; ``model`` holds it.
- ``failed``: ``error`` holds the exception, which is also raised to the caller.

Within a stage ``done`` never decreases, and ``total`` is fixed once known.

Two ways to watch::

    Model.load("org/repo:Q4_K_M", on_event=lambda e: print(e.stage, e.done, e.total))

    for event in edgerunner.load_events("org/repo:Q4_K_M"):
        ...                       # the last event is ready (event.model) or failed (then it raises)
"""

from __future__ import annotations

import enum
import queue
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Stage", "LoadEvent", "EventSink", "iterate_load"]


class Stage(str, enum.Enum):
    """Where a load is. A ``str``, so ``event.stage == "ready"`` works too."""

    IDLE = "idle"
    DOWNLOADING = "downloading"
    LOADING = "loading"
    READY = "ready"
    FAILED = "failed"

    def __str__(self) -> str:
        return self.value


_ORDER = {Stage.IDLE: 0, Stage.DOWNLOADING: 1, Stage.LOADING: 2, Stage.READY: 3, Stage.FAILED: 3}


@dataclass(frozen=True)
class LoadEvent:
    """One step of a load (see the module docstring for the stages)."""

    stage: Stage
    done: int = 0                  # bytes downloaded / paged in so far (this stage)
    total: int | None = None       # bytes in all, None while unknown
    message: str = ""              # what is happening, for a status line
    error: BaseException | None = None  # failed only
    model: Any = field(default=None, repr=False)  # ready only: the loaded Model

    @property
    def fraction(self) -> float | None:
        """``done / total`` in [0, 1], or None when the total is unknown."""
        if not self.total:
            return None
        return min(1.0, self.done / self.total)


class EventSink:
    """Delivers one load's events to a callback, in order and with non-decreasing progress.

    Producers call :meth:`emit` freely (a progress source may repeat itself or, like an HTTP
    download restarted from zero, step back); the sink keeps the contract: a stage going
    backwards, anything after ``ready``/``failed`` and exact repeats are dropped, and ``done``
    is held at its highest value (and at most ``total``).
    An exception raised by the callback aborts the load: it propagates to the producer, and
    the callback is not called again.
    """

    def __init__(self, callback: Callable[[LoadEvent], None] | None):
        self._callback = callback
        self._stage: Stage | None = None
        self._done = 0
        self._total: int | None = None
        self._last: tuple[Any, ...] = ()

    def emit(self, stage: Stage, done: int = 0, total: int | None = None, message: str = "", *,
             error: BaseException | None = None, model: Any = None) -> None:
        if self._stage in (Stage.READY, Stage.FAILED):
            return
        if self._stage is not None and _ORDER[stage] < _ORDER[self._stage]:
            return
        if stage != self._stage:
            self._stage, self._done, self._total = stage, 0, None
        if total is not None and self._total is None:
            self._total = total
        self._done = max(self._done, min(done, self._total) if self._total is not None else done)
        key = (stage, self._done, self._total, message)
        callback = self._callback
        if callback is None or (key == self._last and error is None and model is None):
            return
        self._last = key
        try:
            callback(LoadEvent(stage, self._done, self._total, message, error, model))
        except BaseException:
            self._callback = None
            raise


class _Done:
    """End of an iterated load: the model, or the exception to raise."""

    def __init__(self, model: Any = None, error: BaseException | None = None):
        self.model, self.error = model, error


def iterate_load(load: Callable[[Callable[[LoadEvent], None]], Any]) -> Iterator[LoadEvent]:
    """Run ``load(on_event)`` in a worker thread and yield its events as they happen.

    The last event is ``ready`` (its ``model`` is the result) or ``failed``, after which the
    exception is raised from the iterator. Closing the iterator early (``break``) cancels the
    load at its next event; a partial download is kept and resumed by the next load.
    """
    events: queue.SimpleQueue[LoadEvent | _Done] = queue.SimpleQueue()
    cancelled = threading.Event()

    def on_event(event: LoadEvent) -> None:
        if cancelled.is_set():
            raise _Cancelled("the load was cancelled: its event iterator was closed")
        events.put(event)

    def work() -> None:
        try:
            events.put(_Done(model=load(on_event)))
        except BaseException as exc:  # delivered to the consumer, who re-raises it
            events.put(_Done(error=exc))

    worker = threading.Thread(target=work, name="edgerunner-load", daemon=True)
    worker.start()
    try:
        while True:
            item = events.get()
            if isinstance(item, _Done):
                if item.error is not None:
                    raise item.error
                return
            yield item
    finally:
        cancelled.set()


class _Cancelled(Exception):
    """Raised inside a load whose event iterator was closed."""
