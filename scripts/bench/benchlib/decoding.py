"""A model driven token by token, ours and mlx-lm's the same way: a prompt prefilled
into a fresh cache, then one greedy token a forward, each evaluated before the next.

    decoder = Decoder(model)               # ours: it counts the offsets
    decoder = MlxLmDecoder(mlx_lm_model)   # mlx-lm's: its cache counts them
    seconds = decode_times(decoder, prompt, 64)   # each step's, after the prefill
    tokens, last = greedy(Decoder(model, chunk=128), prompt, 8)

Ours needs each call's offset; mlx-lm's KV cache keeps its own. A prompt is an
mx.array [B, L] of token ids; logits are [B, L, vocab].
"""

import time

import mlx.core as mx
from mlx_lm.models.cache import make_prompt_cache


class Decoder:
    """Drives a Qwen2ModelWeek2 (or any model called as model(x, offset, cache)).
    chunk: the prompt prefilled in chunks of that many tokens, each forward's
    last position only (a chunk's logits [B, 1, vocab], as the engine does)."""

    def __init__(self, model, chunk: int | None = None):
        self.model, self.chunk = model, chunk

    def prefill(self, prompt: mx.array) -> mx.array:
        self.cache = self.model.create_kv_cache()
        self.offset = prompt.shape[1]
        if self.chunk is None:
            return self.model(prompt, 0, self.cache)
        for start in range(0, self.offset, self.chunk):
            part = prompt[:, start : start + self.chunk]
            logits = self.model(part, start, self.cache, last_position_only=True)
        return logits

    def step(self, token: mx.array) -> mx.array:
        """token [B]: the next logits [B, 1, vocab]."""
        logits = self.model(token[:, None], self.offset, self.cache)
        self.offset += 1
        return logits


class MlxLmDecoder(Decoder):
    """Drives an mlx-lm model: its own KV cache counts the offset."""

    def prefill(self, prompt: mx.array) -> mx.array:
        self.cache = make_prompt_cache(self.model)
        return self.model(prompt, cache=self.cache)

    def step(self, token: mx.array) -> mx.array:
        return self.model(token[:, None], cache=self.cache)


def prefill_seconds(decoder: Decoder, prompt: mx.array) -> float:
    """One prefill of `prompt` into an empty cache, all its logits evaluated."""
    start = time.perf_counter()
    mx.eval(decoder.prefill(prompt))
    return time.perf_counter() - start


def greedy(decoder: Decoder, prompt: mx.array, tokens: int) -> tuple[list, mx.array]:
    """`tokens` greedy tokens after `prompt` [1, L], and the prompt's last logits
    [vocab]."""
    logits = decoder.prefill(prompt)[:, -1]
    last, out = logits[0], []
    for _ in range(tokens):
        token = mx.argmax(logits, axis=-1)
        out.append(token.item())
        logits = decoder.step(token)[:, -1]
    return out, last


def decode_times(decoder: Decoder, prompt: mx.array, tokens: int) -> list[float]:
    """Seconds of each of `tokens` greedy decode steps after `prompt` (prefilled
    first, untimed), each step's token evaluated before the next."""
    token = mx.argmax(decoder.prefill(prompt)[:, -1], axis=-1)
    mx.eval(token)
    times = []
    for _ in range(tokens):
        start = time.perf_counter()
        token = mx.argmax(decoder.step(token)[:, -1], axis=-1)
        mx.eval(token)
        times.append(time.perf_counter() - start)
    return times
