"""Fields of OpenAI's and vLLM's request documents this server does not act on.

Each is accepted only with a value that asks for nothing (its default), else a
400 naming it, so that no request is answered as if it had been honoured. The
values compare strictly: 0 does not stand for false. Fields that change nothing a
client can observe (user, metadata, store, service_tier, prompt_cache_key,
safety_identifier, request_id, cache_salt) and fields no API document has are
ignored.
"""

from dataclasses import dataclass
from typing import ClassVar

from pydantic import model_validator

from .validation import RequestModel, Unsupported


@dataclass(frozen=True)
class Unhonoured:
    """A field refused unless its value is one of `asks_nothing`; `why` follows
    the field's name in the message."""

    name: str
    asks_nothing: tuple
    why: str

    def check(self, body: dict) -> None:
        value = body.get(self.name)
        if not any(type(value) is type(v) and value == v for v in self.asks_nothing):
            raise Unsupported(self.why, field=self.name)


class RefusesUnhonoured(RequestModel):
    """A request body that refuses each of its class's `unhonoured` fields whose
    value asks for something, by name, before any other check."""

    unhonoured: ClassVar[tuple[Unhonoured, ...]] = ()

    @model_validator(mode="before")
    @classmethod
    def nothing_unhonoured(cls, body):
        if isinstance(body, dict):
            for field in cls.unhonoured:
                field.check(body)
        return body


def not_yet(name: str, asks_nothing: tuple, what: str) -> Unhonoured:
    return Unhonoured(name, asks_nothing, f"{what}; leave {name} out")


# Both endpoints: OpenAI's and vLLM's sampling, output and template extensions.
NOT_YET = (
    not_yet(
        "include_stop_str_in_output",
        (None, False),
        "answers always end before their stop string",
    ),
    not_yet(
        "skip_special_tokens", (None, True), "special tokens are never in the text"
    ),
    not_yet("modalities", (None, ["text"]), "this model answers in text only"),
    not_yet("audio", (None,), "this model answers in text only"),
    not_yet("prediction", (None,), "predicted outputs are not supported"),
    not_yet("reasoning_effort", (None,), "this model does not reason before answering"),
    not_yet("verbosity", (None, "medium"), "answer length is set by max_tokens"),
    not_yet("web_search_options", (None,), "this server does not search the web"),
    not_yet("best_of", (None, 1), "answers are not ranked (n gives n answers)"),
    not_yet("use_beam_search", (None, False), "beam search is not supported"),
    not_yet(
        "length_penalty",
        (None, 1, 1.0),
        "length penalties (beam search) are not supported",
    ),
    not_yet(
        "stop_token_ids", (None, []), "stop at token ids is not supported (use stop)"
    ),
    not_yet("bad_words", (None, []), "banned words are not supported"),
    not_yet("allowed_token_ids", (None,), "token allow-lists are not supported"),
    not_yet("truncate_prompt_tokens", (None,), "prompts are never truncated"),
    not_yet(
        "prompt_logprobs",
        (None,),
        "a prompt's logprobs come with echo and logprobs on /v1/completions",
    ),
    not_yet(
        "spaces_between_special_tokens",
        (None, True),
        "special tokens are never in the text",
    ),
    not_yet(
        "add_generation_prompt", (None, True), "the assistant's turn is always opened"
    ),
    not_yet(
        "continue_final_message", (None, False), "a final message is not continued"
    ),
    not_yet("documents", (None,), "documents are not passed to the template"),
    not_yet("chat_template", (None,), "the model's own chat template is used"),
    not_yet("chat_template_kwargs", (None, {}), "the template takes no options here"),
    not_yet("logits_processors", (None,), "logits processors are not supported"),
    not_yet("return_tokens_as_token_ids", (None, False), "tokens are returned as text"),
    not_yet(
        "guided_whitespace_pattern", (None,), "JSON answers are compact (no whitespace)"
    ),
    not_yet("mm_processor_kwargs", (None, {}), "this model reads text only"),
    not_yet(
        "kv_transfer_params", (None, {}), "KV transfer between servers is not supported"
    ),
    not_yet("vllm_xargs", (None, {}), "no extra arguments are read"),
    *(
        Unhonoured(
            name, (None,), "use guided_json, guided_regex or guided_choice instead"
        )
        for name in ("guided_grammar", "guided_decoding_backend")
    ),
)

# add_special_tokens: vLLM's defaults, which this server follows (the chat template
# places the special tokens; a completion's text is encoded with them).
CHAT_ONLY = (
    Unhonoured("functions", (None, []), "functions is OpenAI's old name: send tools"),
    Unhonoured(
        "function_call", (None,), "function_call is OpenAI's old name: send tool_choice"
    ),
    not_yet("echo", (None, False), "the last message is not echoed back"),
    not_yet(
        "add_special_tokens",
        (None, False),
        "this endpoint always tokenizes with add_special_tokens=False",
    ),
)
COMPLETION_ONLY = (
    Unhonoured("suffix", (None,), "insertion with a suffix is not supported"),
    not_yet(
        "add_special_tokens",
        (None, True),
        "this endpoint always tokenizes with add_special_tokens=True",
    ),
)
