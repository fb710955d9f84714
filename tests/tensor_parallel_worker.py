"""One rank of tests/test_week_4_day_1.py, started by mlx.launch:

    python tests/tensor_parallel_worker.py SOLUTION OUT_DIR MODE

MODE "check": every computation the tests compare, run on a ShardedQwen2Model,
saved to OUT_DIR/rank{R}.npz (logits) and OUT_DIR/rank{R}.json (tokens, KV head
counts, seconds). The files are written last, so a rank that failed leaves none.
MODE "die": rank 1 exits at once, rank 0 sums with it; rank 0 must fail, not hang.

The test imports the same functions and runs them on one rank's Qwen2ModelWeek2.
"""

import itertools
import os
import sys
import time
from pathlib import Path

if __name__ == "__main__" and sys.argv[3] == "die":
    # Before the heavy imports: rank 1 exits, rank 0's sum must fail, not hang.
    import mlx.core as mx

    group = mx.distributed.init()
    if group.rank() == 1:
        sys.exit(3)
    mx.eval(mx.distributed.all_sum(mx.ones(4), group=group))
    sys.exit(0)
if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    os.environ["TINY_LLM_SOLUTION"] = sys.argv[1]

from tests.solution import tiny  # noqa: I001  (first: fast BLAS before mlx)

import json  # noqa: E402

import mlx.core as mx  # noqa: E402
import mlx.nn as nn  # noqa: E402
import numpy as np  # noqa: E402
from mlx_lm.utils import load_tokenizer  # noqa: E402

from tests.helpers import sharpened  # noqa: E402
from tests.random_models import random_model  # noqa: E402
from tiny_llm_base.embedded_model import ensure_embedded_model  # noqa: E402

# The random models: (architecture, hidden, heads, kv_heads, intermediate, layers,
# vocab, tied). Query/KV heads 6/2, 4/4, 3/1 and 10/5 split evenly over some rank
# counts and unevenly over others; 3/1 copies its one KV head to every rank.
SIZES = [
    ("qwen2", 96, 6, 2, 160, 2, 211, False),
    ("qwen2", 128, 4, 4, 96, 2, 157, True),
    ("llama", 72, 3, 1, 120, 2, 173, True),
    ("llama", 160, 10, 5, 64, 2, 199, False),
]
# A prompt of 5 tokens, a decode step, a chunk of 3: the cache grows as in serving.
PIECES = [5, 1, 3]
# A model with the embedded model's heads (9 query, 3 KV: 6 and 3 on two ranks, 3 and
# 3 on three), 4-bit quantized as the embedded checkpoint is and kept quantized, so
# the ranks slice packed weights, scales and biases (output_rows, input_columns).
QUANTIZED = ("qwen2", 288, 9, 3, 192, 2, 211, False)
# The engine runs: (policy, kv_cache); paged with explicit blocks, the same on
# every rank.
ENGINES = [("alternate", "dense"), ("mixed", "dense"), ("mixed", "paged")]


def feed(model, inputs: mx.array) -> tuple[mx.array, list]:
    """Logits of inputs [B, T] fed in PIECES through one cache; and the cache.

    Each piece is evaluated before the next, as the engine does every step: two
    forwards in one lazy graph hold all_sums that do not depend on each other, and
    ranks whose graphs differ (uneven heads) may run them in different orders,
    summing one rank's piece 1 with another's piece 2.
    """
    cache, logits, offset = model.create_kv_cache(), [], 0
    for length in PIECES:
        logits.append(model(inputs[:, offset : offset + length], offset, cache))
        mx.eval(logits[-1])
        offset += length
    return mx.concatenate(logits, axis=1), cache


def random_inputs(vocab: int, seed: int) -> mx.array:
    rng = np.random.default_rng(seed)
    return mx.array(rng.integers(0, vocab, (2, sum(PIECES))))


def random_models():
    """(seed, mlx-lm model, fast kernels?) for every size: the same weights on every
    rank and in the test."""
    for seed, size in enumerate(SIZES):
        yield seed, random_model(*size, seed=seed), seed % 2 == 1


def quantized_model() -> nn.Module:
    """QUANTIZED's mlx-lm model, quantized in groups of 32 at 4 bits."""
    model = random_model(*QUANTIZED, seed=len(SIZES))
    nn.quantize(model, group_size=32, bits=4)
    mx.eval(model.parameters())
    return model


def generations(model, tokenizer) -> dict[str, list[list[int]]]:
    """Greedy tokens of batch_generate on token-id prompts, one list per prompt, for
    every engine of ENGINES. The clock is a counter, the same on every rank: no
    decision may depend on how long a step took."""
    rng = np.random.default_rng(7)
    prompts = [
        [int(t) for t in rng.integers(3, model.vocab_size, n)] for n in (9, 3, 14, 6)
    ]
    generated = {}
    for policy, kv_cache in ENGINES:
        paged = {"num_blocks": 64, "block_size": 4} if kv_cache == "paged" else {}
        results = tiny.batch_generate(
            model,
            tokenizer,
            prompts,
            batch_size=2,
            prefill_step=4,
            max_tokens=7,
            max_seq_len=64,
            policy=policy,
            kv_cache=kv_cache,
            clock=itertools.count().__next__,
            **paged,
        )
        generated[f"{policy}-{kv_cache}"] = [result.tokens for result in results]
    return generated


def embedded_tokenizer():
    """The embedded model's tokenizer as load_model gives it (EOS ids from its
    config.json), without loading the weights (~1.5 s a rank)."""
    folder = ensure_embedded_model()
    config = json.loads((folder / "config.json").read_text())
    return load_tokenizer(folder, eos_token_ids=config.get("eos_token_id"))


def check(out: Path, group) -> None:
    arrays, facts = {}, {"size": group.size(), "kv_heads": {}}
    start = time.perf_counter()
    for seed, mlx_model, fast in random_models():
        model = tiny.ShardedQwen2Model(mlx_model, group, "float32", fast)
        logits, cache = feed(model, random_inputs(model.vocab_size, seed))
        arrays[f"random{seed}"] = np.array(logits)
        facts["kv_heads"][f"random{seed}"] = cache[0].keys.shape[1]
    model = tiny.ShardedQwen2Model(quantized_model(), group, "quantized")
    logits, cache = feed(model, random_inputs(model.vocab_size, len(SIZES)))
    arrays["quantized"] = np.array(logits)
    facts["kv_heads"]["quantized"] = cache[0].keys.shape[1]
    small = tiny.ShardedQwen2Model(
        sharpened(random_model(*SIZES[0], seed=0)), group, "float32", True
    )
    tokenizer = embedded_tokenizer()
    facts["generated"] = generations(small, tokenizer)
    facts["seconds"] = time.perf_counter() - start
    rank = group.rank()
    np.savez(out / f"rank{rank}.npz", **arrays)
    (out / f"rank{rank}.json").write_text(json.dumps(facts))


if __name__ == "__main__":
    check(Path(sys.argv[2]), mx.distributed.init())
