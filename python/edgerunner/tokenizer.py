"""The tokenizer a GGUF file describes: ``Tokenizer.from_gguf(edgerunner.gguf.open(path))``.

A GGUF carries no ``tokenizer.json``; it stores the vocabulary under llama.cpp's keys
(``tokenizer.ggml.*``). We rebuild the tokenizer from them with Hugging Face ``tokenizers``,
for the two vocabulary kinds llama.cpp calls:

- ``gpt2``: byte-level BPE. Tokens are spelled in GPT-2's byte alphabet; the text is first cut
  by the regexes ``tokenizer.ggml.pre`` names (see ``PRE_TOKENIZER_SPLITS``), then merged.
- ``llama``: SentencePiece BPE. Spaces become ``▁``; characters outside the vocabulary fall back
  to ``<0xXX>`` byte tokens; merges come from the file, or are rebuilt from the token scores.

Control tokens (type 3) are special added tokens, matched whole in the text only when
``parse_special=True``; user-defined tokens (type 4) are always matched whole, as llama.cpp does.

Decoding does not go through ``tokenizers``: every token id maps to the bytes it stands for
(``token_bytes``), so ``decode`` and the streaming ``StreamDecoder`` join the same bytes and
cannot disagree.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
from tokenizers import AddedToken, Regex, Tokenizer as _HFTokenizer
from tokenizers import models, normalizers, pre_tokenizers

__all__ = ["PRE_TOKENIZER_SPLITS", "StreamDecoder", "Tokenizer", "TokenizerError"]

# llama.cpp's token types (tokenizer.ggml.token_type).
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6

SPM_SPACE = "\u2581"  # SentencePiece's visible space, "▁"


class TokenizerError(ValueError):
    """The GGUF's tokenizer metadata is missing, inconsistent or of a kind we do not support."""


# ---- pre-tokenizer regexes ------------------------------------------------------------------
# The regexes llama.cpp applies (in order, each cutting the pieces of the previous) for each
# tokenizer.ggml.pre value. transformers' GGUF converter uses the same ones.

_GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
_LLAMA3 = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2 = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_TEKKEN = (
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+"
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*"
    r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_GPT4O = (
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
    r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

PRE_TOKENIZER_SPLITS: dict[str, tuple[str, ...]] = {
    # "default" is what llama.cpp's converter writes when it did not recognise the tokenizer;
    # like transformers, we read it as GPT-2's split.
    "default": (_GPT2,),
    "gpt-2": (_GPT2,),
    "gpt2": (_GPT2,),
    "smollm": (r"\p{N}", _GPT2),  # digits one by one, then GPT-2
    "llama3": (_LLAMA3,),
    "llama-v3": (_LLAMA3,),
    "llama-bpe": (_LLAMA3,),
    "falcon3": (_LLAMA3,),
    "pixtral": (_LLAMA3,),
    "dbrx": (_LLAMA3,),
    "smaug-bpe": (_LLAMA3,),
    "qwen2": (_QWEN2,),
    "deepseek-r1-qwen": (_QWEN2,),
    "megrez": (_QWEN2,),
    "tekken": (_TEKKEN,),
    "gpt-4o": (_GPT4O,),
    "llama4": (_GPT4O,),
}

# End-of-generation tokens llama.cpp recognises by their text (when the vocabulary has them).
_EOT_TEXTS = (
    "<|eot_id|>", "<|eom_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>",
    "<EOT>", "<|return|>", "<|call|>", "<\uff5cend\u2581of\u2581sentence\uff5c>",
)  # fmt: skip


def gpt2_byte_alphabet() -> dict[int, str]:
    """GPT-2's reversible byte -> printable character map."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    chars = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in chars:
            chars[b] = chr(256 + extra)
            extra += 1
    return chars


def _merges_from_scores(tokens: Sequence[str], scores: Sequence[float]) -> list[tuple[str, str]]:
    """Merges a SentencePiece vocabulary implies: every split of a token into two tokens,
    best (highest score) result first. Same order as transformers' ``generate_merges``, so
    ties break the same way (longer left part first, then longer right part)."""
    vocab = {t: i for i, t in enumerate(tokens)}
    score_of = dict(zip(tokens, scores))
    found: list[tuple[str, str, float]] = []
    for token, score in score_of.items():
        local = []
        for k in range(1, len(token)):
            left, right = token[:k], token[k:]
            if left in vocab and right in vocab:
                local.append((left, right, score))
        local.sort(key=lambda m: (vocab[m[0]], vocab[m[1]]))
        found.extend(local)
    found.sort(key=lambda m: (m[2], len(m[0]), len(m[1])), reverse=True)
    return [(left, right) for left, right, _ in found]


def _metadata_int(metadata: dict[str, Any], key: str) -> int | None:
    value = metadata.get(key)
    return None if value is None else int(value)


class Tokenizer:
    """Text <-> token ids for one model, built from its GGUF metadata.

    Attributes:
        bos_id, eos_id: the begin/end-of-sequence ids, or None when the file names none.
        eot_ids: ids that end generation: eos, ``tokenizer.ggml.eot_token_id`` /
            ``eom_token_id``, and control tokens such as ``<|im_end|>`` or ``<end_of_turn>``.
        special_tokens: text -> id of every control and user-defined token (those matched
            whole in the input text).
        add_bos, add_eos: whether ``encode(..., add_special=True)`` adds them.
    """

    def __init__(
        self,
        backend: _HFTokenizer,
        pieces: list[bytes],
        token_types: np.ndarray,
        *,
        bos_id: int | None,
        eos_id: int | None,
        eot_ids: Iterable[int],
        add_bos: bool,
        add_eos: bool,
        strip_leading_space: bool,
    ):
        self._backend = backend
        self._lock = threading.Lock()  # guards backend.encode_special_tokens, toggled per call
        self._pieces = pieces
        self._types = token_types
        self.bos_id = bos_id
        self.eos_id = eos_id
        self.eot_ids: frozenset[int] = frozenset(eot_ids)
        self.add_bos = add_bos
        self.add_eos = add_eos
        # SentencePiece vocabularies that prepend a space when encoding drop it when decoding.
        self._strip_leading_space = strip_leading_space
        special = {UNKNOWN, CONTROL}
        self._skippable = frozenset(
            [i for i, t in enumerate(token_types) if int(t) in special]
            + [i for i in (bos_id, eos_id) if i is not None]
        )
        self._normal = np.isin(token_types, (NORMAL, UNUSED, BYTE))
        self._special = {
            pieces[i].decode("utf-8", "replace"): i
            for i in np.flatnonzero(np.isin(token_types, (CONTROL, USER_DEFINED))).tolist()
        }

    # ---- construction ----------------------------------------------------------------------

    @classmethod
    def from_gguf(cls, f: Any) -> Tokenizer:
        """Build the tokenizer an ``edgerunner.gguf.GGUFFile`` describes.

        Raises:
            TokenizerError: the file has no vocabulary, or a tokenizer model or pre-tokenizer
                this build does not know.
        """
        m = f.metadata
        kind = m.get("tokenizer.ggml.model")
        tokens = m.get("tokenizer.ggml.tokens")
        if kind is None or tokens is None:
            raise TokenizerError(
                f"{f.path}: no tokenizer in the GGUF metadata (tokenizer.ggml.model / tokenizer.ggml.tokens "
                "missing); this file cannot be used for text generation"
            )
        tokens = list(tokens)
        n = len(tokens)
        types = m.get("tokenizer.ggml.token_type")
        types = np.full(n, NORMAL, np.int32) if types is None else np.asarray(types, np.int32)
        if len(types) != n:
            raise TokenizerError(f"{f.path}: tokenizer.ggml.token_type has {len(types)} entries for {n} tokens")

        bos_id = _metadata_int(m, "tokenizer.ggml.bos_token_id")
        eos_id = _metadata_int(m, "tokenizer.ggml.eos_token_id")
        for name, i in (("bos", bos_id), ("eos", eos_id)):
            if i is not None and not 0 <= i < n:
                raise TokenizerError(
                    f"{f.path}: tokenizer.ggml.{name}_token_id = {i} is outside the vocabulary (0..{n - 1})"
                )

        if kind == "gpt2":
            backend, pieces = _byte_level_bpe(m, tokens, types, f.path)
            add_bos_default, strip = False, False
        elif kind == "llama":
            arch = m.get("general.architecture", "")
            backend, pieces, strip = _sentencepiece_bpe(m, tokens, types, arch)
            add_bos_default = True  # llama.cpp adds BOS to SentencePiece vocabularies that do not say
        else:
            raise TokenizerError(
                f"{f.path}: tokenizer.ggml.model is {kind!r}, which edgerunner does not support; "
                "supported: 'gpt2' (byte-level BPE) and 'llama' (SentencePiece BPE)"
            )

        eot = {i for i in (eos_id, _metadata_int(m, "tokenizer.ggml.eot_token_id"),
                           _metadata_int(m, "tokenizer.ggml.eom_token_id")) if i is not None}  # fmt: skip
        index = {t: i for i, t in enumerate(tokens) if types[i] in (CONTROL, USER_DEFINED)}
        eot.update(index[t] for t in _EOT_TEXTS if t in index)

        return cls(
            backend,
            pieces,
            types,
            bos_id=bos_id,
            eos_id=eos_id,
            eot_ids=eot,
            add_bos=bool(m.get("tokenizer.ggml.add_bos_token", add_bos_default)),
            add_eos=bool(m.get("tokenizer.ggml.add_eos_token", False)),
            strip_leading_space=strip,
        )

    # ---- properties ------------------------------------------------------------------------

    @property
    def vocab_size(self) -> int:
        return len(self._pieces)

    @property
    def special_tokens(self) -> dict[str, int]:
        """Text -> id of the control and user-defined tokens (a copy)."""
        return dict(self._special)

    # ---- encode / decode -------------------------------------------------------------------

    def encode(self, text: str, *, add_special: bool = True, parse_special: bool = True) -> list[int]:
        """Token ids of ``text``.

        Args:
            add_special: add BOS / EOS where the model asks for them (``add_bos`` / ``add_eos``).
            parse_special: map the text of control tokens (``"<|im_start|>"``) to their ids;
                when False it is tokenized as plain text. User-defined tokens always match.
        """
        if not isinstance(text, str):
            raise TypeError(f"encode() takes a str, got {type(text).__name__}")
        with self._lock:
            self._backend.encode_special_tokens = not parse_special
            ids = self._backend.encode(text, add_special_tokens=False).ids
        if add_special:
            if self.add_bos and self.bos_id is not None:
                ids.insert(0, self.bos_id)
            if self.add_eos and self.eos_id is not None:
                ids.append(self.eos_id)
        return ids

    def token_bytes(self, token_id: int) -> bytes:
        """The bytes a token stands for (a byte token or part of a byte-level BPE token may be
        a fragment of a UTF-8 character)."""
        return self._pieces[token_id]

    def token_to_piece(self, token_id: int) -> str:
        """The text of one token; a fragment of a UTF-8 character shows as U+FFFD."""
        return self._pieces[token_id].decode("utf-8", "replace")

    def decode(self, ids: Iterable[int], *, skip_special: bool = False) -> str:
        """Text of a token sequence. ``skip_special`` drops control tokens (BOS, EOS, ...)."""
        stream = self.stream(skip_special=skip_special)
        return "".join(stream.feed(int(i)) for i in ids) + stream.flush()

    def stream(self, *, skip_special: bool = False) -> StreamDecoder:
        """A decoder for generated tokens, one at a time (see :class:`StreamDecoder`)."""
        return StreamDecoder(self, skip_special=skip_special)

    def __repr__(self) -> str:
        return f"Tokenizer(vocab_size={self.vocab_size}, bos_id={self.bos_id}, eos_id={self.eos_id})"


class StreamDecoder:
    """Turns token ids into text as they are generated.

    ``feed(id)`` returns only complete UTF-8 characters: bytes of a character split over
    several tokens are held back until the character is whole. The concatenation of every
    ``feed`` and the final ``flush`` equals ``Tokenizer.decode`` of the same ids.
    """

    __slots__ = ("_pieces", "_skip", "_strip", "_normal", "_pending", "_first")

    def __init__(self, tokenizer: Tokenizer, *, skip_special: bool = False):
        self._pieces = tokenizer._pieces
        self._skip = tokenizer._skippable if skip_special else frozenset()
        self._strip = tokenizer._strip_leading_space
        self._normal = tokenizer._normal
        self._pending = b""
        self._first = True

    def feed(self, token_id: int) -> str:
        """Add one token; return the text that is now complete (possibly "")."""
        if token_id in self._skip:
            return ""
        if token_id < 0 or token_id >= len(self._pieces):
            raise ValueError(f"token id {token_id} is outside the vocabulary (0..{len(self._pieces) - 1})")
        piece = self._pieces[token_id]
        if self._first and piece:
            # SentencePiece's prefix space: dropped from the first token only, as llama.cpp does.
            self._first = False
            if self._strip and piece[:1] == b" " and self._normal[token_id]:
                piece = piece[1:]
        buf = self._pending + piece
        cut = _complete_prefix(buf)
        self._pending = buf[cut:]
        return buf[:cut].decode("utf-8", "replace")

    def flush(self) -> str:
        """Return what is left; an unfinished character comes out as U+FFFD."""
        rest, self._pending = self._pending, b""
        return rest.decode("utf-8", "replace")


def _complete_prefix(buf: bytes) -> int:
    """Length of ``buf`` without a trailing, still incomplete UTF-8 sequence."""
    n = len(buf)
    for back in range(1, min(4, n) + 1):
        b = buf[n - back]
        if b & 0xC0 == 0x80:  # continuation byte: keep looking for the lead
            continue
        need = 2 if b >> 5 == 0b110 else 3 if b >> 4 == 0b1110 else 4 if b >> 3 == 0b11110 else 1
        return n - back if need > back else n
    return n


# ---- builders -------------------------------------------------------------------------------


def _byte_level_bpe(
    m: dict[str, Any], tokens: list[str], types: np.ndarray, path: str
) -> tuple[_HFTokenizer, list[bytes]]:
    pre = m.get("tokenizer.ggml.pre", "default")
    splits = PRE_TOKENIZER_SPLITS.get(pre)
    if splits is None:
        raise TokenizerError(
            f"{path}: tokenizer.ggml.pre is {pre!r}, a pre-tokenizer edgerunner does not know, so it cannot split "
            f"text the way this model was trained; known: {', '.join(sorted(PRE_TOKENIZER_SPLITS))}"
        )
    merges = m.get("tokenizer.ggml.merges")
    if merges is None:
        raise TokenizerError(
            f"{path}: a 'gpt2' (byte-level BPE) vocabulary needs tokenizer.ggml.merges, which is missing"
        )

    to_char = gpt2_byte_alphabet()
    to_byte = {c: b for b, c in to_char.items()}
    alphabet = set(to_char.values())
    vocab: dict[str, int] = {}
    pieces: list[bytes] = []
    for i, token in enumerate(tokens):
        in_alphabet = set(token) <= alphabet
        # A token written outside the byte alphabet (some converters store added tokens as
        # plain text) is respelled, as transformers does.
        vocab[token if in_alphabet else "".join(to_char[b] for b in token.encode("utf-8"))] = i
        if types[i] in (CONTROL, USER_DEFINED) or not in_alphabet:
            pieces.append(token.encode("utf-8"))
        else:
            pieces.append(bytes(to_byte[c] for c in token))

    backend = _HFTokenizer(
        models.BPE(vocab=vocab, merges=[tuple(x.split(" ", 1)) for x in merges], fuse_unk=False)
    )
    backend.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Split(Regex(r), behavior="isolated") for r in splits]
        + [pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]
    )
    # A control token spelled outside the byte alphabet is a converter mislabel; llama.cpp and
    # transformers leave it out of the matched specials.
    _add_special(backend, tokens, types, vocab, lambda t: set(t) <= alphabet)
    return backend, pieces


def _sentencepiece_bpe(
    m: dict[str, Any], tokens: list[str], types: np.ndarray, arch: str
) -> tuple[_HFTokenizer, list[bytes], bool]:
    # Gemma files store tokens of 2+ spaces as real spaces; the BPE sees "▁▁", so respell them
    # (unless the vocabulary already has that spelling).
    present = set(tokens)
    spelled = [
        SPM_SPACE * len(t) if t and not t.strip(" ") and SPM_SPACE * len(t) not in present else t for t in tokens
    ]
    vocab = {t: i for i, t in enumerate(spelled)}

    merges = m.get("tokenizer.ggml.merges")
    if merges is not None:
        pairs = [tuple(x.split(" ", 1)) for x in merges]
    elif arch.startswith("gemma"):
        # Gemma's scores do not follow its merge order; the token order does (as in transformers).
        pairs = _merges_from_scores(spelled, [-i for i in range(len(spelled))])
    else:
        scores = m.get("tokenizer.ggml.scores")
        if scores is None:
            raise TokenizerError("a 'llama' (SentencePiece) vocabulary needs tokenizer.ggml.scores or merges")
        pairs = _merges_from_scores(spelled, np.asarray(scores, np.float32).tolist())

    unk_id = _metadata_int(m, "tokenizer.ggml.unknown_token_id")
    backend = _HFTokenizer(
        models.BPE(
            vocab=vocab,
            merges=pairs,
            unk_token=spelled[unk_id] if unk_id is not None else None,
            fuse_unk=True,
            byte_fallback=True,
        )
    )
    # llama.cpp prefixes a space to every text fragment at the start or after a special token
    # (add_space_prefix); a per-fragment Prepend normalizer does exactly that.
    add_space = bool(m.get("tokenizer.ggml.add_space_prefix", True))
    replace = normalizers.Replace(" ", SPM_SPACE)
    backend.normalizer = (
        normalizers.Sequence([normalizers.Prepend(SPM_SPACE), replace]) if add_space else replace
    )
    _add_special(backend, tokens, types, vocab, lambda t: True)

    pieces: list[bytes] = []
    for token, kind in zip(tokens, types.tolist()):
        if kind == BYTE and len(token) == 6 and token.startswith("<0x") and token.endswith(">"):
            pieces.append(bytes([int(token[3:5], 16)]))
        elif kind in (CONTROL, USER_DEFINED, UNKNOWN):
            pieces.append(token.encode("utf-8"))
        else:
            pieces.append(token.replace(SPM_SPACE, " ").encode("utf-8"))
    return backend, pieces, add_space


def _add_special(backend: _HFTokenizer, tokens: list[str], types: np.ndarray, vocab: dict[str, int], keep) -> None:
    """Control tokens become special added tokens; user-defined ones plain added tokens (both
    matched whole in the text, before the model sees it)."""
    control = [
        AddedToken(t, special=True, normalized=False)
        for t, k in zip(tokens, types.tolist())
        if k == CONTROL and keep(t)
    ]
    user = [
        AddedToken(t, special=False, normalized=False)
        for t, k in zip(tokens, types.tolist())
        if k == USER_DEFINED and t in vocab
    ]
    if control:
        backend.add_special_tokens(control)
    if user:
        backend.add_tokens(user)
