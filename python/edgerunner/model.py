"""The Python face of the engine: ``Model.load``, ``generate``, ``chat`` and multi-turn ``Generator``.

Everything per token that costs (the forward pass, sampling) runs in C++; Python only turns
token ids into text as they stream and watches for stop strings.

    from edgerunner import Model
    model = Model.load("smollm2-135m-instruct")   # a built-in name, a path, or "org/repo:Q4_K_M"
    print(model.chat([{"role": "user", "content": "Hi!"}], max_tokens=32))
    for piece in model.generate("Once upon a time", stream=True, max_tokens=32):
        print(piece, end="", flush=True)
"""

from __future__ import annotations

import os
import random
import re
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from edgerunner import _core, builtin_models, gguf, sources
from edgerunner.chat_template import NO_TEMPLATE_MESSAGE, ChatTemplate, ChatTemplateError, validate_messages
from edgerunner.errors import ContextLengthError
from edgerunner.events import EventSink, LoadEvent, Stage, iterate_load
from edgerunner.sampling import SamplingParams
from edgerunner.tokenizer import Tokenizer

__all__ = ["Model", "Generator", "load_events"]

Prompt = str | Sequence[int]

_TOUCH_CHUNK = 64 << 20  # bytes paged in between two loading events


def devices() -> list[dict[str, Any]]:
    """What this build can run on, here: ``{"device", "available", "description"}`` for the CPU,
    each CUDA device (``"cuda:N"``; one ``"cuda"`` entry saying why where there is none) and Metal.
    ``backend="auto"`` takes the first available GPU entry (``"cuda:0"``, else ``"metal"``), else
    the CPU."""
    found = [{"device": "cpu", "available": True,
              "description": f"{os.cpu_count()} threads, kernels {_core.cpu_isa()} (this CPU runs {', '.join(_core.cpu_isas())})"}]
    if _core.cuda_available():
        found += [{"device": f"cuda:{n}", "available": True, "description": _core.cuda_device(n)}
                  for n in range(_core.cuda_device_count())]
    else:
        found.append({"device": "cuda", "available": False, "description": _core.cuda_device()})
    found.append({"device": "metal", "available": bool(_core.metal_available()), "description": _core.metal_device()})
    return found


def is_backend(name: object) -> bool:
    """Whether ``name`` is spelled as a backend :meth:`Model.load` takes: auto, cpu, cuda, cuda:N or
    metal (whether this build and machine have it, load says)."""
    return isinstance(name, str) and (name in ("auto", "cpu", "cuda", "metal") or re.fullmatch(r"cuda:[0-9]{1,6}", name) is not None)


class Model:
    """A loaded GGUF model. Use :meth:`load` to make one."""

    def __init__(self, path: str, native: Any, file: gguf.GGUFFile, tokenizer: Tokenizer,
                 template: ChatTemplate | None):
        self.path = path
        self._native = native
        self.file = file
        self.tokenizer = tokenizer
        self.chat_template = template
        self._session = _core.Session(native)  # the session behind generate()/chat()/logits()
        self._lock = threading.Lock()          # one native step at a time per model
        self._owners: dict[int, object] = {}    # id(session) -> the stream whose tokens it holds
        # Facts about the latest generate/chat/send: mode (how the prompt was evaluated: reset,
        # extend, decode or cached), prompt_tokens, new_tokens, finish_reason
        # (stop, eos, length or context).
        self.last_generation: dict[str, Any] = {}

    @classmethod
    def load(cls, source: str | os.PathLike[str] | None = None, *, revision: str | None = None,
             on_event: Callable[[LoadEvent], None] | None = None, prewarm: bool = True,
             n_ctx: int | None = None, kv_type: str = "f16", precise: bool = False, threads: int | None = None,
             prefill_chunk: int = 256, backend: str = "auto", dispatch: str = "auto") -> Model:
        """Load a model.

        Args:
            source: a built-in name (``edgerunner.builtin_models.ALIASES``; None: the default
                one), a ``.gguf`` path (a split model: its first shard), or a Hugging Face hub
                name: ``"org/repo"`` (its only GGUF, or its Q4_K_M one), ``"org/repo:Q4_K_M"``
                (by quant tag) or ``"org/repo/file.gguf"``. Hub models are fetched into the hub
                cache and verified (see :mod:`edgerunner.hub`); ``HF_TOKEN``, ``HF_ENDPOINT``,
                ``HF_HOME`` and ``HF_HUB_OFFLINE`` apply.
            revision: the hub revision (branch, tag or commit) to take a hub model from
                (default: main).
            on_event: called with each :class:`edgerunner.events.LoadEvent`, in order:
                ``idle``, ``downloading`` (hub and built-in names), ``loading``, then ``ready``
                or ``failed`` (whose exception is also raised here). Called from this thread.
            prewarm: before ``ready``, page every byte of the mapped model files in (in
                64 MiB chunks, each a ``loading`` event) and run one prefill and one decode
                step on a throw-away token (the thread pool started, the step plans' scratch
                touched, GPU kernels loaded and the decode graph recorded), so the first token
                costs no page faults or one-time set-up. ``False`` is ready as soon as the
                engine is built: faster to load, slower first token. On the CUDA backend the
                weights are already copied to the device by then, so no pages are touched.
            n_ctx: context length in tokens (default: the model's, capped at 4096).
            kv_type: KV cache precision, ``"f16"`` (default), ``"f32"`` or ``"q8_0"``.
            precise: float32 activations and KV cache, no activation quantization: slower, and
                equal to a float32 reference within 1e-2 logits.
            threads: CPU threads (default: all).
            prefill_chunk: tokens per prefill step.
            backend: ``"cpu"``, ``"cuda"`` (a build with the CUDA backend and an NVIDIA GPU: its
                device 0), ``"cuda:N"`` (its device N; ``CUDA_VISIBLE_DEVICES`` chooses and numbers
                them), ``"metal"`` (a macOS build, which has the Metal backend, on a Metal 3 GPU), or
                ``"auto"``: a GPU backend where one is available (and not ``precise``), else the CPU.
            dispatch: how GPU decode steps are issued: ``"eager"`` (every op encoded each step),
                ``"argument_buffers"`` (every op's arguments written once into device tables, the
                same launches each step), ``"recorded"`` (the decode step recorded once, a CUDA
                graph or a Metal indirect command buffer, and replayed) or ``"auto"``
                (recorded). Ignored by the CPU backend.

        Raises:
            FileNotFoundError, edgerunner.GGUFError (malformed file), ValueError (unsupported
            architecture, tensor type or option), edgerunner.ModelFetchError and its
            ModelNotFoundError (unknown repo, file or quant tag; ``available`` lists the tags)
            and IntegrityError (a download that stays corrupt).
        """
        events = EventSink(on_event)
        events.emit(Stage.IDLE, message=f"loading {source if source is not None else builtin_models.DEFAULT_MODEL}")
        try:
            options = dict(n_ctx=int(n_ctx or 0), kv_type=kv_type, precise=precise, n_threads=int(threads or 0),
                           prefill_chunk=int(prefill_chunk), backend=backend, dispatch=dispatch)
            _core.Model.check_options(**options)  # (before a download: a backend that is not here fails now)
            path = str(sources.resolve(source, revision=revision, report=lambda done, total, message: events.emit(
                Stage.DOWNLOADING, done, total, message)))
            file = gguf.open(path)
            total = file.file_size  # every shard
            name = os.path.basename(path)
            events.emit(Stage.LOADING, 0, total, f"building the engine for {name}")
            native = _core.Model.load(path, **options)
            if prewarm and native.backend == "cpu":
                for begin in range(0, total, _TOUCH_CHUNK):
                    end = min(total, begin + _TOUCH_CHUNK)
                    native.touch_weights(begin, end)
                    events.emit(Stage.LOADING, end, total, f"paging in the weights of {name}")
            model = cls(path, native, file, Tokenizer.from_gguf(file), ChatTemplate.from_gguf(file))
            if prewarm:
                events.emit(Stage.LOADING, total, total, "preparing the kernels (one warm-up step)")
                model._warm_up()
            events.emit(Stage.LOADING, total, total, f"{name} is loaded")
        except BaseException as exc:
            events.emit(Stage.FAILED, message=str(exc), error=exc)
            raise
        events.emit(Stage.READY, total, total, f"{name} is ready", model=model)
        return model

    def _warm_up(self) -> None:
        """One prefill step and one decode step on a throw-away token, then forgotten: every
        one-time cost of the first token (thread pool start, scratch pages, GPU kernel loading,
        the decode graph's capture) is paid here."""
        token = self.tokenizer.bos_id if self.tokenizer.bos_id is not None else 0
        n = min(2, self.n_ctx)
        with self._lock:
            self._session.eval(np.full(n, token, np.int32))
            if self.n_ctx > n:
                self._session.eval(np.full(n + 1, token, np.int32))
            self._session.rewind(0)

    # ---- facts ---------------------------------------------------------------------------

    @property
    def config(self) -> dict[str, Any]:
        """Hyperparameters as the engine read them (arch, n_embd, n_layer, n_head, ...)."""
        return self._native.config

    @property
    def n_ctx(self) -> int:
        return self._native.n_ctx

    @property
    def backend(self) -> str:
        """The backend the model runs on: ``"cpu"``, ``"cuda"`` or ``"metal"``."""
        return self._native.backend

    @property
    def device(self) -> str:
        """The device it runs on: ``"cpu"``, ``"cuda:N"`` (N: the CUDA device index) or ``"metal"``."""
        return self._native.device

    @property
    def n_vocab(self) -> int:
        return self._native.config["n_vocab"]

    def __repr__(self) -> str:
        c = self.config
        return (f"Model({os.path.basename(self.path)!r}, arch={c['arch']}, layers={c['n_layer']}, "
                f"n_ctx={self.n_ctx}, kv={self._native.kv_type}, device={self.device}"
                f"{', precise' if self._native.precise else ''})")

    # ---- tokens --------------------------------------------------------------------------

    def tokenize(self, text: str, *, add_special: bool = True, parse_special: bool = True) -> list[int]:
        """Token ids of ``text`` (with BOS/EOS as the model asks when ``add_special``)."""
        return self.tokenizer.encode(text, add_special=add_special, parse_special=parse_special)

    def detokenize(self, ids: Iterable[int], *, skip_special: bool = False) -> str:
        return self.tokenizer.decode(list(ids), skip_special=skip_special)

    def _ids(self, prompt: Prompt) -> np.ndarray:
        ids = self.tokenize(prompt) if isinstance(prompt, str) else list(prompt)
        if not ids:
            raise ValueError("the prompt is empty: give some text or token ids")
        return np.asarray(ids, dtype=np.int32)

    # ---- logits --------------------------------------------------------------------------

    def logits(self, prompt: Prompt, *, all_positions: bool = False) -> np.ndarray:
        """Next-token logits after ``prompt`` (n_vocab,), or every position's (n, n_vocab).

        Reuses the cached prefix of the previous call where it can.
        """
        ids = self._ids(prompt)
        with self._lock:
            if all_positions:
                return self._session.eval_all(ids)
            self._session.eval(ids)
            return self._session.logits()

    # ---- generation ----------------------------------------------------------------------

    def generate(self, prompt: Prompt, *, max_tokens: int = 256, stream: bool = False,
                 stop: str | Sequence[str] = (), ignore_eos: bool = False, temperature: float = 0.0,
                 top_k: int = 0, top_p: float = 1.0, min_p: float = 0.0, repetition_penalty: float = 1.0,
                 presence_penalty: float = 0.0, frequency_penalty: float = 0.0, penalty_last_n: int = 64,
                 logit_bias: Mapping[int, float] | None = None, seed: int | None = None) -> str | Iterator[str]:
        """Continue ``prompt`` (text, tokenized with the model's BOS rules, or token ids).

        Greedy by default (``temperature=0``). Stops after ``max_tokens``, at an end-of-turn or
        EOS token (unless ``ignore_eos``), at any of the ``stop`` strings (not included in the
        output), or when the context is full. ``seed=None`` draws a random seed; a fixed seed
        gives the same text every time. ``stream=True`` returns an iterator of text pieces
        (never half a UTF-8 character); otherwise the whole text.

        Raises:
            edgerunner.ContextLengthError: the prompt does not fit in ``n_ctx``.
        """
        return self._generate(self._session, self._ids(prompt), max_tokens=max_tokens, stream=stream, stop=stop,
                              ignore_eos=ignore_eos, temperature=temperature, top_k=top_k, top_p=top_p,
                              min_p=min_p, repetition_penalty=repetition_penalty,
                              presence_penalty=presence_penalty, frequency_penalty=frequency_penalty,
                              penalty_last_n=penalty_last_n, logit_bias=logit_bias, seed=seed)

    def _generate(self, session: Any, ids: np.ndarray, *, max_tokens: int = 256, stream: bool = False,
                  stop: str | Sequence[str] = (), ignore_eos: bool = False, seed: int | None = None,
                  logit_bias: Mapping[int, float] | None = None, on_done: Any = None,
                  **sampling: Any) -> str | Iterator[str]:
        params = SamplingParams(logit_bias=logit_bias or {}, seed=random.getrandbits(63) if seed is None else seed,
                                **sampling)
        if max_tokens < 0:
            raise ValueError(f"max_tokens must be >= 0, got {max_tokens}")
        stops = [stop] if isinstance(stop, str) else list(stop)
        if any(not s for s in stops):
            raise ValueError("stop strings must be non-empty")
        self.last_generation = {}
        pieces = _stream(self, session, ids, params, max_tokens, stops, ignore_eos, on_done, self.last_generation)
        return pieces if stream else "".join(pieces)

    def chat(self, messages: Sequence[Mapping[str, Any]], *, template_fallback: bool = False,
             **kwargs: Any) -> str | Iterator[str]:
        """Reply to ``messages`` (``[{"role": "user", "content": "..."}]``) using the model's own
        chat template. Keywords are those of :meth:`generate`.

        A model without a chat template raises ``ChatTemplateError`` unless
        ``template_fallback=True``, which uses a generic ChatML template.
        """
        return self.generate(self.render_chat(messages, template_fallback=template_fallback), **kwargs)

    def render_chat(self, messages: Sequence[Mapping[str, Any]], *, add_generation_prompt: bool = True,
                    template_fallback: bool = False) -> list[int]:
        """The token ids of ``messages`` rendered with the chat template."""
        template = self.chat_template
        if template is None:
            if not template_fallback:
                raise ChatTemplateError(f"{os.path.basename(self.path)}: {NO_TEMPLATE_MESSAGE}")
            template = ChatTemplate.default(self.tokenizer.token_to_piece(self.tokenizer.bos_id)
                                            if self.tokenizer.bos_id is not None else "",
                                            self.tokenizer.token_to_piece(self.tokenizer.eos_id)
                                            if self.tokenizer.eos_id is not None else "")
        text = template.render(validate_messages(messages), add_generation_prompt=add_generation_prompt)
        # The template prints BOS itself where the model wants one.
        return self.tokenize(text, add_special=False, parse_special=True)

    def session(self, system: str | None = None) -> Generator:
        """A multi-turn conversation with its own KV cache (see :class:`Generator`)."""
        return Generator(self, system=system)


class Generator:
    """A stateful conversation: ``send`` a user message, get the reply; each turn reuses the
    KV cache of the conversation so far (only the new turn's tokens are processed)."""

    def __init__(self, model: Model, *, system: str | None = None):
        self.model = model
        self.messages: list[dict[str, Any]] = [{"role": "system", "content": system}] if system else []
        self._session = _core.Session(model._native)

    def send(self, content: str, *, stream: bool = False, template_fallback: bool = False,
             **kwargs: Any) -> str | Iterator[str]:
        """Add a user message and reply to it. The reply joins ``messages`` when it is complete;
        if the turn cannot start (bad arguments, context too long) nothing is added."""
        messages = [*self.messages, {"role": "user", "content": content}]
        ids = np.asarray(self.model.render_chat(messages, template_fallback=template_fallback), np.int32)

        def done(reply: str) -> None:
            messages.append({"role": "assistant", "content": reply})

        previous, self.messages = self.messages, messages
        try:
            return self.model._generate(self._session, ids, stream=stream, on_done=done, **kwargs)
        except BaseException:
            self.messages = previous
            raise

    @property
    def last_turn(self) -> dict[str, Any]:
        """Facts about the latest reply (see ``Model.last_generation``)."""
        return self.model.last_generation

    def reset(self) -> None:
        """Forget the conversation (the system message stays)."""
        self.messages = [m for m in self.messages if m["role"] == "system"]


def _stream(model: Model, session: Any, ids: np.ndarray, params: SamplingParams, max_tokens: int,
            stops: list[str], ignore_eos: bool, on_done: Any, info: dict[str, Any]) -> Iterator[str]:
    """The generation loop: prefill (reusing the cached prefix), then sample/append per token."""
    if len(ids) > model.n_ctx:
        raise ContextLengthError(f"the prompt has {len(ids)} tokens but the context holds {model.n_ctx}; "
                                 "load the model with a larger n_ctx or shorten the prompt")
    sampler = params.sampler(model.n_vocab)
    end_ids = frozenset() if ignore_eos else model.tokenizer.eot_ids
    decoder = model.tokenizer.stream(skip_special=True)
    hold = max((len(s) for s in stops), default=1) - 1  # text that might still become a stop string

    def run() -> Iterator[str]:
        text = []
        for piece in pieces():
            text.append(piece)
            yield piece
        if on_done is not None:
            on_done("".join(text))

    def pieces() -> Iterator[str]:
        # The lock is held only around native calls, never across a yield: an abandoned
        # stream cannot block the model. A session another stream used in between is brought
        # back to this stream's tokens first (prefix reuse makes that cheap).
        history = ids.tolist()
        marker = object()

        def own() -> None:
            if model._owners.get(id(session)) is not marker:
                session.eval(np.asarray(history, np.int32))
                model._owners[id(session)] = marker

        with model._lock:
            info.update(mode=session.eval(ids), prompt_tokens=len(ids), new_tokens=0, finish_reason="length")
            model._owners[id(session)] = marker
        pending = ""
        token = -1
        for i in range(max_tokens):
            with model._lock:
                own()
                if i == 0:
                    token = session.sample(sampler)
                else:
                    # the previous token in, the next one out: drawn on the GPU where it can, with
                    # steps running ahead there (told how many draws this loop may still ask for)
                    previous = token
                    token = session.append_sampled(previous, sampler, max_tokens - 1 - i)
                    history.append(previous)
            if token in end_ids:
                info["finish_reason"] = "eos"
                break
            info["new_tokens"] = i + 1
            pending += decoder.feed(token)
            if stops:
                cut = min((p for p in (pending.find(s) for s in stops) if p >= 0), default=-1)
                if cut >= 0:
                    info["finish_reason"] = "stop"
                    if pending[:cut]:
                        yield pending[:cut]
                    return
                if len(pending) > hold:
                    yield pending[: len(pending) - hold]
                    pending = pending[len(pending) - hold:]
            elif pending:
                yield pending
                pending = ""
            if i == max_tokens - 1:
                break
            if len(history) >= model.n_ctx:
                info["finish_reason"] = "context"
                break
        pending += decoder.flush()
        if stops:
            cut = min((p for p in (pending.find(s) for s in stops) if p >= 0), default=-1)
            if cut >= 0:
                info["finish_reason"] = "stop"
                pending = pending[:cut]
        if pending:
            yield pending

    return run()


def load_events(source: str | os.PathLike[str] | None = None, **options: Any) -> Iterator[LoadEvent]:
    """:meth:`Model.load` as an iterator of its lifecycle events (the load runs in a worker thread).

    The last event is ``ready``, whose ``model`` is the loaded model, or ``failed``, after which
    the exception is raised from the iterator. Leaving the loop early cancels the load at its
    next event (a partial download is kept and resumed by the next load)::

        for event in edgerunner.load_events("org/repo:Q4_K_M"):
            show(event.stage, event.done, event.total)
        model = event.model
    """
    if "on_event" in options:
        raise TypeError("load_events() delivers the events itself; use Model.load(on_event=...) for a callback")
    return iterate_load(lambda on_event: Model.load(source, on_event=on_event, **options))
