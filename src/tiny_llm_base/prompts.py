"""What a caller hands batch_generate (PromptSpec) and what it gets back for each
prompt (GenerationResult), with the helpers both sides share: the default sampler, a
prompt's token ids, and the checks of int arguments and of what a sampler returns."""

import numbers
import re
from collections.abc import Callable
from dataclasses import dataclass, field

import mlx.core as mx

# A sampler maps log-probabilities [B, V] to token ids [B]; a request calls its own
# with its one row, [1, V].
Sampler = Callable[[mx.array], mx.array]
PRIORITIES = ("interactive", "batch")


def greedy(logprobs: mx.array) -> mx.array:
    """logprobs: [B, V] -> token ids [B]: the most likely token of each row."""
    return mx.argmax(logprobs, axis=-1)


@dataclass
class PromptSpec:
    """A prompt with its own settings. batch_generate also takes a plain text or list
    of token ids: that is PromptSpec(prompt), every setting at its default.

    prompt: text, chat-templated as one user turn, or token ids used as they are (see
        prompt_token_ids).
    max_tokens: the most tokens to generate for this prompt. None: batch_generate's
        max_tokens (if that is None too: until EOS or a full cache). Below 1: this
        request alone fails (finish_reason "error"), and so does a non-int.
    sampler: log-probabilities [1, V] -> token id [1] for this prompt alone. None:
        batch_generate's sampler, or greedy if that is None too. A sampler that is not
        callable, raises, or returns anything but one token id (see sampled_token_id)
        fails this request alone.
    priority: "batch" or "interactive". An interactive request's prefill chunks go
        first, and it may take any free decode slot, while batch requests together
        hold at most batch_size - reserved_interactive_slots of them. Anything else:
        this request alone fails.
    arrival_step: how many scheduler iterations must be done before the request is
        admitted: 0 joins the first iteration, s joins the iteration whose
        SchedulerSnapshot.step is s + 1 (empty iterations run until then if nothing
        else is left). Below 0: batch_generate raises ValueError; not an int:
        TypeError.
    constraint (week 3 day 5): None (unconstrained), Regex(pattern) or
        Choice(options): the answer must match the pattern as a whole, or be one of
        the options. A bad one (unsupported syntax, a regex that matches nothing, an
        empty list) fails this request alone; one that cannot finish within
        max_tokens ends with "length".
    options: a SamplingOptions (tiny_llm_base.sampling_options): logprobs, a seed,
        penalties, logit biases, min-p, min_tokens, ignore_eos. None asks for none.
        A bad one fails this request alone.
    n: how many answers (choices) to generate for the prompt, each its own request
        with its own index; choice i's seed is seed + i. The choices after the
        first wait for the first one's prefill and share its full prompt blocks (a
        paged KV cache): the prompt is computed once but for its last partial block.
        Below 1: batch_generate raises ValueError; not an int: TypeError.
    """

    prompt: str | list[int]
    max_tokens: int | None = None
    sampler: Sampler | None = None
    priority: str = "batch"
    arrival_step: int = 0
    constraint: object = None
    options: object = None
    n: int = 1


@dataclass
class GenerationResult:
    """What batch_generate returns for one prompt; the results come in prompt order.

    text: the generated text, detokenized ("" when nothing was generated).
    tokens: the generated token ids; the EOS that ends a request is never among them.
    finish_reason: "stop" (the model sampled EOS), "length" (max_tokens tokens),
        "max_seq_len" (the cache is full: the request's offset reached max_seq_len),
        "error" (this request alone failed; `error` says why, the others ran on), or
        "abort" (Engine.abort stopped it; batch_generate never aborts).
    metrics: the request's RequestMetrics, times on batch_generate's clock.
    error: why the request failed, else None.
    prompt, priority: as given (a plain prompt has priority "batch").
    cached_tokens: prompt tokens whose keys and values came from the prefix cache
        instead of a forward (Week 3 Day 3); 0 without prefix caching.
    logprobs: a TokenLogprob per generated token, when the prompt's options asked
        for them; prompt_logprobs: one per prompt token (None for the first), when
        asked.
    index: the choice this is of its prompt (0 unless the prompt asked n > 1).
    choices: batch_generate's result for a prompt with n > 1 is its choice 0, and
        holds all n results here, in index order; [] otherwise.
    """

    text: str
    tokens: list[int]
    finish_reason: str
    metrics: object
    error: str | None = None
    prompt: str | list[int] = ""
    priority: str = "batch"
    cached_tokens: int = 0
    logprobs: list = field(default_factory=list)
    prompt_logprobs: list | None = None
    index: int = 0
    choices: list = field(default_factory=list, repr=False, compare=False)


def is_int(value) -> bool:
    """An int or a NumPy integer; a bool is not (True would pass for 1)."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def check_int(name: str, value, minimum: int, allow_none: bool = False) -> None:
    """TypeError unless `value` is an int (or None when allowed), ValueError when it
    is below `minimum`; both name the argument."""
    if value is None and allow_none:
        return
    if not is_int(value):
        kind = "an int or None" if allow_none else "an int"
        raise TypeError(f"{name} must be {kind}, got {type(value).__name__} {value!r}")
    if value < minimum:
        raise ValueError(f"{name} must be at least {minimum}, got {value}")


# Stand-ins for message texts while the chat template renders: private-use code
# points, which neither a template nor a tokenizer treats specially.
_HOLE = re.compile("\ue000([0-9]+)\ue001")


def chat_token_ids(
    tokenizer, messages: list[dict], continue_final: bool = False, **template_options
) -> list[int]:
    """The messages through the tokenizer's chat template, the assistant's turn
    opened; with continue_final, the prompt ends with the last message's text
    instead (an assistant's start for the model to continue: no end of its turn
    after it, Hugging Face's continue_final_message). Every message's text is
    tokenized as text: a user who writes "<|im_end|>" or "<|im_start|>system" gets
    those characters, never the special tokens that delimit turns, so message
    text cannot forge another role's turn.

    Messages that spell no special token go through apply_chat_template as they
    are. Otherwise the template renders with a stand-in for each text; the
    template's own text is tokenized with its special tokens, each message's text
    alone with special tokens split (Hugging Face's split_special_tokens).
    """
    hf = getattr(tokenizer, "_tokenizer", tokenizer)
    spellings = [
        added.content
        for added in (getattr(hf, "added_tokens_decoder", None) or {}).values()
        if added.special
    ]
    turn = (
        {"continue_final_message": True}
        if continue_final
        else {"add_generation_prompt": True}
    )
    texts = [m.get("content") for m in messages]
    if not any(
        isinstance(text, str) and spelling in text
        for text in texts
        for spelling in spellings
    ):
        return list(tokenizer.apply_chat_template(messages, **turn, **template_options))
    masked = [
        {**m, "content": f"\ue000{i}\ue001"} if isinstance(text, str) else m
        for i, (m, text) in enumerate(zip(messages, texts))
    ]
    rendered = tokenizer.apply_chat_template(
        masked, tokenize=False, **turn, **template_options
    )
    ids: list[int] = []
    for i, piece in enumerate(_HOLE.split(rendered)):
        if i % 2 == 0:
            ids += tokenizer.encode(piece, add_special_tokens=False) if piece else []
        elif texts[int(piece)]:
            ids += hf(
                texts[int(piece)], add_special_tokens=False, split_special_tokens=True
            )["input_ids"]
    return ids


def prompt_token_ids(
    tokenizer, prompt: str | list[int], vocab_size: int | None = None
) -> list[int]:
    """Token ids of a prompt: a text goes through the tokenizer's chat template as one
    user turn, with the assistant's turn opened after it; a list (or tuple) of ids is
    copied.

    Raises ValueError("the prompt is empty: give the model something to answer") for
    a text that is empty or only whitespace, ValueError("the prompt has no tokens")
    for an empty list, TypeError for a prompt that is neither (None, say) or an id that
    is not an int (a float or a bool), and, given vocab_size, ValueError naming the
    first id outside [0, vocab_size). Request catches them: that request fails with
    the message as its error, and batch_generate runs the others.
    """
    if isinstance(prompt, str):
        if not prompt.strip():
            raise ValueError("the prompt is empty: give the model something to answer")
        return chat_token_ids(tokenizer, [{"role": "user", "content": prompt}])
    if not isinstance(prompt, (list, tuple)):
        raise TypeError(
            f"a prompt must be text or a list of token ids, got {type(prompt).__name__}"
        )
    if len(prompt) == 0:
        raise ValueError("the prompt has no tokens")
    for position, token in enumerate(prompt):
        if not is_int(token):
            raise TypeError(
                f"prompt token {position} is {type(token).__name__} {token!r}: "
                "token ids are ints"
            )
        if vocab_size is not None and not 0 <= token < vocab_size:
            raise ValueError(
                f"prompt token {position} is {token}, outside the model's vocabulary "
                f"[0, {vocab_size}): give ids the model's tokenizer made"
            )
    return [int(token) for token in prompt]


def request_prompt_ids(
    model, tokenizer, prompt, priority, max_tokens, sampler, max_seq_len: int
) -> list[int]:
    """A Request's prompt token ids (prompt_token_ids), once its settings hold up:
    a priority of PRIORITIES, max_tokens an int of at least 1 or None, a callable
    sampler, a prompt whose tokens plus max_tokens - 1 fit model.context_length and
    whose tokens fit max_seq_len. Raises TypeError or ValueError saying what to
    fix (the request then fails alone)."""
    if priority not in PRIORITIES:
        raise ValueError(f"priority must be one of {PRIORITIES}, got {priority!r}")
    check_int("max_tokens", max_tokens, 1, allow_none=True)
    if not callable(sampler):
        raise TypeError(
            "sampler must be callable (log-probabilities [1, V] -> token id [1]), "
            f"got {type(sampler).__name__}"
        )
    ids = prompt_token_ids(tokenizer, prompt, model.vocab_size)
    # Every prompt token and every generated token but the last takes a position.
    needed = len(ids) + (max_tokens or 1) - 1
    context = model.context_length
    if needed > context:
        raise ValueError(
            f"the prompt has {len(ids)} tokens and max_tokens is "
            f"{max_tokens}: that needs {needed} positions, more than the model's "
            f"context of {context}; shorten the prompt or lower max_tokens"
        )
    if len(ids) > max_seq_len:
        raise ValueError(
            f"the prompt has {len(ids)} tokens but max_seq_len is "
            f"{max_seq_len}: raise max_seq_len or shorten the prompt"
        )
    return ids


def sampled_token_id(sampled, vocab_size: int) -> int:
    """The token id a sampler returned: one integer in an mx.array, in [0, vocab_size).

    Raises TypeError or ValueError that say what a sampler must return.
    """
    usage = (
        "a sampler returns one token id as an mx.array, "
        "e.g. mx.argmax(logprobs, axis=-1)"
    )
    if not isinstance(sampled, mx.array):
        raise TypeError(f"the sampler returned {type(sampled).__name__}: {usage}")
    if sampled.size != 1:
        raise ValueError(
            f"the sampler returned an array of shape {tuple(sampled.shape)}: {usage}"
        )
    if not mx.issubdtype(sampled.dtype, mx.integer):
        raise TypeError(
            f"the sampler returned {sampled.item()} ({sampled.dtype}), not an integer "
            f"token id: {usage}"
        )
    token = sampled.item()
    if not 0 <= token < vocab_size:
        raise ValueError(
            f"the sampler returned token id {token}, outside the model's vocabulary "
            f"[0, {vocab_size})"
        )
    return token
