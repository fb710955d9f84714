"""Structured outputs on the server (week 3 day 5), talked to as clients do: one server
on 127.0.0.1 at a free port, in a thread of this process, serving a random model (the
grammar makes the answers; conftest.protocol_model) through the package's Engine
(tests/solution.py, as tests/test_serve.py does).

OpenAI's response_format json_schema (strict) and json_object through the `openai`
package; vLLM's guided_choice, guided_regex, guided_json and structured_outputs as
extra body fields; a constraint that cannot finish within max_tokens ends with
"length"; bad constraints get a 400 in OpenAI's error shape naming the field and
what is wrong; a constrained request beside a plain one leaves the plain one its
greedy answer.
"""

import dataclasses
import json
import re
from concurrent.futures import ThreadPoolExecutor

import httpx
import jsonschema
import pytest

from tiny_llm_serve import ServerSettings, create_app

from .helpers import TLS
from .servers import CONSTRAINTS, WAIT_S, BrokenEngine, RunningServer
from .solution import tiny

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 12},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
    },
    "required": ["name", "age"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
def server(protocol_model):
    """A random model: the grammar, not the model, makes these answers valid."""
    mlx_model, tokenizer = protocol_model
    model = tiny.Qwen2ModelWeek2(mlx_model, use_fast_kernels=True)
    # One run here first: the model's lazily built arrays are evaluated on this
    # thread, not first on the engine's (MLX streams belong to a thread).
    tiny.batch_generate(model, tokenizer, [[1, 2, 3]], max_tokens=2)
    engine = tiny.Engine(
        model, tokenizer, batch_size=4, max_seq_len=256, policy="mixed"
    )
    settings = ServerSettings("test-model")
    running = RunningServer(
        create_app(engine, settings, tiny.make_sampler, CONSTRAINTS)
    )
    yield running
    running.stop()


@pytest.fixture(scope="module")
def client(server):
    return server.openai_client(api_key="none")


def ask(client, question: str, max_tokens: int = 32, **options):
    return client.chat.completions.create(
        model="test-model",
        messages=[{"role": "user", "content": question}],
        max_tokens=max_tokens,
        temperature=0,
        **options,
    ).choices[0]


def test_response_format_json_schema_gives_a_valid_answer(client):
    choice = ask(
        client,
        "Describe a person as JSON.",
        max_tokens=40,
        response_format={
            "type": "json_schema",
            "json_schema": {"name": "person", "schema": SCHEMA, "strict": True},
        },
    )
    assert choice.finish_reason == "stop"
    jsonschema.validate(json.loads(choice.message.content), SCHEMA)


def test_json_object_and_vllm_options_match(client):
    """Asked at once, so that the engine steps them together."""
    pattern = r"\d{4}-\d{2}-\d{2}"
    questions = [
        ("Is the sky blue?", {"extra_body": {"guided_choice": ["yes", "no"]}}),
        ("A date, please.", {"extra_body": {"guided_regex": pattern}}),
        ("Give me JSON.", {"extra_body": {"structured_outputs": {"json": SCHEMA}}}),
        (
            "A fruit.",
            {"extra_body": {"structured_outputs": {"choice": ["apple", "pear"]}}},
        ),
        ("A person.", {"response_format": {"type": "json_object"}}),
    ]
    with ThreadPoolExecutor(len(questions)) as pool:
        futures = [pool.submit(ask, client, q, **options) for q, options in questions]
        choice, date, person, fruit, anything = [f.result() for f in futures]
    assert choice.message.content in ("yes", "no")
    assert re.fullmatch(pattern, date.message.content)
    jsonschema.validate(json.loads(person.message.content), SCHEMA)
    assert fruit.message.content in ("apple", "pear")
    assert anything.message.content.startswith("{")
    if anything.finish_reason == "stop":
        assert isinstance(json.loads(anything.message.content), dict)


def test_a_constraint_that_cannot_finish_ends_with_length(client):
    answer = ask(
        client,
        "Describe a person as JSON.",
        max_tokens=3,
        extra_body={"guided_json": SCHEMA},
    )
    assert answer.finish_reason == "length"
    assert answer.message.content.startswith("{")


BAD = [
    ({"guided_choice": []}, "guided_choice", "empty list"),
    ({"guided_choice": "yes"}, "guided_choice", "list of strings"),
    (
        {"guided_choice": ["yes", 1]},
        "guided_choice",
        "must be a list of strings, got an array, whose item [1] is a number (1)",
    ),
    (
        {"structured_outputs": {"choice": ["a", ["b"]]}},
        "structured_outputs.choice",
        'whose item [1] is an array (["b"])',
    ),
    ({"guided_regex": "("}, "guided_regex", "never closed"),
    ({"guided_regex": r"[^\s\S]"}, "guided_regex", "matches nothing"),
    ({"guided_regex": 5}, "guided_regex", "a string"),
    (
        {"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}},
        "response_format.json_schema.schema",
        "required",
    ),
    (
        {
            "response_format": {
                "type": "json_schema",
                "json_schema": {
                    "name": "x",
                    "schema": {"type": "array", "uniqueItems": 1},
                },
            }
        },
        "response_format.json_schema.schema",
        "uniqueItems",
    ),
    (
        {
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": "x", "schema": {"type": "colour"}},
            }
        },
        "response_format.json_schema.schema",
        "colour",
    ),
    ({"guided_json": "{oops"}, "guided_json", "not JSON"),
    ({"response_format": {"type": "yaml"}}, "response_format.type", "json_schema"),
    ({"guided_regex": "a", "guided_choice": ["a"]}, "guided_choice", "at most one"),
    ({"structured_outputs": {"grammar": "x"}}, "structured_outputs.grammar", "json"),
    ({"guided_grammar": "root ::= x"}, "guided_grammar", "guided_json"),
]


def schema_body(schema) -> dict:
    return {
        "response_format": {
            "type": "json_schema",
            "json_schema": {"name": "x", "schema": schema},
        }
    }


def nested_arrays(depth: int) -> dict:
    schema: dict = {"type": "integer"}
    for _ in range(depth):
        schema = {"type": "array", "items": schema}
    return schema


SCHEMA_PARAM = "response_format.json_schema.schema"
# Each of these crashed the grammar library, was answered wrongly, failed after the
# request started, or was refused in the library's own words (issue 30).
HOSTILE = [
    (  # crashed the process (i64's minimum)
        schema_body(
            {"type": "integer", "minimum": -(10**21), "maximum": -(10**21) + 1}
        ),
        SCHEMA_PARAM,
        "integer bounds must lie within",
    ),
    (
        schema_body(
            {"type": "integer", "minimum": -(2**63) - 1, "maximum": -(2**63) - 1}
        ),
        SCHEMA_PARAM,
        "integer bounds must lie within",
    ),
    (  # clamped to i64: 2**63 - 1 answered as if it were above 2**63
        {"guided_json": {"type": "integer", "minimum": 2**63}},
        "guided_json",
        "`minimum` is 9223372036854775808",
    ),
    (  # through a float: the only valid answer replaced by another
        {
            "guided_json": {
                "type": "integer",
                "minimum": 2**53 + 1,
                "maximum": 2**53 + 1,
            }
        },
        "guided_json",
        "integer bounds must lie within",
    ),
    (
        {"guided_json": {"type": "number", "minimum": 1e308}},
        "guided_json",
        "number bounds",
    ),
    (
        {
            "guided_json": {
                "$defs": {
                    "a": {
                        "type": "object",
                        "properties": {"x": {"$ref": "#/$defs/a"}},
                        "required": ["x"],
                        "additionalProperties": False,
                    }
                },
                "$ref": "#/$defs/a",
            }
        },
        "guided_json",
        "no finite JSON value",
    ),
    ({"guided_json": {"$ref": "#"}}, "guided_json", "no finite JSON value"),
    (
        {"guided_json": {"type": "string", "pattern": "^a{1000000}$"}},
        "guided_json",
        "lower its repetition counts",
    ),
    (schema_body(False), SCHEMA_PARAM, "no value satisfies"),
    ({"guided_json": {"enum": []}}, "guided_json", "`enum` is an empty list"),
    ({"guided_json": nested_arrays(200)}, "guided_json", "nested more than 64"),
    ({"guided_json": {"not": {"type": "string"}}}, "guided_json", 'keywords "not"'),
    ({"guided_regex": "\U0001f600{1,3}"}, "guided_regex", "U+1F600"),
    ({"guided_regex": "a\x00"}, "guided_regex", "U+0000"),
    ({"guided_choice": ["\U0001f600"]}, "guided_choice", "no token holds"),
    ({"guided_choice": ["\x00"]}, "guided_choice", "U+0000"),
    ({"guided_regex": "(" * 500 + "a" + ")" * 500}, "guided_regex", "nested more"),
    ({"guided_regex": "{" * 900_000}, "guided_regex", "at most 100,000"),
    (
        {"guided_choice": [f"w{i}" for i in range(10_000)]},
        "guided_choice",
        "fewer choices",
    ),
]


@pytest.mark.parametrize("fields, param, words", HOSTILE)
def test_hostile_constraints_get_one_400_in_the_clients_terms(
    server, fields, param, words
):
    """Refused before any work, in the client's terms: never a crash, a 500 after
    the request started, or the library's wording (Rust names, "anyOf")."""
    body = {"messages": [{"role": "user", "content": "Hi"}], **fields}
    response = httpx.post(
        f"{server.url}/v1/chat/completions", json=body, timeout=60, verify=TLS
    )
    assert response.status_code == 400, response.text[:500]
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error"
    assert error["param"] == param
    assert words in error["message"], error["message"]
    assert "Some(" not in error["message"] and "anyOf is empty" not in error["message"]


def test_a_constraint_stuck_mid_answer_is_the_clients_400_not_a_500():
    """What the engine reports when a constraint dead-ends after the request started
    (the sampler raised UnsatisfiableConstraint): the server answers a 400 naming the
    field, and any other failure stays a 500."""
    from types import SimpleNamespace

    from tiny_llm_serve.constraints import generation_error

    stuck = SimpleNamespace(
        error="sampling token 2 failed: UnsatisfiableConstraint: no token of the "
        "vocabulary can continue the constraint here",
        tokens=[7],
    )
    error = generation_error(stuck, "guided_regex")
    assert (error.status, error.kind, error.param) == (
        400,
        "invalid_request_error",
        "guided_regex",
    )
    assert error.message.startswith("guided_regex cannot be met: after 1 tokens")
    broken = SimpleNamespace(
        error="sampling token 1 failed: RuntimeError: x", tokens=[]
    )
    assert generation_error(broken, "guided_regex").status == 500
    assert generation_error(stuck, None).status == 500


def test_a_package_without_structured_outputs_gets_a_501(tokenizer):
    """A learner's package before week 3 day 5: its start_constraint raises
    NotImplementedError, and the request is refused with that day's message before
    it reaches the engine."""

    def unwritten(constraint, tokenizer, vocab_size):
        raise NotImplementedError("Week 3 Day 5: start_constraint")

    factory = dataclasses.replace(CONSTRAINTS, start=unwritten)
    engine = BrokenEngine(tokenizer, tokenizer.vocab_size)
    settings = ServerSettings("test-model")
    running = RunningServer(create_app(engine, settings, tiny.make_sampler, factory))
    try:
        body = {"messages": [{"role": "user", "content": "Hi"}], "guided_regex": "a+"}
        response = httpx.post(
            f"{running.url}/v1/chat/completions", json=body, timeout=WAIT_S, verify=TLS
        )
    finally:
        running.stop()
    assert response.status_code == 501, response.text
    error = response.json()["error"]
    assert (error["param"], error["code"]) == ("guided_regex", "not_implemented")
    assert "Week 3 Day 5" in error["message"], error["message"]
    assert "leave guided_regex out" in error["message"], error["message"]
    assert engine.added == []


def test_schema_true_means_any_json_value(client):
    answer = ask(
        client, "Give me a number.", max_tokens=12, extra_body={"guided_json": True}
    )
    if answer.finish_reason == "stop":
        json.loads(answer.message.content)
    else:
        assert answer.finish_reason == "length"


@pytest.mark.parametrize("fields, param, words", BAD)
def test_bad_constraints_get_a_400_saying_what_is_wrong(server, fields, param, words):
    body = {"messages": [{"role": "user", "content": "Hi"}], **fields}
    response = httpx.post(
        f"{server.url}/v1/chat/completions", json=body, timeout=30, verify=TLS
    )
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error"
    assert error["param"] == param
    assert words in error["message"], error["message"]


def test_completions_take_the_same_options(server):
    body = {"prompt": "Answer:", "max_tokens": 8, "guided_choice": ["alpha", "beta"]}
    response = httpx.post(
        f"{server.url}/v1/completions", json=body, timeout=WAIT_S, verify=TLS
    )
    assert response.status_code == 200, response.text
    assert response.json()["choices"][0]["text"] in ("alpha", "beta")


def test_a_constraint_never_changes_another_requests_answer(client):
    """A plain request's greedy answer is the same alone and beside constrained
    requests in the same batch."""
    question = "Name three primary colors."
    alone = ask(client, question, max_tokens=16).message.content
    with ThreadPoolExecutor(4) as pool:
        futures = [
            pool.submit(ask, client, "A person as JSON.", 24, extra_body=extra)
            for extra in (
                {"guided_json": SCHEMA},
                {"guided_regex": "[a-z]{3,8}"},
                {"guided_choice": ["red", "green", "blue"]},
            )
        ]
        beside = pool.submit(ask, client, question, 16)
        answers = [f.result(timeout=WAIT_S) for f in futures]
        assert beside.result(timeout=WAIT_S).message.content == alone
    assert re.fullmatch("[a-z]{3,8}", answers[1].message.content)
    assert answers[2].message.content in ("red", "green", "blue")
