"""The engine's settings in one object, checked once when it is made.

Engine, batch_generate and the command lines all take an EngineConfig (or its fields
as keyword arguments). A wrong type is a TypeError, a wrong value a ValueError, each
naming the setting and saying what it takes. What belongs to one prompt (its text or
ids, max_tokens, sampler, priority) is the Request's to check: a bad one fails that
request alone.
"""

import dataclasses
import math
import os
from collections.abc import Iterable
from dataclasses import dataclass

from .memory import (
    KV_BITS,
    KV_DTYPES,
    KV_GROUP_SIZE,
    available_memory,
    format_bytes,
    kv_bytes_per_token,
    parse_bytes,
)
from .prompts import PromptSpec, Sampler, check_int, is_int

POLICIES = ("alternate", "mixed")
KV_CACHES = ("dense", "paged")
SPECULATIVE = (None, "ngram")
DEFAULT_KV_DISK_BUDGET = 4 * 2**30
# The mixed step's partial-prefill limits (vLLM's names), each an int >= 1 or None.
STEP_LIMITS = (
    "long_prefill_token_threshold",
    "max_num_partial_prefills",
    "max_long_partial_prefills",
)


def is_adaptive(policy) -> bool:
    """An AdaptiveChunker, or anything shaped like one: it is asked
    select_chunk_size(decoding, batch_size) and told record(seconds)."""
    return hasattr(policy, "select_chunk_size")


# The settings of how drafts are proposed: another value than their default means
# nothing without speculative.
DRAFT_SETTINGS = ("num_speculative_tokens", "prompt_lookup_max", "prompt_lookup_min")


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
    speculative: None, or "ngram" (mixed policy, week 3 day 4): each decoding request
        proposes up to num_speculative_tokens draft tokens by prompt lookup (what
        followed the latest earlier occurrence of its last prompt_lookup_max down to
        prompt_lookup_min tokens) and the step verifies them; the output is the
        same as without.
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
        "float16", half the bytes of float32; or "int8" / "int4": quantized,
        KV_GROUP_SIZE numbers sharing a float32 scale and bias, 3.2x / 5.3x the
        tokens of float32 in the same kv_memory (the embedded model's head_dim 64),
        and less accurate (book: the paged-cache chapter).
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
    batch_patience: float = 30.0
    speculative: str | None = None
    num_speculative_tokens: int = 4
    prompt_lookup_max: int = 3
    prompt_lookup_min: int = 1
    jump_forward: bool = False
    kv_cache: str = "dense"
    block_size: int = 16
    num_blocks: int | None = None
    kv_memory: int | str | None = None
    prefix_caching: bool = True
    kv_disk_dir: str | os.PathLike | None = None
    kv_disk_budget: int | str = DEFAULT_KV_DISK_BUDGET
    kv_dtype: str = "float32"

    def __post_init__(self) -> None:
        check_int("batch_size", self.batch_size, 1)
        check_int("max_seq_len", self.max_seq_len, 1)
        check_int("max_tokens", self.max_tokens, 1, allow_none=True)
        step = self.prefill_step
        if not (callable(step) or is_adaptive(step)):
            if step is not None and not is_int(step):
                raise TypeError(
                    "prefill_step must be an int chunk size, None (no chunking), "
                    "select_chunk_size or an AdaptiveChunker, got "
                    f"{type(step).__name__} {step!r}"
                )
            check_int("prefill_step", step, 1, allow_none=True)
        check_int("reserved_interactive_slots", self.reserved_interactive_slots, 0)
        if self.reserved_interactive_slots >= self.batch_size:
            raise ValueError(
                "reserved_interactive_slots must be less than batch_size "
                f"({self.batch_size}), got {self.reserved_interactive_slots}: batch "
                "requests need a slot"
            )
        if self.sampler is not None and not callable(self.sampler):
            raise TypeError(
                f"sampler must be callable or None, got {type(self.sampler).__name__}"
            )
        if self.policy not in POLICIES:
            raise ValueError(f"policy must be one of {POLICIES}, got {self.policy!r}")
        check_int("token_budget", self.token_budget, self.batch_size + 1, True)
        self.check_prefill_limits()
        self.check_speculative()
        self.check_kv_cache()

    def check_prefill_limits(self) -> None:
        for name in STEP_LIMITS:
            check_int(name, getattr(self, name), 1, allow_none=True)
        for name in ("token_budget", *STEP_LIMITS):
            if getattr(self, name) is not None and self.policy != "mixed":
                raise ValueError(
                    f"{name} limits a mixed step: pass policy='mixed' or leave it None"
                )
        most, long = self.max_num_partial_prefills, self.max_long_partial_prefills
        if most is not None and long is not None and long > most:
            raise ValueError(
                f"max_long_partial_prefills ({long}) cannot pass "
                f"max_num_partial_prefills ({most}): lower it, or raise the other"
            )
        patience = self.batch_patience
        if isinstance(patience, bool) or not isinstance(patience, (int, float)):
            raise TypeError(
                "batch_patience must be a number of seconds, got "
                f"{type(patience).__name__}"
            )
        if not math.isfinite(patience) or patience < 0:
            raise ValueError(
                f"batch_patience must be a finite number of seconds >= 0, got {patience}"
            )

    def check_speculative(self) -> None:
        if self.speculative not in SPECULATIVE:
            raise ValueError(
                f"speculative must be None or 'ngram' (prompt lookup), got "
                f"{self.speculative!r}"
            )
        check_int("num_speculative_tokens", self.num_speculative_tokens, 1)
        check_int("prompt_lookup_min", self.prompt_lookup_min, 1)
        check_int("prompt_lookup_max", self.prompt_lookup_max, self.prompt_lookup_min)
        for name in ("jump_forward", "prefix_caching"):
            value = getattr(self, name)
            if not isinstance(value, bool):
                raise TypeError(
                    f"{name} must be True or False, got {type(value).__name__} "
                    f"{value!r}"
                )
        if not self.speculative:
            defaults = {f.name: f.default for f in dataclasses.fields(self)}
            for name in DRAFT_SETTINGS:
                default = defaults[name]
                if getattr(self, name) != default:
                    raise ValueError(
                        f"{name} sets how drafts are proposed, but speculative is "
                        "None (no drafts): pass speculative='ngram' or leave "
                        f"{name} at {default}"
                    )
        if self.speculative and self.policy != "mixed":
            raise ValueError(
                "speculative decoding verifies drafts inside a mixed step: pass "
                "policy='mixed' or leave speculative None"
            )
        if self.jump_forward and self.policy != "mixed":
            raise ValueError(
                "jump_forward feeds forced tokens as drafts inside a mixed step: pass "
                "policy='mixed' or leave jump_forward False"
            )

    def check_kv_cache(self) -> None:
        if self.kv_cache not in KV_CACHES:
            raise ValueError(
                f"kv_cache must be one of {KV_CACHES}, got {self.kv_cache!r}"
            )
        check_int("block_size", self.block_size, 1)
        check_int("num_blocks", self.num_blocks, 1, allow_none=True)
        if self.kv_memory is not None:
            object.__setattr__(
                self, "kv_memory", parse_bytes("kv_memory", self.kv_memory)
            )
            if self.num_blocks is not None:
                raise ValueError(
                    "num_blocks and kv_memory both size the pool: pass one of them"
                )
        one_request = self.blocks_per_request
        if self.num_blocks is not None and self.num_blocks < one_request:
            raise ValueError(
                f"num_blocks is {self.num_blocks}, but one request of max_seq_len="
                f"{self.max_seq_len} tokens needs {one_request} blocks of "
                f"{self.block_size}: pass at least {one_request}, or lower max_seq_len"
            )
        if self.kv_dtype not in KV_DTYPES:
            raise ValueError(
                f"kv_dtype must be one of {KV_DTYPES}, got {self.kv_dtype!r}"
            )
        if self.kv_dtype != "float32" and self.kv_cache != "paged":
            raise ValueError(
                f"kv_dtype {self.kv_dtype!r} stores the paged pool's keys and "
                "values: pass kv_cache='paged', or leave kv_dtype 'float32'"
            )
        if not isinstance(self.prefix_caching, bool):
            raise TypeError(
                "prefix_caching must be True or False, got "
                f"{type(self.prefix_caching).__name__}"
            )
        self.check_kv_disk()

    def check_kv_disk(self) -> None:
        object.__setattr__(
            self, "kv_disk_budget", parse_bytes("kv_disk_budget", self.kv_disk_budget)
        )
        folder = self.kv_disk_dir
        if folder is None:
            if self.kv_disk_budget != DEFAULT_KV_DISK_BUDGET:
                raise ValueError(
                    "kv_disk_budget sizes the disk tier, but kv_disk_dir is None: "
                    "pass kv_disk_dir or leave kv_disk_budget out"
                )
            return
        if not isinstance(folder, (str, os.PathLike)):
            raise TypeError(
                f"kv_disk_dir must be a folder's path or None, got "
                f"{type(folder).__name__}"
            )
        if not os.fspath(folder).strip():
            raise ValueError("kv_disk_dir is empty: pass a folder's path, or None")
        if self.kv_cache != "paged" or not self.prefix_caching:
            raise ValueError(
                "kv_disk_dir keeps the prefix cache's blocks: pass kv_cache='paged' "
                "with prefix_caching=True, or leave kv_disk_dir None"
            )

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
        half the memory available now) over the bytes a block of this model's keys
        and values takes. ValueError when one request of max_seq_len would not fit.
        A model that does not show its layers gets batch_size x max_seq_len
        positions."""
        if self.num_blocks is not None:
            return self.num_blocks
        per_token = kv_bytes_per_token(model, self.kv_dtype)
        if per_token is None:
            return self.batch_size * self.blocks_per_request
        budget = self.kv_memory or available_memory() // 2
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
