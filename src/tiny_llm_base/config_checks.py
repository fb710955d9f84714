"""The checks an EngineConfig runs when it is made (config.py): each setting's type
and range, then the settings that only mean something together (a mixed step's
limits, speculative decoding's, the KV cache's and its disk tier's). A wrong type is
a TypeError, a wrong value a ValueError, each naming the setting and saying what to
pass instead. Each check takes the EngineConfig being made (config.py imports this
module, so this one names the class only here).
"""

import dataclasses
import math
import os

from .memory import KV_DTYPES, parse_bytes
from .prompts import check_int, is_int

POLICIES = ("alternate", "mixed")
KV_CACHES = ("dense", "paged")
SPECULATIVE = (None, "ngram", "learned")
DEFAULT_KV_DISK_BUDGET = 4 * 2**30
# The mixed step's limits (the first three vLLM's names), each an int >= 1 or None.
STEP_LIMITS = (
    "long_prefill_token_threshold",
    "max_num_partial_prefills",
    "max_long_partial_prefills",
    "long_prefill_attention_budget",
)


def is_adaptive(policy) -> bool:
    """An AdaptiveChunker, or anything shaped like one: it is asked
    select_chunk_size(decoding, batch_size) and told record(seconds)."""
    return hasattr(policy, "select_chunk_size")


# The settings of how drafts are proposed: another value than their default means
# nothing without speculative.
DRAFT_SETTINGS = ("num_speculative_tokens", "prompt_lookup_max", "prompt_lookup_min")


def check_settings(config) -> None:
    """Every check, in order: the batch, the chunking, the policy, then the
    groups below."""
    check_int("batch_size", config.batch_size, 1)
    check_int("max_seq_len", config.max_seq_len, 1)
    check_int("max_tokens", config.max_tokens, 1, allow_none=True)
    step = config.prefill_step
    if not (callable(step) or is_adaptive(step)):
        if step is not None and not is_int(step):
            raise TypeError(
                "prefill_step must be an int chunk size, None (no chunking), "
                "select_chunk_size or an AdaptiveChunker, got "
                f"{type(step).__name__} {step!r}"
            )
        check_int("prefill_step", step, 1, allow_none=True)
    check_int("reserved_interactive_slots", config.reserved_interactive_slots, 0)
    if config.reserved_interactive_slots >= config.batch_size:
        raise ValueError(
            "reserved_interactive_slots must be less than batch_size "
            f"({config.batch_size}), got {config.reserved_interactive_slots}: batch "
            "requests need a slot"
        )
    if config.sampler is not None and not callable(config.sampler):
        raise TypeError(
            f"sampler must be callable or None, got {type(config.sampler).__name__}"
        )
    if config.policy not in POLICIES:
        raise ValueError(f"policy must be one of {POLICIES}, got {config.policy!r}")
    check_int("token_budget", config.token_budget, config.batch_size + 1, True)
    check_prefill_limits(config)
    check_speculative(config)
    check_kv_cache(config)


def check_prefill_limits(config) -> None:
    """The mixed step's limits (token_budget and STEP_LIMITS: mixed policy only)
    and batch_patience."""
    for name in STEP_LIMITS:
        check_int(name, getattr(config, name), 1, allow_none=True)
    for name in ("token_budget", *STEP_LIMITS):
        if getattr(config, name) is not None and config.policy != "mixed":
            raise ValueError(
                f"{name} limits a mixed step: pass policy='mixed' or leave it None"
            )
    if (
        config.long_prefill_attention_budget is not None
        and config.long_prefill_token_threshold is None
    ):
        raise ValueError(
            "long_prefill_attention_budget caps a long prompt's chunks, and with "
            "long_prefill_token_threshold None no prompt is long: pass a threshold "
            "too, or leave the budget None"
        )
    most, long = config.max_num_partial_prefills, config.max_long_partial_prefills
    if most is not None and long is not None and long > most:
        raise ValueError(
            f"max_long_partial_prefills ({long}) cannot pass "
            f"max_num_partial_prefills ({most}): lower it, or raise the other"
        )
    patience = config.batch_patience
    if isinstance(patience, bool) or not isinstance(patience, (int, float)):
        raise TypeError(
            f"batch_patience must be a number of seconds, got {type(patience).__name__}"
        )
    if not math.isfinite(patience) or patience < 0:
        raise ValueError(
            f"batch_patience must be a finite number of seconds >= 0, got {patience}"
        )


def check_speculative(config) -> None:
    """speculative, the draft settings (meaningless without it), the types of
    jump_forward, prefix_caching and step_ahead; drafts need the mixed policy."""
    if config.speculative not in SPECULATIVE:
        raise ValueError(
            f"speculative must be None, 'ngram' (prompt lookup) or 'learned' (prompt "
            f"lookup, else a draft head), got {config.speculative!r}"
        )
    if (config.speculative == "learned") != (config.draft_head is not None):
        raise ValueError(
            "speculative='learned' drafts with a draft head: pass draft_head="
            "load_draft_head(model, path) (pdm run train-drafter makes one)"
            if config.draft_head is None
            else "a draft_head drafts only with speculative='learned': pass it, or "
            "leave draft_head None"
        )
    check_int("num_speculative_tokens", config.num_speculative_tokens, 1)
    check_int("prompt_lookup_min", config.prompt_lookup_min, 1)
    check_int("prompt_lookup_max", config.prompt_lookup_max, config.prompt_lookup_min)
    for name in ("jump_forward", "prefix_caching", "step_ahead"):
        value = getattr(config, name)
        if not isinstance(value, bool):
            raise TypeError(
                f"{name} must be True or False, got {type(value).__name__} {value!r}"
            )
    if not config.speculative:
        defaults = {f.name: f.default for f in dataclasses.fields(config)}
        for name in DRAFT_SETTINGS:
            default = defaults[name]
            if getattr(config, name) != default:
                raise ValueError(
                    f"{name} sets how drafts are proposed, but speculative is "
                    "None (no drafts): pass speculative='ngram' or leave "
                    f"{name} at {default}"
                )
    if config.speculative and config.policy != "mixed":
        raise ValueError(
            "speculative decoding verifies drafts inside a mixed step: pass "
            "policy='mixed' or leave speculative None"
        )
    if config.jump_forward and config.policy != "mixed":
        raise ValueError(
            "jump_forward feeds forced tokens as drafts inside a mixed step: pass "
            "policy='mixed' or leave jump_forward False"
        )


def check_kv_cache(config) -> None:
    """kv_cache, the pool's size (num_blocks or kv_memory, parsed to bytes, not
    both), kv_dtype (paged only), then the disk tier."""
    if config.kv_cache not in KV_CACHES:
        raise ValueError(
            f"kv_cache must be one of {KV_CACHES}, got {config.kv_cache!r}"
        )
    check_int("block_size", config.block_size, 1)
    check_int("num_blocks", config.num_blocks, 1, allow_none=True)
    if config.kv_memory is not None:
        object.__setattr__(
            config, "kv_memory", parse_bytes("kv_memory", config.kv_memory)
        )
        if config.num_blocks is not None:
            raise ValueError(
                "num_blocks and kv_memory both size the pool: pass one of them"
            )
    one_request = config.blocks_per_request
    if config.num_blocks is not None and config.num_blocks < one_request:
        raise ValueError(
            f"num_blocks is {config.num_blocks}, but one request of max_seq_len="
            f"{config.max_seq_len} tokens needs {one_request} blocks of "
            f"{config.block_size}: pass at least {one_request}, or lower max_seq_len"
        )
    if config.kv_dtype not in KV_DTYPES:
        raise ValueError(
            f"kv_dtype must be one of {KV_DTYPES}, got {config.kv_dtype!r}"
        )
    if config.kv_dtype != "float32" and config.kv_cache != "paged":
        raise ValueError(
            f"kv_dtype {config.kv_dtype!r} stores the paged pool's keys and "
            "values: pass kv_cache='paged', or leave kv_dtype 'float32'"
        )
    if not isinstance(config.prefix_caching, bool):
        raise TypeError(
            "prefix_caching must be True or False, got "
            f"{type(config.prefix_caching).__name__}"
        )
    check_kv_disk(config)


def check_kv_disk(config) -> None:
    """kv_disk_dir (a folder, for paged prefix caching only) and kv_disk_budget
    (parsed to bytes; meaningless without the folder)."""
    object.__setattr__(
        config, "kv_disk_budget", parse_bytes("kv_disk_budget", config.kv_disk_budget)
    )
    folder = config.kv_disk_dir
    if folder is None:
        if config.kv_disk_budget != DEFAULT_KV_DISK_BUDGET:
            raise ValueError(
                "kv_disk_budget sizes the disk tier, but kv_disk_dir is None: "
                "pass kv_disk_dir or leave kv_disk_budget out"
            )
        return
    if not isinstance(folder, (str, os.PathLike)):
        raise TypeError(
            f"kv_disk_dir must be a folder's path or None, got {type(folder).__name__}"
        )
    if not os.fspath(folder).strip():
        raise ValueError("kv_disk_dir is empty: pass a folder's path, or None")
    if config.kv_cache != "paged" or not config.prefix_caching:
        raise ValueError(
            "kv_disk_dir keeps the prefix cache's blocks: pass kv_cache='paged' "
            "with prefix_caching=True, or leave kv_disk_dir None"
        )
