"""Week 4 Day 1: tensor parallelism with mx.distributed.

The splitting rules are checked alone (every head on exactly one rank, whole GQA
groups). Then pytest starts real ranks with `mlx.launch --backend ring` on
127.0.0.1, 2 and 3 of them, once each (tests/tensor_parallel_worker.py), and
compares what the sharded model computed on every rank with the unsharded
Qwen2ModelWeek2 in this process: logits of random Qwen2/Llama models whose heads
split evenly and unevenly, of a 4-bit quantized one with the embedded model's heads
(kept quantized: the ranks slice packed weights), and the greedy tokens of
batch_generate. The launcher's exit status says nothing about its ranks (it is 0
when a rank failed), so a rank counts as done only when it wrote its results; a
launch that runs past its time is killed with all its ranks.
"""

import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest

from . import tensor_parallel_worker as worker
from .helpers import assert_within, sharpened
from .launches import LAUNCH_TIMEOUT, assert_no_rank_left, launch_command
from .random_models import random_model
from .solution import SOLUTION, tiny

WORKER = Path(worker.__file__)
# Random models: logits ~0.5, float32, sums only reordered by the split.
RANDOM_ATOL = 1e-4


# --- Who holds what ----------------------------------------------------------------


@pytest.mark.task(1)
def test_split_evenly_gives_the_extra_to_the_first_pieces():
    assert tiny.split_evenly(9, 2) == [5, 4]
    assert tiny.split_evenly(3, 2) == [2, 1]
    assert tiny.split_evenly(10, 3) == [4, 3, 3]
    assert tiny.split_evenly(6, 3) == [2, 2, 2]
    assert tiny.split_evenly(2, 4) == [1, 1, 0, 0]
    with pytest.raises(ValueError):
        tiny.split_evenly(4, 0)


@pytest.mark.task(1)
def test_shard_range_covers_the_items_in_whole_units():
    assert [tiny.shard_range(1536, 2, r) for r in range(2)] == [
        (0, 768),
        (768, 1536),
    ]
    assert [tiny.shard_range(10, 3, r) for r in range(3)] == [(0, 4), (4, 7), (7, 10)]
    assert [tiny.shard_range(192, 2, r, unit=64) for r in range(2)] == [
        (0, 128),
        (128, 192),
    ]
    with pytest.raises(ValueError):
        tiny.shard_range(100, 2, 0, unit=64)


@pytest.mark.task(1)
@pytest.mark.parametrize(
    "num_heads, num_kv_heads",
    [(9, 3), (6, 2), (4, 4), (3, 1), (10, 5), (14, 2), (8, 8), (12, 4)],
)
def test_shard_heads_gives_every_query_head_to_one_rank_with_its_kv_head(
    num_heads, num_kv_heads
):
    group = num_heads // num_kv_heads
    for size in range(1, num_heads + 1):
        shards = tiny.shard_heads(num_heads, num_kv_heads, size)
        assert len(shards) == size
        assert shards[0].q_start == 0 and shards[-1].q_stop == num_heads
        for before, after in zip(shards, shards[1:]):
            assert before.q_stop == after.q_start, f"{size} ranks: {shards}"
        for shard in shards:
            assert shard.num_heads >= 1
            read = {q // group for q in range(shard.q_start, shard.q_stop)}
            assert read == set(range(shard.kv_start, shard.kv_stop)), shards
            # Local grouped attention: query head i reads local KV head
            # i // (num_heads / num_kv_heads) of this rank.
            assert shard.num_heads % shard.num_kv_heads == 0, shards
            local_group = shard.num_heads // shard.num_kv_heads
            for i in range(shard.num_heads):
                assert (shard.q_start + i) // group == shard.kv_start + i // local_group
        # The larger shares go to the lower ranks.
        counts = [shard.num_heads for shard in shards]
        if num_kv_heads >= size:
            assert counts == sorted(counts, reverse=True)


@pytest.mark.task(1)
def test_shard_heads_of_the_embedded_model_on_two_ranks():
    assert tiny.shard_heads(9, 3, 2) == [
        tiny.HeadShard(0, 6, 0, 2),
        tiny.HeadShard(6, 9, 2, 3),
    ]
    with pytest.raises(ValueError, match="at most 9"):
        tiny.shard_heads(9, 3, 10)


@pytest.mark.task(2)
def test_rows_and_columns_of_a_quantized_weight():
    w = mx.random.normal((8, 128))
    packed, scales, biases = mx.quantize(w, group_size=32, bits=4)
    q = tiny.QuantizedWeights(packed, scales, biases, 32, 4)
    whole = mx.dequantize(packed, scales, biases, group_size=32, bits=4)

    def dense(part):
        return mx.dequantize(
            part.weight, part.scales, part.biases, group_size=32, bits=4
        )

    assert_within(dense(tiny.output_rows(q, 2, 5)), whole[2:5], 0.0)
    assert_within(dense(tiny.input_columns(q, 32, 96)), whole[:, 32:96], 0.0)
    assert_within(tiny.input_columns(w, 3, 7), w[:, 3:7], 0.0)
    assert_within(tiny.output_rows(w, 3, 7), w[3:7], 0.0)
    with pytest.raises(ValueError, match="float32"):
        tiny.input_columns(q, 16, 96)


@pytest.mark.task(2)
def test_one_rank_is_the_unsharded_model():
    """Not launched: mx.distributed.init() is a group of one, all_sum a copy."""
    mlx_model = random_model(*worker.SIZES[0], seed=0)
    sharded = tiny.ShardedQwen2Model(mlx_model, weights="float32")
    whole = tiny.Qwen2ModelWeek2(mlx_model, weights="float32")
    assert (sharded.size, sharded.rank) == (1, 0)
    inputs = worker.random_inputs(whole.vocab_size, 0)
    assert_within(
        worker.feed(sharded, inputs)[0], worker.feed(whole, inputs)[0], RANDOM_ATOL
    )


# --- Real ranks --------------------------------------------------------------------


def launch(ranks: int, out: Path, mode: str) -> str:
    """Run the worker on `ranks` local ranks (ring backend, 127.0.0.1); its output.

    The launcher runs in a session of its own: when it runs past LAUNCH_TIMEOUT it
    and every rank are killed, and the test fails; either way no rank is left.
    """
    process = subprocess.Popen(
        launch_command(ranks, str(WORKER), SOLUTION, str(out), mode),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        output, _ = process.communicate(timeout=LAUNCH_TIMEOUT)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        output, _ = process.communicate()
        pytest.fail(f"{ranks} ranks ran past {LAUNCH_TIMEOUT} s:\n{output[-3000:]}")
    finally:
        assert_no_rank_left(process.pid)
    return output


@pytest.fixture(scope="module", params=[2, 3], ids=["2-ranks", "3-ranks"])
def ranks(request, tmp_path_factory):
    """(size, [(arrays, facts) per rank]) of one launch of the worker."""
    size = request.param
    out = tmp_path_factory.mktemp(f"ranks{size}")
    output = launch(size, out, "check")
    results = []
    for rank in range(size):
        if not (out / f"rank{rank}.json").exists():
            pytest.fail(f"rank {rank} of {size} wrote no results:\n{output[-4000:]}")
        arrays = dict(np.load(out / f"rank{rank}.npz"))
        results.append((arrays, json.loads((out / f"rank{rank}.json").read_text())))
    return size, results


@pytest.fixture(scope="module")
def one_rank(embedded_model):
    """The same computations on the unsharded Qwen2ModelWeek2 in this process."""
    arrays = {}
    for seed, mlx_model, fast in worker.random_models():
        model = tiny.Qwen2ModelWeek2(mlx_model, "float32", fast)
        arrays[f"random{seed}"] = np.array(
            worker.feed(model, worker.random_inputs(model.vocab_size, seed))[0]
        )
    model = tiny.Qwen2ModelWeek2(worker.quantized_model(), "quantized")
    inputs = worker.random_inputs(model.vocab_size, len(worker.SIZES))
    arrays["quantized"] = np.array(worker.feed(model, inputs)[0])
    tokenizer = embedded_model[1]
    small = tiny.Qwen2ModelWeek2(
        sharpened(random_model(*worker.SIZES[0], seed=0)), "float32", True
    )
    return arrays, worker.generations(small, tokenizer)


@pytest.mark.task(2)
def test_sharded_logits_match_one_rank(ranks, one_rank):
    size, results = ranks
    expected, _ = one_rank
    for rank, (arrays, _) in enumerate(results):
        for name, logits in expected.items():
            where = f"{name}, rank {rank} of {size}"
            assert_within(arrays[name], logits, RANDOM_ATOL, where)


@pytest.mark.task(2)
def test_every_rank_computes_the_same_logits_bit_for_bit(ranks):
    """After each all_sum every rank holds the same residual, so every rank samples
    the same token: the engines never disagree."""
    size, results = ranks
    first, _ = results[0]
    for rank, (arrays, _) in enumerate(results[1:], start=1):
        for name in first:
            assert np.array_equal(arrays[name], first[name]), f"{name}, rank {rank}"


@pytest.mark.task(2)
def test_each_rank_caches_only_its_kv_heads(ranks):
    size, results = ranks
    for rank, (_, facts) in enumerate(results):
        for seed, size_row in enumerate(worker.SIZES):
            heads = tiny.shard_heads(size_row[2], size_row[3], size)[rank]
            assert facts["kv_heads"][f"random{seed}"] == heads.num_kv_heads
        heads = tiny.shard_heads(9, 3, size)[rank]
        assert facts["kv_heads"]["quantized"] == heads.num_kv_heads


@pytest.mark.task(2)
def test_greedy_tokens_match_one_rank(ranks, one_rank):
    size, results = ranks
    _, expected = one_rank
    for rank, (_, facts) in enumerate(results):
        for engine, tokens in expected.items():
            assert facts["generated"][engine] == tokens, f"{engine}, rank {rank}"
    assert any(len(t) == 7 for t in expected["mixed-dense"]), "every prompt hit EOS"


@pytest.mark.task(2)
def test_a_rank_that_dies_fails_the_run_and_leaves_no_process(tmp_path):
    start = time.monotonic()
    output = launch(2, tmp_path, "die")
    # The launcher returns 0 and only warns: "Node with rank 1 exited with code 3".
    assert re.search(r"exited with code (?!0\b)-?\d+", output), output[-3000:]
    assert not list(tmp_path.iterdir())
    assert time.monotonic() - start < LAUNCH_TIMEOUT
