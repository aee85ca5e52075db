"""edgerunner: fast local LLM inference over GGUF models.

The native core (``edgerunner._core``) is imported by the submodules that need it, so the
pure-Python tools (``edgerunner.model_builder``, ``edgerunner.builtin_models``) work on their own.
"""

from __future__ import annotations

from edgerunner.errors import GGUFError

__version__ = "0.1.0"
__all__ = ["GGUFError", "__version__"]
