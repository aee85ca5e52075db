"""edgerunner.tokenizer against Hugging Face transformers loading the same GGUF (the oracle).

Real models (SmolLM2-135M-Instruct: byte-level BPE, pre "smollm"; Gemma 3 270M: SentencePiece
with byte fallback) are marked slow; the random-weight tiny models (byte-level BPE with the
llama-bpe and qwen2 pre-tokenizers) are not.
"""

from __future__ import annotations

import pathlib

import numpy as np
import pytest

from edgerunner import gguf
from edgerunner.tokenizer import PRE_TOKENIZER_SPLITS, Tokenizer, TokenizerError, _complete_prefix

CORPUS = [
    "",
    "Hello world",
    "Hello, world!",
    " leading space",
    "  two leading spaces",
    "trailing space ",
    "trailing spaces   ",
    " ",
    "   ",
    "\t",
    "\n",
    "\n\n\n",
    "a\n\nb\n\n\nc",
    "tabs\tand\t\tmore\ttabs",
    "mixed \t \n whitespace \r\n windows",
    "12345678",
    "3.14159",
    "1,000,000 and 42 and 007",
    "The year 2024 had 366 days.",
    "def fib(n):\n    if n < 2:\n        return n\n    return fib(n - 1) + fib(n - 2)\n",
    "for (int i = 0; i < n; ++i) { sum += a[i]; }",
    "x = {'a': [1, 2, 3], \"b\": None}  # comment",
    "<html><body><p>Hi</p></body></html>",
    "I'm sure you'll see they've done it, we'd've known.",
    "DON'T SHOUT, It'S fine",
    "naïve café résumé über straße",
    "Ελληνικά και русский текст",
    "日本語のテキストと中文文本",
    "한국어 문장입니다",
    "مرحبا بالعالم",
    "हिन्दी पाठ",
    "emoji 😀🎉🚀 end",
    "family 👨\u200d👩\u200d👧\u200d👦 and flag 🇫🇷 and skin 👍🏽",
    "rare 𒀀𒀁 cuneiform and 🦩",
    "mixed: English, 日本語, русский, 123, 🤖!",
    "<|im_start|>user\nhi<|im_end|>",
    "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>assistant\n",
    "<start_of_turn>user",
    "<start_of_turn>user\nHello<end_of_turn>\n<start_of_turn>model\n",
    "text<|endoftext|>more text",
    "<bos>literal bos",
    "<not_a_special_token>",
    "a<|im_end|>b<|im_start|>c",
    "!!!???...,,,;;;",
    "----====____****",
    "http://example.com/path?query=1&b=2#frag",
    "email@example.com",
    "CamelCaseIdentifier snake_case_identifier",
    "ÀÉÎÕÜ àéîõü ñ ç",
    "\u00a0non-breaking\u00a0space",
    "zero\u200bwidth",
    "repeated aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa letters",
    "    indented four\n        indented eight",
]


def _hf_tokenizer(path: pathlib.Path):
    transformers = pytest.importorskip("transformers")
    return transformers.AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)


def _pair(path: pathlib.Path) -> tuple[Tokenizer, object]:
    return Tokenizer.from_gguf(gguf.open(path)), _hf_tokenizer(path)


def _real_model(alias: str) -> pathlib.Path:
    from edgerunner import builtin_models

    try:
        return pathlib.Path(builtin_models.fetch(alias))
    except Exception as e:  # offline without a cached copy
        pytest.skip(f"cannot fetch {alias}: {e}")


@pytest.fixture(scope="module")
def smollm():
    pytest.importorskip("transformers")
    return _pair(_real_model("smollm2-135m-instruct"))


@pytest.fixture(scope="module")
def gemma():
    pytest.importorskip("transformers")
    return _pair(_real_model("gemma3-270m"))


@pytest.fixture(scope="module")
def tiny_files(tmp_path_factory) -> dict[str, pathlib.Path]:
    from edgerunner.model_builder import write_random_model

    d = tmp_path_factory.mktemp("tok")
    return {arch: write_random_model(d / f"tiny-{arch}.gguf", arch=arch, preset="tiny") for arch in ("llama", "qwen2")}


@pytest.fixture(scope="module")
def tiny(tiny_files):
    pytest.importorskip("transformers")
    return {arch: _pair(path) for arch, path in tiny_files.items()}


# ---- comparisons with transformers -----------------------------------------------------------


def _check_encode(pair, text: str) -> None:
    ours, hf = pair
    assert ours.encode(text) == hf.encode(text), text
    assert ours.encode(text, add_special=False) == hf.encode(text, add_special_tokens=False), text


def _check_parse_special_off(pair, text: str) -> None:
    ours, hf = pair
    expected = hf(text, add_special_tokens=False, split_special_tokens=True)["input_ids"]
    assert ours.encode(text, add_special=False, parse_special=False) == expected, text


def _check_decode(pair, text: str) -> None:
    ours, hf = pair
    ids = hf.encode(text)
    for skip in (False, True):
        assert ours.decode(ids, skip_special=skip) == hf.decode(ids, skip_special_tokens=skip), (text, skip)
    plain = ours.encode(text, add_special=False)
    if hf.decode(plain) == text:
        assert ours.decode(plain) == text


def _check_stream(pair, text: str) -> None:
    ours, _ = pair
    ids = ours.encode(text)
    stream = ours.stream()
    chunks = [stream.feed(i) for i in ids] + [stream.flush()]
    assert "".join(chunks) == ours.decode(ids), text
    if "\ufffd" not in text:
        assert not any("\ufffd" in c for c in chunks), (text, chunks)


@pytest.mark.slow
@pytest.mark.parametrize("text", CORPUS)
@pytest.mark.parametrize("model", ["smollm", "gemma"])
def test_real_model_matches_transformers(model, text, request):
    pair = request.getfixturevalue(model)
    _check_encode(pair, text)
    _check_parse_special_off(pair, text)
    _check_decode(pair, text)
    _check_stream(pair, text)


@pytest.mark.parametrize("text", CORPUS)
@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_tiny_model_matches_transformers(tiny, arch, text):
    pair = tiny[arch]
    _check_encode(pair, text)
    _check_parse_special_off(pair, text)
    _check_decode(pair, text)
    _check_stream(pair, text)


@pytest.mark.slow
def test_real_model_long_text(smollm, gemma):
    text = "\n".join(CORPUS) * 20
    for pair in (smollm, gemma):
        _check_encode(pair, text)
        _check_stream(pair, text)


# ---- special tokens, flags -------------------------------------------------------------------


@pytest.mark.slow
def test_smollm_special_tokens(smollm):
    tok, _ = smollm
    assert tok.vocab_size == 49152
    assert (tok.bos_id, tok.eos_id) == (1, 2)
    assert tok.special_tokens["<|im_start|>"] == 1
    assert tok.special_tokens["<|im_end|>"] == 2
    assert tok.eot_ids >= {2, 0}  # <|im_end|> (eos) and <|endoftext|>
    assert not tok.add_bos  # the file says add_bos_token = false
    assert tok.encode("<|im_start|>user")[0] == 1
    assert 1 not in tok.encode("<|im_start|>user", parse_special=False)
    assert tok.token_to_piece(1) == "<|im_start|>"
    assert tok.decode([1, 4093], skip_special=True) == tok.decode([4093])


@pytest.mark.slow
def test_gemma_special_tokens(gemma):
    tok, _ = gemma
    assert tok.vocab_size == 262144
    assert (tok.bos_id, tok.eos_id) == (2, 1)
    assert tok.add_bos
    assert tok.encode("") == [2]
    assert tok.encode("", add_special=False) == []
    assert tok.eot_ids >= {1, tok.special_tokens["<end_of_turn>"]}
    ids = tok.encode("<start_of_turn>user\n")
    assert ids[:2] == [2, tok.special_tokens["<start_of_turn>"]]


@pytest.mark.slow
def test_gemma_stream_splits_characters_over_byte_tokens(gemma):
    tok, _ = gemma
    text = "𒀀 and 🦩"  # not in the vocabulary: byte-fallback tokens, one UTF-8 byte each
    ids = tok.encode(text, add_special=False)
    assert any(len(tok.token_bytes(i)) == 1 and tok.token_bytes(i)[0] >= 0x80 for i in ids)
    stream = tok.stream()
    chunks = [stream.feed(i) for i in ids]
    assert "" in chunks  # some tokens completed no character
    assert "".join(chunks) + stream.flush() == text
    assert all("\ufffd" not in c for c in chunks)


def test_stream_splits_emoji_over_byte_level_tokens(tiny_files):
    tok = Tokenizer.from_gguf(gguf.open(tiny_files["llama"]))
    text = "日本 👨\u200d👩\u200d👧 ok"
    ids = tok.encode(text)
    assert any(b & 0xC0 == 0x80 for i in ids for b in tok.token_bytes(i)[:1])  # a token starts mid-character
    stream = tok.stream()
    chunks = [stream.feed(i) for i in ids]
    assert "".join(chunks) + stream.flush() == text == tok.decode(ids)
    assert all("\ufffd" not in c for c in chunks)


def test_stream_flush_reports_unfinished_character(tiny_files):
    tok = Tokenizer.from_gguf(gguf.open(tiny_files["llama"]))
    first_byte = next(i for i in range(tok.vocab_size) if tok.token_bytes(i) == b"\xf0")
    stream = tok.stream()
    assert stream.feed(first_byte) == ""
    assert stream.flush() == "\ufffd"
    assert tok.decode([first_byte]) == "\ufffd"


def test_tiny_model_flags(tiny_files):
    tok = Tokenizer.from_gguf(gguf.open(tiny_files["qwen2"]))
    im_end = tok.special_tokens["<|im_end|>"]
    assert tok.eos_id == im_end and im_end in tok.eot_ids
    assert tok.special_tokens["<|endoftext|>"] in tok.eot_ids
    assert tok.encode("<|im_end|>") == [im_end]
    assert tok.encode("<|im_end|>", parse_special=False) != [im_end]
    assert tok.decode([im_end], skip_special=True) == ""
    with pytest.raises(TypeError):
        tok.encode(b"bytes")  # type: ignore[arg-type]


# ---- construction errors ---------------------------------------------------------------------


class _FakeFile:
    def __init__(self, metadata: dict, path: str = "fake.gguf"):
        self.metadata = metadata
        self.path = path


def test_unknown_pre_tokenizer_is_a_clear_error(tiny_files):
    meta = dict(gguf.open(tiny_files["llama"]).metadata)
    meta["tokenizer.ggml.pre"] = "brand-new-pre"
    with pytest.raises(TokenizerError, match="brand-new-pre.*known: .*llama-bpe"):
        Tokenizer.from_gguf(_FakeFile(meta))


def test_missing_and_unsupported_vocabularies(tiny_files):
    meta = dict(gguf.open(tiny_files["llama"]).metadata)
    with pytest.raises(TokenizerError, match="no tokenizer"):
        Tokenizer.from_gguf(_FakeFile({k: v for k, v in meta.items() if not k.startswith("tokenizer.")}))
    with pytest.raises(TokenizerError, match="'bert'.*supported"):
        Tokenizer.from_gguf(_FakeFile({**meta, "tokenizer.ggml.model": "bert"}))


def test_required_pre_tokenizers_are_known():
    assert {"smollm", "llama-bpe", "llama3", "qwen2", "gpt-2", "default"} <= set(PRE_TOKENIZER_SPLITS)


@pytest.mark.parametrize(
    ("data", "cut"),
    [
        (b"", 0),
        (b"abc", 3),
        ("é".encode(), 2),
        ("é".encode()[:1], 0),
        (b"a" + "日".encode()[:2], 1),
        (b"a" + "😀".encode()[:3], 1),
        ("😀".encode(), 4),
        (b"\x80\x80\x80\x80", 4),  # stray continuation bytes: nothing to wait for
    ],
)
def test_complete_prefix(data, cut):
    assert _complete_prefix(data) == cut


def test_from_gguf_does_not_need_transformers(tiny_files):
    tok = Tokenizer.from_gguf(gguf.open(tiny_files["qwen2"]))
    for text in CORPUS:
        assert tok.decode(tok.encode(text)) == text


def test_decode_rejects_ids_outside_the_vocabulary(tiny_files):
    tok = Tokenizer.from_gguf(gguf.open(tiny_files["llama"]))
    for bad in (-1, tok.vocab_size):
        with pytest.raises(ValueError, match="outside the vocabulary"):
            tok.decode([bad])


def _small_spm_metadata() -> dict:
    """A SentencePiece ('llama') vocabulary in llama.cpp's layout: merges come from the scores."""
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    types = [2, 3, 3] + [6] * 256
    scores = [0.0, 0.0, 0.0] + [0.0] * 256
    words = ["▁", "h", "e", "l", "o", "w", "r", "d", "▁h", "ll", "▁he", "llo", "▁hello",
             "▁w", "or", "ld", "▁wor", "▁world"]  # fmt: skip
    tokens += words
    types += [1] * len(words)
    scores += [-float(i) for i in range(len(words))]
    return {
        "general.architecture": "llama",
        "tokenizer.ggml.model": "llama",
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.token_type": np.array(types, np.int32),
        "tokenizer.ggml.scores": np.array(scores, np.float32),
        "tokenizer.ggml.bos_token_id": 1,
        "tokenizer.ggml.eos_token_id": 2,
        "tokenizer.ggml.unknown_token_id": 0,
    }


def test_sentencepiece_prefix_space_and_byte_fallback():
    tok = Tokenizer.from_gguf(_FakeFile(_small_spm_metadata()))
    ids = {t: i for i, t in enumerate(_small_spm_metadata()["tokenizer.ggml.tokens"])}
    assert tok.add_bos  # llama.cpp's default for SentencePiece vocabularies
    assert tok.encode("hello world") == [1, ids["▁hello"], ids["▁world"]]
    # a space is prefixed at the start and after every special token, as llama.cpp does
    assert tok.encode("</s>hello", add_special=False) == [2, ids["▁hello"]]
    assert tok.encode("hé", add_special=False) == [ids["▁h"], ids["<0xC3>"], ids["<0xA9>"]]
    all_ids = tok.encode("hello héllo world")
    assert tok.decode(all_ids) == "<s> hello héllo world"  # the prefix space is only dropped from a first text token
    assert tok.decode(all_ids, skip_special=True) == "hello héllo world"
    stream = tok.stream(skip_special=True)
    chunks = [stream.feed(i) for i in all_ids]
    assert chunks[:2] == ["", "hello"] and "" in chunks  # é waits for its second byte
    assert "".join(chunks) + stream.flush() == "hello héllo world"
