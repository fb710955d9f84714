"""A prompt asked n times (PromptSpec.n): n Requests under one request id.

Choice i is a Request with choice=PromptChoice(i, the Request of choice 0; None
for choice 0 itself) and the options for_choice(options, i) gives (seed + i; the
prompt's logprobs only for choice 0). The planner lets every later choice wait for
choice 0's prefill, and a paged KV manager shares its full prompt blocks. The engine reports
each choice's outputs under the one id with its index, and an abort may name one
choice.
"""

from collections.abc import Callable

from tiny_llm_base import EngineConfig, PromptSpec, check_int, for_choice, greedy

from .request import PromptChoice, Request


def make_choices(
    model, tokenizer, spec: PromptSpec, config: EngineConfig, clock: Callable
) -> list["Request"]:
    """The Requests of spec's n choices, in index order, with prefill_max_step=None
    (the planner sizes every chunk), the spec's max_tokens and sampler or else the
    config's (greedy without either), its priority and constraint (week 3 day 5),
    the config's max_seq_len and `clock`. ValueError or TypeError for a bad n."""
    check_int("n", spec.n, 1)
    max_tokens = config.max_tokens if spec.max_tokens is None else spec.max_tokens
    choices: list[Request] = []
    for index in range(spec.n):
        choices.append(
            Request(
                model,
                tokenizer,
                spec.prompt,
                prefill_max_step=None,
                max_tokens=max_tokens,
                max_seq_len=config.max_seq_len,
                sampler=spec.sampler or config.sampler or greedy,
                priority=spec.priority,
                clock=clock,
                constraint=spec.constraint,
                options=for_choice(spec.options, index),
                choice=PromptChoice(index, choices[0] if choices else None),
            )
        )
    return choices


def choices_to_stop(
    ids: dict["Request", int], request_id: int, index: int | None
) -> list["Request"]:
    """The unfinished choices of request `request_id` among `ids` (request -> its
    request id): all of them, or only choice `index` when it is not None."""
    return [
        request
        for request, i in ids.items()
        if i == request_id
        and not request.is_finished
        and (index is None or request.choice.index == index)
    ]
