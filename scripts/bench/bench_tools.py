"""Tool calls that always parse (week 4 day 2): `pdm run bench-tools`.

The embedded model is asked, through its chat template with the tools described,
to call one of the functions of each of the 31 tool sets (benchlib/tool_sets.py),
greedy and sampled (temperature 0.7), each answer twice: under the tool-call
grammar (tool_choice "required", one call) and free, as a server that parses after
the fact would see it. An answer counts when parse_tool_calls finds a call that
names a function of its set and whose arguments validate against that function's
parameters (the jsonschema package). Goal: every constrained answer counts.

The peer, mlx_lm.server on the same float32 weights (--no-peer skips it), gets
the same chat (the tools described in the system message, as our template
fallback writes it) with `tools` and the same temperature, BATCH requests at a
time: its rate is that of the calls it returns in message.tool_calls, what a
client sees. The embedded template has no tool support, so mlx-lm infers no tool
parser; the calls that parse_tool_calls would find in its content are reported
beside it.
"""

from scripts.commands.interrupt import exit_on_interrupt

exit_on_interrupt()  # first: Ctrl-C during the imports below never shows a traceback

import tiny_llm_base  # noqa: F401  (first: the fast BLAS before mlx.core)

import json

import jsonschema

from scripts.bench.benchlib import servers
from scripts.bench.benchlib.course import course, run_benchmark
from scripts.bench.benchlib.harness import Bench, clocked
from scripts.bench.benchlib.goals import at_least
from scripts.bench.benchlib.tool_sets import CALL_MAX_TOKENS, TOOL_SETS
from scripts.commands.ports import free_port
from tiny_llm_base import PromptSpec
from tiny_llm_base.tool_prompts import hermes_messages, tool_chat_token_ids

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
    return valid_calls(tools, [(call.name, call.arguments) for call in calls])


def valid_calls(tools: list[dict], calls: list[tuple]) -> tuple[bool, bool]:
    """calls: [(name, arguments)] -> (any call, one names a function of tools
    and its arguments validate against that function's parameters)."""
    functions = {t["function"]["name"]: t["function"]["parameters"] for t in tools}
    for name, arguments in calls:
        if name in functions and jsonschema.Draft202012Validator(
            functions[name]
        ).is_valid(arguments):
            return True, True
    return bool(calls), False


def peer_answer(tools: list[dict], response) -> dict:
    """One tool set's answer from mlx_lm.server: (returned calls, content calls)."""
    if response.status_code != 200:
        return {"error": f"{response.status_code}: {response.text[:200]}"}
    answer = response.json()
    message = answer["choices"][0]["message"]
    returned = []
    for call in message.get("tool_calls") or []:
        try:
            arguments = json.loads(call["function"]["arguments"])
        except (json.JSONDecodeError, KeyError, TypeError):
            arguments = None
        returned.append((call.get("function", {}).get("name"), arguments))
    return {
        "returned": valid_calls(tools, returned),
        "in_content": counts(tools, message.get("content") or ""),
        "tokens": answer["usage"]["completion_tokens"],
    }


def run_peer(sets: list, temperatures: dict) -> dict:
    """mlx_lm.server on every set (the same chat, with `tools`), BATCH at a time,
    for each named temperature."""
    out = {}
    with servers.peer(free_port(), BATCH, float32=True) as server:
        for name, temperature in temperatures.items():
            bodies = [
                {
                    "messages": hermes_messages(question(tools), tools),
                    "tools": tools,
                    "max_tokens": CALL_MAX_TOKENS,
                    "temperature": temperature,
                }
                for tools in sets
            ]
            replies, seconds = clocked(server.chat, bodies, BATCH)
            answers = [peer_answer(t, r) for t, (r, _) in zip(sets, replies)]
            fine = [a for a in answers if "error" not in a]
            out[name] = {
                "answers": len(sets),
                "parsed": sum(a["returned"][0] for a in fine),
                "valid": sum(a["returned"][1] for a in fine),
                "parsed_in_content": sum(a["in_content"][0] for a in fine),
                "valid_in_content": sum(a["in_content"][1] for a in fine),
                "tokens": sum(a["tokens"] for a in fine),
                "seconds": seconds,
                "errors": [a["error"] for a in answers if "error" in a],
            }
    return out


def share(run: dict) -> float:
    """The share of a run's answers holding a valid call."""
    return run["valid"] / run["answers"]


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
    results, seconds = clocked(
        course.batch_generate, model, tokenizer, specs, batch_size=BATCH,
        max_tokens=CALL_MAX_TOKENS, max_seq_len=MAX_SEQ_LEN, sampler=sampler,
        policy="mixed",
    )  # fmt: skip
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
    bench.option("--no-peer", False, "skip mlx_lm.server")
    args = bench.parse()
    console = bench.start()
    sets = TOOL_SETS[::4] if args.quick else TOOL_SETS
    models = bench.models()
    model, tokenizer = models.float32, models.tokenizer
    samplers = {"greedy": course.make_sampler(0.0)}
    if not args.quick:
        samplers["sampled"] = course.make_sampler(TEMPERATURE)
    runs, goals = {}, []
    columns = {
        "answers": lambda kind, _: kind,
        "a call parsed": lambda _, r: f"{r['parsed']}/{r['answers']}",
        "a valid call": lambda _, r: f"{r['valid']}/{r['answers']} ({share(r):.0%})",
        "tokens/s": lambda _, r: f"{r['tokens'] / r['seconds']:.1f}",
        "errors": lambda _, r: str(len(r["errors"])),
    }

    def row(kind: str, r: dict) -> None:  # a long run's progress
        runs[kind] = r
        cells = [cell(kind, r) for cell in list(columns.values())[1:]]
        console.print(f"{kind}: " + ", ".join(cells))

    for name, sampler in samplers.items():
        for constrained in (True, False):
            kind = f"{name}, {'grammar' if constrained else 'free'}"
            with console.status(kind):
                r = run(model, tokenizer, sets, sampler, constrained)
            row(kind, r)
            if constrained:
                why = (
                    f"{r['valid']} of {r['answers']} answers; errors: {r['errors'][:2]}"
                )
                goals.append(at_least(f"{name}: calls valid", share(r), 1.0, why))
    if not args.no_peer:
        temperatures = {"greedy": 0.0, "sampled": TEMPERATURE}
        temperatures = {name: temperatures[name] for name in samplers}
        with console.status("mlx_lm.server"):
            peer = run_peer(sets, temperatures)
        for name, r in peer.items():
            row(f"{name}, mlx_lm.server", r)
            console.print(
                f"{name}, mlx_lm.server: calls in its content that parse_tool_calls "
                f"finds: {r['parsed_in_content']}/{r['answers']}, valid "
                f"{r['valid_in_content']}/{r['answers']}"
            )
    title = (
        f"{len(sets)} tool sets, the embedded model, {CALL_MAX_TOKENS} tokens at most"
    )
    bench.table(title, columns, runs)
    return bench.finish({"tool_sets": len(sets), "runs": runs}, goals)


if __name__ == "__main__":
    run_benchmark(main)
