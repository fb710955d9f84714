"""What the disk tier's tests share: an engine on a folder (blocks of BLOCK), the
folder's block files and the tier's warnings, and a first run left on disk."""

import numpy as np

from .helpers import token_ids
from .paged_checks import run_engine
from .solution import tiny

BLOCK = 4
MAX_TOKENS = 9


def make_engine(model, tokenizer, sampler, folder, **settings):
    return tiny.Engine(
        model,
        tokenizer,
        batch_size=2,
        max_seq_len=96,
        prefill_step=8,
        policy="mixed",
        max_tokens=MAX_TOKENS,
        sampler=sampler,
        kv_cache="paged",
        block_size=BLOCK,
        kv_disk_dir=folder,
        **settings,
    )


def fresh_engine(model, tokenizer, sampler, **settings):
    """An engine without a cache or a disk tier: the tokens to compare against."""
    return tiny.Engine(
        model,
        tokenizer,
        batch_size=2,
        max_seq_len=96,
        max_tokens=MAX_TOKENS,
        sampler=sampler,
        kv_cache="paged",
        prefix_caching=False,
        **settings,
    )


def block_files(folder) -> list:
    return sorted(folder.glob("*/*.safetensors"))


def disk_warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "tiny_llm.kv_disk"]


def run_and_close(model, vocab, tokenizer, sampler, folder, seed=5, **settings):
    """A 30-token prompt run on an engine then closed on `folder`: (the prompt, its
    tokens, a follow-up that resends both and adds 6 tokens)."""
    rng = np.random.default_rng(seed)
    prompt = token_ids(rng, vocab, 30)
    engine = make_engine(model, tokenizer, sampler, folder, **settings)
    (answer,) = run_engine(engine, [prompt])
    engine.close()
    follow_up = prompt + answer.tokens + token_ids(rng, vocab, 6)
    return prompt, answer.tokens, follow_up


def chain_path(folder, tokens, count: int):
    """The file in a model's `folder` of the count-th block (from 1) of the chain
    that `tokens` start."""
    parent = None
    for i in range(count):
        parent = tiny.chain_hash(parent, tokens[i * BLOCK : (i + 1) * BLOCK])
    return folder / f"{parent.hex()}.safetensors"
