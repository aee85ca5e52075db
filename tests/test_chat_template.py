"""edgerunner.chat_template against transformers' apply_chat_template (the oracle), plus the
sandbox and the helpers HF templates expect."""

from __future__ import annotations

import datetime
import pathlib

import pytest

from edgerunner import gguf
from edgerunner.chat_template import (
    DEFAULT_TEMPLATE,
    NO_TEMPLATE_MESSAGE,
    ChatTemplate,
    ChatTemplateError,
    validate_messages,
)

CONVERSATIONS = [
    [{"role": "user", "content": "Hello!"}],
    [
        {"role": "system", "content": "You are a terse assistant."},
        {"role": "user", "content": "What is 2+2?"},
        {"role": "assistant", "content": "4."},
        {"role": "user", "content": "And 3+3?"},
    ],
    [
        {"role": "user", "content": "  Übersetze: 日本語 🤖\nzweite Zeile  "},
        {"role": "assistant", "content": "Japanese\n\n- one\n- two"},
        {"role": "user", "content": "<b>html</b> & \"quotes\" {{ not jinja }}"},
    ],
]

# Gemma 3's chat template (google/gemma-3-*-it tokenizer_config.json). The Gemma 3 270M base GGUF
# we test with has none, so the comparison uses this one with both renderers.
GEMMA3_TEMPLATE = (
    "{{ bos_token }}\n"
    "{%- if messages[0]['role'] == 'system' -%}\n"
    "    {%- if messages[0]['content'] is string -%}\n"
    "        {%- set first_user_prefix = messages[0]['content'] + '\n\n' -%}\n"
    "    {%- else -%}\n"
    "        {%- set first_user_prefix = messages[0]['content'][0]['text'] + '\n\n' -%}\n"
    "    {%- endif -%}\n"
    "    {%- set loop_messages = messages[1:] -%}\n"
    "{%- else -%}\n"
    '    {%- set first_user_prefix = "" -%}\n'
    "    {%- set loop_messages = messages -%}\n"
    "{%- endif -%}\n"
    "{%- for message in loop_messages -%}\n"
    "    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}\n"
    '        {{ raise_exception("Conversation roles must alternate user/assistant/user/assistant/...") }}\n'
    "    {%- endif -%}\n"
    "    {%- if (message['role'] == 'assistant') -%}\n"
    '        {%- set role = "model" -%}\n'
    "    {%- else -%}\n"
    "        {%- set role = message['role'] -%}\n"
    "    {%- endif -%}\n"
    "    {{ '<start_of_turn>' + role + '\n' + (first_user_prefix if loop.first else \"\") }}\n"
    "    {%- if message['content'] is string -%}\n"
    "        {{ message['content'] | trim }}\n"
    "    {%- elif message['content'] is iterable -%}\n"
    "        {%- for item in message['content'] -%}\n"
    "            {%- if item['type'] == 'image' -%}\n"
    "                {{ '<start_of_image>' }}\n"
    "            {%- elif item['type'] == 'text' -%}\n"
    "                {{ item['text'] | trim }}\n"
    "            {%- endif -%}\n"
    "        {%- endfor -%}\n"
    "    {%- else -%}\n"
    '        {{ raise_exception("Invalid content type") }}\n'
    "    {%- endif -%}\n"
    "    {{ '<end_of_turn>\n' }}\n"
    "{%- endfor -%}\n"
    "{%- if add_generation_prompt -%}\n"
    "    {{'<start_of_turn>model\n'}}\n"
    "{%- endif -%}\n"
)

# Exercises tools, tojson (indent, non-ASCII, no HTML escaping), loop controls, namespace,
# whitespace control (trim_blocks / lstrip_blocks) and {% generation %}.
FEATURE_TEMPLATE = """\
{% set ns = namespace(n=0) %}
{% if tools %}
Tools:
{{ tools | tojson(indent=2) }}
{% endif %}
{% for m in messages %}
    {% if m['role'] == 'system' %}{% continue %}{% endif %}
    {% set ns.n = ns.n + 1 %}
[{{ ns.n }}] {{ m['role'] }}: {{ m['content'] | tojson }}
    {% if m['role'] == 'assistant' %}{% generation %}{{ m['content'] }}{% endgeneration %}{% endif %}
    {% if loop.index > 3 %}{% break %}{% endif %}
{% endfor %}
{% if add_generation_prompt %}assistant:{% endif %}"""

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Wetter für einen Ort <heute>",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
        },
    }
]


def _real_model(alias: str) -> pathlib.Path:
    from edgerunner import builtin_models

    try:
        return pathlib.Path(builtin_models.fetch(alias))
    except Exception as e:  # offline without a cached copy
        pytest.skip(f"cannot fetch {alias}: {e}")


def _hf(path: pathlib.Path):
    transformers = pytest.importorskip("transformers")
    return transformers.AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)


def _hf_render(template: str, messages, **kwargs) -> str:
    """transformers' renderer without a tokenizer (same code path apply_chat_template uses)."""
    pytest.importorskip("transformers")
    from transformers.utils.chat_template_utils import render_jinja_template

    rendered, _ = render_jinja_template(conversations=[messages], chat_template=template, **kwargs)
    return rendered[0]


@pytest.fixture(scope="module")
def smollm():
    path = _real_model("smollm2-135m-instruct")
    return ChatTemplate.from_gguf(gguf.open(path)), _hf(path)


@pytest.fixture(scope="module")
def gemma():
    path = _real_model("gemma3-270m")
    return gguf.open(path), _hf(path)


# ---- against transformers --------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("messages", CONVERSATIONS)
@pytest.mark.parametrize("add_generation_prompt", [True, False])
def test_smollm_template_matches_transformers(smollm, messages, add_generation_prompt):
    ours, hf = smollm
    assert ours is not None
    expected = hf.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt)
    assert ours.render(messages, add_generation_prompt=add_generation_prompt) == expected


@pytest.mark.slow
def test_gemma_270m_has_no_template(gemma):
    f, hf = gemma
    assert ChatTemplate.from_gguf(f) is None
    assert hf.chat_template is None


@pytest.mark.slow
@pytest.mark.parametrize("messages", CONVERSATIONS)
@pytest.mark.parametrize("add_generation_prompt", [True, False])
def test_gemma3_template_matches_transformers(gemma, messages, add_generation_prompt):
    _, hf = gemma
    ours = ChatTemplate(GEMMA3_TEMPLATE, bos_token=hf.bos_token, eos_token=hf.eos_token)
    expected = hf.apply_chat_template(
        messages, chat_template=GEMMA3_TEMPLATE, tokenize=False, add_generation_prompt=add_generation_prompt
    )
    assert ours.render(messages, add_generation_prompt=add_generation_prompt) == expected
    assert expected.startswith("<bos>")


@pytest.mark.slow
def test_gemma3_template_rejects_what_transformers_rejects(gemma):
    # Gemma folds a system message into the first user turn, and insists on user/model alternation.
    _, hf = gemma
    ours = ChatTemplate(GEMMA3_TEMPLATE, bos_token=hf.bos_token, eos_token=hf.eos_token)
    bad = [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]
    with pytest.raises(Exception, match="must alternate"):
        hf.apply_chat_template(bad, chat_template=GEMMA3_TEMPLATE, tokenize=False)
    with pytest.raises(ChatTemplateError, match="must alternate"):
        ours.render(bad)
    rendered = ours.render(CONVERSATIONS[1])
    assert "system" not in rendered and rendered.startswith("<bos><start_of_turn>user\nYou are a terse")


@pytest.mark.parametrize("messages", CONVERSATIONS)
def test_feature_template_matches_transformers(messages):
    ours = ChatTemplate(FEATURE_TEMPLATE, bos_token="<s>", eos_token="</s>")
    for tools in (None, TOOLS):
        expected = _hf_render(FEATURE_TEMPLATE, messages, tools=tools, add_generation_prompt=True)
        assert ours.render(messages, tools=tools) == expected


@pytest.mark.parametrize("messages", CONVERSATIONS)
def test_default_template_matches_transformers(messages):
    expected = _hf_render(DEFAULT_TEMPLATE, messages, add_generation_prompt=True)
    assert ChatTemplate.default().render(messages) == expected
    assert expected.endswith("<|im_start|>assistant\n")


def test_tiny_model_template(tmp_path):
    from edgerunner.model_builder import write_random_model

    path = write_random_model(tmp_path / "tiny.gguf", arch="qwen2", preset="tiny")
    template = ChatTemplate.from_gguf(gguf.open(path))
    assert template is not None and template.eos_token == "<|im_end|>"
    assert template.render(CONVERSATIONS[0]) == "<|im_start|>user\nHello!<|im_end|>\n<|im_start|>assistant\n"


# ---- sandbox and helpers ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("source", "what"),
    [
        ("{{ ''.__class__.__mro__ }}", "str.__class__"),
        ("{{ ''.__class__ }}", "str.__class__"),
        ("{{ cycler.__init__.__globals__ }}", "__init__"),
        ("{{ messages.__class__.__base__.__subclasses__() }}", "list.__class__"),
        ("{{ raise_exception.__globals__ }}", "__globals__"),
        ("{% set _ = messages.append({'role': 'user'}) %}", "list.append"),
        ("{% set _ = messages[0].update({'role': 'x'}) %}", "dict.update"),
    ],
)
def test_sandbox_escape_is_refused(source, what):
    with pytest.raises(ChatTemplateError, match="sandbox forbids") as info:
        ChatTemplate(source).render(CONVERSATIONS[0])
    assert what in str(info.value)


def test_namespace_refuses_underscore_attributes():
    with pytest.raises(ChatTemplateError, match="sandbox forbids"):
        ChatTemplate("{% set ns = namespace(__dict__=1) %}").render(CONVERSATIONS[0])


def test_raise_exception():
    template = ChatTemplate(
        "{% if messages[0]['role'] == 'system' %}{{ raise_exception('no system role') }}{% endif %}ok"
    )
    assert template.render(CONVERSATIONS[0]) == "ok"
    with pytest.raises(ChatTemplateError, match="rejected the conversation: no system role"):
        template.render(CONVERSATIONS[1])


def test_strftime_now_and_extra_variables():
    template = ChatTemplate("{{ strftime_now('%Y-%m-%d') }}|{{ enable_thinking }}|{{ bos_token }}", bos_token="<s>")
    before = datetime.date.today().isoformat()
    out = template.render(CONVERSATIONS[0], enable_thinking=False)
    assert out.split("|")[0] in (before, datetime.date.today().isoformat())
    assert out.split("|")[1:] == ["False", "<s>"]


def test_tojson_hf_semantics():
    out = ChatTemplate("{{ {'k': 'é<&>'} | tojson }}|{{ [1] | tojson(indent=2) }}").render(CONVERSATIONS[0])
    assert out == '{"k": "é<&>"}|[\n  1\n]'


def test_template_errors():
    with pytest.raises(ChatTemplateError, match="does not compile"):
        ChatTemplate("{% for m in messages %}")
    with pytest.raises(ChatTemplateError, match="failed to render"):
        ChatTemplate("{{ messages[0]['content'] + 1 }}").render(CONVERSATIONS[0])


@pytest.mark.parametrize(
    ("messages", "error", "match"),
    [
        ("hello", TypeError, "list of dicts"),
        ({"role": "user", "content": "x"}, TypeError, "list of dicts"),
        ([], ValueError, "empty"),
        (["hello"], TypeError, r"messages\[0\] must be a dict"),
        ([{"content": "x"}], ValueError, r"messages\[0\] has no 'role'"),
        ([{"role": "user"}], ValueError, "has no 'content'"),
        ([{"role": 1, "content": "x"}], TypeError, "role'] must be a str"),
        ([{"role": "user", "content": 5}], TypeError, "content'] must be a str or a list"),
    ],
)
def test_invalid_messages(messages, error, match):
    with pytest.raises(error, match=match):
        validate_messages(messages)
    with pytest.raises(error, match=match):
        ChatTemplate(DEFAULT_TEMPLATE).render(messages)


def test_no_template_message_is_actionable():
    assert "no chat template" in NO_TEMPLATE_MESSAGE and "DEFAULT_TEMPLATE" in NO_TEMPLATE_MESSAGE
