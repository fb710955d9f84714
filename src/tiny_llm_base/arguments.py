"""batch_generate's argument checks: a wrong type is a TypeError, a wrong value a
ValueError, each naming the argument and saying what it takes. What belongs to one
prompt (its text or ids, max_tokens, sampler, priority) is the Request's to check: a
bad one fails that request alone."""

from collections.abc import Iterable

from .prompts import PromptSpec, check_int, is_int


POLICIES = ("alternate", "mixed")


def check_engine_arguments(
    model,
    batch_size,
    prefill_step,
    max_seq_len,
    max_tokens,
    sampler,
    reserved_interactive_slots,
    clock,
    policy="alternate",
    token_budget=None,
) -> None:
    """Raise for the first bad engine setting.

    max_seq_len may not pass the model's context_length. prefill_step is None, an int
    of at least 1, a policy function, or an object with select_chunk_size (an
    AdaptiveChunker). policy is "alternate" or "mixed"; token_budget (mixed only) is
    None or more than batch_size, so that a step always has room for a prefill token
    beside one decode token per slot.
    """
    check_int("batch_size", batch_size, 1)
    check_int("max_seq_len", max_seq_len, 1)
    if max_seq_len > model.context_length:
        raise ValueError(
            f"max_seq_len is {max_seq_len} but the model's context is "
            f"{model.context_length} positions: pass at most {model.context_length}"
        )
    check_int("max_tokens", max_tokens, 1, allow_none=True)
    is_policy = callable(prefill_step) or hasattr(prefill_step, "select_chunk_size")
    if not is_policy:
        if prefill_step is not None and not is_int(prefill_step):
            raise TypeError(
                "prefill_step must be an int chunk size, None (no chunking), "
                "select_chunk_size or an AdaptiveChunker, got "
                f"{type(prefill_step).__name__} {prefill_step!r}"
            )
        check_int("prefill_step", prefill_step, 1, allow_none=True)
    check_int("reserved_interactive_slots", reserved_interactive_slots, 0)
    if reserved_interactive_slots >= batch_size:
        raise ValueError(
            "reserved_interactive_slots must be less than batch_size "
            f"({batch_size}), got {reserved_interactive_slots}: batch requests need "
            "a slot"
        )
    if sampler is not None and not callable(sampler):
        raise TypeError(
            f"sampler must be callable or None, got {type(sampler).__name__}"
        )
    if not callable(clock):
        raise TypeError(f"clock must be callable, got {type(clock).__name__}")
    if policy not in POLICIES:
        raise ValueError(f"policy must be one of {POLICIES}, got {policy!r}")
    check_int("token_budget", token_budget, batch_size + 1, allow_none=True)
    if token_budget is not None and policy != "mixed":
        raise ValueError(
            "token_budget limits a mixed step: pass policy='mixed' or leave it None"
        )


KV_CACHES = ("dense", "paged")


def check_kv_cache_arguments(
    kv_cache, block_size, num_blocks, prefix_caching, max_seq_len
) -> None:
    """Raise for the first bad KV cache setting of an Engine (week 3 days 2 and 3).

    kv_cache is "dense" or "paged"; block_size an int of at least 1; num_blocks
    None (as many positions as the dense cache: batch_size x max_seq_len) or enough
    blocks for one request of max_seq_len tokens, so the oldest request can always
    go on; prefix_caching a bool.
    """
    if kv_cache not in KV_CACHES:
        raise ValueError(f"kv_cache must be one of {KV_CACHES}, got {kv_cache!r}")
    check_int("block_size", block_size, 1)
    one_request = -(-max_seq_len // block_size)
    check_int("num_blocks", num_blocks, 1, allow_none=True)
    if num_blocks is not None and num_blocks < one_request:
        raise ValueError(
            f"num_blocks is {num_blocks}, but one request of max_seq_len="
            f"{max_seq_len} tokens needs {one_request} blocks of {block_size}: pass "
            f"at least {one_request}, or lower max_seq_len"
        )
    if not isinstance(prefix_caching, bool):
        raise TypeError(
            f"prefix_caching must be True or False, got {type(prefix_caching).__name__}"
        )


def check_batch_arguments(
    model,
    prompts,
    batch_size,
    prefill_step,
    max_seq_len,
    max_tokens,
    sampler,
    reserved_interactive_slots,
    on_step,
    clock,
    policy="alternate",
    token_budget=None,
) -> list[PromptSpec]:
    """Raise for the first bad argument of batch_generate (the engine's settings, see
    check_engine_arguments, then prompts and on_step); return the prompts, each as a
    PromptSpec."""
    check_engine_arguments(
        model,
        batch_size,
        prefill_step,
        max_seq_len,
        max_tokens,
        sampler,
        reserved_interactive_slots,
        clock,
        policy,
        token_budget,
    )
    if on_step is not None and not callable(on_step):
        raise TypeError(
            f"on_step must be callable or None, got {type(on_step).__name__}"
        )
    if isinstance(prompts, (str, bytes, PromptSpec)) or not isinstance(
        prompts, Iterable
    ):
        raise TypeError(
            f"prompts must be a list of prompts, got {type(prompts).__name__}: "
            "pass [prompt] for a single prompt"
        )
    prompts = list(prompts)
    if prompts and all(is_int(p) for p in prompts):
        raise TypeError(
            "prompts is a list of ints: pass [token_ids] for a single prompt of "
            "token ids"
        )
    specs = [p if isinstance(p, PromptSpec) else PromptSpec(p) for p in prompts]
    for spec in specs:
        check_int("arrival_step", spec.arrival_step, 0)
    return specs
