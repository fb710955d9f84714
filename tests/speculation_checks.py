"""Checks that speculative decoding's tests share (week 3 day 4, week 4 day 3): the
rows hold exactly the accepted tokens, an engine's tokens, and Pearson's chi-square."""

import mlx.core as mx
import numpy as np

from .helpers import assert_within, run_engine
from .solution import tiny


# Chi-square critical values at p = 0.001 (a correct rule fails 1 run in 1,000).
CHI_SQUARE_999 = {
    1: 10.83,
    2: 13.82,
    3: 16.27,
    4: 18.47,
    5: 20.52,
    6: 22.46,
    7: 24.32,
    8: 26.12,
}


def chi_square(counts: np.ndarray, probs: np.ndarray) -> tuple[float, int]:
    """Pearson's statistic over the cells with probability > 0, and its degrees of
    freedom."""
    keep = probs > 0
    assert counts[~keep].sum() == 0, "a token outside the sampler's support was drawn"
    n = counts.sum()
    expected = n * probs[keep]
    return float(((counts[keep] - expected) ** 2 / expected).sum()), int(keep.sum()) - 1


def check_rows(engine, model=None) -> None:
    """Every decoding request's row holds exactly its offset (every layer) and, paged,
    no block past it; with `model`, the row's keys equal a fresh prefill's of the
    request's tokens."""
    decoding = [(s, r) for s, r in enumerate(engine.slots) if r is not None]
    for slot, request in decoding:
        for layer in engine.kv.batch_cache:
            assert layer.offset[slot] == request.offset, "a rejected draft was kept"
        if engine.config.kv_cache == "paged":
            table = engine.kv.tables[request]
            size = engine.config.block_size
            assert len(table.blocks) == tiny.blocks_needed(request.offset, size)
        if model is not None:
            fed = request.tokens[: request.offset]
            cache = model.create_kv_cache()
            model(mx.array([fed]), 0, cache)
            for number in (0, len(cache) - 1):
                layer = engine.kv.batch_cache[number]
                if engine.config.kv_cache == "paged":
                    keys, _ = layer.slots[slot].layer.gather(
                        [layer.slots[slot].table.blocks], request.offset
                    )
                else:
                    keys = layer.keys[slot : slot + 1, :, : request.offset]
                expected, _ = cache[number].fetch()
                assert_within(keys, expected, 1e-4, f"slot {slot} layer {number}")


def repeating_prompt(rng, vocab: int, length: int) -> list[int]:
    piece = [int(t) for t in rng.integers(3, vocab, max(2, length // 3))]
    return (piece * 4)[:length]


def engine_tokens(model, tokenizer, prompts, check=None, **settings) -> tuple:
    """(tokens per prompt, results, run metrics) of a mixed-policy engine, check()
    called after every step."""
    engine = tiny.Engine(model, tokenizer, policy="mixed", **settings)
    results = run_engine(engine, prompts, check)
    return [r.tokens for r in results], results, engine.metrics


def third_token_distribution(
    mlx_model, prompt: list[int], eos: int, temp: float = 1.0
) -> np.ndarray:
    """Over a vocabulary of 8 at `temp`: the exact probability of each third
    generated token after `prompt` (EOS included), and in cell 8 of EOS ending
    the answer sooner, from mlx-lm's logits."""

    def probs_after(tokens):
        logits = mlx_model(mx.array([tokens]))[0, -1].astype(mx.float32)
        return np.array(mx.softmax(logits / temp), dtype=np.float64)

    first = probs_after(prompt)
    third, early = np.zeros(8), first[eos]
    for t1 in set(range(8)) - {eos}:
        second = probs_after(prompt + [t1])
        early += first[t1] * second[eos]
        for t2 in set(range(8)) - {eos}:
            third += first[t1] * second[t2] * probs_after(prompt + [t1, t2])
    return np.append(third, early)


def third_token_counts(results, eos: int) -> np.ndarray:
    """Each result's outcome counted as third_token_distribution's cells."""
    counts = np.zeros(9)
    for result in results:
        if len(result.tokens) == 3:
            counts[result.tokens[2]] += 1
        elif len(result.tokens) == 2 and result.finish_reason == "stop":
            counts[eos] += 1
        else:
            counts[8] += 1
    return counts
