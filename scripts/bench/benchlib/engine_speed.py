"""The engine end to end against mlx-lm's own generation loops, on the same float32
weights and the same greedy sampler (EOS never picked, so every request runs to
max_tokens and both do the same work).

- ours: batch_generate's loop over an Engine under the mixed policy (add every
  prompt, step until done; the first step prefills them together), each step
  timed; step_ahead=False: the plain ModelRunner (every step evaluated and read
  before the next starts).
- mlx-lm: stream_generate for one prompt, BatchGenerator for several.
- the forward alone: decode steps of the model on a [B, 1] batch with a full cache,
  each evaluated: what a step costs without the engine around it.

A run's figure is generated tokens over its wall time, prefill included.
"""

import statistics
import time
from dataclasses import dataclass

import mlx.core as mx
from mlx_lm.generate import BatchGenerator, stream_generate

from scripts.bench.benchlib.course import course
from scripts.bench.benchlib.decoding import Decoder, decode_times
from tiny_llm_base import PromptSpec


@dataclass
class Generated:
    """tokens: each prompt's generated ids; seconds: the run's wall time;
    decode_steps: the seconds of each engine step that only decoded (ours)."""

    tokens: list[list[int]]
    seconds: float
    decode_steps: list[float]

    def tokens_per_s(self) -> float:
        return sum(map(len, self.tokens)) / self.seconds


def chat_prompts(tokenizer, questions: list[str]) -> list[list[int]]:
    return [
        tokenizer.apply_chat_template(
            [{"role": "user", "content": q}], add_generation_prompt=True
        )
        for q in questions
    ]


def run_ours(model, tokenizer, prompts, max_tokens, sampler, **settings) -> Generated:
    """batch_generate's loop, batch_size len(prompts), the mixed policy and the
    Engine `settings`, each step timed."""
    settings = dict(batch_size=len(prompts), policy="mixed", **settings)
    engine = course.Engine(model, tokenizer, **settings)
    chunked = []
    engine.on_forward = lambda record: chunked.append(bool(record.chunks))
    start = time.perf_counter()
    ids = [engine.add_request(PromptSpec(p, max_tokens, sampler)) for p in prompts]
    results, steps = {}, []
    while engine.has_unfinished():
        chunked.clear()
        began = time.perf_counter()
        for output in engine.step():
            if output.result is not None:
                results[output.request_id] = output.result.tokens
        if chunked and not any(chunked):
            steps.append(time.perf_counter() - began)
    seconds = time.perf_counter() - start
    return Generated([results[i] for i in ids], seconds, steps)


def run_mlx_lm(peer, tokenizer, prompts, max_tokens, sampler) -> Generated:
    """stream_generate for one prompt; a BatchGenerator of len(prompts) slots that
    prefills them together (mlx-lm's batch_generate) for more."""
    start = time.perf_counter()
    if len(prompts) == 1:
        responses = stream_generate(
            peer, tokenizer, prompts[0], max_tokens=max_tokens, sampler=sampler
        )
        tokens = [[r.token for r in responses]]
        return Generated(tokens, time.perf_counter() - start, [])
    generator = BatchGenerator(
        peer,
        sampler=sampler,
        completion_batch_size=len(prompts),
        prefill_batch_size=len(prompts),
    )
    uids = generator.insert(prompts, [max_tokens] * len(prompts))
    tokens = {uid: [] for uid in uids}
    left = len(uids)
    while left:
        for response in generator.next()[1]:
            tokens[response.uid].append(response.token)
            left -= response.finish_reason is not None
    seconds = time.perf_counter() - start
    generator.close()
    return Generated([tokens[u] for u in uids], seconds, [])


def forward_alone(model, rows: int, context: int, steps: int = 8) -> float:
    """The median seconds of a decode forward of `rows` rows at about `context`
    positions (a full cache of random prompts), each evaluated alone."""
    prompt = mx.random.randint(0, model.vocab_size, (rows, context))
    return statistics.median(decode_times(Decoder(model), prompt, steps))
