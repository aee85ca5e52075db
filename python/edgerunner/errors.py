"""Exceptions raised by edgerunner. Each message names the offending input and the fix."""

from __future__ import annotations


class GGUFError(ValueError):
    """A GGUF file is malformed or unsupported.

    Attributes:
        field: what was being read, e.g. ``"tensor_count"`` or ``"tensor 'output.weight' offset"``.
        offset: the byte offset in the file where that field starts.
    """

    def __init__(self, message: str, field: str | None = None, offset: int | None = None):
        super().__init__(message)
        self.field = field
        self.offset = offset


class ContextLengthError(ValueError):
    """The tokens do not fit in the model's context (``n_ctx``): load with a larger ``n_ctx``,
    shorten the input, or let ``generate`` truncate the prompt (``truncate="left"``)."""
