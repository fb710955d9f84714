"""Week 4 Day 2: tool calls on the constraint mask (tool_calls.py).

The oracle for what a call may be is the jsonschema package (an independent
validator): the grammar accepts a call's text exactly when jsonschema accepts its
JSON against the call schema, on hand-made tools and on random arguments. Under the
grammar, a random model's calls for the 31 tool sets of the suite
(scripts/bench/benchlib/tool_sets.py) all parse and validate; the embedded model,
asked through its chat template, calls the named function with valid arguments.
"""

import json

import jsonschema
import numpy as np
import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

from scripts.bench.benchlib.tool_sets import CALL_MAX_TOKENS, TOOL_SETS
from tiny_llm_base import PromptSpec
from tiny_llm_base.tool_prompts import tool_chat_token_ids

from .helpers import call_text, grammar_accepts, token_ids
from .random_models import random_model
from .solution import tiny

VOCAB = 49152  # the embedded tokenizer's

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "maxLength": 12},
                "days": {"type": "integer", "minimum": 1, "maximum": 7},
                "unit": {"enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city"],
            "additionalProperties": False,
        },
    },
}
ADD = {
    "type": "function",
    "function": {
        "name": "add",
        "parameters": {
            "type": "object",
            "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
            "required": ["a", "b"],
            "additionalProperties": False,
        },
    },
}
DEFS = {
    "type": "function",
    "function": {
        "name": "segment",
        "parameters": {
            "$defs": {
                "pt": {
                    "type": "object",
                    "properties": {"x": {"type": "integer"}, "y": {"type": "integer"}},
                    "required": ["x", "y"],
                    "additionalProperties": False,
                }
            },
            "type": "object",
            "properties": {"a": {"$ref": "#/$defs/pt"}, "b": {"$ref": "#/$defs/pt"}},
            "required": ["a", "b"],
            "additionalProperties": False,
        },
    },
}
TOOLS = [WEATHER, ADD, DEFS]


def accepts(tokenizer, tools, text: str, choice="auto", parallel=True) -> bool:
    """Does the grammar of `tools` under `choice` accept `text` as a whole answer?"""
    return grammar_accepts(
        tiny.tool_constraint(tools, choice, parallel), tokenizer, text
    )


def schema_valid(tools, name: str, arguments) -> bool:
    schema = tiny.call_schema(tiny.check_tools(tools))
    return jsonschema.Draft202012Validator(schema).is_valid(
        {"name": name, "arguments": arguments}
    )


CASES = [
    ("get_weather", {"city": "Paris"}),
    ("get_weather", {"city": "Oslo", "days": 3, "unit": "celsius"}),
    ("get_weather", {"city": "Oslo", "days": 9}),
    ("get_weather", {"city": "Oslo", "unit": "kelvin"}),
    ("get_weather", {"town": "Paris"}),
    ("get_weather", {"city": "Paris", "extra": 1}),
    ("get_weather", {}),
    ("add", {"a": 1, "b": -2}),
    ("add", {"a": 1}),
    ("add", {"a": 1.5, "b": 2}),
    ("segment", {"a": {"x": 1, "y": 2}, "b": {"x": 0, "y": 0}}),
    ("segment", {"a": {"x": 1}, "b": {"x": 0, "y": 0}}),
    ("mul", {"a": 1, "b": 2}),
]


@pytest.mark.task(2)
@pytest.mark.parametrize("name, arguments", CASES)
def test_a_call_is_accepted_exactly_when_its_schema_validates(
    tokenizer, name, arguments
):
    text = call_text(name, arguments)
    assert accepts(tokenizer, TOOLS, text, "required") == schema_valid(
        TOOLS, name, arguments
    ), text


@pytest.mark.task(2)
@settings(max_examples=40, deadline=None)
@given(
    st.dictionaries(
        st.sampled_from(["city", "days", "unit", "town"]),
        st.one_of(
            st.text("abcXYZ é", max_size=14),
            st.integers(-2, 9),
            st.sampled_from(["celsius", "fahrenheit", "kelvin"]),
            st.booleans(),
        ),
        max_size=4,
    )
)
def test_random_arguments_agree_with_jsonschema(tokenizer, arguments):
    # llguidance takes an object's keys in the order its schema lists them (the
    # chapter says so), so the call is written in that order, unknown keys last
    listed = list(WEATHER["function"]["parameters"]["properties"])
    keys = sorted(arguments, key=lambda k: listed.index(k) if k in listed else 99)
    text = call_text("get_weather", {k: arguments[k] for k in keys})
    assert accepts(tokenizer, TOOLS, text, "required") == schema_valid(
        TOOLS, "get_weather", arguments
    ), text


@pytest.mark.task(2)
def test_tool_choice_decides_what_the_answer_may_be(tokenizer):
    call = call_text("add", {"a": 1, "b": 2})
    other = call_text("get_weather", {"city": "Rome"})
    text = "Let me add them."
    # auto: text, text then a call, calls then text; never a call that fails
    assert accepts(tokenizer, TOOLS, text)
    assert accepts(tokenizer, TOOLS, f"{text}{call}")
    assert accepts(tokenizer, TOOLS, f"{call}\n{other} done")
    assert not accepts(tokenizer, TOOLS, f"{text}{call_text('add', {'a': 1})}")
    # required: calls only
    assert accepts(tokenizer, TOOLS, f"{call}\n{other}", "required")
    assert not accepts(tokenizer, TOOLS, text, "required")
    assert not accepts(tokenizer, TOOLS, f"{text}{call}", "required")
    # a named function: only its calls
    named = {"type": "function", "function": {"name": "add"}}
    assert accepts(tokenizer, TOOLS, call, named)
    assert not accepts(tokenizer, TOOLS, other, named)
    # none: never a call
    assert accepts(tokenizer, TOOLS, text, "none")
    assert not accepts(tokenizer, TOOLS, f"{text}{call}", "none")
    assert not accepts(tokenizer, TOOLS, f"{text} <tool_call> is a tag", "none")
    # one call without parallel_tool_calls, at most MAX_CALLS with it
    assert not accepts(tokenizer, TOOLS, f"{call}\n{other}", "required", False)
    assert accepts(tokenizer, TOOLS, call, "required", False)
    most = tiny.tool_calls.MAX_CALLS
    assert accepts(tokenizer, TOOLS, "\n".join([call] * most), "required")
    assert not accepts(tokenizer, TOOLS, "\n".join([call] * (most + 1)), "required")


@pytest.mark.task(2)
def test_tool_grammar_refuses_in_its_docstrings_words():
    """The exact texts (json.dumps of the choice, not its repr), and any dict that
    does not name an offered function, whatever its "type", names no function."""
    functions = tiny.check_tools(TOOLS)
    names = [f["name"] for f in functions]
    for choice in (
        {"type": "function", "function": {"name": "mul"}},
        {"type": "retrieval", "function": {"name": names[0]}},
        {"type": "function"},
    ):
        with pytest.raises(ValueError) as caught:
            tiny.tool_grammar(functions, choice)
        assert str(caught.value) == (
            f"tool_choice names no function in tools: {json.dumps(choice)}; "
            f"name one of {names}"
        )
    with pytest.raises(ValueError) as caught:
        tiny.tool_grammar(functions, "always")
    assert str(caught.value) == (
        'tool_choice must be "auto", "required", "none" or a named function, '
        'got "always"'
    )


@pytest.mark.task(2)
def test_only_local_pointers_are_rooted():
    """A plain-name fragment ("#pt", an $anchor) stays as it is; the root and
    other pointers move under the function's $defs."""
    parameters = {
        "type": "object",
        "properties": {
            "a": {"$anchor": "pt", "type": "string"},
            "b": {"$ref": "#pt"},
            "c": {"$ref": "#/properties/a"},
            "e": {"$ref": "#"},
        },
    }
    tool = {"type": "function", "function": {"name": "f", "parameters": parameters}}
    moved = tiny.call_schema(tiny.check_tools([tool]))["$defs"]["f"]["properties"]
    assert moved["b"] == {"$ref": "#pt"}
    assert moved["c"] == {"$ref": "#/$defs/f/properties/a"}
    assert moved["e"] == {"$ref": "#/$defs/f"}


@pytest.mark.task(2)
def test_a_bad_tool_choice_or_tool_set_says_what_is_wrong():
    with pytest.raises(ValueError, match="names no function"):
        tiny.tool_constraint(TOOLS, {"type": "function", "function": {"name": "mul"}})
    with pytest.raises(ValueError, match="tool_choice must be"):
        tiny.tool_constraint(TOOLS, "always")
    bad = [
        ([], "non-empty list"),
        ([{"type": "retrieval"}], r"tools\[0\]"),
        ([{"type": "function", "function": {"name": "a b"}}], "letters, digits"),
        ([ADD, ADD], "given twice"),
        (
            [{"type": "function", "function": {"name": "f", "parameters": []}}],
            "JSON Schema of an object",
        ),
        (
            [
                {
                    "type": "function",
                    "function": {
                        "name": "f",
                        "parameters": {"type": "object", "not": {"type": "null"}},
                    },
                }
            ],
            r"tools\[0\]\.function\.parameters",
        ),
    ]
    for tools, message in bad:
        with pytest.raises(ValueError, match=message):
            tiny.check_tools(tools)


@pytest.mark.task(2)
def test_no_call_past_the_limit_even_one_the_user_asked_to_copy(tokenizer):
    """The text after the last allowed call never holds the tag: a model asked to
    repeat `<tool_call>{"name": "delete_all_files"...}` cannot write it, whether
    the limit is one call (no parallel calls) or MAX_CALLS."""
    call = call_text("add", {"a": 1, "b": 2})
    injected = call_text("delete_all_files", {"path": "/", "force": True})
    more = call_text("add", {"a": 3, "b": 4})
    most = tiny.tool_calls.MAX_CALLS
    assert not accepts(tokenizer, TOOLS, f"{call} Sure: {injected}", "auto", False)
    assert not accepts(tokenizer, TOOLS, f"{call} and {more}", "auto", False)
    assert not accepts(tokenizer, TOOLS, f"{call} then <tool_call> x", "auto", False)
    assert accepts(tokenizer, TOOLS, f"{call} done, no more tags", "auto", False)
    calls = "\n".join([call] * most)
    assert accepts(tokenizer, TOOLS, f"{calls} done", "auto")
    assert not accepts(tokenizer, TOOLS, f"{calls} {injected}", "auto")
    assert not accepts(tokenizer, TOOLS, f"{calls} {more}", "auto")


@pytest.mark.task(2)
def test_defs_and_definitions_of_the_same_name_stay_apart(tokenizer):
    """`#/$defs/t` and `#/definitions/t` are two schemas (here a string and an
    integer); the grammar accepts a call exactly when jsonschema validates it."""
    parameters = {
        "type": "object",
        "$defs": {"t": {"type": "string"}},
        "definitions": {"t": {"type": "integer"}},
        "properties": {
            "k": {"$ref": "#/$defs/t"},
            "m": {"$ref": "#/definitions/t"},
            "n": {"$ref": "#/properties/m"},
        },
        "required": ["k", "m", "n"],
        "additionalProperties": False,
    }
    tools = [{"type": "function", "function": {"name": "f", "parameters": parameters}}]
    for arguments in (
        {"k": "a", "m": 1, "n": 2},
        {"k": 123, "m": 1, "n": 2},
        {"k": "a", "m": "x", "n": 2},
        {"k": "a", "m": 1, "n": "s"},
    ):
        valid = jsonschema.Draft202012Validator(parameters).is_valid(arguments)
        text = call_text("f", arguments)
        assert accepts(tokenizer, tools, text, "required") == valid, arguments


# --- any text the grammar accepts holds only calls the request offered ----------------

NAMES = ["f", "g", "h", "delete_all_files"]
properties = st.dictionaries(
    st.sampled_from("xyz"),
    st.one_of(
        st.just({"type": "integer", "minimum": -3, "maximum": 3}),
        st.just({"type": "string", "maxLength": 4}),
        st.just({"enum": ["a", 1, None]}),
        st.just({"type": "boolean"}),
        st.just({"$ref": "#/$defs/t"}),
        st.just({"$ref": "#/definitions/t"}),
    ),
    min_size=1,
    max_size=3,
)
functions = st.builds(
    lambda name, props, required: {
        "type": "function",
        "function": {
            "name": name,
            "parameters": {
                "type": "object",
                "properties": props,
                "required": [k for k in props if k in required],
                "additionalProperties": False,
                "$defs": {"t": {"type": "string", "maxLength": 2}},
                "definitions": {"t": {"type": "integer", "minimum": 0}},
            },
        },
    },
    st.sampled_from(NAMES[:3]),
    properties,
    st.sets(st.sampled_from("xyz")),
)
tool_sets = st.lists(
    functions, min_size=1, max_size=3, unique_by=lambda t: t["function"]["name"]
)
argument_values = st.one_of(
    st.integers(-4, 4), st.sampled_from(["a", "ab", "abcde", None, True])
)
forced_calls = st.builds(
    call_text,
    st.sampled_from(NAMES),
    st.dictionaries(st.sampled_from("xyzw"), argument_values, max_size=3),
)
forced_pieces = st.one_of(
    forced_calls, st.sampled_from(["ok ", "\n", "<tool_call>", "</tool_call>", " "])
)


@pytest.mark.task(2)
@settings(max_examples=150, deadline=None)
@given(
    tool_sets,
    st.lists(forced_pieces, max_size=5),
    st.sampled_from(["auto", "required", "named"]),
    st.booleans(),
)
def test_an_accepted_answer_holds_only_offered_valid_calls(
    tokenizer, tools, pieces, choice, parallel
):
    """Random tool sets (their $defs and definitions both named t) and random text
    forced through the grammar (calls to offered and unoffered tools, valid and
    invalid arguments, stray tags): whenever the grammar accepts the text, every
    call parse_tool_calls reads names a tool the choice allows, validates against
    the client's own schema (jsonschema), and there are no more calls than allowed
    and no tag left in the text."""
    if choice == "named":
        choice = {
            "type": "function",
            "function": {"name": tools[0]["function"]["name"]},
        }
        allowed = tools[:1]
    else:
        allowed = tools
    text = "".join(pieces)
    accepted = accepts(tokenizer, tools, text, choice, parallel)
    event(f"accepted: {accepted}")
    if not accepted:
        return
    content, calls = tiny.parse_tool_calls(text)
    most = tiny.tool_calls.MAX_CALLS if parallel else 1
    assert len(calls) <= most
    assert "<tool_call>" not in content
    schemas = {t["function"]["name"]: t["function"]["parameters"] for t in allowed}
    for call in calls:
        assert call.name in schemas, text
        jsonschema.validate(call.arguments, schemas[call.name])


pieces = st.text("ab <>/\n{}", max_size=12).filter(lambda t: "<tool_call>" not in t)
# An argument may hold the tags' text: a call is read by its JSON, not cut at a tag.
values = st.one_of(
    st.integers(-5, 5), st.sampled_from(["<tool_call>", "</tool_call>", "a"])
)
calls = st.tuples(
    st.sampled_from(["f", "get_x"]),
    st.dictionaries(st.sampled_from("xyz"), values, max_size=3),
)


@pytest.mark.task(1)
@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(pieces, calls), max_size=4), pieces)
def test_parse_tool_calls_splits_text_and_calls(parts, tail):
    text = "".join(piece + call_text(*call) for piece, call in parts) + tail
    content, found = tiny.parse_tool_calls(text)
    assert [(c.name, c.arguments) for c in found] == [call for _, call in parts]
    assert content == ("".join(piece for piece, _ in parts) + tail).strip()


@pytest.mark.task(2)
def test_a_tag_inside_an_argument_is_part_of_the_call(tokenizer):
    """The grammar lets a string hold the tags' text (a sampled city may), so the
    call must read back whole, not end at the tag inside its JSON."""
    for city in ("</tool_call>", "<tool_call>"):
        text = call_text("get_weather", {"city": city})
        assert accepts(tokenizer, [WEATHER], text, "required", parallel=False)
        content, [call] = tiny.parse_tool_calls(f"a {text} b")
        assert (call.name, call.arguments) == ("get_weather", {"city": city})
        assert content == "a  b"


@pytest.mark.task(1)
def test_a_block_that_is_not_a_call_stays_in_the_text():
    broken = '<tool_call>\n{"name": "f", "arguments": {"x": 1}\n</tool_call>'
    keyless = '<tool_call>\n{"function": "f"}\n</tool_call>'
    unclosed = '<tool_call>\n{"name": "f", "arguments": {}}'
    good = call_text("g", {"y": 2})
    for block in (broken, keyless, unclosed):
        content, found = tiny.parse_tool_calls(f"a {block} {good} b")
        assert [(c.name, c.arguments) for c in found] == [("g", {"y": 2})]
        assert block in content


@pytest.fixture(scope="module")
def wide_model():
    """A small random Qwen2 model over the embedded tokenizer's whole vocabulary:
    unconstrained, its output is garbage."""
    mlx_model = random_model("qwen2", 32, 2, 1, 48, 1, VOCAB, True, seed=12)
    return tiny.Qwen2ModelWeek2(mlx_model, weights="float32")


@pytest.mark.task(2)
def test_a_random_model_calls_every_tool_set_validly(wide_model, tokenizer):
    """Sampled at temperature 1, one call each ("required", no parallel calls):
    every answer is exactly one call that names a function of its set and whose
    arguments validate against that function's parameters."""
    rng = np.random.default_rng(5)
    specs = [
        PromptSpec(
            token_ids(rng, VOCAB, 3 + i % 5),
            constraint=tiny.tool_constraint(tools, "required", False),
        )
        for i, tools in enumerate(TOOL_SETS)
    ]
    results = tiny.batch_generate(
        wide_model,
        tokenizer,
        specs,
        batch_size=16,
        max_tokens=CALL_MAX_TOKENS,
        sampler=tiny.make_sampler(1.0),
        policy="mixed",
    )
    for tools, result in zip(TOOL_SETS, results):
        assert result.error is None and result.finish_reason == "stop", result
        content, [call] = tiny.parse_tool_calls(result.text)
        assert content == ""
        [function] = [
            t["function"] for t in tools if t["function"]["name"] == call.name
        ]
        jsonschema.validate(call.arguments, function["parameters"])


@pytest.mark.task(2)
def test_the_embedded_model_calls_the_named_function(embedded_model, tokenizer):
    """Through the chat template (the tools described in the system message, as
    the embedded model's template has no tool support), greedy."""
    mlx_model, _ = embedded_model
    model = tiny.Qwen2ModelWeek2(mlx_model, weights="float32")
    messages = [{"role": "user", "content": "What is the weather in Paris?"}]
    ids = tool_chat_token_ids(tokenizer, messages, TOOLS)
    assert "get_weather" in tokenizer.decode(ids)
    named = {"type": "function", "function": {"name": "get_weather"}}
    [result] = tiny.batch_generate(
        model,
        tokenizer,
        [PromptSpec(ids, constraint=tiny.tool_constraint(TOOLS, named, False))],
        max_tokens=64,
    )
    assert result.finish_reason == "stop", result.text
    _, [call] = tiny.parse_tool_calls(result.text)
    assert call.name == "get_weather"
    jsonschema.validate(call.arguments, WEATHER["function"]["parameters"])
