"""Week 3 Day 5: JSON Schema constraints (tiny_llm_base.structured, llguidance's masks
behind the course's constraint interface), through the learner's start_constraint
and Request.

A suite of 52 schemas (scripts/bench/benchlib/schemas.py: nested objects, arrays
with bounds, enums, required and optional fields, number ranges, string patterns,
unions, $refs) on a random model with the embedded tokenizer's whole vocabulary,
whose unconstrained output is garbage: every answer parses and validates (the
jsonschema package, an independent validator). A handful on the embedded model.
Constrained rows beside unconstrained ones leave those their usual tokens; bad
schemas fail their request alone with a message that says what is wrong; a schema
that cannot finish within max_tokens ends with "length".
"""

import json
import re
import subprocess
import sys

import jsonschema
import numpy as np
import pytest

from scripts.bench.benchlib.schemas import MAX_TOKENS, SUITE
from tiny_llm_base import JsonObject, JsonSchema, PromptSpec, greedy

from .helpers import assert_same_tokens, expected_tokens, token_ids
from .random_models import random_model
from .solution import tiny

pytestmark = pytest.mark.task(3)

VOCAB = 49152  # the embedded tokenizer's: JSON punctuation comes in whole tokens


@pytest.fixture(scope="module")
def wide_pair():
    """A small random Qwen2 model over the embedded tokenizer's whole vocabulary."""
    mlx_model = random_model("qwen2", 32, 2, 1, 48, 1, VOCAB, True, seed=11)
    return mlx_model, tiny.Qwen2ModelWeek2(mlx_model, weights="float32")


def assert_valid(schema: dict, result, what: str) -> None:
    assert result.error is None, f"{what}: {result.error}"
    assert result.finish_reason == "stop", (what, result.finish_reason, result.text)
    try:
        value = json.loads(result.text)
    except json.JSONDecodeError as error:
        raise AssertionError(f"{what}: not JSON ({error}): {result.text!r}") from None
    jsonschema.validate(value, schema)


def test_every_schema_of_the_suite_compiles():
    assert len(SUITE) >= 50
    for name, schema, _ in SUITE:
        try:
            JsonSchema(schema).check()
        except ValueError as error:
            raise AssertionError(f"{name}: {error}") from None


def test_random_models_answer_the_whole_suite_validly(wide_pair, tokenizer):
    """Sampled at temperature 1 from random weights, 16 rows a batch: every answer of
    the 52 schemas parses and validates."""
    _, model = wide_pair
    rng = np.random.default_rng(3)
    specs = [
        PromptSpec(token_ids(rng, VOCAB, 3 + i % 5), constraint=JsonSchema(schema))
        for i, (_, schema, _) in enumerate(SUITE)
    ]
    results = tiny.batch_generate(
        model,
        tokenizer,
        specs,
        batch_size=16,
        max_tokens=MAX_TOKENS,
        sampler=tiny.make_sampler(1.0),
        policy="mixed",
    )
    for (name, schema, _), result in zip(SUITE, results):
        assert_valid(schema, result, name)


def test_greedy_rows_beside_unconstrained_rows_keep_their_tokens(wide_pair, tokenizer):
    """JSON rows and plain rows in one batch: the plain rows get mlx-lm's greedy
    tokens, the JSON rows validate (greedy on random weights can loop inside an
    unbounded number; these schemas bound everything)."""
    mlx_model, model = wide_pair
    rng = np.random.default_rng(4)
    schemas = [schema for name, schema, _ in SUITE if name in ("person", "order")]
    plain = [token_ids(rng, VOCAB, 6), token_ids(rng, VOCAB, 9)]
    specs = [
        PromptSpec(token_ids(rng, VOCAB, 5), constraint=JsonSchema(schemas[0])),
        PromptSpec(plain[0]),
        PromptSpec(token_ids(rng, VOCAB, 7), constraint=JsonSchema(schemas[1])),
        PromptSpec(plain[1]),
    ]
    results = tiny.batch_generate(
        model, tokenizer, specs, batch_size=4, max_tokens=24, sampler=greedy
    )
    for result, (tokens, gaps) in zip(
        results[1::2], expected_tokens(mlx_model, plain, 24, tokenizer)
    ):
        assert_same_tokens(result.tokens, tokens, gaps, "an unconstrained row")
    for schema, result in zip(schemas, results[0::2]):
        if result.finish_reason == "stop":
            assert_valid(schema, result, "a greedy JSON row")
        else:
            assert result.finish_reason == "length"


def test_json_object_answers_are_objects(wide_pair, tokenizer):
    _, model = wide_pair
    rng = np.random.default_rng(5)
    specs = [
        PromptSpec(token_ids(rng, VOCAB, 4), constraint=JsonObject()) for _ in range(3)
    ]
    results = tiny.batch_generate(
        model, tokenizer, specs, max_tokens=24, sampler=tiny.make_sampler(1.0)
    )
    for result in results:
        assert result.error is None and result.text.startswith("{")
        if result.finish_reason == "stop":
            assert isinstance(json.loads(result.text), dict)


def test_a_schema_that_cannot_finish_ends_with_length(wide_pair, tokenizer):
    _, model = wide_pair
    schema = {"type": "array", "items": {"const": "abc"}, "minItems": 20}
    spec = PromptSpec([5, 6, 7], constraint=JsonSchema(schema))
    result = tiny.batch_generate(model, tokenizer, [spec], max_tokens=8)[0]
    assert result.error is None
    assert result.finish_reason == "length" and len(result.tokens) == 8
    assert result.text.startswith('["abc"')


@pytest.mark.parametrize(
    "schema, words",
    [
        ({"type": "array", "uniqueItems": True}, "uniqueItems"),
        ({"type": "colour"}, "colour"),
        ({"type": "string", "minLength": 5, "maxLength": 2}, "minLength"),
        ({"$ref": "#/$defs/missing"}, "missing"),
        ({"type": "integer", "minimum": 5, "maximum": 1}, "minimum"),
    ],
)
def test_bad_schemas_say_what_is_wrong(schema, words, tokenizer):
    with pytest.raises(ValueError, match="invalid JSON schema") as error:
        tiny.start_constraint(JsonSchema(schema), tokenizer, VOCAB)
    assert words in str(error.value)


def test_a_bad_schema_fails_its_request_alone(wide_pair, tokenizer):
    mlx_model, model = wide_pair
    prompt = [11, 12, 13, 14]
    specs = [
        PromptSpec(prompt, constraint=JsonSchema({"type": "array", "not": {}})),
        PromptSpec(prompt),
    ]
    results = tiny.batch_generate(model, tokenizer, specs, max_tokens=6)
    assert results[0].finish_reason == "error" and "not" in results[0].error
    tokens, gaps = expected_tokens(mlx_model, [prompt], 6, tokenizer)[0]
    assert_same_tokens(results[1].tokens, tokens, gaps, "the good request")


def test_schema_text_and_dict_are_the_same_constraint():
    schema = {"type": "object", "properties": {"a": {"type": "boolean"}}}
    assert JsonSchema(schema) == JsonSchema(json.dumps(schema))
    with pytest.raises(ValueError, match="not valid JSON"):
        JsonSchema("{not json")
    with pytest.raises(ValueError, match="must be an object"):
        JsonSchema("[1, 2]")


def test_a_constraint_is_validated_once(monkeypatch):
    """A tool constraint is checked where it is made, then started by the server
    and by the engine: llguidance validates it once. A bad one fails every time."""
    import llguidance

    validate = llguidance.LLMatcher.validate_grammar_with_warnings
    calls = []

    def counted(grammar):
        calls.append(grammar)
        return validate(grammar)

    monkeypatch.setattr(llguidance.LLMatcher, "validate_grammar_with_warnings", counted)
    schema = {"type": "object", "properties": {"a": {"type": "boolean"}}}
    constraint = JsonSchema(schema)
    for _ in range(3):
        constraint.check()
    assert len(calls) == 1
    assert constraint == JsonSchema(schema) and hash(constraint) == hash(
        JsonSchema(schema)
    )
    bad = JsonSchema({"type": "object", "uniqueItems": True, "not": {}})
    for _ in range(2):
        with pytest.raises(ValueError, match="invalid JSON schema"):
            bad.check()
    assert len(calls) == 3


EMBEDDED = ["person", "weather", "order", "enum field"]


def test_the_embedded_model_answers_validly(embedded_week2_model, tokenizer):
    """The embedded model, greedy, asked in words: valid JSON for each schema."""
    model = embedded_week2_model(True, "auto")
    chosen = [entry for entry in SUITE if entry[0] in EMBEDDED]
    specs = [
        PromptSpec(
            tokenizer.apply_chat_template(
                [{"role": "user", "content": f"{request} Reply in JSON."}],
                add_generation_prompt=True,
            ),
            constraint=JsonSchema(schema),
        )
        for _, schema, request in chosen
    ]
    results = tiny.batch_generate(
        model, tokenizer, specs, batch_size=4, max_tokens=MAX_TOKENS, policy="mixed"
    )
    for (name, schema, _), result in zip(chosen, results):
        assert_valid(schema, result, name)


# --- schemas screened before native code (tiny_llm_base.schema_checks) ------------------

CRASHED_THE_LIBRARY = [
    {"type": "integer", "minimum": -(10**21), "maximum": -(10**21) + 1},
    {"type": "integer", "minimum": -(2**63) - 1, "maximum": -(2**63) - 1},
]


def checked_in_a_child(schemas: list) -> list[str]:
    """Each schema's JsonSchema.check() in a child process ("accepted", or the first
    line of its ValueError), so that a crash is a failed test, not a dead test run;
    the child must live on to answer for every schema."""
    code = (
        "import json, sys\n"
        "from tiny_llm_base import JsonSchema\n"
        "for schema in json.loads(sys.stdin.read()):\n"
        "    try:\n"
        "        JsonSchema(schema).check()\n"
        "        print('accepted')\n"
        "    except ValueError as error:\n"
        "        print(str(error).splitlines()[0])\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code],
        input=json.dumps(schemas),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, (result.returncode, result.stderr[-2000:])
    lines = result.stdout.splitlines()
    assert len(lines) == len(schemas)
    return lines


def test_schemas_that_crashed_the_grammar_library_are_a_value_error():
    """Each schema is refused with a ValueError naming the bound."""
    lines = checked_in_a_child(CRASHED_THE_LIBRARY)
    assert all("integer bounds must lie within" in line for line in lines), lines


HUGE = [2**63, -(2**63) - 1, -(10**21), 10**21, 2**53 + 1]
CARRIERS = {  # a number in every position a keyword can hold one
    "type": "object",
    "properties": {
        "a": {"type": "integer", "const": 1},
        "b": {"enum": [1, "x", [2], {"c": 3}]},
        "d": {"type": "integer", "default": 4, "examples": [5]},
        "e": {"type": "array", "prefixItems": [{"const": 6}], "minItems": 7},
        "f": {"type": "string", "maxLength": 8},
    },
    "patternProperties": {"^g": {"const": 9}},
    "dependentSchemas": {"h": {"properties": {"i": {"const": 10}}}},
    "$defs": {"j": {"anyOf": [{"const": 11}, {"enum": [12]}]}},
}


def number_paths(value, path=()):
    if isinstance(value, dict):
        for key, item in value.items():
            yield from number_paths(item, (*path, key))
    elif isinstance(value, list):
        for i, item in enumerate(value):
            yield from number_paths(item, (*path, i))
    elif isinstance(value, int) and not isinstance(value, bool):
        yield path


def where(path) -> str:
    """A path as the messages write it: properties.b.enum[3].c"""
    text = ""
    for key in path:
        text += f"[{key}]" if isinstance(key, int) else f".{key}"
    return text.lstrip(".")


def replaced(value, path, new):
    if not path:
        return new
    copy = json.loads(json.dumps(value))
    node = copy
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = new
    return copy


def test_a_huge_integer_anywhere_in_a_schema_is_a_value_error():
    """Every integer of CARRIERS in turn made huge (beyond i64, or past 2**53 where
    floats lose integers): each schema is refused with a message naming where, and
    the child process that compiles them lives on (one of them crashed it)."""
    paths = list(number_paths(CARRIERS))
    assert len(paths) == 13, paths
    cases = [
        (replaced(CARRIERS, path, huge), where(path)) for path in paths for huge in HUGE
    ]
    lines = checked_in_a_child([schema for schema, _ in cases])
    for (_, place), line in zip(cases, lines):
        assert line.startswith(f"`{place}` is "), (place, line)
        assert "2**53" in line or "2**31" in line, (place, line)


@pytest.mark.parametrize(
    "schema, words",
    [
        ({"type": "integer", "minimum": 2**53 + 1}, "integer bounds"),
        ({"type": "number", "maximum": 1e300}, "number bounds"),
        ({"type": "number", "minimum": 1e-300}, "number bounds"),
        ({"type": "integer", "minimum": "3"}, "must be a number"),
        (False, "no value satisfies"),
        ({"oneOf": []}, "`oneOf` is an empty list"),
        ({"properties": {"a": {"enum": []}}}, "`properties.a.enum`"),
        ({"$ref": "#"}, "no finite JSON value"),
        (
            {"type": "array", "minItems": 1, "items": {"$ref": "#"}},
            "no finite JSON value",
        ),
        ({"type": "string", "pattern": "a{2000}"}, "lower its repetition counts"),
        ({"type": "string", "minLength": 2**32}, "`minLength` is 4294967296: at most"),
    ],
)
def test_schemas_screened_in_the_clients_terms(schema, words):
    with pytest.raises(ValueError, match=re.escape(words)):
        JsonSchema(schema).check()


@pytest.mark.parametrize(
    "schema",
    [
        True,
        {},
        {"type": "integer", "minimum": -(2**53), "maximum": 2**53},
        {"type": "number", "minimum": -1e15, "maximum": 0.5},
        {  # a linked list: recursive, but its "next" may be left out
            "type": "object",
            "properties": {"value": {"type": "integer"}, "next": {"$ref": "#"}},
            "required": ["value"],
        },
        {"type": "array", "items": {"$ref": "#"}},  # [] ends it
    ],
)
def test_schemas_with_finite_answers_are_accepted(schema):
    JsonSchema(schema).check()


def test_json_object_has_no_whitespace_to_run_on(tokenizer):
    # Unbounded whitespace is how a json_object answer can run to max_tokens
    # (OpenAI's and vLLM's grammars limit it); this one allows none: no token
    # that is only whitespace, anywhere in an object or after it.
    blank = [
        token
        for token in range(VOCAB)
        if (text := tokenizer.decode([token])) and not text.strip()
    ]
    state = JsonObject().start(tokenizer, VOCAB)
    written = []
    for token in tokenizer.encode('{"a":[1,{"b":"c d"}]}', add_special_tokens=False):
        in_string = tokenizer.decode(written).count('"') % 2 == 1  # text is content
        if not in_string:
            assert not set(blank) & set(state.allowed().ids.tolist()), written
        state.advance(token)
        written.append(token)
    assert state.is_accepting
    after = set(state.allowed().ids.tolist())
    assert not set(blank) & after
