"""Logprobs, echo, n, seed, penalties and logit_bias on the server, talked to with the
official openai client: one server on 127.0.0.1 at a free port, in a thread of this
process, serving the embedded model in float32 through the package's Engine (tests/solution.py; paged
KV cache, prefix caching, mixed policy: `pdm run serve`'s defaults).

Log-probabilities are checked against mlx-lm's own model holding the same float32
weights (one forward over the prompt and the answer, log-softmax at each position);
the engine-level checks of each option's formula are the day tests'
(test_week_2_day_6_sampling.py and the days after).
"""

import json

import jsonschema
import numpy as np
import openai
import pytest

from tiny_llm_serve import ServerSettings, create_app

from .helpers import mlx_lm_logprobs
from .servers import CONSTRAINTS, RunningServer, chat_prompt
from .solution import tiny

MODEL = "test-model"
QUESTION = "Write one sentence about the sea."
TOLERANCE = 2e-3  # our fast float32 kernels against mlx-lm's, in log-probability


@pytest.fixture(scope="module")
def server(embedded_model, embedded_week2_model):
    model = embedded_week2_model(True, "float32", tiny)
    # One run here first: the model's lazily built arrays are evaluated on this
    # thread, not first on the engine's (MLX streams belong to a thread).
    tiny.batch_generate(model, embedded_model[1], [[1, 2, 3]], max_tokens=2)
    engine = tiny.Engine(
        model,
        embedded_model[1],
        batch_size=4,
        max_seq_len=256,
        policy="mixed",
        kv_cache="paged",
    )
    settings = ServerSettings(MODEL)
    app = create_app(engine, settings, tiny.make_sampler, CONSTRAINTS)
    running = RunningServer(app)
    yield running
    running.stop()


@pytest.fixture(scope="module")
def client(server):
    return server.openai_client(api_key="none")


def chat(client, max_tokens: int = 6, question: str = QUESTION, **options):
    return client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": question}],
        max_tokens=max_tokens,
        **options,
    )


def test_chat_logprobs_are_the_models_before_sampling(
    client, tokenizer, embedded_float32_reference
):
    reply = chat(client, temperature=0, logprobs=True, top_logprobs=3)
    choice = reply.choices[0]
    entries = choice.logprobs.content
    assert len(entries) == reply.usage.completion_tokens
    assert "".join(e.token for e in entries) == choice.message.content
    answer = [tokenizer.encode(e.token, add_special_tokens=False) for e in entries]
    assert all(len(ids) == 1 for ids in answer), answer  # one token each
    prompt = chat_prompt(tokenizer, QUESTION)
    expected = mlx_lm_logprobs(embedded_float32_reference, prompt + sum(answer, []))
    for i, (entry, [token]) in enumerate(zip(entries, answer)):
        row = expected[len(prompt) - 1 + i]
        assert bytes(entry.bytes).decode() == entry.token
        assert abs(entry.logprob - row[token]) < TOLERANCE
        tops = [top.logprob for top in entry.top_logprobs]
        np.testing.assert_allclose(tops, np.sort(row)[::-1][:3], atol=TOLERANCE)
        assert entry.top_logprobs[0].token == entry.token  # greedy: the top one


def test_completions_echo_with_max_tokens_0_scores_the_prompt(
    client, tokenizer, embedded_float32_reference
):
    """lm-eval's loglikelihood request: the prompt's tokens and logprobs, the first
    one's null, nothing generated."""
    ids = tokenizer.encode("The capital of France is Paris, and it is big.")
    reply = client.completions.create(
        model=MODEL, prompt=ids, max_tokens=0, echo=True, logprobs=1, temperature=0
    )
    choice = reply.choices[0]
    assert choice.text == tokenizer.decode(ids) and choice.finish_reason == "length"
    assert reply.usage.completion_tokens == 0
    logprobs = choice.logprobs
    assert len(logprobs.tokens) == len(ids) and "".join(logprobs.tokens) == choice.text
    assert logprobs.token_logprobs[0] is None and logprobs.top_logprobs[0] is None
    offsets = logprobs.text_offset
    assert offsets[0] == 0
    assert all(choice.text[o:].startswith(t) for o, t in zip(offsets, logprobs.tokens))
    expected = mlx_lm_logprobs(embedded_float32_reference, ids)
    for position in range(1, len(ids)):
        row = expected[position - 1]
        assert abs(logprobs.token_logprobs[position] - row[ids[position]]) < TOLERANCE
        top = logprobs.top_logprobs[position]
        assert logprobs.tokens[position] in top and len(top) <= 2
        assert max(top.values()) == pytest.approx(row.max(), abs=TOLERANCE)
    # lm-eval's own form: max_tokens 1, and it reads token_logprobs[ctxlen:-1].
    one = client.completions.create(
        model=MODEL, prompt=[ids], max_tokens=1, echo=True, logprobs=1, temperature=0
    ).choices[0]
    scored = one.logprobs.token_logprobs
    assert len(scored) == len(ids) + 1 and scored[0] is None
    assert scored[1:-1] == pytest.approx(logprobs.token_logprobs[1:], abs=1e-5)


def test_completions_echo_streams_the_prompt_first(client):
    options = dict(model=MODEL, prompt="The sea is", max_tokens=3, temperature=0)
    whole = client.completions.create(echo=True, logprobs=2, **options).choices[0]
    assert whole.text.startswith("The sea is")
    chunks = list(
        client.completions.create(echo=True, logprobs=2, stream=True, **options)
    )
    texts = [c.choices[0].text for c in chunks if c.choices]
    assert texts[0].startswith("The sea is") and "".join(texts) == whole.text
    tokens = [
        t for c in chunks if c.choices and c.choices[0].logprobs
        for t in c.choices[0].logprobs.tokens
    ]  # fmt: skip
    assert tokens == whole.logprobs.tokens
    offsets = [
        o for c in chunks if c.choices and c.choices[0].logprobs
        for o in c.choices[0].logprobs.text_offset
    ]  # fmt: skip
    assert offsets == whole.logprobs.text_offset


def test_n_choices_each_have_an_index_and_usage_sums_them(client):
    reply = chat(
        client,
        max_tokens=5,
        n=3,
        temperature=1.0,
        seed=7,
        extra_body={"ignore_eos": True},
    )
    assert [c.index for c in reply.choices] == [0, 1, 2]
    assert all(c.finish_reason == "length" for c in reply.choices)
    assert reply.usage.completion_tokens == 15
    assert len({c.message.content for c in reply.choices}) > 1  # seeds 7, 8, 9
    greedy = chat(client, max_tokens=5, n=2, temperature=0)
    assert greedy.choices[0].message.content == greedy.choices[1].message.content


def test_a_seed_repeats_its_answer_streamed_or_not(client):
    options = dict(max_tokens=8, temperature=1.0, seed=1234)
    first = chat(client, **options).choices[0].message.content
    assert chat(client, **options).choices[0].message.content == first
    streamed = chat(client, stream=True, **options)
    text = "".join(c.choices[0].delta.content or "" for c in streamed if c.choices)
    assert text == first
    others = {
        chat(client, **{**options, "seed": s}).choices[0].message.content
        for s in (1, 2)
    }
    assert others != {first}


def test_logit_bias_forces_a_token(client, tokenizer):
    [bang] = tokenizer.encode("!", add_special_tokens=False)
    reply = chat(client, max_tokens=4, temperature=0, logit_bias={str(bang): 100})
    assert reply.choices[0].message.content == "!!!!"
    banned = chat(client, max_tokens=4, temperature=0, logit_bias={str(bang): -100})
    assert "!" not in banned.choices[0].message.content


def test_streamed_choices_carry_their_index_logprobs_and_one_usage(client):
    whole = chat(client, max_tokens=5, temperature=0, logprobs=True)
    stream = chat(
        client,
        max_tokens=5,
        n=2,
        temperature=0,
        logprobs=True,
        stream=True,
        stream_options={"include_usage": True},
    )
    texts, entries, reasons, usages = ["", ""], [[], []], [None, None], []
    for chunk in stream:
        if chunk.usage is not None:
            usages.append(chunk.usage)
        for choice in chunk.choices:
            texts[choice.index] += choice.delta.content or ""
            if choice.logprobs:
                entries[choice.index] += [e.token for e in choice.logprobs.content]
            reasons[choice.index] = choice.finish_reason or reasons[choice.index]
    expected = whole.choices[0]
    assert texts == [expected.message.content] * 2
    assert entries == [[e.token for e in expected.logprobs.content]] * 2
    assert reasons == [expected.finish_reason] * 2
    [usage] = usages
    assert usage.completion_tokens == 2 * whole.usage.completion_tokens


def test_a_stop_string_ends_each_choice_alone(client):
    """A choice that meets its stop string is aborted alone (the engine's abort with
    the choice's index); each counts its tokens up to the one that completed it."""
    answer = chat(client, max_tokens=12, temperature=0).choices[0].message.content
    words = answer.split()
    assert len(words) >= 4, answer
    stop = " " + words[2]
    one = chat(client, max_tokens=12, temperature=0, stop=[stop])
    both = chat(client, max_tokens=12, temperature=0, stop=[stop], n=2)
    expected = answer[: answer.index(stop)]
    for choice in both.choices + one.choices:
        assert (choice.message.content, choice.finish_reason) == (expected, "stop")
    assert both.usage.completion_tokens == 2 * one.usage.completion_tokens


SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 8},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
    },
    "required": ["name", "age"],
    "additionalProperties": False,
}


def test_a_constraint_holds_with_every_option(client, tokenizer):
    """The schema's mask comes first: whatever the bias (a large one on "}"), the
    penalties, min-p, the seed and the temperature add, a token the schema refuses
    is never drawn; each choice parses, and its logprobs spell it."""
    [brace] = tokenizer.encode("}", add_special_tokens=False)
    reply = chat(
        client,
        max_tokens=60,
        question="Describe a person as JSON.",
        n=2,
        temperature=1.0,
        seed=3,
        logprobs=True,
        top_logprobs=2,
        frequency_penalty=1.0,
        presence_penalty=0.5,
        logit_bias={str(brace): 50},
        response_format={
            "type": "json_schema",
            "json_schema": {"name": "person", "schema": SCHEMA, "strict": True},
        },
        extra_body={"repetition_penalty": 1.2, "min_p": 0.05},
    )
    for choice in reply.choices:
        assert choice.finish_reason == "stop", choice
        jsonschema.validate(json.loads(choice.message.content), SCHEMA)
        spelled = "".join(e.token for e in choice.logprobs.content)
        assert spelled == choice.message.content


def test_options_that_would_end_past_a_constraint_are_refused(client):
    for option in ({"min_tokens": 2}, {"ignore_eos": True}):
        with pytest.raises(openai.BadRequestError) as refused:
            chat(
                client,
                response_format={"type": "json_object"},
                extra_body=option,
            )
        assert refused.value.body["param"] == next(iter(option))
