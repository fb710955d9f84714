"""Chats with tools through a model's chat template (given code, not course material).

A template written for tools (Qwen2.5's) renders OpenAI's `tools`, an assistant's
`tool_calls` and `role: "tool"` results itself: transformers passes them to it. A
template without tool support (the embedded SmolLM2's) silently drops `tools`; for
it the tools are described in a system message and the calls and results are
written as text in the same Hermes format (`<tool_call>` / `<tool_response>`), the
format week 4 day 2's grammar constrains.
"""

import json
import weakref

from .prompts import chat_token_ids

# The Hermes format's call tags (Qwen2.5's template writes the same).
OPEN = "<tool_call>"
CLOSE = "</tool_call>"

TOOLS_INTRO = (
    "You can call functions to help answer. The functions are described as JSON "
    "Schemas inside <tools></tools>:\n<tools>\n{tools}\n</tools>\n"
    "To call one, answer with its name and arguments as a JSON object inside "
    "<tool_call></tool_call> tags, one call per pair of tags:\n"
    '<tool_call>\n{{"name": "function_name", "arguments": {{"arg": "value"}}}}\n'
    "</tool_call>"
)


# tokenizer -> whether its template renders tools: probed once, not per request.
_renders_tools: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def template_renders_tools(tokenizer) -> bool:
    """Does the tokenizer's chat template render `tools` (a probe tool appears in
    the rendered text)? Asked once per tokenizer."""
    if tokenizer not in _renders_tools:
        _renders_tools[tokenizer] = _probe_renders_tools(tokenizer)
    return _renders_tools[tokenizer]


def _probe_renders_tools(tokenizer) -> bool:
    probe = {
        "type": "function",
        "function": {"name": "probe_tool_name_x", "parameters": {"type": "object"}},
    }
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": "hi"}], tools=[probe], tokenize=False
    )
    return "probe_tool_name_x" in text


def tool_chat_token_ids(
    tokenizer, messages: list[dict], tools: list | None, continue_final: bool = False
) -> list[int]:
    """The chat's token ids, the assistant's turn opened (continue_final: the last
    message left open instead, see chat_token_ids), with `tools` (OpenAI's
    list, or None) offered to the model and earlier calls and results in the
    conversation. A template that renders tools renders the calls and results
    too, also when no tools are offered (tool_choice "none"); for one that does
    not, they are Hermes text. OpenAI sends a call's arguments as JSON text;
    templates expect a dict, so they are decoded first."""
    messages = [_decoded_calls(m) for m in messages]
    if not tools and not any(_has_tool_parts(m) for m in messages):
        return chat_token_ids(tokenizer, messages, continue_final)
    if template_renders_tools(tokenizer):  # its own calls and results, tools or not
        return chat_token_ids(tokenizer, messages, continue_final, tools=tools or None)
    return chat_token_ids(tokenizer, hermes_messages(messages, tools), continue_final)


def _has_tool_parts(message: dict) -> bool:
    return message.get("role") == "tool" or bool(message.get("tool_calls"))


def _decoded_calls(message: dict) -> dict:
    calls = message.get("tool_calls")
    if not calls:
        return message
    decoded = []
    for call in calls:
        function = dict(call.get("function") or {})
        arguments = function.get("arguments")
        if isinstance(arguments, str):
            try:
                function["arguments"] = json.loads(arguments) if arguments else {}
            except json.JSONDecodeError:
                raise ValueError(
                    "a tool call's function.arguments must be JSON text, got "
                    f"{arguments[:40]!r}"
                ) from None
        decoded.append({**call, "function": function})
    return {**message, "tool_calls": decoded}


def hermes_messages(messages: list[dict], tools: list | None) -> list[dict]:
    """The chat for a template without tool support: the tools in the system
    message, calls and results as Hermes-format text in plain turns (what
    bench-tools sends mlx_lm.server, so its model reads the same prompt)."""
    out = []
    if tools:
        described = "\n".join(json.dumps(t.get("function", t)) for t in tools)
        intro = TOOLS_INTRO.format(tools=described)
        if messages and messages[0].get("role") in ("system", "developer"):
            first, messages = messages[0], messages[1:]
            intro = f"{first.get('content') or ''}\n\n{intro}"
        out.append({"role": "system", "content": intro})
    for message in messages:
        role = message.get("role")
        if role == "tool":
            result = message.get("content") or ""
            text = f"<tool_response>\n{result}\n</tool_response>"
            out.append({"role": "user", "content": text})
        elif message.get("tool_calls"):
            blocks = [
                "<tool_call>\n"
                + json.dumps(
                    {
                        "name": call["function"].get("name"),
                        "arguments": call["function"].get("arguments", {}),
                    }
                )
                + "\n</tool_call>"
                for call in message["tool_calls"]
            ]
            text = "\n".join(
                ([message["content"]] if message.get("content") else []) + blocks
            )
            out.append({"role": "assistant", "content": text})
        else:
            out.append(message)
    return out
