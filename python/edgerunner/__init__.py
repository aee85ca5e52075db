"""edgerunner: fast local LLM inference over GGUF models.

    from edgerunner import Model
    model = Model.load("smollm2-135m-instruct")   # a built-in name, a .gguf path, or "org/repo:Q4_K_M"
    print(model.chat([{"role": "user", "content": "Hello!"}]))

    for event in edgerunner.load_events("org/repo:Q4_K_M"):   # idle, downloading, loading, ready
        print(event.stage, event.done, event.total)

The native core (``edgerunner._core``) is imported on first use of ``Model``, so the pure-Python
tools (``edgerunner.model_builder``, ``edgerunner.builtin_models``) work on their own.
"""

from __future__ import annotations

from typing import Any

from edgerunner.errors import (ContextLengthError, GGUFError, IntegrityError, ModelFetchError, ModelNotFoundError,
                               OutOfMemoryError)
from edgerunner.events import LoadEvent, Stage

__version__ = "0.1.0"
__all__ = ["Model", "Generator", "load_events", "devices", "LoadEvent", "Stage", "GGUFError", "ContextLengthError",
           "OutOfMemoryError", "ModelFetchError", "ModelNotFoundError", "IntegrityError", "TokenizerError",
           "ChatTemplateError", "__version__"]


def __getattr__(name: str) -> Any:
    if name in ("Model", "Generator", "load_events", "devices"):
        from edgerunner import model

        return getattr(model, name)
    if name == "TokenizerError":
        from edgerunner.tokenizer import TokenizerError

        return TokenizerError
    if name == "ChatTemplateError":
        from edgerunner.chat_template import ChatTemplateError

        return ChatTemplateError
    raise AttributeError(f"module 'edgerunner' has no attribute {name!r}")
