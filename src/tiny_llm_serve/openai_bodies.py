"""The OpenAI API's request bodies as pydantic models, each turning itself into a
GenerationRequest.

`/v1/chat/completions` takes ChatCompletionBody (messages of role and text content,
through the model's chat template); `/v1/completions` CompletionBody (one prompt,
text or token ids, without a template). Both share GenerationBody's fields: stream,
stream_options, the answer's length, sampling (temperature, top_p, top_k, and
sampling_fields.py's n, seed, penalties, logit_bias, min_p, min_tokens,
ignore_eos, logprobs), stop, priority and the structured-output options. Fields
the server cannot honour are refused by name (unhonoured.py); validation.py turns
any refusal into the 400 the client reads.

Extension: `priority` ("interactive" or "batch") picks the engine's queue. Chat
requests are interactive and completions batch unless the body says otherwise.
"""

from abc import abstractmethod
from typing import Annotated, Any, ClassVar

from pydantic import AfterValidator, PlainValidator, TypeAdapter, model_validator
from tiny_llm_base import PRIORITIES

from .errors import json_type, short
from .request import GenerationRequest
from .request import ConstraintRequest
from .sampling_fields import (
    ChatLogprobFields,
    CompletionLogprobFields,
    SamplingFields,
)
from .structured_options import StructuredOutputFields
from .tool_options import (
    ToolCallMessage,
    ToolFields,
    parallel_calls,
    tools_and_format,
)
from .tool_results import chat_calls_and_results, refuse_unasked_results
from .unhonoured import CHAT_ONLY, COMPLETION_ONLY, NOT_YET, RefusesUnhonoured
from .validation import (
    OptionsObject,
    Refusal,
    RequestModel,
    Text,
    Unsupported,
    at_least_one,
    at_least_one_or_scoring,
    expect,
    is_int,
    number_in,
    required,
    top_k_limit,
    valid_text,
)

ROLES = ("system", "developer", "user", "assistant", "tool")
MAX_STOP_STRINGS = 4
MAX_TEMPERATURE = 2.0
PROMPT_FORMS = (
    'a string ("Once upon a time"), a list of token ids ([1, 2, 3]), or a list '
    "holding one of them"
)


def stop_strings(stop) -> list[str]:
    if stop is None:
        return []
    stops = [stop] if isinstance(stop, str) else stop
    if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
        raise Refusal(
            f"must be a string or a list of strings, got {json_type(stop)}",
            "invalid_type",
        )
    if len(stops) > MAX_STOP_STRINGS:
        raise Refusal(f"has {len(stops)} strings: send at most {MAX_STOP_STRINGS}")
    if any(s == "" for s in stops):
        raise Refusal("holds an empty string: every stop string needs text")
    return [valid_text(s) for s in stops]


def known_priority(priority) -> str | None:
    if priority is not None and priority not in PRIORITIES:
        raise Refusal(
            f'is {short(priority)}: use "interactive" (chat, served first) or "batch"'
        )
    return priority


def no_other_option(value) -> None:
    raise Unsupported(
        "only include_usage and continuous_usage_stats are supported; leave the "
        "others out"
    )


class StreamOptions(OptionsObject):
    """stream_options: include_usage (usage on a last chunk with no choices) and
    vLLM's continuous_usage_stats (with include_usage, as vLLM: usage on every
    chunk too, the completion tokens of the chunk's choice so far)."""

    __pydantic_extra__: dict[str, Annotated[Any, AfterValidator(no_other_option)]]

    include_usage: Annotated[bool, expect("true or false")] = False
    continuous_usage_stats: Annotated[bool, expect("true or false")] = False


class GenerationBody(RefusesUnhonoured, SamplingFields, StructuredOutputFields):
    """The fields both endpoints share. A subclass names its endpoint, its default
    priority and the fields it refuses (`unhonoured`), and gives its prompt. A
    max_tokens of 0 is only for scoring a prompt (scores_prompt)."""

    endpoint: ClassVar[str]
    default_priority: ClassVar[str]

    model: Annotated[str | None, expect("a string (see GET /v1/models)")] = None
    stream: Annotated[bool | None, expect("true or false")] = None
    stream_options: Annotated[
        StreamOptions | None, expect('an object like {"include_usage": true}')
    ] = None
    max_tokens: Annotated[
        int | None, expect("an integer"), AfterValidator(at_least_one_or_scoring)
    ] = None
    temperature: Annotated[float, number_in(0.0, MAX_TEMPERATURE, 1.0)] = None
    top_p: Annotated[float, number_in(0.0, 1.0, 1.0, open_low=True)] = None
    top_k: Annotated[int | None, expect("an integer"), AfterValidator(top_k_limit)] = (
        None
    )
    stop: Annotated[list[str], PlainValidator(stop_strings)] = None
    priority: Annotated[str | None, PlainValidator(known_priority)] = None

    @model_validator(mode="after")
    def consistent(self) -> "GenerationBody":
        if self.stream_options is not None and not self.stream:
            raise Refusal('needs "stream": true', field="stream_options")
        if self.answer_limit() == 0 and not self.echoes_prompt():
            raise Refusal(
                "must be at least 1, got 0 (0 is for scoring a prompt: "
                '/v1/completions with "echo": true)',
                field="max_tokens",
            )
        constraint = self.constraint_request()
        self.check_lengths(self.answer_limit(), constraint and constraint.param)
        if self.stop and constraint is not None and constraint.cuts_whole:
            # A stop string would cut an answer its constraint promises whole (a
            # JSON object at its first ","), and return the invalid prefix. Tool
            # calls are spared by the stop strings themselves (stop_strings.py).
            raise Refusal(
                f"cannot be combined with {constraint.param}: a stop string would "
                "cut the answer the constraint promises whole; leave stop out (the "
                "constraint already decides where the answer ends)",
                field="stop",
            )
        return self

    def answer_limit(self) -> int | None:
        return self.max_tokens

    def echoes_prompt(self) -> bool:
        """The answer starts with the prompt (echo); max_tokens may then be 0: the
        prompt alone, scored by its logprobs."""
        return False

    @abstractmethod
    def prompt_fields(self) -> dict:
        """The GenerationRequest's prompt: {"messages": ...} or {"prompt": ...}."""

    def generation_request(self) -> GenerationRequest:
        options = self.stream_options or StreamOptions()
        return GenerationRequest(
            self.endpoint,
            self.model,
            **self.prompt_fields(),
            stream=bool(self.stream),
            include_usage=options.include_usage,
            continuous_usage=options.include_usage and options.continuous_usage_stats,
            max_tokens=self.answer_limit(),
            temperature=self.temperature,
            top_p=self.top_p,
            top_k=self.top_k,
            stop=self.stop,
            priority=self.priority or self.default_priority,
            constraint=self.constraint_request(),
            n=self.n or 1,
            options=self.sampling_options(),
            echo=self.echoes_prompt(),
        )


def known_role(role) -> str:
    """A message's role; "developer" is OpenAI's newer name for "system"."""
    if role not in ROLES:
        legacy = (
            " (a function result is a tool message now)" if role == "function" else ""
        )
        raise Refusal(f"is {role!r}: use one of {', '.join(ROLES)}{legacy}")
    return "system" if role == "developer" else role


class TextPart(RequestModel):
    """One part of a message's content: {"type": "text", "text": "..."}."""

    text: Annotated[Text, expect("a string")] = None

    @model_validator(mode="before")
    @classmethod
    def a_text_part(cls, part):
        if not (isinstance(part, dict) and part.get("type") == "text"):
            raise Refusal(
                'must be a text part {"type": "text", "text": "..."}: this model '
                "reads text only"
            )
        return part


TEXT_PARTS = TypeAdapter(list[TextPart])


def message_text(content) -> str:
    """A message's text: a string, or a list of text parts joined."""
    if isinstance(content, str):
        return valid_text(content)
    if isinstance(content, list):
        return "".join(part.text for part in TEXT_PARTS.validate_python(content))
    raise Refusal(
        f'must be a string or a list of {{"type": "text"}} parts, got '
        f"{json_type(content)}",
        "invalid_type",
    )


def optional_text(content) -> str | None:
    return None if content is None else message_text(content)


class Message(RequestModel):
    """One chat message: a role and its text; an assistant's message may carry the
    calls it made instead of (or beside) text, and a tool message answers one call
    (tool_call_id)."""

    role: Annotated[str, PlainValidator(known_role)] = None
    content: Annotated[str | None, PlainValidator(optional_text)] = None
    tool_calls: Annotated[
        list[ToolCallMessage] | None, expect("a list of tool calls")
    ] = None
    tool_call_id: Annotated[str | None, expect("a string")] = None

    @model_validator(mode="after")
    def complete(self) -> "Message":
        if self.content is None and not (self.role == "assistant" and self.tool_calls):
            raise Refusal(
                "is required: the message's text (an assistant message may give "
                "tool_calls instead)",
                "missing_required_parameter",
                field="content",
            )
        if self.role == "tool" and self.tool_call_id is None:
            raise Refusal(
                "is required in a tool message: the id of the call it answers",
                "missing_required_parameter",
                field="tool_call_id",
            )
        return self


def messages_given(messages: list[Message]) -> list[Message]:
    if not messages:
        raise Refusal(
            'is empty: send at least one message, such as {"role": "user", '
            '"content": "Hi"}'
        )
    return messages


class ChatCompletionBody(ToolFields, ChatLogprobFields, GenerationBody):
    """A /v1/chat/completions body. max_completion_tokens is OpenAI's newer name
    for max_tokens and wins when both are given. With tools, the answer is
    constrained to text and calls that parse (tool_choice), like a structured-output
    option, so it is one of them for the one-option and stop checks."""

    endpoint = "chat"
    default_priority = "interactive"
    unhonoured = CHAT_ONLY + NOT_YET

    messages: Annotated[
        list[Annotated[Message, expect("an object with role and content")]],
        expect("a list of {role, content} objects"),
        AfterValidator(messages_given),
        required('a list such as [{"role": "user", "content": "Hi"}]'),
    ] = None
    max_completion_tokens: Annotated[
        int | None, expect("an integer"), AfterValidator(at_least_one)
    ] = None

    def answer_limit(self) -> int | None:
        if self.max_completion_tokens is not None:
            return self.max_completion_tokens
        return self.max_tokens

    def prompt_fields(self) -> dict:
        return {
            "messages": [m.model_dump(exclude_none=True) for m in self.messages],
            "tools": self.tools_offered(),
        }

    def constraint_requests(self) -> list[ConstraintRequest]:
        """The structured-output options; with tools, one: the tools, with the
        JSON format (if any) that an answer without calls follows."""
        found = super().constraint_requests()
        if not self.tools:
            return found
        choice = self.tool_choice or "auto"
        parallel = parallel_calls(self.parallel_tool_calls, choice)
        value = (self.tools, choice, parallel)
        return [tools_and_format(value, found)]

    @model_validator(mode="after")
    def tools_consistent(self) -> "ChatCompletionBody":
        self.check_tool_choice()
        refuse_unasked_results(chat_calls_and_results(self.messages))
        return self


def one_prompt(prompt) -> str | list[int]:
    """One prompt: a string, token ids, or a list holding exactly one of them."""
    if prompt is None:
        raise Refusal(
            'is required: a string such as "Once upon a time", or token ids',
            "missing_required_parameter",
        )
    if (
        isinstance(prompt, list)
        and prompt
        and all(isinstance(p, (str, list)) for p in prompt)
    ):
        if len(prompt) > 1:
            raise Refusal(f"holds {len(prompt)} prompts: send one prompt per request")
        prompt = prompt[0]  # a batch of one
        if isinstance(prompt, list) and any(isinstance(p, (str, list)) for p in prompt):
            raise Refusal(
                f"must be a string or a list of token ids, got {json_type(prompt)} "
                f"holding {json_type(prompt[0])}: prompt takes {PROMPT_FORMS}",
                "invalid_type",
                at="[0]",
            )
    if isinstance(prompt, str):
        if not prompt:
            raise Refusal("is empty: give the model text to continue")
        return valid_text(prompt)
    if isinstance(prompt, list):
        if not prompt:
            raise Refusal("is an empty list: give text or token ids")
        for position, token in enumerate(prompt):
            if not is_int(token) or token < 0:
                raise Refusal(
                    f"is {short(token)}: token ids are ints >= 0; prompt takes "
                    f"{PROMPT_FORMS}",
                    "invalid_type",
                    at=f"[{position}]",
                )
        return list(prompt)
    raise Refusal(f"must be {PROMPT_FORMS}, got {json_type(prompt)}", "invalid_type")


class CompletionBody(CompletionLogprobFields, GenerationBody):
    """A /v1/completions body: one prompt, used without a chat template; with
    echo, the answer starts with the prompt, and max_tokens may be 0 (the prompt
    scored: its logprobs, nothing generated)."""

    endpoint = "completion"
    default_priority = "batch"
    unhonoured = COMPLETION_ONLY + NOT_YET

    prompt: Annotated[str | list[int], PlainValidator(one_prompt)] = None

    def echoes_prompt(self) -> bool:
        return bool(self.echo)

    def prompt_fields(self) -> dict:
        return {"prompt": self.prompt}
