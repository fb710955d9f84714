"""The OpenAI-compatible server (src/tiny_llm_serve), talked to as clients do.

One server on 127.0.0.1 at a free port, in a thread of this process, serves the
embedded model through the Engine of the package under test (tests/solution.py: the
reference, or yours in `pdm run test`'s run, TINY_LLM_SOLUTION=learner; the server
itself has no stubs, so it serves the package it is given). Clients: the
official `openai` package and httpx.

What is checked: greedy answers equal batch_generate's for the same prompts (chat
and completions, streamed and whole); stop strings cut the answer where
batch_generate's text has them; 16 concurrent streaming clients all finish with the
right answers; a client that disconnects mid-stream has its slot free within the
engine's next step; every bad input in BAD_INPUTS gets a 4xx with OpenAI's error
object; past max_waiting requests get 503 with Retry-After; /metrics counts what was
served; a missing or wrong API key gets 401; an engine whose step raises fails its
requests with the engine's error, and /health says so.
"""

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tiny_llm_base import PromptSpec
from tiny_llm_serve import ServerSettings, create_app

from scripts.commands.ports import free_port

from .cli_runs import ServeCli
from .helpers import TLS, kv_bytes_a_token
from .servers import (
    API_KEY,
    CHAT,
    COMPLETIONS,
    HI,
    MAX_SEQ_LEN,
    MODEL,
    CONSTRAINTS,
    SEA,
    WAIT_S,
    HeldEngine,
    RunningServer,
    broken_server,
    chat_prompt,
    content_pieces,
    wait_idle,
)
from .solution import tiny

ROOT = Path(__file__).resolve().parents[1]
MAX_BODY_BYTES = 64 * 1024
BATCH_SIZE = 8
QUESTIONS = [
    "What is the capital of France?",
    "Name three primary colors.",
    "How many legs does a spider have?",
    "Who wrote Romeo and Juliet?",
]


@pytest.fixture(scope="module")
def model(protocol_model):
    """A random model, its weights as `pdm run serve` takes them ("auto"): these
    tests compare the server's answers with batch_generate's on the same engine."""
    return tiny.Qwen2ModelWeek2(
        protocol_model[0], weights="auto", use_fast_kernels=True
    )


@pytest.fixture(scope="module")
def server(model, protocol_model, want):
    engine = tiny.Engine(
        model,
        protocol_model[1],
        batch_size=BATCH_SIZE,
        max_seq_len=MAX_SEQ_LEN,
        prefill_step=128,
        policy="mixed",
        reserved_interactive_slots=1,
        kv_cache="paged",  # what `pdm run serve` runs on the reference
    )
    settings = ServerSettings(
        MODEL, api_key=API_KEY, max_waiting=64, max_body_bytes=MAX_BODY_BYTES
    )
    held = HeldEngine(engine)
    running = RunningServer(create_app(held, settings, tiny.make_sampler, CONSTRAINTS))
    running.settings, running.engine = settings, held
    yield running
    running.stop()


@pytest.fixture(scope="module")
def client(server):
    return server.openai_client()


@pytest.fixture
def http(server):
    headers = {"Authorization": f"Bearer {API_KEY}"}
    with httpx.Client(
        base_url=server.url, verify=TLS, headers=headers, timeout=WAIT_S
    ) as c:
        yield c


RAW = "The three largest cities in Europe are"
MAX_TOKENS = 8  # for QUESTIONS
SEA_TOKENS = 8  # enough words: the stop string is the third one


@pytest.fixture(scope="module")
def want(model, tokenizer) -> dict[str, object]:
    """batch_generate's greedy results, by question (chat) or text (raw), computed
    once before the server gets any request."""
    specs = {q: PromptSpec(chat_prompt(tokenizer, q), MAX_TOKENS) for q in QUESTIONS}
    specs[SEA] = PromptSpec(chat_prompt(tokenizer, SEA), SEA_TOKENS)
    specs[RAW] = PromptSpec(list(tokenizer.encode(RAW)), MAX_TOKENS)
    results = tiny.batch_generate(
        model, tokenizer, list(specs.values()), batch_size=len(specs)
    )
    return dict(zip(specs, results))


def openai_reason(result) -> str:
    return {"stop": "stop", "length": "length"}[result.finish_reason]


def scrape(http) -> dict[str, float]:
    """/metrics as {sample name with labels: value}."""
    samples = {}
    for family in text_string_to_metric_families(http.get("/metrics").text):
        for sample in family.samples:
            labels = ",".join(f"{k}={v}" for k, v in sorted(sample.labels.items()))
            samples[f"{sample.name}{{{labels}}}" if labels else sample.name] = (
                sample.value
            )
    return samples


# Answers: the server's greedy tokens are batch_generate's.


def test_chat_answers_equal_batch_generate(client, tokenizer, want):
    for question in QUESTIONS[:2]:
        result, prompt = want[question], chat_prompt(tokenizer, question)
        reply = client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": question}],
            max_tokens=MAX_TOKENS,
            temperature=0,
        )
        choice = reply.choices[0]
        assert choice.message.role == "assistant"
        assert choice.message.content == result.text
        assert choice.finish_reason == openai_reason(result)
        assert reply.usage.completion_tokens == len(result.tokens)
        assert reply.usage.prompt_tokens == len(prompt)
        assert reply.usage.total_tokens == len(prompt) + len(result.tokens)
        assert reply.usage.prompt_tokens_details.cached_tokens >= 0
        assert reply.model == MODEL


def test_streamed_chat_equals_batch_generate_with_usage(client, want):
    question = QUESTIONS[2]
    chunks = list(
        client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": question}],
            max_tokens=MAX_TOKENS,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == want[question].text
    assert chunks[0].choices[0].delta.role == "assistant"
    reasons = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert reasons[-1] == openai_reason(want[question])
    assert set(reasons[:-1]) == {None}
    assert len(chunks[-1].choices) == 0, "include_usage ends with a usage-only chunk"
    assert chunks[-1].usage.completion_tokens == len(want[question].tokens)
    assert len({c.id for c in chunks}) == 1


def test_completions_use_the_raw_prompt(client, tokenizer, want):
    ids = list(tokenizer.encode(RAW))
    reply = client.completions.create(
        model=MODEL, prompt=RAW, max_tokens=MAX_TOKENS, temperature=0
    )
    assert reply.choices[0].text == want[RAW].text
    assert reply.usage.prompt_tokens == len(ids)
    streamed = client.completions.create(
        model=MODEL, prompt=ids, max_tokens=MAX_TOKENS, temperature=0, stream=True
    )
    assert "".join(c.choices[0].text for c in streamed if c.choices) == want[RAW].text


@pytest.mark.parametrize("stream", [False, True])
def test_stop_strings_cut_the_answer(stream, client, want, http):
    full = want[SEA].text
    words = full.split()
    assert len(words) >= 4, f"the answer is too short to cut: {full!r}"
    stop = " " + words[2]
    reply = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": SEA}],
        max_tokens=SEA_TOKENS,
        temperature=0,
        stop=[stop, "no such text"],
        stream=stream,
    )
    if stream:
        chunks = [c for c in reply if c.choices]
        text = "".join(c.choices[0].delta.content or "" for c in chunks)
        reason = chunks[-1].choices[0].finish_reason
    else:
        text, reason = reply.choices[0].message.content, reply.choices[0].finish_reason
    assert text == full[: full.index(stop)]
    assert reason == "stop"
    wait_idle(http)


def test_sampling_with_temperature_answers(client):
    reply = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Say hi."}],
        max_tokens=4,
        temperature=0.8,
        top_p=0.9,
        extra_body={"top_k": 20},
    )
    assert reply.choices[0].finish_reason in ("stop", "length")
    assert 1 <= reply.usage.completion_tokens <= 4


def test_sixteen_concurrent_streaming_clients(server, want, http):
    wait_idle(http)
    aclient = openai.AsyncOpenAI(
        base_url=server.url + "/v1", api_key=API_KEY, max_retries=0, timeout=WAIT_S
    )

    async def one(question: str) -> tuple[str, str]:
        stream = await aclient.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": question}],
            max_tokens=MAX_TOKENS,
            temperature=0,
            stream=True,
        )
        text, reason = "", None
        async for chunk in stream:
            if chunk.choices:
                text += chunk.choices[0].delta.content or ""
                reason = chunk.choices[0].finish_reason or reason
        return text, reason

    async def all_of_them():
        try:
            return await asyncio.gather(*(one(QUESTIONS[i % 4]) for i in range(16)))
        finally:
            await aclient.close()

    answers = asyncio.run(asyncio.wait_for(all_of_them(), WAIT_S))
    for number, (text, reason) in enumerate(answers):
        result = want[QUESTIONS[number % 4]]
        assert text == result.text, f"client {number}"
        assert reason == openai_reason(result), f"client {number}"
    wait_idle(http)


def test_a_client_that_disconnects_has_its_request_aborted(server, http):
    """The disconnect aborts the request: its slot frees, the abort is counted, and
    it stops far short of its 400 tokens. The engine is held after 8 steps, so the
    request is surely still running when the client looks and leaves; how many
    steps run between the close and the server's reading it depends on the load,
    so the test bounds the tokens, not the steps."""
    wait_idle(http)
    before = scrape(http)
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "Tell me a very long story."}],
        "max_tokens": 400,
        "temperature": 0,
        "stream": True,
    }
    with server.engine.held_after(8):
        with http.stream("POST", "/v1/chat/completions", json=body) as response:
            assert response.status_code == 200
            lines = response.iter_lines()
            content_pieces(lines, 3)
            busy = http.get("/engine").json()
            assert busy["running"] == 1, json.dumps(busy)
    # The connection is closed here: the step after the server sees it aborts it.
    wait_idle(http)
    after = scrape(http)
    aborted = "tiny_llm:request_success_total{finished_reason=abort}"
    assert after[aborted] - before[aborted] == 1
    generated = after["tiny_llm:generation_tokens_total"]
    assert generated - before["tiny_llm:generation_tokens_total"] < 50


def test_metrics_count_what_was_served(client, http, model):
    wait_idle(http)
    before = scrape(http)
    replies = [
        client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": q}],
            max_tokens=5,
            temperature=0,
        )
        for q in QUESTIONS[:3]
    ]
    wait_idle(http)
    after = scrape(http)

    def delta(name: str) -> float:
        return after[name] - before.get(name, 0.0)

    completion = [r.usage.completion_tokens for r in replies]
    prefilled = sum(
        r.usage.prompt_tokens - r.usage.prompt_tokens_details.cached_tokens
        for r in replies
    )
    assert delta("tiny_llm:generation_tokens_total") == sum(completion)
    assert delta("tiny_llm:prompt_tokens_total") == prefilled
    assert delta("tiny_llm:time_to_first_token_seconds_count") == 3
    assert delta("tiny_llm:e2e_request_latency_seconds_count") == 3
    assert delta("tiny_llm:inter_token_latency_seconds_count") == sum(
        n - 1 for n in completion
    )
    finished = sum(
        delta(f"tiny_llm:request_success_total{{finished_reason={reason}}}")
        for reason in ("stop", "length")
    )
    assert finished == 3
    assert delta("tiny_llm:prefill_chunks_total") >= 3
    assert delta("tiny_llm:decode_steps_total") >= max(completion) - 1
    assert after["tiny_llm:num_requests_running"] == 0
    assert after["tiny_llm:num_requests_waiting"] == 0
    assert after["tiny_llm:mlx_active_memory_bytes"] > 0
    # The default budget (half the available memory), in whole blocks; the pool's
    # arrays hold some of it once requests have run, never more than all of it.
    budget = after["tiny_llm:kv_budget_tokens"]
    assert budget >= MAX_SEQ_LEN and budget % 16 == 0
    pool = after["tiny_llm:kv_pool_bytes"]
    assert 0 < pool <= budget * kv_bytes_a_token(model)


def test_a_repeated_prompt_is_served_from_the_prefix_cache(client, tokenizer, http):
    """The second time, the prompt's full blocks come from the prefix cache: usage
    says how many tokens, and /metrics counts them as hits."""
    question = "Describe a lighthouse in one sentence, please, in plain words."
    prompt = chat_prompt(tokenizer, question)
    wait_idle(http)
    before = scrape(http)
    replies = [
        client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": question}],
            max_tokens=3,
            temperature=0,
        )
        for _ in range(2)
    ]
    wait_idle(http)
    after = scrape(http)
    cached = replies[1].usage.prompt_tokens_details.cached_tokens
    assert 0 < cached < len(prompt)
    assert (
        replies[0].choices[0].message.content == replies[1].choices[0].message.content
    )
    hits = "tiny_llm:prefix_cache_hits_total"
    queries = "tiny_llm:prefix_cache_queries_total"
    assert after[hits] - before[hits] == sum(
        r.usage.prompt_tokens_details.cached_tokens for r in replies
    )
    assert after[queries] - before[queries] == 2 * len(prompt)


# Refusals.


def long_text(tokens_at_least: int) -> str:
    return "word " * tokens_at_least


# (name, method, path, body (a dict, or raw bytes), status, param the error names)
BAD_INPUTS = [
    ("malformed JSON", "POST", CHAT, b'{"messages": [', 400, None),
    ("body not an object", "POST", CHAT, b"[1, 2]", 400, None),
    (
        "NaN temperature",
        "POST",
        CHAT,
        b'{"messages": [{"role": "user", "content": "Hi"}], "temperature": NaN}',
        400,
        "temperature",
    ),  # fmt: skip
    ("messages missing", "POST", CHAT, {"max_tokens": 3}, 400, "messages"),
    ("messages empty", "POST", CHAT, {"messages": []}, 400, "messages"),
    ("messages not a list", "POST", CHAT, {"messages": "Hi"}, 400, "messages"),
    ("message not an object", "POST", CHAT, {"messages": ["Hi"]}, 400, "messages[0]"),
    (
        "unknown role",
        "POST",
        CHAT,
        {"messages": [{"role": "wizard", "content": "Hi"}]},
        400,
        "messages[0].role",
    ),  # fmt: skip
    (
        "function role (OpenAI's old name for tool results)",
        "POST",
        CHAT,
        {"messages": [{"role": "function", "content": "1"}]},
        400,
        "messages[0].role",
    ),  # fmt: skip
    (
        "content a number",
        "POST",
        CHAT,
        {"messages": [{"role": "user", "content": 7}]},
        400,
        "messages[0].content",
    ),  # fmt: skip
    (
        "image content",
        "POST",
        CHAT,
        {
            "messages": [
                {
                    "role": "user",
                    "content": [{"type": "image_url", "image_url": {"url": "x"}}],
                }
            ]
        },
        400,
        "messages[0].content[0]",
    ),  # fmt: skip
    ("n = 0", "POST", CHAT, {"messages": HI, "n": 0}, 400, "n"),
    (
        "max_tokens 0",
        "POST",
        CHAT,
        {"messages": HI, "max_tokens": 0},
        400,
        "max_tokens",
    ),
    (
        "max_tokens negative",
        "POST",
        CHAT,
        {"messages": HI, "max_tokens": -5},
        400,
        "max_tokens",
    ),  # fmt: skip
    (
        "max_tokens a string",
        "POST",
        CHAT,
        {"messages": HI, "max_tokens": "ten"},
        400,
        "max_tokens",
    ),  # fmt: skip
    (
        "max_tokens a float",
        "POST",
        CHAT,
        {"messages": HI, "max_tokens": 2.5},
        400,
        "max_tokens",
    ),  # fmt: skip
    (
        "max_completion_tokens 0",
        "POST",
        CHAT,
        {"messages": HI, "max_completion_tokens": 0},
        400,
        "max_completion_tokens",
    ),  # fmt: skip
    (
        "temperature negative",
        "POST",
        CHAT,
        {"messages": HI, "temperature": -0.5},
        400,
        "temperature",
    ),  # fmt: skip
    (
        "temperature above 2",
        "POST",
        CHAT,
        {"messages": HI, "temperature": 3},
        400,
        "temperature",
    ),  # fmt: skip
    (
        "temperature a string",
        "POST",
        CHAT,
        {"messages": HI, "temperature": "hot"},
        400,
        "temperature",
    ),  # fmt: skip
    ("top_p 0", "POST", CHAT, {"messages": HI, "top_p": 0}, 400, "top_p"),
    ("top_p above 1", "POST", CHAT, {"messages": HI, "top_p": 1.5}, 400, "top_p"),
    ("top_k -2", "POST", CHAT, {"messages": HI, "top_k": -2}, 400, "top_k"),
    ("stop not text", "POST", CHAT, {"messages": HI, "stop": 5}, 400, "stop"),
    (
        "five stop strings",
        "POST",
        CHAT,
        {"messages": HI, "stop": list("abcde")},
        400,
        "stop",
    ),  # fmt: skip
    (
        "stream not a boolean",
        "POST",
        CHAT,
        {"messages": HI, "stream": "yes"},
        400,
        "stream",
    ),  # fmt: skip
    (
        "stream_options without stream",
        "POST",
        CHAT,
        {"messages": HI, "stream_options": {"include_usage": True}},
        400,
        "stream_options",
    ),  # fmt: skip
    (
        "unknown priority",
        "POST",
        CHAT,
        {"messages": HI, "priority": "urgent"},
        400,
        "priority",
    ),  # fmt: skip
    (
        "top_logprobs past 20",
        "POST",
        CHAT,
        {"messages": HI, "logprobs": True, "top_logprobs": 50},
        400,
        "top_logprobs",
    ),  # fmt: skip
    (
        "top_logprobs without logprobs",
        "POST",
        CHAT,
        {"messages": HI, "top_logprobs": 2},
        400,
        "top_logprobs",
    ),  # fmt: skip
    (
        "logit_bias with a token id outside the vocabulary",
        "POST",
        CHAT,
        {"messages": HI, "logit_bias": {"1000000": 5}},
        400,
        "logit_bias",
    ),  # fmt: skip
    (
        "logit_bias past 100",
        "POST",
        CHAT,
        {"messages": HI, "logit_bias": {"7": 101}},
        400,
        "logit_bias",
    ),  # fmt: skip
    (
        "logit_bias keyed by a word",
        "POST",
        CHAT,
        {"messages": HI, "logit_bias": {"hello": 1}},
        400,
        "logit_bias",
    ),  # fmt: skip
    (
        "min_tokens past max_tokens",
        "POST",
        CHAT,
        {"messages": HI, "max_tokens": 2, "min_tokens": 3},
        400,
        "min_tokens",
    ),  # fmt: skip
    (
        "repetition_penalty 0",
        "POST",
        CHAT,
        {"messages": HI, "repetition_penalty": 0},
        400,
        "repetition_penalty",
    ),  # fmt: skip
    (
        "tools",
        "POST",
        CHAT,
        {"messages": HI, "tools": [{"type": "function"}]},
        400,
        "tools",
    ),  # fmt: skip
    ("seed a string", "POST", CHAT, {"messages": HI, "seed": "1"}, 400, "seed"),
    (
        "presence_penalty past 2",
        "POST",
        CHAT,
        {"messages": HI, "presence_penalty": 3},
        400,
        "presence_penalty",
    ),  # fmt: skip
    ("unknown model", "POST", CHAT, {"model": "gpt-9", "messages": HI}, 404, "model"),
    ("model not a string", "POST", CHAT, {"model": 3, "messages": HI}, 400, "model"),
    (
        "prompt longer than the context",
        "POST",
        CHAT,
        {"messages": [{"role": "user", "content": long_text(MAX_SEQ_LEN)}]},
        400,
        "messages",
    ),  # fmt: skip
    (
        "prompt + max_tokens past the context",
        "POST",
        CHAT,
        {"messages": HI, "max_tokens": MAX_SEQ_LEN},
        400,
        "messages",
    ),  # fmt: skip
    (
        "body too large",
        "POST",
        CHAT,
        {"messages": [{"role": "user", "content": "x" * MAX_BODY_BYTES}]},
        413,
        None,
    ),  # fmt: skip
    (
        "completion prompt missing",
        "POST",
        COMPLETIONS,
        {"max_tokens": 3},
        400,
        "prompt",
    ),
    ("completion prompt empty", "POST", COMPLETIONS, {"prompt": ""}, 400, "prompt"),
    (
        "two completion prompts",
        "POST",
        COMPLETIONS,
        {"prompt": ["a", "b"]},
        400,
        "prompt",
    ),  # fmt: skip
    (
        "token id outside the vocabulary",
        "POST",
        COMPLETIONS,
        {"prompt": [1, 10**9]},
        400,
        "prompt",
    ),  # fmt: skip
    ("token id a float", "POST", COMPLETIONS, {"prompt": [1, 2.5]}, 400, "prompt"),
    ("echo on chat", "POST", CHAT, {"messages": HI, "echo": True}, 400, "echo"),
    ("completion n = 17", "POST", COMPLETIONS, {"prompt": "a", "n": 17}, 400, "n"),
    (
        "completion logprobs past 5",
        "POST",
        COMPLETIONS,
        {"prompt": "a", "logprobs": 6},
        400,
        "logprobs",
    ),  # fmt: skip
    (
        "completion max_tokens 0 without echo",
        "POST",
        COMPLETIONS,
        {"prompt": "a", "max_tokens": 0},
        400,
        "max_tokens",
    ),  # fmt: skip
    ("GET on a POST endpoint", "GET", CHAT, None, 405, None),
    ("unknown path", "POST", "/v1/embeddings", {"input": "a"}, 404, None),
]


def test_there_are_at_least_twenty_bad_input_cases():
    assert len(BAD_INPUTS) >= 20


@pytest.mark.parametrize(
    "name, method, path, body, status, param",
    BAD_INPUTS,
    ids=[c[0] for c in BAD_INPUTS],
)
def test_bad_input_gets_an_openai_error(http, name, method, path, body, status, param):
    if isinstance(body, bytes):
        response = http.request(
            method, path, content=body, headers={"Content-Type": "application/json"}
        )
    else:
        response = http.request(method, path, json=body)
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert isinstance(error["message"], str) and len(error["message"]) > 10
    assert "Traceback" not in response.text
    assert error["param"] == param
    assert error["type"] in ("invalid_request_error", "not_found_error")


def test_the_context_error_names_both_lengths(http, tokenizer):
    content = long_text(MAX_SEQ_LEN)
    prompt = chat_prompt(tokenizer, content)
    response = http.post(
        CHAT, json={"messages": [{"role": "user", "content": content}]}
    )
    message = response.json()["error"]["message"]
    assert str(len(prompt)) in message and str(MAX_SEQ_LEN) in message
    assert response.json()["error"]["code"] == "context_length_exceeded"


def test_refused_requests_never_reach_the_engine(http):
    wait_idle(http)
    before, counted = http.get("/engine").json()["total"], scrape(http)
    http.post(CHAT, json={"messages": HI, "n": 0})
    assert http.get("/engine").json()["total"] == before
    rejected = "tiny_llm:request_rejected_total{reason=bad_request}"
    assert scrape(http)[rejected] - counted[rejected] == 1


def test_past_max_waiting_requests_get_503_with_retry_after(server, http):
    wait_idle(http)
    rejected = "tiny_llm:request_rejected_total{reason=busy}"
    before = scrape(http)[rejected]
    server.settings.max_waiting = 2
    body = {"model": MODEL, "messages": HI, "max_tokens": 2, "temperature": 0}
    headers = {"Authorization": f"Bearer {API_KEY}"}

    async def burst():
        async with httpx.AsyncClient(
            base_url=server.url, headers=headers, timeout=WAIT_S
        ) as c:
            return await asyncio.gather(*(c.post(CHAT, json=body) for _ in range(10)))

    try:
        responses = asyncio.run(asyncio.wait_for(burst(), WAIT_S))
    finally:
        server.settings.max_waiting = 64
    busy = [r for r in responses if r.status_code == 503]
    served = [r for r in responses if r.status_code == 200]
    assert len(busy) + len(served) == 10
    assert busy and len(served) >= 2
    for response in busy:
        assert response.headers["Retry-After"].isdigit()
        assert response.json()["error"]["type"] == "server_busy"
    assert scrape(http)[rejected] - before == len(busy)
    wait_idle(http)


def test_a_missing_or_wrong_api_key_gets_401(server):
    with httpx.Client(base_url=server.url, verify=TLS, timeout=WAIT_S) as bare:
        for headers in (
            {},
            {"Authorization": "Bearer wrong"},
            {"Authorization": API_KEY},
        ):
            response = bare.post(CHAT, json={"messages": HI}, headers=headers)
            assert response.status_code == 401
            assert response.json()["error"]["type"] == "authentication_error"
        assert bare.get("/v1/models").status_code == 401
        assert bare.get("/health").status_code == 200
        assert bare.get("/metrics").status_code == 401
    wrong = openai.OpenAI(base_url=server.url + "/v1", api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        wrong.models.list()


def test_models_health_and_chat_page(client, http):
    assert [m.id for m in client.models.list()] == [MODEL]
    assert http.get("/health").json() == {"status": "ok"}
    page = http.get("/")
    assert page.status_code == 200 and "/v1/chat/completions" in page.text
    assert "<script src" not in page.text, "the page loads nothing from elsewhere"
    for kind in ("json_object", "json_schema"):  # it can ask for a JSON answer
        assert (
            f'<option value="{kind}">' in page.text and "response_format" in page.text
        )


# An engine whose step raises: its requests fail with the engine's error.


def test_an_engine_that_raises_fails_its_requests_and_health(tokenizer, model):
    with broken_server(tokenizer, model.vocab_size) as running:
        broken = running.openai_client(api_key="none")
        stream = broken.chat.completions.create(
            model=MODEL, messages=HI, max_tokens=2, stream=True
        )
        with pytest.raises(openai.APIError, match="Week 2 Day 6"):
            list(stream)
        with httpx.Client(base_url=running.url, verify=TLS, timeout=WAIT_S) as c:
            assert c.get("/health").status_code == 503
            again = c.post(CHAT, json={"messages": HI, "max_tokens": 2})
            assert again.status_code == 503
            assert "Week 2 Day 6" in again.json()["error"]["message"]
            assert "restart" in again.json()["error"]["message"]


@pytest.mark.parametrize(
    "arguments, complaint",
    [
        (["--batch-size", "0"], "--batch-size must be at least 1"),
        (["--policy", "alternate", "--token-budget", "64"], "add --policy mixed"),
        (["--max-num-partial-prefills", "0"], "must be a number of at least 1"),
        (
            ["--policy", "alternate", "--max-long-partial-prefills", "1"],
            "limits a mixed step",
        ),
        (
            [
                "--long-prefill-token-threshold",
                "none",
                "--long-prefill-attention-budget",
                "4096",
            ],
            "no prompt is long",
        ),
        (
            ["--long-prefill-attention-budget", "0"],
            "--long-prefill-attention-budget must be a number of at least 1",
        ),
        (["--batch-patience", "nan"], "--batch-patience must be a finite number"),
        (["--batch-patience", "-1"], "--batch-patience must be at least 0"),
        (["--solution", "mine"], "choose ref or learner"),
        (["--api-key", " "], "--api-key is empty"),
    ],
)
def test_serve_refuses_bad_options_with_one_line(arguments, complaint):
    result = subprocess.run(
        [sys.executable, "-m", "scripts.commands.serve", *arguments],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=WAIT_S,
    )
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [result.stderr.strip()]
    assert result.stderr.startswith("error: ") and complaint in result.stderr


# The KV budget: how many tokens fit, said at start-up and in /metrics.


def test_serve_says_and_reports_how_many_tokens_its_kv_memory_holds(
    embedded_week2_model,
):
    # The CLI serves the embedded model, its weights "auto" as here.
    per_token = kv_bytes_a_token(embedded_week2_model(True, "auto", tiny))
    blocks = 64 * 2**20 // (per_token * 16)
    port = free_port()
    options = ["--port", str(port), "--max-seq-len", "512", "--batch-size", "2",
               "--kv-memory", "64MiB"]  # fmt: skip
    with ServeCli(*options) as server:
        said = server.wait_for("KV cache:")
        assert said == (
            f"KV cache: paged, budget 64.0 MiB = {blocks * 16:,} tokens ({blocks:,} "
            f"blocks of 16) at {per_token:,} bytes a token; the pool grows as it is "
            "used\n"
        )
        server.wait_for("serving")
        with httpx.Client(
            base_url=f"http://127.0.0.1:{port}", verify=TLS, timeout=WAIT_S
        ) as c:
            before = scrape(c)
            assert before["tiny_llm:kv_budget_tokens"] == blocks * 16
            assert before["tiny_llm:kv_pool_bytes"] == 0  # nothing written yet
            reply = c.post(CHAT, json={"messages": HI, "max_tokens": 2})
            assert reply.status_code == 200, reply.text
            # The step's metrics are recorded before its tokens reach the client.
            pool = scrape(c)["tiny_llm:kv_pool_bytes"]
        # The pool grew by whole blocks, and stays within the budget.
        assert 0 < pool and pool % (per_token * 16) == 0
        assert pool <= blocks * 16 * per_token <= 64 * 2**20
        server.process.terminate()
        server.process.wait(timeout=WAIT_S)
    assert "Traceback" not in server.log


def test_metrics_give_a_dense_cache_budget_and_no_pool(model, tokenizer):
    engine = tiny.Engine(
        model, tokenizer, batch_size=2, max_seq_len=64, kv_cache="dense"
    )
    app = create_app(engine, ServerSettings(MODEL), tiny.make_sampler, CONSTRAINTS)
    running = RunningServer(app)
    try:
        with httpx.Client(base_url=running.url, verify=TLS, timeout=WAIT_S) as c:
            samples = scrape(c)
    finally:
        running.stop()
    assert samples["tiny_llm:kv_budget_tokens"] == 2 * 64
    assert samples["tiny_llm:kv_pool_bytes"] == 0
    per_token = kv_bytes_a_token(model)
    assert samples["tiny_llm:kv_bytes_per_token{kv_dtype=float32}"] == per_token


def test_metrics_give_an_int8_pool_its_tokens_and_bytes(model, tokenizer):
    """An int8 pool: 64 + 2 x 2 x 4 bytes for each head's 64 numbers, against 256 in
    float32, so the same kv_memory holds 3.2x the tokens."""
    per_token = kv_bytes_a_token(model) * 80 // 256
    engine = tiny.Engine(
        model,
        tokenizer,
        batch_size=2,
        max_seq_len=64,
        kv_cache="paged",
        kv_memory="16MiB",
        kv_dtype="int8",
    )
    app = create_app(engine, ServerSettings(MODEL), tiny.make_sampler, CONSTRAINTS)
    running = RunningServer(app)
    try:
        with httpx.Client(base_url=running.url, verify=TLS, timeout=WAIT_S) as c:
            samples = scrape(c)
    finally:
        running.stop()
    assert samples["tiny_llm:kv_bytes_per_token{kv_dtype=int8}"] == per_token
    blocks = 16 * 2**20 // (per_token * 16)
    assert samples["tiny_llm:kv_budget_tokens"] == blocks * 16
    by_dtype = "tiny_llm:kv_budget_tokens_by_dtype{kv_dtype=%s}"
    assert samples[by_dtype % "int8"] == blocks * 16
    f32_blocks = blocks * 16 * per_token // (kv_bytes_a_token(model) * 16)
    assert samples[by_dtype % "float32"] == f32_blocks * 16
