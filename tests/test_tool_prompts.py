"""Chats with tools through a chat template (tiny_llm_base.tool_prompts, given code).

The oracle is transformers' apply_chat_template itself: a template written for
tools (here one written like Qwen2.5's) renders the tools, the assistant's calls
and the tool results, with tools offered or not (tool_choice "none" offers none);
the embedded SmolLM2 template has no tool support, so the calls and results are
written as Hermes text in plain turns.
"""

import json

import pytest
from mlx_lm.tokenizer_utils import load as load_tokenizer

from tiny_llm_base.embedded_model import ensure_embedded_model
from tiny_llm_base.tool_prompts import template_renders_tools, tool_chat_token_ids

# Qwen2.5-Instruct's tool template, in substance: tools in the system turn, calls
# as <tool_call> blocks, results as <tool_response> blocks in a user turn.
TOOL_TEMPLATE = """
{%- if tools %}<|im_start|>system
{% if messages[0].role == 'system' %}{{ messages[0].content }}{% else %}You are a helpful assistant.{% endif %}

# Tools
<tools>{% for tool in tools %}
{{ tool | tojson }}{% endfor %}
</tools><|im_end|>
{% elif messages[0].role == 'system' %}<|im_start|>system
{{ messages[0].content }}<|im_end|>
{% endif %}
{%- for message in messages %}
{%- if message.role == 'user' or (message.role == 'assistant' and not message.tool_calls) %}<|im_start|>{{ message.role }}
{{ message.content }}<|im_end|>
{% elif message.role == 'assistant' %}<|im_start|>assistant{% if message.content %}
{{ message.content }}{% endif %}
{%- for call in message.tool_calls %}
<tool_call>
{"name": "{{ call.function.name }}", "arguments": {{ call.function.arguments | tojson }}}
</tool_call>{% endfor %}<|im_end|>
{% elif message.role == 'tool' %}
{%- if loop.first or messages[loop.index0 - 1].role != 'tool' %}<|im_start|>user{% endif %}
<tool_response>
{{ message.content }}
</tool_response>
{%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}<|im_end|>
{% endif %}
{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}<|im_start|>assistant
{% endif %}"""

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}
ARGUMENTS = {"city": "Paris"}
HISTORY = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "What is the weather in Paris?"},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "call_1",
                "type": "function",
                "function": {"name": "get_weather", "arguments": json.dumps(ARGUMENTS)},
            }
        ],
    },
    {"role": "tool", "tool_call_id": "call_1", "content": "sunny, 21 C"},
]


def decoded(messages: list[dict]) -> list[dict]:
    """The history as templates take it: a call's arguments as a dict."""
    out = []
    for message in messages:
        if message.get("tool_calls"):
            calls = [
                {**c, "function": {**c["function"], "arguments": ARGUMENTS}}
                for c in message["tool_calls"]
            ]
            message = {**message, "tool_calls": calls}
        out.append(message)
    return out


@pytest.fixture(scope="module")
def tool_tokenizer():
    """The embedded tokenizer, as mlx-lm loads it, with a template that renders
    tools (a fresh one: the session's tokenizer keeps its own template)."""
    tokenizer = load_tokenizer(ensure_embedded_model())
    tokenizer._tokenizer.chat_template = TOOL_TEMPLATE
    return tokenizer


def rendered(tokenizer, messages: list[dict], **options) -> list[int]:
    return list(
        tokenizer.apply_chat_template(messages, add_generation_prompt=True, **options)
    )


def test_the_probe_tells_a_tool_template_from_the_embedded_one(
    tool_tokenizer, tokenizer
):
    assert template_renders_tools(tool_tokenizer)
    assert not template_renders_tools(tokenizer)


@pytest.mark.parametrize("tools", [None, [WEATHER]], ids=["none offered", "offered"])
def test_a_tool_template_renders_the_history_itself(tool_tokenizer, tools):
    """Also with no tools offered (tool_choice "none"): the template's own
    rendering of the call and its result, not the Hermes text of the fallback."""
    ids = tool_chat_token_ids(tool_tokenizer, HISTORY, tools)
    expected = rendered(tool_tokenizer, decoded(HISTORY), tools=tools)
    assert ids == expected
    text = tool_tokenizer.decode(ids)
    assert "<tool_response>\nsunny, 21 C\n</tool_response>" in text
    assert ("# Tools" in text) == (tools is not None)
    assert "You can call functions" not in text


def test_the_embedded_template_gets_the_history_as_hermes_text(tokenizer):
    ids = tool_chat_token_ids(tokenizer, HISTORY, None)
    as_text = [
        HISTORY[0],
        HISTORY[1],
        {
            "role": "assistant",
            "content": '<tool_call>\n{"name": "get_weather", "arguments": '
            '{"city": "Paris"}}\n</tool_call>',
        },
        {
            "role": "user",
            "content": "<tool_response>\nsunny, 21 C\n</tool_response>",
        },
    ]
    assert ids == rendered(tokenizer, as_text)


def test_a_plain_chat_is_the_template_s_plain_rendering(tool_tokenizer, tokenizer):
    plain = HISTORY[:2]
    for each in (tool_tokenizer, tokenizer):
        assert tool_chat_token_ids(each, plain, None) == rendered(each, plain)
