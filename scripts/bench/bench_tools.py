"""Tool calls that always parse (week 4 day 2): `pdm run bench-tools`.

The embedded model is asked, through its chat template with the tools described,
to call one of the functions of each of the 31 tool sets (benchlib/tool_sets.py),
greedy and sampled (temperature 0.7), each answer twice: under the tool-call
grammar (tool_choice "required", one call) and free, as a server that parses after
the fact would see it. An answer counts when parse_tool_calls finds a call that
names a function of its set and whose arguments validate against that function's
parameters (the jsonschema package). Goal: every constrained answer counts.

mlx_lm.server is not run here: the embedded model's chat template has no tool
support, so mlx-lm's tool parser never engages and its answers are the free ones.
"""

import tiny_llm_base  # noqa: F401  (first: the fast BLAS before mlx.core)

import time

import jsonschema

from scripts.bench.benchlib.course import course, run_benchmark
from scripts.bench.benchlib.harness import Bench, at_least
from scripts.bench.benchlib.render import grid
from scripts.bench.benchlib.tool_sets import CALL_MAX_TOKENS, TOOL_SETS
from tiny_llm_base import PromptSpec
from tiny_llm_base.tool_prompts import tool_chat_token_ids

BATCH = 8
MAX_SEQ_LEN = 2048  # four tools' descriptions and a call
TEMPERATURE = 0.7


def question(tools: list[dict]) -> list[dict]:
    """A user turn asking for one of the tools ("Look up a person." -> "a person")."""
    things = [t["function"]["description"][len("Look up ") : -1] for t in tools]
    ask = f"Please look up {' or '.join(things)} for me, with a function call."
    return [{"role": "user", "content": ask}]


def counts(tools: list[dict], text: str) -> tuple[bool, bool]:
    """(a call parsed, a parsed call validates against its function)."""
    _, calls = course.parse_tool_calls(text)
    functions = {t["function"]["name"]: t["function"]["parameters"] for t in tools}
    for call in calls:
        if call.name in functions and jsonschema.Draft202012Validator(
            functions[call.name]
        ).is_valid(call.arguments):
            return True, True
    return bool(calls), False


def run(model, tokenizer, sets, sampler, constrained: bool) -> dict:
    specs = [
        PromptSpec(
            tool_chat_token_ids(tokenizer, question(tools), tools),
            constraint=course.tool_constraint(tools, "required", False)
            if constrained
            else None,
        )
        for tools in sets
    ]
    start = time.perf_counter()
    results = course.batch_generate(
        model,
        tokenizer,
        specs,
        batch_size=BATCH,
        max_tokens=CALL_MAX_TOKENS,
        max_seq_len=MAX_SEQ_LEN,
        sampler=sampler,
        policy="mixed",
    )
    seconds = time.perf_counter() - start
    found = [counts(tools, r.text) for tools, r in zip(sets, results)]
    return {
        "answers": len(sets),
        "parsed": sum(p for p, _ in found),
        "valid": sum(v for _, v in found),
        "tokens": sum(len(r.tokens) for r in results),
        "seconds": seconds,
        "errors": [r.error for r in results if r.error],
    }


def main() -> int:
    bench = Bench(__doc__, quick=True, out="bench-results/tools.json")
    args = bench.parse()
    console = bench.start()
    sets = TOOL_SETS[::4] if args.quick else TOOL_SETS
    models = bench.models()
    model, tokenizer = models.float32, models.tokenizer
    samplers = {"greedy": course.make_sampler(0.0)}
    if not args.quick:
        samplers["sampled"] = course.make_sampler(TEMPERATURE)
    runs, rows, goals = {}, [], []
    for name, sampler in samplers.items():
        for constrained in (True, False):
            kind = f"{name}, {'grammar' if constrained else 'free'}"
            with console.status(kind):
                r = runs[kind] = run(model, tokenizer, sets, sampler, constrained)
            n = r["answers"]
            rows.append(
                [
                    kind,
                    f"{r['parsed']}/{n}",
                    f"{r['valid']}/{n} ({100 * r['valid'] / n:.0f}%)",
                    f"{r['tokens'] / r['seconds']:.1f}",
                    str(len(r["errors"])),
                ]
            )
            if constrained:
                why = f"{r['valid']} of {n} answers; errors: {r['errors'][:2]}"
                goals.append(at_least(f"{name}: calls valid", r["valid"] / n, 1.0, why))
    columns = ["answers", "a call parsed", "a valid call", "tokens/s", "errors"]
    title = (
        f"{len(sets)} tool sets, the embedded model, {CALL_MAX_TOKENS} tokens at most"
    )
    console.print(grid(title, columns, rows))
    return bench.finish({"tool_sets": len(sets), "runs": runs}, goals)


if __name__ == "__main__":
    run_benchmark(main)
