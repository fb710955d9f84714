"""Week 3 Day 3's prefix cache with its disk tier (given code: disk_tier.py and
tiny_llm_base/kv_disk.py, on top of the day's PrefixCachingKvManager).

An engine closed on a folder leaves its named blocks there, and a new engine on the
same folder finds them: its prefill starts after them and its tokens are mlx-lm's
greedy tokens, as a fresh engine's without a cache are. Blocks the pool evicts are
found on disk too. Another model's blocks are never read; a garbage, truncated,
altered or foreign file is ignored with one warning line and removed (the hostile
and broken files: test_week_3_day_3_disk_hostile.py); a quantized pool's blocks
come back as they were stored; the folder keeps to its budget, the chain's first
blocks kept longest; a disk that fails to write costs only the disk tier.
"""

import logging
import shutil

import mlx.core as mx
import numpy as np
import pytest

from tiny_llm_base import EngineConfig
from tiny_llm_base.kv_identity import model_identity
from tiny_llm_base.mlx_lm_reference import greedy_without
from tiny_llm_serve import ServerSettings, create_app

from .disk_checks import (
    BLOCK,
    MAX_TOKENS,
    block_files,
    disk_warnings,
    fresh_engine,
    make_engine,
    run_and_close,
)
from .helpers import TLS, assert_like_mlx_lm, sharpened, token_ids
from .paged_checks import assert_pool_empty, run_engine
from .random_models import random_model
from .servers import CONSTRAINTS, HI, WAIT_S, RunningServer
from .solution import tiny

pytestmark = pytest.mark.task(2)


def shared_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


@pytest.fixture
def first_run(pair, tokenizer, no_eos, tmp_path):
    """A request run on an engine that is then closed on tmp_path: (its prompt, its
    tokens, the follow-up prompt that resends both and adds 6 tokens, the folder)."""
    mlx_model, model = pair
    vocab = mlx_model.args.vocab_size
    run = run_and_close(model, vocab, tokenizer, no_eos[0], tmp_path)
    return *run, tmp_path


def test_a_new_engine_finds_the_blocks_a_closed_one_left(
    pair, tokenizer, no_eos, first_run
):
    """Closed with 9 full blocks named (30 + 9 tokens, the last never fed: 38
    positions), the folder holds 9 files; a new engine's follow-up starts after
    them (read from disk) and gets mlx-lm's tokens, as a fresh engine's without a
    cache does."""
    mlx_model, model = pair
    sampler, banned = no_eos
    prompt, answer, follow_up, folder = first_run
    full = (len(prompt) + len(answer) - 1) // BLOCK
    assert len(block_files(folder)) == full == 9
    engine = make_engine(model, tokenizer, sampler, folder)
    (reply,) = run_engine(engine, [follow_up])
    assert reply.cached_tokens == full * BLOCK
    assert engine.kv.disk.blocks_read == full
    assert_like_mlx_lm([reply], mlx_model, [follow_up], MAX_TOKENS, tokenizer, banned)
    (alone,) = run_engine(fresh_engine(model, tokenizer, sampler), [follow_up])
    assert reply.tokens == alone.tokens
    assert_pool_empty(engine)


def test_blocks_the_pool_evicts_are_found_on_disk(pair, tokenizer, no_eos, tmp_path):
    """A pool of 24 blocks: the first prompt's blocks are evicted by two others, so
    its second run finds them on disk, never closed, and still gets mlx-lm's
    tokens."""
    mlx_model, model = pair
    sampler, banned = no_eos
    rng = np.random.default_rng(6)
    vocab = mlx_model.args.vocab_size
    prompts = [token_ids(rng, vocab, 40) for _ in range(3)]
    prompts.append(prompts[0] + token_ids(rng, vocab, 3))
    specs = [tiny.PromptSpec(p, arrival_step=20 * i) for i, p in enumerate(prompts)]
    engine = make_engine(model, tokenizer, sampler, tmp_path, num_blocks=24)
    results = run_engine(engine, specs)
    assert engine.kv.disk.blocks_written > 0
    shared = shared_prefix(prompts[3], prompts[0] + results[0].tokens)
    found = min(shared, len(prompts[3]) - 1) // BLOCK
    assert found >= 10 and results[3].cached_tokens == found * BLOCK
    assert engine.kv.disk.blocks_read == found, "the prefix was still in the pool"
    assert_like_mlx_lm(results, mlx_model, prompts, MAX_TOKENS, tokenizer, banned)
    assert_pool_empty(engine)


@pytest.mark.parametrize("kv_dtype", ["int8", "int4", "float16"])
def test_a_quantized_pool_finds_its_blocks_after_a_restart(
    random_pairs, tokenizer, tmp_path, kv_dtype
):
    """A pool that stores its rows quantized (random_pairs[1]: heads of 32, one
    quantization group): the new engine reads every block the closed one left and
    its tokens are those of a fresh engine with the same kv_dtype and no cache."""
    mlx_model, model = random_pairs[1]
    vocab = mlx_model.args.vocab_size
    sampler = greedy_without(tokenizer.eos_token_ids, vocab)
    settings = dict(kv_dtype=kv_dtype)
    prompt, answer, follow_up = run_and_close(
        model, vocab, tokenizer, sampler, tmp_path, **settings
    )
    full = (len(prompt) + len(answer) - 1) // BLOCK
    engine = make_engine(model, tokenizer, sampler, tmp_path, **settings)
    (reply,) = run_engine(engine, [follow_up])
    assert engine.kv.disk.blocks_read == full and reply.cached_tokens == full * BLOCK
    fresh = fresh_engine(model, tokenizer, sampler, **settings)
    (alone,) = run_engine(fresh, [follow_up])
    assert reply.tokens == alone.tokens
    assert_pool_empty(engine)


def test_another_models_blocks_are_never_read(
    pair, tokenizer, no_eos, first_run, caplog
):
    """Another model of the same shapes on the same folder: its own subfolder,
    nothing found. The first model's files copied into that subfolder under the same
    names: the chain's first is refused (one warning, naming another model) and
    removed, nothing is loaded, and the tokens are mlx-lm's."""
    prompt, _, follow_up, folder = first_run
    sampler, banned = no_eos
    mlx_model = sharpened(random_model(seed=7))  # pair's sizes, other weights
    model = tiny.Qwen2ModelWeek2(mlx_model, weights="float32")
    other = make_engine(model, tokenizer, sampler, folder)
    mine = other.kv.disk.folder
    theirs = block_files(folder)
    assert mine.is_dir() and not list(mine.iterdir())
    (reply,) = run_engine(other, [follow_up])
    assert reply.cached_tokens == 0
    for path in theirs:
        shutil.copy(path, mine / path.name)
    other = make_engine(model, tokenizer, sampler, folder)  # sees the copies
    with caplog.at_level(logging.WARNING, "tiny_llm.kv_disk"):
        (reply,) = run_engine(other, [follow_up])
    assert reply.cached_tokens == 0 and other.kv.disk.blocks_read == 0
    (warning,) = disk_warnings(caplog)
    assert "another model's block" in warning
    root = mine / f"{tiny.chain_hash(None, follow_up[:BLOCK]).hex()}.safetensors"
    assert str(root) in warning and not root.exists()
    assert len(list(mine.iterdir())) == len(theirs) - 1
    assert_like_mlx_lm([reply], mlx_model, [follow_up], MAX_TOKENS, tokenizer, banned)


def test_the_identity_sees_weights_of_the_same_shapes(pair):
    """Two models alike but for one weight's values have different identities; the
    same model has the same one (another block size: another one)."""
    mlx_model, model = pair
    same = tiny.Qwen2ModelWeek2(mlx_model, weights="float32")
    assert model_identity(model, 4) == model_identity(same, 4)
    assert model_identity(model, 4) != model_identity(model, 8)
    layer = same.layers[-1].attention
    layer.wv = layer.wv + 1e-3
    assert model_identity(model, 4) != model_identity(same, 4)


def test_the_identity_stays_as_the_fast_model_runs(pair):
    """What a forward leaves behind (the fast path's rows of RoPE) is not identity:
    a model that has run steps keeps the identity it had fresh."""
    mlx_model, _ = pair
    model = tiny.Qwen2ModelWeek2(mlx_model, weights="float32", use_fast_kernels=True)
    fresh = model_identity(model, 4)
    cache = model.create_kv_cache()
    mx.eval(model(mx.array([[1, 2, 3]]), 0, cache))
    mx.eval(model(mx.array([[4]]), mx.array([3]), cache))
    assert model_identity(model, 4) == fresh


def test_the_folder_keeps_its_budget_and_the_chain_start(
    pair, tokenizer, no_eos, tmp_path
):
    """A budget of 4 blocks' files: closing with 9 named blocks keeps the chain's
    first 4 (the others would be useless without them); a store opened with a budget
    of 2 removes down to the first 2; a new engine then finds those."""
    mlx_model, model = pair
    sampler, banned = no_eos
    rng = np.random.default_rng(8)
    prompt = token_ids(rng, mlx_model.args.vocab_size, 30)
    probe = make_engine(model, tokenizer, sampler, tmp_path / "probe")
    run_engine(probe, [prompt])
    probe.close()
    file_bytes = max(p.stat().st_size for p in block_files(tmp_path / "probe"))
    budget = 4 * file_bytes
    engine = make_engine(
        model, tokenizer, sampler, tmp_path / "kv", kv_disk_budget=budget
    )
    (answer,) = run_engine(engine, [prompt])
    engine.close()
    files = block_files(tmp_path / "kv")
    assert len(files) == 4 and sum(p.stat().st_size for p in files) <= budget
    chain, parent = [], None
    for i in range(4):
        parent = tiny.chain_hash(parent, prompt[i * BLOCK : (i + 1) * BLOCK])
        chain.append(engine.kv.disk.path(parent))
    assert files == sorted(chain)
    smaller = make_engine(
        model, tokenizer, sampler, tmp_path / "kv", kv_disk_budget=2 * file_bytes
    )
    assert block_files(tmp_path / "kv") == sorted(chain[:2])
    follow_up = prompt + answer.tokens + [1, 2, 3]
    (reply,) = run_engine(smaller, [follow_up])
    assert reply.cached_tokens == 2 * BLOCK
    assert_like_mlx_lm([reply], mlx_model, [follow_up], MAX_TOKENS, tokenizer, banned)


def test_a_disk_that_fails_to_write_costs_only_the_disk_tier(
    pair, tokenizer, no_eos, tmp_path, caplog
):
    """The model's folder replaced by a file: closing warns once and writes
    nothing, and the tokens are mlx-lm's."""
    mlx_model, model = pair
    sampler, banned = no_eos
    prompt = token_ids(np.random.default_rng(9), mlx_model.args.vocab_size, 30)
    engine = make_engine(model, tokenizer, sampler, tmp_path)
    folder = engine.kv.disk.folder
    folder.rmdir()
    folder.write_text("not a folder")
    (result,) = run_engine(engine, [prompt])
    with caplog.at_level(logging.WARNING, "tiny_llm.kv_disk"):
        engine.close()
    (warning,) = disk_warnings(caplog)
    assert "cannot write" in warning
    assert engine.kv.disk.blocks_written == 0
    assert_like_mlx_lm([result], mlx_model, [prompt], MAX_TOKENS, tokenizer, banned)


@pytest.mark.parametrize(
    "settings, error, words",
    [
        ({"kv_disk_dir": "kv", "kv_cache": "dense"}, ValueError, "kv_cache='paged'"),
        (
            {"kv_disk_dir": "kv", "kv_cache": "paged", "prefix_caching": False},
            ValueError,
            "prefix_caching=True",
        ),
        ({"kv_disk_budget": "1GiB"}, ValueError, "kv_disk_dir is None"),
        ({"kv_disk_dir": "kv", "kv_cache": "paged", "kv_disk_budget": "x"}, ValueError,
         "kv_disk_budget must be a size"),
        ({"kv_disk_dir": 3, "kv_cache": "paged"}, TypeError, "folder's path"),
    ],
)  # fmt: skip
def test_disk_settings_are_checked(settings, error, words):
    with pytest.raises(error, match=words):
        EngineConfig(**settings)


def test_a_folder_that_cannot_be_made_is_refused(pair, tokenizer, tmp_path):
    _, model = pair
    blocked = tmp_path / "file"
    blocked.write_text("")
    with pytest.raises(ValueError, match="pass a folder this process may write"):
        make_engine(model, tokenizer, None, blocked / "kv")


class Hiding:
    """A model that shows the engine its caches, vocabulary and context, and no
    layers (a wrapper, say)."""

    def __init__(self, model):
        self.create_kv_cache = model.create_kv_cache
        self.vocab_size, self.context_length = model.vocab_size, model.context_length


def test_a_model_that_hides_its_layers_is_refused(pair, tokenizer, tmp_path):
    """The disk tier checks every block against the model's layers: a model that
    does not show them is refused at the start, saying what to do."""
    with pytest.raises(ValueError, match="leave kv_disk_dir out"):
        make_engine(Hiding(pair[1]), tokenizer, None, tmp_path)


def test_a_restarted_server_finds_the_conversation(
    embedded_model, embedded_week2_model, tmp_path
):
    """The server's shutdown closes its engine on the engine thread: a second
    server on the same folder answers the follow-up turn with the first turn's
    blocks read from disk (usage's cached_tokens), and a fresh engine's answer."""
    import httpx

    tokenizer = embedded_model[1]
    model = embedded_week2_model(True)

    def served_chat(messages: list[dict]) -> dict:
        engine = tiny.Engine(
            model,
            tokenizer,
            batch_size=2,
            max_seq_len=256,
            policy="mixed",
            kv_cache="paged",
            kv_disk_dir=tmp_path,
        )
        settings = ServerSettings("test-model")
        running = RunningServer(
            create_app(engine, settings, tiny.make_sampler, CONSTRAINTS)
        )
        try:
            with httpx.Client(
                base_url=running.url, verify=TLS, timeout=WAIT_S
            ) as client:
                body = dict(messages=messages, max_tokens=6, temperature=0)
                answer = client.post("/v1/chat/completions", json=body)
                assert answer.status_code == 200, answer.text
                return answer.json()
        finally:
            running.stop()

    first = served_chat(HI)
    assert block_files(tmp_path), "the shutdown wrote no block"
    messages = [
        *HI,
        {"role": "assistant", "content": first["choices"][0]["message"]["content"]},
        {"role": "user", "content": "And how are you?"},
    ]
    second = served_chat(messages)
    cached = second["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert cached > 0 and cached % 16 == 0
    prompt = list(tokenizer.apply_chat_template(messages, add_generation_prompt=True))
    fresh = tiny.Engine(
        model, tokenizer, max_seq_len=256, max_tokens=6, kv_cache="paged"
    )
    (alone,) = run_engine(fresh, [prompt])
    assert alone.cached_tokens == 0
    assert second["choices"][0]["message"]["content"] == alone.text
