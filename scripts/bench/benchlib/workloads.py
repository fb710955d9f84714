"""The requests a benchmark sends: token-id prompts through the chat template, how
many tokens each generates, and when each arrives.

A request arrives either after a number of engine steps (arrival_steps: cases a and
b, reproducible whatever the machine's speed) or at a time after the start of the
run (arrival_s: case c, as a server sees its clients).
"""

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from scripts.bench.benchlib.prompt_texts import (
    CODE_SNIPPETS,
    GROUNDED_TASKS,
    NOTE_TOPICS,
    NOTES_QUESTIONS,
    OPEN_QUESTIONS,
    PASSAGES,
    SHORT_QUESTIONS,
)
from tiny_llm_base.mlx_lm_reference import chat_ids


@dataclass
class Workload:
    """One request per entry: prompt ids, max_tokens, arrival, and whether it is short.

    arrival_steps: engine steps done before the request arrives. arrival_s: seconds
    after the start of the run; when given, it replaces arrival_steps.
    """

    name: str
    prompts: list[list[int]]
    max_tokens: list[int]
    arrival_steps: list[int]
    short: list[bool]
    arrival_s: list[float] | None = None

    @property
    def max_seq_len(self) -> int:
        return max(len(p) + m for p, m in zip(self.prompts, self.max_tokens)) + 1

    @property
    def prompt_tokens(self) -> int:
        return sum(len(p) for p in self.prompts)

    def describe(self) -> str:
        longs = sorted(len(p) for p, s in zip(self.prompts, self.short) if not s)
        arrivals = (
            f"Poisson arrivals over {self.arrival_s[-1]:.0f} s"
            if self.arrival_s
            else "arrivals by step"
        )
        return (
            f"{len(self.prompts)} requests ({len(longs)} long: {longs} tokens), "
            f"{self.prompt_tokens} prompt tokens, {arrivals}"
        )


def chat(tokenizer, messages: list[dict]) -> list[int]:
    """The token ids of a conversation, ready for the assistant's answer."""
    return list(tokenizer.apply_chat_template(messages, add_generation_prompt=True))


def long_prompt(tokenizer, tokens: int, seed: int) -> list[int]:
    """A chat prompt of about `tokens` tokens: numbered notes, then a question."""
    rng = np.random.default_rng(seed)
    notes = []
    while True:
        text = "\n".join(notes) + "\nWhich note surprised you most, and why?"
        ids = chat_ids(tokenizer, "Read my notes.\n" + text)
        if len(ids) >= tokens:
            return ids
        topic = NOTE_TOPICS[rng.integers(len(NOTE_TOPICS))]
        notes.append(
            f"Note {len(notes) + 1}: on day {rng.integers(1, 29)} {topic} changed by "
            f"{rng.integers(2, 90)} percent, after {rng.integers(1, 12)} quiet weeks."
        )


def shared_system_prompt(tokenizer, tokens: int, requests: int) -> list[list[int]]:
    """Requests sharing one system prompt of about `tokens` tokens (numbered notes),
    each with its own short question about them (NOTES_QUESTIONS, at most 16)."""
    notes = []
    while len(tokenizer.encode("\n".join(notes))) < tokens:
        i = len(notes)
        notes.append(
            f"Note {i + 1}: on day {i % 28 + 1} {NOTE_TOPICS[i % len(NOTE_TOPICS)]} "
            f"changed by {(7 * i) % 88 + 2} percent after {i % 11 + 1} quiet weeks."
        )
    system = {"role": "system", "content": "\n".join(notes)}
    return [
        chat(tokenizer, [system, {"role": "user", "content": question}])
        for question in NOTES_QUESTIONS[:requests]
    ]


def mixed_workload(tokenizer, quick: bool) -> Workload:
    """Case a: long prompts queued among short ones, everything at step 0."""
    lengths = (120, 160, 200) if quick else (300, 400, 500)
    max_tokens = 8 if quick else 16
    shorts = [chat_ids(tokenizer, q) for q in SHORT_QUESTIONS]
    longs = [long_prompt(tokenizer, n, seed) for seed, n in enumerate(lengths)]
    prompts, short = [], []
    for i, ids in enumerate(shorts):
        if i % 3 == 0 and longs:
            prompts.append(longs.pop(0))
            short.append(False)
        prompts.append(ids)
        short.append(True)
    n = len(prompts)
    return Workload("a", prompts, [max_tokens] * n, [0] * n, short)


def long_context_workload(tokenizer, quick: bool) -> Workload:
    """Case b: 4 short requests decode; a long prompt arrives at step 8."""
    long_tokens, short_max_tokens = (384, 24) if quick else (1024, 64)
    prompts = [chat_ids(tokenizer, q) for q in SHORT_QUESTIONS[:4]]
    prompts.append(long_prompt(tokenizer, long_tokens, seed=7))
    return Workload(
        "b",
        prompts,
        [short_max_tokens] * 4 + [8],
        [0, 0, 0, 0, 8],
        [True] * 4 + [False],
    )


def arrivals_workload(tokenizer, quick: bool, seed: int = 0) -> Workload:
    """Case c: requests arrive over time, a Poisson process (exponential gaps, fixed
    seed); one in four is long (300 to 900 tokens), the others short questions."""
    rng = np.random.default_rng(seed)
    count, rate, max_tokens = (6, 1.0, 8) if quick else (12, 0.5, 16)
    arrival_s = np.cumsum(rng.exponential(1 / rate, count))
    arrival_s -= arrival_s[0]  # the first request opens the run
    prompts, short = [], []
    for i in range(count):
        if i % 4 == 1:
            length = int(rng.integers(300, 900)) // (3 if quick else 1)
            prompts.append(long_prompt(tokenizer, length, seed=100 + i))
            short.append(False)
        else:
            prompts.append(chat_ids(tokenizer, SHORT_QUESTIONS[i % 10]))
            short.append(True)
    return Workload(
        "c",
        prompts,
        [max_tokens] * count,
        [0] * count,
        short,
        arrival_s=[float(t) for t in arrival_s],
    )


WORKLOADS = {"a": mixed_workload, "b": long_context_workload, "c": arrivals_workload}
CASE_TITLES = {
    "a": "a: long prompts queued among short ones",
    "b": "b: a long prompt arrives while 4 requests decode",
    "c": "c: requests arrive over time (Poisson)",
}


def grounded_text(source: str) -> str:
    """ "passage 1" or "code 0": the text a grounded task is given."""
    kind, index = source.split()
    return (PASSAGES if kind == "passage" else CODE_SNIPPETS)[int(index)]


def grounded_workload(tokenizer, requests: int, max_tokens: int) -> Workload:
    """Input-grounded requests (quote, summarise, edit code, answer from a passage:
    GROUNDED_TASKS, in turn), every one at step 0."""
    prompts = [
        chat_ids(tokenizer, template.format(text=grounded_text(source)))
        for template, source in (
            GROUNDED_TASKS[i % len(GROUNDED_TASKS)] for i in range(requests)
        )
    ]
    return Workload(
        "input-grounded",
        prompts,
        [max_tokens] * requests,
        [0] * requests,
        [True] * requests,
    )


def chat_workload(tokenizer, requests: int, max_tokens: int) -> Workload:
    """Open-ended chat: short questions with nothing to copy (OPEN_QUESTIONS, in
    turn), every one at step 0."""
    prompts = [
        chat_ids(tokenizer, OPEN_QUESTIONS[i % len(OPEN_QUESTIONS)])
        for i in range(requests)
    ]
    return Workload(
        "open-ended chat",
        prompts,
        [max_tokens] * requests,
        [0] * requests,
        [True] * requests,
    )


def warmup_workload(tokenizer) -> Workload:
    """Two tiny requests, the second arriving mid-run: every code path compiles."""
    ids = chat_ids(tokenizer, "Hi")
    return Workload("warm-up", [ids, ids * 3], [4, 4], [0, 1], [True, True])


AGENT_SYSTEM = (
    "You are a coding agent working in the tiny-llm repository. You read files with "
    "read_file(path), search with grep(pattern), and run the tests with "
    "run_tests(path). After each tool result, say in one or two sentences what you "
    "learned and which file you will read next. Keep your notes short: the user "
    "reads them between tool calls."
)
# The files a coding agent reads, in turn: tiny_llm_base's (there in every tree).
AGENT_FILES = (
    "config.py", "memory.py", "prompts.py", "loader.py", "weights.py",
    "reports.py", "structured.py", "kv_disk.py", "tool_prompts.py", "fast_blas.py",
    "schema_checks.py", "embedded_model.py",
)  # fmt: skip


def agent_session(tokenizer, turns: int, tool_tokens: int) -> tuple[str, list[str]]:
    """A coding agent's session: its system prompt, and each turn's user message, a
    read_file tool result of about `tool_tokens` tokens of this repository's source
    (tiny_llm_base's files, from their first line)."""
    base = Path(__file__).resolve().parents[3] / "src" / "tiny_llm_base"
    messages = []
    for name in (AGENT_FILES * turns)[:turns]:
        lines, text = (base / name).read_text().splitlines(), ""
        for line in lines:
            if len(tokenizer.encode(text + line)) > tool_tokens:
                break
            text += line + "\n"
        messages.append(
            f"Tool result of read_file('src/tiny_llm_base/{name}'):\n{text}"
        )
    return AGENT_SYSTEM, messages
