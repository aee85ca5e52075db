"""Chat templates: the model's own Jinja template (``tokenizer.chat_template``), rendered the way
Hugging Face ``apply_chat_template`` renders it, inside Jinja's immutable sandbox.

Templates come with downloaded models, so they are untrusted code. The sandbox forbids
attribute access to internals (``__class__``, ``__globals__``, ...) and mutation of the inputs;
a template that tries gets a :class:`ChatTemplateError` that says so.

A model without a template: ``ChatTemplate.from_gguf`` returns None. The caller then either
raises with :data:`NO_TEMPLATE_MESSAGE` or, if the user opted in, renders
:data:`DEFAULT_TEMPLATE` (ChatML) via ``ChatTemplate.default(...)``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from functools import lru_cache
from typing import Any

import jinja2
import jinja2.ext
import jinja2.nodes
from jinja2.exceptions import SecurityError, TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment

__all__ = ["DEFAULT_TEMPLATE", "NO_TEMPLATE_MESSAGE", "ChatTemplate", "ChatTemplateError", "validate_messages"]

# ChatML, as SmolLM and Qwen use it. Only used when the caller opts in.
DEFAULT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

NO_TEMPLATE_MESSAGE = (
    "this model has no chat template (no tokenizer.chat_template in its GGUF metadata), so it cannot "
    "format a conversation; it may be a base model meant for plain text completion. Use generate() "
    "with a prompt string, or pass template_fallback=True to use the generic ChatML template "
    "(edgerunner.chat_template.DEFAULT_TEMPLATE), which the model may not have been trained on"
)


class ChatTemplateError(ValueError):
    """A chat template failed to compile or render, called ``raise_exception``, or tried to
    escape the sandbox."""


class _GenerationTag(jinja2.ext.Extension):
    """``{% generation %}...{% endgeneration %}``: HF's marker for assistant text (used to build
    training masks). Rendering only needs its body."""

    tags = {"generation"}

    def parse(self, parser: Any) -> jinja2.nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_render"), [], [], body).set_lineno(lineno)

    def _render(self, caller: Any) -> str:
        return caller()


class _Sandbox(ImmutableSandboxedEnvironment):
    """Jinja's immutable sandbox, but an unsafe attribute fails at once. (Jinja returns an
    undefined value instead, which prints as "" and would hide the attempt.)"""

    def unsafe_undefined(self, obj: Any, attribute: str) -> Any:
        raise _Forbidden(f"{type(obj).__name__}.{attribute}")


class _Forbidden(SecurityError):
    def __init__(self, what: str):
        super().__init__(f"access to {what} is unsafe")
        self.what = what


class _TemplateRaised(TemplateError):
    """The template called ``raise_exception(msg)``."""


def _raise_exception(message: str) -> None:
    raise _TemplateRaised(message)


def _tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None,
            separators: tuple[str, str] | None = None, sort_keys: bool = False) -> str:  # fmt: skip
    # HF's tojson: no HTML escaping (Jinja's does), non-ASCII kept, indent/separators exposed.
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


class _Namespace(jinja2.utils.Namespace):
    """``namespace(...)`` that refuses underscore names (as HF's does)."""

    def __init__(*args: Any, **kwargs: Any):  # noqa: N805 - same signature trick as jinja2.utils.Namespace
        self, args = args[0], args[1:]
        attrs = dict(*args, **kwargs)
        for name in attrs:
            _Namespace._check(name)
        jinja2.utils.Namespace.__init__(self, attrs)

    def __setitem__(self, name: str, value: Any) -> None:
        _Namespace._check(name)
        jinja2.utils.Namespace.__setitem__(self, name, value)

    @staticmethod
    def _check(name: Any) -> None:
        if isinstance(name, str) and name.startswith("_"):
            raise SecurityError(f"chat templates cannot set underscore attribute {name!r} on a namespace")


@lru_cache(maxsize=1)
def _environment() -> _Sandbox:
    env = _Sandbox(
        trim_blocks=True, lstrip_blocks=True, extensions=[_GenerationTag, jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    env.globals["namespace"] = _Namespace
    return env


def _plain(value: Any) -> Any:
    """A copy made of plain JSON types only, so the template cannot reach methods of rich
    objects the caller passed in (numpy scalars, pydantic models, ...)."""
    if value is None or type(value) in (str, int, float, bool):
        return value
    if isinstance(value, bool):
        return bool(value)
    if isinstance(value, str):
        return str.__str__(value)
    if isinstance(value, int):
        return int.__int__(value)
    if isinstance(value, float):
        return float.__float__(value)
    if isinstance(value, Mapping):
        return {_plain(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if callable(getattr(value, "item", None)):  # numpy scalars
        return _plain(value.item())
    if callable(getattr(value, "model_dump", None)):  # pydantic models
        return _plain(value.model_dump())
    raise TypeError(f"chat template input of type {type(value).__name__} is not JSON-like (dict/list/str/number)")


def validate_messages(messages: Any) -> list[dict[str, Any]]:
    """Check that ``messages`` is a list of ``{"role": str, "content": str | list | None, ...}``
    dicts; return a plain copy.

    Raises:
        TypeError: not a list, an entry is not a dict, or role/content have the wrong type.
        ValueError: the list is empty, or an entry lacks ``role``.
    """
    if isinstance(messages, (str, bytes, Mapping)) or not isinstance(messages, Sequence):
        raise TypeError(
            f"messages must be a list of dicts like {{'role': 'user', 'content': 'Hi'}}, got {type(messages).__name__}"
        )
    if not messages:
        raise ValueError("messages is empty; a chat needs at least one message")
    for i, message in enumerate(messages):
        if not isinstance(message, Mapping):
            raise TypeError(f"messages[{i}] must be a dict with 'role' and 'content', got {type(message).__name__}")
        if "role" not in message:
            raise ValueError(f"messages[{i}] has no 'role' (keys: {sorted(message)}); add e.g. 'role': 'user'")
        if not isinstance(message["role"], str):
            raise TypeError(f"messages[{i}]['role'] must be a str, got {type(message['role']).__name__}")
        if "content" not in message and "tool_calls" not in message:
            raise ValueError(f"messages[{i}] (role {message['role']!r}) has no 'content'")
        content = message.get("content")
        if content is not None and not isinstance(content, (str, list, tuple)):
            raise TypeError(
                f"messages[{i}]['content'] must be a str or a list of content parts, got {type(content).__name__}"
            )
    return _plain(list(messages))


class ChatTemplate:
    """One model's chat template.

    Args:
        source: the Jinja template text.
        bos_token, eos_token: the token *texts* the template may print (``{{ bos_token }}``).

    Raises:
        ChatTemplateError: the template does not compile.
    """

    def __init__(self, source: str, bos_token: str = "", eos_token: str = ""):
        if not isinstance(source, str):
            raise TypeError(f"chat template source must be a str, got {type(source).__name__}")
        self.source = source
        self.bos_token = bos_token
        self.eos_token = eos_token
        try:
            self._template = _environment().from_string(source)
        except TemplateError as e:
            raise ChatTemplateError(f"the chat template does not compile: {e}") from e

    @classmethod
    def from_gguf(cls, f: Any) -> ChatTemplate | None:
        """The template in a GGUF's ``tokenizer.chat_template``, or None if it has none."""
        m = f.metadata
        source = m.get("tokenizer.chat_template")
        if not source:
            return None
        bos, eos = _token_text(m, "bos"), _token_text(m, "eos")
        return cls(source, bos, eos)

    @classmethod
    def default(cls, bos_token: str = "", eos_token: str = "") -> ChatTemplate:
        """The ChatML fallback (:data:`DEFAULT_TEMPLATE`), for callers who opted in."""
        return cls(DEFAULT_TEMPLATE, bos_token, eos_token)

    def render(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        add_generation_prompt: bool = True,
        tools: Sequence[Mapping[str, Any]] | None = None,
        **extra: Any,
    ) -> str:
        """The prompt text for ``messages``.

        Args:
            add_generation_prompt: end with the header of an assistant turn, so the model answers.
            tools: JSON schemas of callable tools, for templates that describe them.
            extra: more template variables (e.g. ``enable_thinking=False``, ``documents``).

        Raises:
            TypeError, ValueError: malformed messages.
            ChatTemplateError: the template raised (``raise_exception``), failed, or broke the sandbox.
        """
        chat = validate_messages(messages)
        if tools is not None and (isinstance(tools, (str, Mapping)) or not all(isinstance(t, Mapping) for t in tools)):
            raise TypeError("tools must be a list of JSON-schema dicts")
        context = {"bos_token": self.bos_token, "eos_token": self.eos_token, **_plain(extra)}
        try:
            return self._template.render(
                messages=chat,
                tools=_plain(tools),
                add_generation_prompt=add_generation_prompt,
                **context,
            )
        except _TemplateRaised as e:
            raise ChatTemplateError(f"the chat template rejected the conversation: {e.message}") from None
        except SecurityError as e:
            did = f"tried to access {e.what}" if isinstance(e, _Forbidden) else f"did something ({e})"
            raise ChatTemplateError(
                f"the chat template {did}, which the sandbox forbids; the template is unsafe and was not rendered"
            ) from None
        except TemplateError as e:
            raise ChatTemplateError(f"the chat template failed to render: {e}") from e
        except Exception as e:  # a Python error inside the template (TypeError, KeyError, ...)
            raise ChatTemplateError(f"the chat template failed to render: {type(e).__name__}: {e}") from e

    def __repr__(self) -> str:
        return f"ChatTemplate({len(self.source)} chars, bos_token={self.bos_token!r}, eos_token={self.eos_token!r})"


def _token_text(m: Mapping[str, Any], name: str) -> str:
    tokens = m.get("tokenizer.ggml.tokens")
    i = m.get(f"tokenizer.ggml.{name}_token_id")
    if tokens is None or i is None or not 0 <= int(i) < len(tokens):
        return ""
    return tokens[int(i)]
