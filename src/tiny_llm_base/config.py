"""The engine's settings in one object, checked once when it is made.

Engine, batch_generate and the command lines all take an EngineConfig (or its fields
as keyword arguments). A wrong type is a TypeError, a wrong value a ValueError, each
naming the setting and saying what it takes (the checks are config_checks.py's; the
model-dependent ones, check_model and the KV budget's, are here). What belongs to one prompt (its text or
ids, max_tokens, sampler, priority) is the Request's to check: a bad one fails that
request alone.
"""

import dataclasses
import os
from collections.abc import Iterable
from dataclasses import dataclass

from .config_checks import DEFAULT_KV_DISK_BUDGET, check_settings
from .memory import (
    KV_BITS,
    KV_GROUP_SIZE,
    device_available_memory,
    format_bytes,
    kv_bytes_per_token,
)
from .prompts import PromptSpec, Sampler, check_int, is_int


@dataclass(frozen=True)
class EngineConfig:
    """What an Engine runs with.

    batch_size: decode slots. max_seq_len: positions one request may hold, at most
        the model's context_length (checked against the model by check_model).
    prefill_step: prompt tokens per prefill chunk; None prefills each prompt whole;
        or a policy asked before each chunk: a function called as policy(prompt
        tokens, requests in decode slots, batch_size), such as select_chunk_size, or
        an AdaptiveChunker. With the "mixed" policy it caps one request's chunk.
    policy: "alternate" (week 2 days 6-7: a chunk's forward, then the decodes') or
        "mixed" (week 3 day 1: one forward a step). token_budget: the most tokens one
        mixed step feeds (None: no limit); more than batch_size, so a step always
        has room for a prefill token beside one decode row per slot.
    max_tokens, sampler: defaults that a PromptSpec may override (sampler None:
        greedy).
    reserved_interactive_slots: batch requests together never hold more than
        batch_size - reserved_interactive_slots decode slots.
    kv_cache: "dense" (week 2 day 5's caches) or "paged" (week 3 day 2): a pool of
        blocks of block_size positions; prefix_caching (paged only, week 3 day 3)
        reuses full blocks an earlier request computed.
    long_prefill_token_threshold, max_num_partial_prefills, max_long_partial_prefills
        (mixed policy, week 3 day 1; vLLM's names): a prompt of more tokens than the
        threshold is long, and a long prompt's chunk is at most that many tokens; at
        most max_num_partial_prefills requests are partly prefilled at once (1: one
        prompt at a time, first come first served), at most
        max_long_partial_prefills of them long. None: no such limit.
    long_prefill_attention_budget (mixed policy, needs the threshold): a long
        prompt's chunk of L tokens at offset o keeps L x (o + L), its attention
        scores per head and layer, within this many (at least 1 token a chunk), so
        its chunks shrink as the prompt goes deeper. None: tokens alone cap it.
    speculative: None, "ngram" or "learned" (mixed policy). "ngram" (week 3 day
        4): each decoding request proposes up to num_speculative_tokens draft
        tokens by prompt lookup (what followed the latest earlier occurrence of its
        last prompt_lookup_max down to prompt_lookup_min tokens) and the step
        verifies them; the output is the same as without. "learned" (week 4 day
        3): prompt lookup of prompt_lookup_max tokens where it finds one, else
        draft_head's guesses from the model's own hidden state (a DraftHead:
        load_draft_head).
    jump_forward (mixed policy, week 3 day 5): a constrained request proposes the
        tokens its constraint forces (a fixed key, punctuation) as drafts, verified
        like prompt lookup's, so its output is the same as without.
    batch_patience: seconds after its arrival during which a batch request yields
        to interactive requests: they go before it and, when no slot is free, may
        preempt it. Past them it keeps its place (never starved); 0: arrival order.
    kv_memory: the keys and values' budget in bytes (an int, or a size such as
        "512MiB" or "2GB"). Paged: the pool holds at most this much, and grows
        towards it only as blocks are used (None: half the memory available when the
        engine starts). Dense: batch_size x max_seq_len positions must fit it (None:
        no limit). num_blocks: the paged pool's size in blocks instead of kv_memory.
    kv_disk_dir (paged, prefix caching): a folder of its own that keeps named
        blocks past the process (the disk tier, disk_tier.py): a block goes there
        when the pool evicts it and at Engine.close, and a lookup goes on there
        where the pool's chain ends, so an engine started later on the same folder
        finds what an earlier one computed. kv_disk_budget: the most bytes the folder's files
        take (an int or a size such as "4GiB"), least recently used out first.
    kv_dtype (paged only): how the pool stores keys and values: "float32" as the
        model computes them (float32 here; a bfloat16 model's stay bfloat16);
        "float16", half the bytes of float32, the one that kept float32's greedy
        tokens on 19 of 20 of bench-paged's chat prompts; or "int8" / "int4":
        quantized,
        KV_GROUP_SIZE numbers sharing a float32 scale and bias, 3.2x / 5.3x the
        tokens of float32 in the same kv_memory (the embedded model's head_dim 64),
        and less accurate: int8 turned 11 of 20 answers within 256 tokens (book: the
        paged-cache chapter).
    step_ahead: start the next decode forward before this step's tokens are read,
        so the engine's Python runs while the model computes (step_ahead.py; same
        tokens); False: every step evaluated and read before the next is built.
        On by default: bench-engine measured the step ahead faster at batch 1
        and 8 (2026-12-02 08:56; level at 09:15) and in 6 of 8 rows over four
        earlier runs (book: the engine days appendix).
    """

    batch_size: int = 5
    max_seq_len: int = 512
    prefill_step: object = 128
    policy: str = "alternate"
    token_budget: int | None = None
    max_tokens: int | None = None
    sampler: Sampler | None = None
    reserved_interactive_slots: int = 0
    long_prefill_token_threshold: int | None = None
    max_num_partial_prefills: int | None = None
    max_long_partial_prefills: int | None = None
    long_prefill_attention_budget: int | None = None
    batch_patience: float = 30.0
    speculative: str | None = None
    num_speculative_tokens: int = 4
    prompt_lookup_max: int = 3
    prompt_lookup_min: int = 1
    draft_head: object = None
    jump_forward: bool = False
    kv_cache: str = "dense"
    block_size: int = 16
    num_blocks: int | None = None
    kv_memory: int | str | None = None
    prefix_caching: bool = True
    kv_disk_dir: str | os.PathLike | None = None
    kv_disk_budget: int | str = DEFAULT_KV_DISK_BUDGET
    kv_dtype: str = "float32"
    step_ahead: bool = True

    def __post_init__(self) -> None:
        check_settings(self)

    @classmethod
    def of(cls, config: "EngineConfig | None", settings: dict) -> "EngineConfig":
        """`config` (default: EngineConfig()) with the keyword `settings` replacing
        its fields; TypeError for a name that is no setting."""
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(settings) - names)
        if unknown:
            raise TypeError(
                f"unknown engine setting {unknown[0]!r}: the settings are "
                f"{', '.join(sorted(names))}"
            )
        if config is not None and not isinstance(config, cls):
            raise TypeError(
                f"config must be an EngineConfig or None, got {type(config).__name__}: "
                "pass the settings as keywords (batch_size=4, max_seq_len=512)"
            )
        return dataclasses.replace(config or cls(), **settings)

    def check_model(self, model) -> None:
        """The settings that depend on the model: max_seq_len within its context, and
        a quantized kv_dtype's groups within its heads."""
        if self.max_seq_len > model.context_length:
            raise ValueError(
                f"max_seq_len is {self.max_seq_len} but the model's context is "
                f"{model.context_length} positions: pass at most "
                f"{model.context_length}"
            )
        layers = getattr(model, "layers", None)
        if self.kv_dtype in KV_BITS and layers:
            head_dim = layers[0].attention.head_dim
            if head_dim % KV_GROUP_SIZE:
                raise ValueError(
                    f"kv_dtype {self.kv_dtype!r} quantizes keys in groups of "
                    f"{KV_GROUP_SIZE} numbers, but this model's heads have {head_dim}: "
                    "use kv_dtype 'float16' or 'float32'"
                )

    def pool_blocks(self, model) -> int:
        """The paged pool's budget in blocks: num_blocks, else kv_memory (default:
        half the memory the device could give now, device_available_memory: a
        GPU's own on a GPU) over the bytes a block of this model's keys and values
        takes. ValueError when one request of max_seq_len would not fit.
        A model that does not show its layers gets batch_size x max_seq_len
        positions."""
        if self.num_blocks is not None:
            return self.num_blocks
        per_token = kv_bytes_per_token(model, self.kv_dtype)
        if per_token is None:
            return self.batch_size * self.blocks_per_request
        budget = self.kv_memory or device_available_memory() // 2
        blocks = budget // (per_token * self.block_size)
        if blocks < self.blocks_per_request:
            given = (
                f"kv_memory {format_bytes(budget)}"
                if self.kv_memory
                else f"the default KV budget (half the available memory, "
                f"{format_bytes(budget)})"
            )
            needed = self.blocks_per_request * self.block_size * per_token
            raise ValueError(
                f"{given} holds {blocks * self.block_size:,} tokens at {per_token:,} "
                f"bytes a token, but one request of max_seq_len={self.max_seq_len} "
                f"needs {self.blocks_per_request} blocks of {self.block_size}: pass "
                f"kv_memory of at least {format_bytes(needed)}, or lower max_seq_len"
            )
        return blocks

    def check_dense_memory(self, model) -> None:
        """ValueError when kv_memory is set and batch_size x max_seq_len positions of
        the model's keys and values pass it (the dense cache can grow that far)."""
        per_token = kv_bytes_per_token(model)
        if self.kv_memory is None or per_token is None:
            return
        needed = self.batch_size * self.max_seq_len * per_token
        if needed > self.kv_memory:
            fits = self.kv_memory // (self.max_seq_len * per_token)
            advice = (
                f"pass batch_size {fits} or less"
                if fits
                else "pass kv_memory of at least "
                f"{format_bytes(self.max_seq_len * per_token)} for one request"
            )
            raise ValueError(
                f"a dense cache of batch_size {self.batch_size} x max_seq_len "
                f"{self.max_seq_len} needs {format_bytes(needed)}, past kv_memory "
                f"{format_bytes(self.kv_memory)}: {advice}, lower max_seq_len, or "
                "use kv_cache='paged'"
            )

    @property
    def blocks_per_request(self) -> int:
        """The blocks one request of max_seq_len positions needs."""
        return -(-self.max_seq_len // self.block_size)


def check_callable(name: str, value, allow_none: bool = True) -> None:
    """TypeError unless `value` is callable (or None when allowed)."""
    if (value is None and allow_none) or callable(value):
        return
    raise TypeError(f"{name} must be callable or None, got {type(value).__name__}")


def prompt_specs(prompts) -> list[PromptSpec]:
    """batch_generate's prompts, each as a PromptSpec; TypeError for anything but a
    list of prompts, ValueError or TypeError for a bad arrival_step or n."""
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
        check_int("n", spec.n, 1)
    return specs
