"""Structured outputs measured: `pdm run bench-structured` (week 3 day 5).

pdm run bench-structured              # the goals, met or missed
pdm run bench-structured --quick      # 12 schemas, shorter timing runs
pdm run bench-structured --no-peer    # without mlx_lm.server

Validity: the 52 schemas of scripts/bench/benchlib/schemas.py, each asked for in
words with the schema in the prompt, greedy, sent 8 at a time as OpenAI requests
with response_format json_schema (strict) to our server and to mlx_lm.server (the
peer, which ignores response_format), both on the embedded model in float32. An
answer is valid when it parses and validates (jsonschema); "lenient" also strips a
```json fence first. Goal: 100% valid for ours.

Overhead: 8 requests decoding side by side on our Engine (the mixed policy,
in-process), each exactly 48 tokens (greedy with EOS banned, so every step has 8
rows): unconstrained; under a JSON schema (llguidance's masks); under a permissive
regex (the course's token index, warm). Time per output token: the median step
whose 8 rows each decode one token, over 8 (the median resists the other work on
this shared machine); each kind runs 3 times (--quick: 1), the kinds in turn, the
fastest kept. Goal: constrained within 10% of unconstrained.

Cold states: the first use of a state of the course's TokenIndex walks the whole
vocabulary's trie (once per state and constraint, then kept): its cost for a
permissive pattern, beside the warm lookup and llguidance's first mask.

Jump-forward: JUMP_REQUESTS customer records under a schema whose fixed keys are
long (LONG_KEYS; through llguidance) and under the same shape as a course regex,
BATCH_JUMP at a time, greedy, EOS ending each: end-to-end seconds with and without
EngineConfig.jump_forward (the kinds and settings in turn, each --repeats times, the
fastest kept), and the tokens compared. Goal: at least 1.3x faster, tokens
identical.
"""

from scripts.commands.interrupt import exit_on_interrupt

exit_on_interrupt()  # first: Ctrl-C during the imports below never shows a traceback

import tiny_llm_base  # noqa: F401  (first: the fast BLAS before mlx.core)

# isort: split
import json
import statistics

import jsonschema
import mlx.core as mx
from rich.markup import escape

from scripts.bench.benchlib import servers
from scripts.bench.benchlib.course import course, run_benchmark
from scripts.bench.benchlib.harness import Bench, clocked
from scripts.bench.benchlib.goals import at_least, identical
from scripts.bench.benchlib.harness import interleaved
from scripts.bench.benchlib.runners import run_to_end
from scripts.bench.benchlib.schemas import MAX_TOKENS, SUITE, obj
from scripts.commands.ports import free_port
from tiny_llm_base import JsonSchema, PromptSpec
from tiny_llm_base.mlx_lm_reference import chat_ids
from tiny_llm_base.structured import guidance_tokenizer

BATCH = 8
TOKENS = 48  # per request in the overhead runs
STORY = obj({"story": {"type": "string", "minLength": 2000}})
PERMISSIVE = r"[A-Za-z0-9 ,.;:'\-]+"
TOPICS = ["a dragon", "the sea", "a robot", "a city", "winter", "a garden", "a train"]
LONG_KEYS = obj(  # most of an answer is its keys: what jump-forward skips
    {
        "customer_full_name": {"type": "string", "maxLength": 24},
        "customer_shipping_address_first_line": {"type": "string", "maxLength": 32},
        "number_of_orders_placed_this_year": {
            "type": "integer",
            "minimum": 0,
            "maximum": 999,
        },
        "customer_has_an_active_loyalty_membership": {"type": "boolean"},
    }
)
LONG_KEYS_PATTERN = (
    r'\{"customer_full_name": "[A-Z][a-z]{1,10}( [A-Z][a-z]{1,12})?", '
    r'"customer_shipping_address_first_line": "[0-9]{1,4}( [A-Z][a-z]{1,12}){1,3}", '
    r'"number_of_orders_placed_this_year": [0-9]{1,3}, '
    r'"customer_has_an_active_loyalty_membership": (true|false)\}'
)
JUMP_REQUESTS, BATCH_JUMP = 4, 4
CUSTOMERS = ["a bakery", "a bookshop", "a garage", "a florist"]


def question(request: str, schema: dict) -> str:
    return (
        f"{request} Reply with JSON only, following this JSON Schema: "
        f"{json.dumps(schema)}"
    )


def verdict(schema: dict, text: str) -> tuple[bool, bool]:
    """(valid as sent, valid once a ```json fence is stripped)."""

    def valid(candidate: str) -> bool:
        try:
            jsonschema.validate(json.loads(candidate), schema)
        except (json.JSONDecodeError, jsonschema.ValidationError):
            return False
        return True

    fenced = text.strip().removeprefix("```json").removeprefix("```")
    fenced = fenced.removesuffix("```").strip()
    return valid(text), valid(text) or valid(fenced)


def share(answers: list[dict], key: str) -> float:
    """The share of answers valid (key "valid") or valid once unfenced ("lenient")."""
    return sum(a.get(key, False) for a in answers) / len(answers)


def body(request: str, schema: dict) -> dict:
    """The chat request for one schema, greedy, under response_format json_schema."""
    return {
        "messages": [{"role": "user", "content": question(request, schema)}],
        "max_tokens": MAX_TOKENS,
        "temperature": 0,
        "response_format": {
            "type": "json_schema",
            "json_schema": {"name": "answer", "schema": schema, "strict": True},
        },
    }


def graded(name: str, schema: dict, response, seconds: float) -> dict:
    """One answer: its text and whether it is valid as sent and once unfenced."""
    if response.status_code != 200:
        return dict(name=name, text="", error=response.text, seconds=seconds)
    text = response.json()["choices"][0]["message"]["content"]
    strict, lenient = verdict(schema, text)
    return dict(name=name, text=text, valid=strict, lenient=lenient, s=seconds)


def validity(suite: list, peer: bool) -> dict:
    """Our server and (peer) mlx_lm.server on the suite, BATCH requests at a time."""
    options = ("--batch-size", str(BATCH))
    starts = {"tiny-llm": lambda port: servers.ours(port, course.solution, *options)}
    if peer:
        starts["mlx_lm.server"] = lambda port: servers.peer(port, BATCH, float32=True)
    out = {}
    for name, start in starts.items():
        with start(free_port()) as server:
            bodies = [body(request, schema) for _, schema, request in suite]
            replies, seconds = clocked(server.chat, bodies, BATCH)
        answers = [graded(n, sc, *reply) for (n, sc, _), reply in zip(suite, replies)]
        out[name] = dict(answers=answers, seconds=seconds)
    return out


def timed_batch(model, tokenizer, sampler, constraint, tokens: int) -> float:
    """The median step of 8 decode rows (every request past its first token, each
    accepting one), in ms per output token. sampler: greedy with EOS never chosen,
    so every step has all BATCH rows, constrained or not."""
    stories = [f"Write a long story about {t}." for t in (TOPICS * 2)[:BATCH]]
    prompts = [chat_ids(tokenizer, story) for story in stories]
    engine = course.Engine(
        model, tokenizer, batch_size=BATCH, policy="mixed", sampler=sampler
    )
    specs = [PromptSpec(p, max_tokens=tokens, constraint=constraint) for p in prompts]
    started, steps = set(), []

    def step(engine, outputs, seconds: float) -> None:
        if len(started) == BATCH and [len(o.tokens) for o in outputs] == [1] * BATCH:
            steps.append(seconds)
        started.update(o.request_id for o in outputs if o.tokens)

    run_to_end(engine, specs, step)
    return 1000 * statistics.median(steps) / BATCH


def overhead(model, tokenizer, sampler, tokens: int, repeats: int) -> dict:
    """Fastest of `repeats` runs of each kind, the kinds taken in turn."""
    kinds = {
        "unconstrained": None,
        "JSON schema": JsonSchema(STORY),
        "regex (course)": course.Regex(PERMISSIVE),
    }
    for constraint in kinds.values():  # warm: the regex's states, the kernels
        timed_batch(model, tokenizer, sampler, constraint, 4)
    runs = interleaved(
        {
            kind: lambda c=constraint: timed_batch(model, tokenizer, sampler, c, tokens)
            for kind, constraint in kinds.items()
        },
        repeats,
    )
    return {kind: min(ms) for kind, ms in runs.items()}


def cold_states(tokenizer, vocab_size: int) -> dict:
    """The course TokenIndex's first and second allowed() of permissive states, and
    llguidance's first mask, in ms; the Vocabulary build once, in s."""
    _, vocabulary_s = clocked(course.vocabulary_of, tokenizer, vocab_size)
    out = dict(vocabulary_s=vocabulary_s, patterns={})
    for pattern in (r".*", PERMISSIVE, r"[a-z]+( [a-z]+)*", r'"[^"]*"'):
        regex = course.Regex(pattern)
        state, cold = clocked(course.start_constraint, regex, tokenizer, vocab_size)
        allowed, warm = clocked(state.allowed)
        out["patterns"][pattern] = dict(
            cold_ms=1000 * cold, warm_ms=1000 * warm, allowed=allowed.count
        )
    _, out["llguidance_tokenizer_s"] = clocked(
        guidance_tokenizer, tokenizer, vocab_size
    )
    _, start_s = clocked(lambda: JsonSchema(STORY).start(tokenizer, vocab_size))
    out["llguidance_start_ms"] = 1000 * start_s
    return out


def jump_forward(model, tokenizer, repeats: int) -> dict:
    """Seconds end to end without and with jump_forward, per kind of constraint,
    the fastest of `repeats` (the settings in turn); forced drafts proposed and
    accepted; whether the tokens are the same."""
    asks = [f"Make up one customer of {c} as JSON." for c in CUSTOMERS[:JUMP_REQUESTS]]
    prompts = [chat_ids(tokenizer, ask) for ask in asks]
    kinds = {
        "JSON schema": JsonSchema(LONG_KEYS),
        "regex (course)": course.Regex(LONG_KEYS_PATTERN),
    }
    out = {}
    for kind, constraint in kinds.items():
        specs = [
            PromptSpec(p, max_tokens=MAX_TOKENS, constraint=constraint) for p in prompts
        ]

        def run(jump: bool, specs=specs) -> tuple[list, float]:
            return clocked(
                course.batch_generate, model, tokenizer, specs,
                batch_size=BATCH_JUMP, policy="mixed", jump_forward=jump,
            )  # fmt: skip

        runs = interleaved(
            {jump: lambda j=jump: run(j) for jump in (False, True)}, repeats
        )
        runs = {jump: min(r, key=lambda run: run[1]) for jump, r in runs.items()}
        (plain, plain_s), (jumped, jump_s) = runs[False], runs[True]
        out[kind] = dict(
            plain_s=plain_s,
            jump_s=jump_s,
            speedup=plain_s / jump_s,
            tokens=sum(len(r.tokens) for r in jumped),
            drafts=sum(r.metrics.draft_tokens for r in jumped),
            accepted=sum(r.metrics.accepted_draft_tokens for r in jumped),
            same_tokens=sum(a.tokens == b.tokens for a, b in zip(plain, jumped)),
            valid=sum(r.finish_reason == "stop" for r in jumped),
            requests=len(specs),
        )
    return out


def main() -> int:
    bench = Bench(__doc__, quick=True, out="bench-results/structured.json")
    bench.option("--no-peer", False, "skip mlx_lm.server")
    args = bench.parse()
    console = bench.start()
    suite = SUITE[::4] + SUITE[1:2] if args.quick else SUITE
    models = bench.models()
    model, tokenizer = models.float32, models.tokenizer
    vocab_size = model.vocab_size
    console.print(f"embedded model, float32, vocabulary {vocab_size}")

    cold = cold_states(tokenizer, vocab_size)
    columns = {
        "pattern": lambda pattern, _: escape(pattern),
        "allowed tokens": lambda _, r: str(r["allowed"]),
        "cold ms": lambda _, r: f"{r['cold_ms']:.0f}",
        "warm ms": lambda _, r: f"{r['warm_ms']:.3f}",
    }
    title = "first use of a state (course TokenIndex) vs warm"
    bench.table(title, columns, cold["patterns"])
    console.print(
        f"course vocabulary built once in {cold['vocabulary_s']:.2f} s, llguidance's "
        f"tokenizer in {cold['llguidance_tokenizer_s']:.2f} s; then a schema compiled "
        f"and its first mask: {cold['llguidance_start_ms']:.1f} ms"
    )

    tokens, repeats = (24, 1) if args.quick else (TOKENS, 3)
    ms = overhead(model, tokenizer, models.no_eos, tokens, repeats)
    columns = {
        "kind": lambda kind, _: kind,
        "ms/token": lambda _, value: f"{value:.1f}",
        "vs unconstrained": lambda _, value: f"{value / ms['unconstrained']:.2f}x",
    }
    bench.table(
        f"batch {BATCH}, {tokens} tokens each: time per output token", columns, ms
    )

    jumps = jump_forward(model, tokenizer, repeats=1 if args.quick else 2)
    columns = {
        "kind": lambda kind, _: kind,
        "without s": lambda _, r: f"{r['plain_s']:.1f}",
        "with s": lambda _, r: f"{r['jump_s']:.1f}",
        "speed-up": lambda _, r: f"{r['speedup']:.2f}x",
        "accepted": lambda _, r: f"{r['accepted']}/{r['drafts']}",
        "same": lambda _, r: f"{r['same_tokens']}/{r['requests']}",
    }
    title = f"jump-forward: {JUMP_REQUESTS} customer records, batch {BATCH_JUMP}"
    bench.table(title, columns, jumps)

    valid = validity(suite, peer=not args.no_peer)
    rates = {n: share(run["answers"], "valid") for n, run in valid.items()}
    columns = {
        "server": lambda name, _: name,
        "valid": lambda name, _: f"{rates[name]:.0%}",
        "lenient": lambda _, run: f"{share(run['answers'], 'lenient'):.0%}",
        "seconds": lambda _, run: f"{run['seconds']:.0f}",
    }
    title = f"{len(suite)} schemas, response_format json_schema, greedy"
    bench.table(title, columns, valid)

    ours = valid["tiny-llm"]["answers"]
    invalid = [a["name"] for a in ours if not a.get("valid", False)]
    peer = (
        f"mlx_lm.server: {rates['mlx_lm.server']:.0%}"
        if "mlx_lm.server" in rates
        else "peer not run"
    )
    goals = [
        at_least(
            "answers valid on the schema suite (ours)",
            rates["tiny-llm"],
            1.0,
            f"invalid: {', '.join(invalid) or 'none'}; {peer}",
        )
    ]
    for kind in ("JSON schema", "regex (course)"):
        goals.append(
            at_least(
                f"{kind}: unconstrained time per token / constrained, batch {BATCH}",
                ms["unconstrained"] / ms[kind],
                0.9,
                f"{ms[kind]:.1f} ms vs {ms['unconstrained']:.1f} ms a token",
            )
        )
    for kind, r in jumps.items():
        goals.append(
            at_least(
                f"jump-forward, {kind}, long fixed keys: seconds without / with",
                r["speedup"],
                1.3,
                f"{r['accepted']} of {r['drafts']} forced drafts accepted, "
                f"{r['tokens']} tokens",
            )
        )
        goals.append(
            identical(
                f"jump-forward, {kind}: tokens identical",
                r["same_tokens"],
                r["requests"],
            )
        )
    record = dict(
        quick=args.quick,
        batch=BATCH,
        tokens=tokens,
        peak_memory_mb=mx.get_peak_memory() / 2**20,
        cold_states=cold,
        ms_per_token=ms,
        validity={
            name: dict(rate=rates[name], seconds=run["seconds"], answers=run["answers"])
            for name, run in valid.items()
        },
        jump_forward=jumps,
    )
    return bench.finish(record, goals)


if __name__ == "__main__":
    run_benchmark(main)
