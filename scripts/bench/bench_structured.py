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

import tiny_llm_base  # noqa: F401  (first: the fast BLAS before mlx.core)

# isort: split
import json
import os
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import jsonschema
import mlx.core as mx
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from scripts.bench.bench_serve import Server, float32_folder, free_port
from scripts.bench.benchlib.measure import ratio_goal
from scripts.bench.benchlib.schemas import MAX_TOKENS, SUITE
from scripts.bench.benchlib.course import add_option, course, run_benchmark, use
from scripts.commands.cli import option_parser
from tiny_llm_base import JsonSchema, PromptSpec, load_model
from tiny_llm_base.embedded_model import ensure_embedded_model
from tiny_llm_base.structured import guidance_tokenizer

PEER = (
    "import sys, tiny_llm_base; from mlx_lm.server import main; "
    "sys.argv = ['mlx_lm.server'] + sys.argv[1:]; main()"
)
BATCH = 8
TOKENS = 48  # per request in the overhead runs
STORY = {
    "type": "object",
    "properties": {"story": {"type": "string", "minLength": 2000}},
    "required": ["story"],
    "additionalProperties": False,
}
PERMISSIVE = r"[A-Za-z0-9 ,.;:'\-]+"
TOPICS = ["a dragon", "the sea", "a robot", "a city", "winter", "a garden", "a train"]
LONG_KEYS = {  # most of an answer is its keys: what jump-forward skips
    "type": "object",
    "properties": {
        "customer_full_name": {"type": "string", "maxLength": 24},
        "customer_shipping_address_first_line": {"type": "string", "maxLength": 32},
        "number_of_orders_placed_this_year": {
            "type": "integer",
            "minimum": 0,
            "maximum": 999,
        },
        "customer_has_an_active_loyalty_membership": {"type": "boolean"},
    },
    "required": [
        "customer_full_name",
        "customer_shipping_address_first_line",
        "number_of_orders_placed_this_year",
        "customer_has_an_active_loyalty_membership",
    ],
    "additionalProperties": False,
}
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


def ask_all(url: str, suite: list, constrained: bool) -> list[dict]:
    """Every schema's request, BATCH at a time, greedy."""

    def one(entry) -> dict:
        name, schema, request = entry
        body = {
            "messages": [{"role": "user", "content": question(request, schema)}],
            "max_tokens": MAX_TOKENS,
            "temperature": 0,
        }
        if constrained:
            body["response_format"] = {
                "type": "json_schema",
                "json_schema": {"name": "answer", "schema": schema, "strict": True},
            }
        start = time.perf_counter()
        response = httpx.post(url + "/v1/chat/completions", json=body, timeout=600)
        seconds = time.perf_counter() - start
        if response.status_code != 200:
            return dict(name=name, text="", error=response.text, seconds=seconds)
        text = response.json()["choices"][0]["message"]["content"]
        strict, lenient = verdict(schema, text)
        return dict(name=name, text=text, valid=strict, lenient=lenient, s=seconds)

    with ThreadPoolExecutor(BATCH) as pool:
        return list(pool.map(one, suite))


def validity(suite: list, peer: bool) -> dict:
    """Our server and (peer) mlx_lm.server on the suite."""
    folder = float32_folder(ensure_embedded_model()) if peer else None
    servers = {
        "tiny-llm": lambda port: Server(
            "tiny-llm",
            [
                *(sys.executable, "-m", "scripts.commands.serve"),
                *("--port", str(port), "--batch-size", str(BATCH)),
                *("--solution", course.solution),
            ],
            port,
            "/health",
        )
    }
    if peer:
        servers["mlx_lm.server"] = lambda port: Server(
            "mlx_lm.server",
            [
                *(sys.executable, "-c", PEER, "--model", str(folder)),
                *("--port", str(port)),
                *("--host", "127.0.0.1", "--decode-concurrency", str(BATCH)),
                *("--prompt-concurrency", str(BATCH)),
            ],
            port,
            "/v1/models",
        )
    out = {}
    for name, start in servers.items():
        server = start(free_port())
        try:
            began = time.perf_counter()
            answers = ask_all(server.url, suite, constrained=True)
            out[name] = dict(answers=answers, seconds=time.perf_counter() - began)
        finally:
            server.stop()
    return out


def eos_banned_greedy(tokenizer, vocab_size: int):
    """Greedy with EOS never chosen: every request of a timing run makes all its
    tokens, so every step has all BATCH rows, constrained or not."""
    ban = mx.zeros((vocab_size,))
    ban[list(tokenizer.eos_token_ids)] = -mx.inf

    def sample(logprobs: mx.array) -> mx.array:
        return mx.argmax(logprobs + ban, axis=-1)

    return sample


def timed_batch(model, tokenizer, constraint, tokens: int) -> float:
    """The median step of 8 decode rows (every request past its first token, each
    accepting one), in ms per output token."""
    prompts = [
        tokenizer.apply_chat_template(
            [{"role": "user", "content": f"Write a long story about {t}."}],
            add_generation_prompt=True,
        )
        for t in (TOPICS * 2)[:BATCH]
    ]
    sampler = eos_banned_greedy(tokenizer, model.vocab_size)
    engine = course.Engine(
        model, tokenizer, batch_size=BATCH, policy="mixed", sampler=sampler
    )
    for prompt in prompts:
        engine.add_request(PromptSpec(prompt, max_tokens=tokens, constraint=constraint))
    started, steps = set(), []
    while engine.has_unfinished():
        before = time.perf_counter()
        outputs = engine.step()
        seconds = time.perf_counter() - before
        counts = [len(o.tokens) for o in outputs]
        if len(started) == BATCH and counts == [1] * BATCH:
            steps.append(seconds)
        started |= {o.request_id for o in outputs if o.tokens}
    return 1000 * statistics.median(steps) / BATCH


def overhead(model, tokenizer, tokens: int, repeats: int) -> dict:
    """Fastest of `repeats` runs of each kind, the kinds taken in turn."""
    kinds = {
        "unconstrained": None,
        "JSON schema": JsonSchema(STORY),
        "regex (course)": course.Regex(PERMISSIVE),
    }
    for constraint in kinds.values():  # warm: the regex's states, the kernels
        timed_batch(model, tokenizer, constraint, 4)
    best = {}
    for _ in range(repeats):
        for kind, constraint in kinds.items():
            ms = timed_batch(model, tokenizer, constraint, tokens)
            best[kind] = min(best.get(kind, ms), ms)
    return best


def cold_states(tokenizer, vocab_size: int) -> dict:
    """The course TokenIndex's first and second allowed() of permissive states, and
    llguidance's first mask, in ms; the Vocabulary build once, in s."""
    start = time.perf_counter()
    course.vocabulary_of(tokenizer, vocab_size)
    vocabulary_s = time.perf_counter() - start
    out = dict(vocabulary_s=vocabulary_s, patterns={})
    for pattern in (r".*", PERMISSIVE, r"[a-z]+( [a-z]+)*", r'"[^"]*"'):
        regex = course.Regex(pattern)
        start = time.perf_counter()
        state = course.start_constraint(regex, tokenizer, vocab_size)
        cold = time.perf_counter() - start
        start = time.perf_counter()
        state.allowed()
        warm = time.perf_counter() - start
        out["patterns"][pattern] = dict(
            cold_ms=1000 * cold, warm_ms=1000 * warm, allowed=state.allowed().count
        )
    start = time.perf_counter()
    guidance_tokenizer(tokenizer, vocab_size)
    out["llguidance_tokenizer_s"] = time.perf_counter() - start
    start = time.perf_counter()
    JsonSchema(STORY).start(tokenizer, vocab_size)
    out["llguidance_start_ms"] = 1000 * (time.perf_counter() - start)
    return out


def jump_forward(model, tokenizer, repeats: int) -> dict:
    """Seconds end to end without and with jump_forward, per kind of constraint,
    the fastest of `repeats` (the settings in turn); forced drafts proposed and
    accepted; whether the tokens are the same."""
    prompts = [
        tokenizer.apply_chat_template(
            [{"role": "user", "content": f"Make up one customer of {c} as JSON."}],
            add_generation_prompt=True,
        )
        for c in CUSTOMERS[:JUMP_REQUESTS]
    ]
    kinds = {
        "JSON schema": JsonSchema(LONG_KEYS),
        "regex (course)": course.Regex(LONG_KEYS_PATTERN),
    }
    out = {}
    for kind, constraint in kinds.items():
        specs = [
            PromptSpec(p, max_tokens=MAX_TOKENS, constraint=constraint) for p in prompts
        ]
        runs = {}
        for _ in range(repeats):
            for jump in (False, True):
                start = time.perf_counter()
                results = course.batch_generate(
                    model,
                    tokenizer,
                    specs,
                    batch_size=BATCH_JUMP,
                    policy="mixed",
                    jump_forward=jump,
                )
                seconds = time.perf_counter() - start
                if jump not in runs or seconds < runs[jump][0]:
                    runs[jump] = (seconds, results)
        (plain_s, plain), (jump_s, jumped) = runs[False], runs[True]
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
    parser = option_parser(__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--no-peer", action="store_true", help="skip mlx_lm.server")
    parser.add_argument(
        "--json", type=Path, default=Path("bench-results/structured.json")
    )
    add_option(parser)
    args = parser.parse_args()
    use(args)
    console = Console()
    suite = SUITE[::4] + SUITE[1:2] if args.quick else SUITE
    mlx_model, tokenizer = load_model()
    model = course.Qwen2ModelWeek2(mlx_model, weights="float32", use_fast_kernels=True)
    vocab_size = model.vocab_size
    console.print(
        f"embedded model, float32, vocabulary {vocab_size}; load average "
        f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} cores",
        highlight=False,
    )

    cold = cold_states(tokenizer, vocab_size)
    table = Table(title="first use of a state (course TokenIndex) vs warm")
    for column in ("pattern", "allowed tokens", "cold ms", "warm ms"):
        table.add_column(column, justify="left" if column == "pattern" else "right")
    for pattern, row in cold["patterns"].items():
        table.add_row(
            escape(pattern),
            str(row["allowed"]),
            f"{row['cold_ms']:.0f}",
            f"{row['warm_ms']:.3f}",
        )
    console.print(table)
    console.print(
        f"course vocabulary built once in {cold['vocabulary_s']:.2f} s, llguidance's "
        f"tokenizer in {cold['llguidance_tokenizer_s']:.2f} s; then a schema compiled "
        f"and its first mask: {cold['llguidance_start_ms']:.1f} ms",
        highlight=False,
    )

    tokens, repeats = (24, 1) if args.quick else (TOKENS, 3)
    ms = overhead(model, tokenizer, tokens, repeats)
    table = Table(title=f"batch {BATCH}, {tokens} tokens each: time per output token")
    table.add_column("kind")
    table.add_column("ms/token", justify="right")
    table.add_column("vs unconstrained", justify="right")
    for kind, value in ms.items():
        table.add_row(kind, f"{value:.1f}", f"{value / ms['unconstrained']:.2f}x")
    console.print(table)

    jumps = jump_forward(model, tokenizer, repeats=1 if args.quick else 2)
    table = Table(
        title=f"jump-forward: {JUMP_REQUESTS} customer records, batch {BATCH_JUMP}"
    )
    for column in ("kind", "without s", "with s", "speed-up", "accepted", "same"):
        table.add_column(column, justify="left" if column == "kind" else "right")
    for kind, r in jumps.items():
        table.add_row(
            kind,
            f"{r['plain_s']:.1f}",
            f"{r['jump_s']:.1f}",
            f"{r['speedup']:.2f}x",
            f"{r['accepted']}/{r['drafts']}",
            f"{r['same_tokens']}/{r['requests']}",
        )
    console.print(table)

    valid = validity(suite, peer=not args.no_peer)
    table = Table(title=f"{len(suite)} schemas, response_format json_schema, greedy")
    for column in ("server", "valid", "lenient", "seconds"):
        table.add_column(column, justify="left" if column == "server" else "right")
    rates = {}
    for name, run in valid.items():
        answers = run["answers"]
        rates[name] = sum(a.get("valid", False) for a in answers) / len(answers)
        lenient = sum(a.get("lenient", False) for a in answers) / len(answers)
        table.add_row(
            name, f"{rates[name]:.0%}", f"{lenient:.0%}", f"{run['seconds']:.0f}"
        )
    console.print(table)

    goals = [
        dict(
            goal="every answer valid on the schema suite (ours)",
            value=rates["tiny-llm"],
            met=rates["tiny-llm"] == 1.0,
            limit=(
                f"mlx_lm.server: {rates['mlx_lm.server']:.0%}"
                if "mlx_lm.server" in rates
                else "peer not run"
            ),
        )
    ]
    for kind in ("JSON schema", "regex (course)"):
        goal = ratio_goal(
            f"{kind}: unconstrained time per token / constrained, batch {BATCH}",
            ms["unconstrained"] / ms[kind],
            0.9,
        )
        goals.append(goal)
    for kind, r in jumps.items():
        goals.append(
            ratio_goal(
                f"jump-forward, {kind}, long fixed keys: seconds without / with",
                r["speedup"],
                1.3,
                f"{r['accepted']} of {r['drafts']} forced drafts accepted, "
                f"{r['tokens']} tokens",
            )
        )
        same = r["same_tokens"] == r["requests"]
        goals.append(
            dict(
                goal=f"jump-forward, {kind}: tokens identical",
                value=f"{r['same_tokens']} of {r['requests']}",
                met=same,
                limit="",
            )
        )
    for g in goals:
        mark = "[green]met[/]" if g["met"] else "[red]missed[/]"
        value = f"{g['value']:.2f}" if isinstance(g["value"], float) else g["value"]
        limit = f" ({g['limit']})" if g["limit"] else ""
        console.print(f"{mark} {g['goal']}: {value}{limit}", highlight=False)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    record = dict(
        meta=dict(
            quick=args.quick,
            batch=BATCH,
            tokens=tokens,
            load=os.getloadavg(),
            peak_memory_mb=mx.get_peak_memory() / 2**20,
        ),
        cold_states=cold,
        ms_per_token=ms,
        validity={
            name: dict(rate=rates[name], seconds=run["seconds"], answers=run["answers"])
            for name, run in valid.items()
        },
        jump_forward=jumps,
        goals=goals,
    )
    args.json.write_text(json.dumps(record, indent=2))
    console.print(f"wrote {args.json}", highlight=False)
    return 0


if __name__ == "__main__":
    run_benchmark(main)
