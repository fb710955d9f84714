"""The OpenAI API's request bodies, checked, and its response objects, built.

`parse_chat` and `parse_completion` turn a decoded JSON body into a GenerationRequest
or raise ApiError naming the field at fault and what to send instead. The builders at
the end make the JSON objects the endpoints return: whole responses, stream chunks
and usage.

Extension: `priority` ("interactive" or "batch") picks the engine's queue. Chat
requests are interactive and completions batch unless the body says otherwise.

Structured outputs (both endpoints): OpenAI's `response_format` ({"type":
"json_object"} or {"type": "json_schema", "json_schema": {"name", "schema",
"strict"}}), and vLLM's extra fields `guided_json` (a schema), `guided_regex`,
`guided_choice` (a list of strings) and the newer `structured_outputs` ({"json"},
{"regex"}, {"choice"} or {"json_object": true}). At most one per request; the
parsed form is GenerationRequest.constraint, turned into the package's constraint
and checked against the tokenizer by the app (a bad one is a 400).
"""

import json
import math
import time
import uuid
from dataclasses import dataclass, field

from .errors import ApiError, invalid

ROLES = ("system", "developer", "user", "assistant")
PRIORITIES = ("interactive", "batch")
MAX_STOP_STRINGS = 4
MAX_TEMPERATURE = 2.0


@dataclass
class GenerationRequest:
    """One checked request. Exactly one of `messages` (chat) and `prompt`
    (completion: text, or token ids used as they are) is set.

    max_tokens None: until the context is full. top_k None: no limit. stop: strings
    that end the answer where they first appear (not included in it).
    """

    endpoint: str  # "chat" or "completion"
    model: str | None
    messages: list[dict] | None = None
    prompt: str | list[int] | None = None
    stream: bool = False
    include_usage: bool = False
    max_tokens: int | None = None
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int | None = None
    stop: list[str] = field(default_factory=list)
    priority: str = "batch"
    constraint: "ConstraintRequest | None" = None

    @property
    def is_greedy(self) -> bool:
        return self.temperature == 0


def parse_chat(body) -> GenerationRequest:
    """A /v1/chat/completions body: messages of role and text content."""
    body = require_object(body)
    request = GenerationRequest("chat", model_field(body), priority="interactive")
    request.messages = chat_messages(body)
    refuse_unsupported(body, ("tools", "functions", "tool_choice"), "tools")
    if body.get("logprobs") not in (None, False) or body.get("top_logprobs"):
        raise unsupported("logprobs", "log-probabilities are not returned")
    common_fields(
        body, request, max_tokens_names=("max_completion_tokens", "max_tokens")
    )
    request.constraint = constraint_fields(body)
    refuse_stop_with_constraint(request)
    return request


def parse_completion(body) -> GenerationRequest:
    """A /v1/completions body: one prompt, text or token ids, used without a chat
    template."""
    body = require_object(body)
    request = GenerationRequest("completion", model_field(body), priority="batch")
    request.prompt = completion_prompt(body)
    if body.get("echo"):
        raise unsupported("echo", "the prompt is not echoed back")
    if body.get("suffix") is not None:
        raise unsupported("suffix", "insertion with a suffix is not supported")
    if body.get("logprobs") is not None:
        raise unsupported("logprobs", "log-probabilities are not returned")
    best_of = body.get("best_of")
    if best_of not in (None, 1):
        raise invalid(f"best_of must be 1, got {best_of!r}", "best_of")
    common_fields(body, request, max_tokens_names=("max_tokens",))
    request.constraint = constraint_fields(body)
    refuse_stop_with_constraint(request)
    return request


def refuse_stop_with_constraint(request: GenerationRequest) -> None:
    """A stop string would cut an answer its constraint promises whole (a JSON
    object at its first ","), and return the invalid prefix as a normal stop."""
    if request.stop and request.constraint is not None:
        raise invalid(
            f"stop cannot be combined with {request.constraint.param}: a stop string "
            "would cut the answer the constraint promises whole; leave stop out (the "
            "constraint already decides where the answer ends)",
            "stop",
        )


def require_object(body) -> dict:
    if not isinstance(body, dict):
        raise invalid(
            f"the request body must be a JSON object, got {json_type(body)}",
            None,
            code="invalid_type",
        )
    return body


def model_field(body: dict) -> str | None:
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise wrong_type("model", model, "a string (see GET /v1/models)")
    return model


def chat_messages(body: dict) -> list[dict]:
    """The messages as the chat template takes them: role and text content.
    "developer" is OpenAI's newer name for "system"."""
    if "messages" not in body or body["messages"] is None:
        raise invalid(
            'messages is required: a list such as [{"role": "user", "content": "Hi"}]',
            "messages",
            code="missing_required_parameter",
        )
    messages = body["messages"]
    if not isinstance(messages, list):
        raise wrong_type("messages", messages, "a list of {role, content} objects")
    if not messages:
        raise invalid(
            "messages is empty: send at least one message, such as "
            '{"role": "user", "content": "Hi"}',
            "messages",
        )
    checked = []
    for number, message in enumerate(messages):
        where = f"messages[{number}]"
        if not isinstance(message, dict):
            raise wrong_type(where, message, "an object with role and content")
        role = message.get("role")
        if role not in ROLES:
            raise invalid(
                f"{where}.role is {role!r}: use one of {', '.join(ROLES)}"
                + (
                    " (this server runs no tools)"
                    if role in ("tool", "function")
                    else ""
                ),
                f"{where}.role",
            )
        checked.append(
            {
                "role": "system" if role == "developer" else role,
                "content": message_text(message.get("content"), f"{where}.content"),
            }
        )
    return checked


def message_text(content, where: str) -> str:
    """A message's text: a string, or a list of {"type": "text", "text": ...} parts."""
    if isinstance(content, str):
        return valid_text(content, where)
    if isinstance(content, list):
        texts = []
        for number, part in enumerate(content):
            if not (isinstance(part, dict) and part.get("type") == "text"):
                raise invalid(
                    f"{where}[{number}] must be a text part "
                    '{"type": "text", "text": "..."}: this model reads text only',
                    f"{where}[{number}]",
                )
            if not isinstance(part.get("text"), str):
                raise wrong_type(
                    f"{where}[{number}].text", part.get("text"), "a string"
                )
            texts.append(valid_text(part["text"], f"{where}[{number}].text"))
        return "".join(texts)
    raise wrong_type(where, content, 'a string or a list of {"type": "text"} parts')


def completion_prompt(body: dict) -> str | list[int]:
    """One prompt: a string, token ids, or a list holding exactly one of them."""
    if "prompt" not in body or body["prompt"] is None:
        raise invalid(
            'prompt is required: a string such as "Once upon a time", or token ids',
            "prompt",
            code="missing_required_parameter",
        )
    prompt = body["prompt"]
    if (
        isinstance(prompt, list)
        and prompt
        and all(isinstance(p, (str, list)) for p in prompt)
    ):
        if len(prompt) > 1:
            raise invalid(
                f"prompt holds {len(prompt)} prompts: send one prompt per request",
                "prompt",
            )
        prompt = prompt[0]  # a batch of one
        if isinstance(prompt, list) and any(isinstance(p, (str, list)) for p in prompt):
            raise invalid(
                f"prompt[0] must be a string or a list of token ids, got "
                f"{json_type(prompt)} holding {json_type(prompt[0])}: {PROMPT_FORMS}",
                "prompt",
                code="invalid_type",
            )
    if isinstance(prompt, str):
        if not prompt:
            raise invalid("prompt is empty: give the model text to continue", "prompt")
        return valid_text(prompt, "prompt")
    if isinstance(prompt, list):
        if not prompt:
            raise invalid("prompt is an empty list: give text or token ids", "prompt")
        for position, token in enumerate(prompt):
            if not is_int(token) or token < 0:
                raise invalid(
                    f"prompt[{position}] is {short(token)}: token ids are ints "
                    f">= 0; {PROMPT_FORMS}",
                    "prompt",
                    code="invalid_type",
                )
        return list(prompt)
    raise wrong_type("prompt", prompt, PROMPT_FORMS.removeprefix("prompt takes "))


PROMPT_FORMS = (
    'prompt takes a string ("Once upon a time"), a list of token ids ([1, 2, 3]), '
    "or a list holding one of them"
)


def valid_text(text: str, where: str) -> str:
    """`text` if it is valid Unicode: JSON may escape half a surrogate pair
    ("\\ud800"), which no tokenizer can encode."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as error:
        raise invalid(
            f"{where} holds an unpaired surrogate ({text[error.start]!a}) at character "
            f"{error.start}: send valid Unicode text (a \\ud800-\\udbff escape must "
            "be followed by a \\udc00-\\udfff one)",
            where,
            code="invalid_text",
        ) from None
    return text


def common_fields(
    body: dict, request: GenerationRequest, max_tokens_names: tuple[str, ...]
) -> None:
    """The fields both endpoints share: n, stream, stream_options, max_tokens,
    sampling, stop and priority."""
    n = body.get("n")
    if n is not None and (not is_int(n) or n != 1):
        raise invalid(
            f"n must be 1, got {n!r}: this server returns one choice per request; "
            "send n requests instead",
            "n",
        )
    stream = body.get("stream")
    if stream is not None and not isinstance(stream, bool):
        raise wrong_type("stream", stream, "true or false")
    request.stream = bool(stream)
    options = body.get("stream_options")
    if options is not None:
        if not request.stream:
            raise invalid('stream_options needs "stream": true', "stream_options")
        if not isinstance(options, dict):
            raise wrong_type(
                "stream_options", options, 'an object like {"include_usage": true}'
            )
        for key, value in options.items():
            if key != "include_usage" and value not in (None, False):
                raise unsupported(
                    f"stream_options.{key}",
                    "only include_usage is supported; leave the others out",
                )
        include_usage = options.get("include_usage", False)
        if not isinstance(include_usage, bool):
            raise wrong_type(
                "stream_options.include_usage", include_usage, "true or false"
            )
        request.include_usage = include_usage
    for name in max_tokens_names:
        value = body.get(name)
        if value is None:
            continue
        if not is_int(value):
            raise wrong_type(name, value, "an integer")
        if value < 1:
            raise invalid(f"{name} must be at least 1, got {value}", name)
        request.max_tokens = value
        break
    request.temperature = number_field(body, "temperature", 1.0, 0.0, MAX_TEMPERATURE)
    request.top_p = number_field(body, "top_p", 1.0, 0.0, 1.0, open_low=True)
    top_k = body.get("top_k")
    if top_k is not None:
        if not is_int(top_k):
            raise wrong_type("top_k", top_k, "an integer")
        if top_k < -1:
            raise invalid(
                f"top_k must be at least 1 (or -1 for no limit), got {top_k}", "top_k"
            )
        request.top_k = top_k if top_k >= 1 else None
    request.stop = stop_strings(body.get("stop"))
    priority = body.get("priority")
    if priority is not None:
        if priority not in PRIORITIES:
            raise invalid(
                f'priority is {priority!r}: use "interactive" (chat, served first) '
                'or "batch"',
                "priority",
            )
        request.priority = priority
    for name in ("presence_penalty", "frequency_penalty"):
        value = body.get(name)
        if value not in (None, 0, 0.0) or isinstance(value, bool):
            raise unsupported(
                name, "penalties are not supported; send 0 or leave it out"
            )
    if body.get("logit_bias"):
        raise unsupported("logit_bias", "logit biases are not supported")
    if body.get("seed") is not None:
        raise unsupported(
            "seed",
            "sampling draws from the engine's shared random state; leave seed out",
        )
    for name, no_effect, what in NOT_YET:
        if name in body and body[name] not in no_effect:
            raise unsupported(name, f"{what}; leave {name} out")
    # The tokenizer's own special tokens: vLLM's defaults, which this server follows
    # (the chat template places them; a completion's text is encoded with them).
    added = request.endpoint != "chat"
    if body.get("add_special_tokens") not in (None, added):
        raise unsupported(
            "add_special_tokens",
            f"this endpoint always tokenizes with add_special_tokens={added}; leave "
            "add_special_tokens out",
        )


# Fields of OpenAI's and vLLM's request documents this server does not act on: each
# is accepted only with a value that asks for nothing (the defaults), else a 400,
# so that no request is answered as if it had been honoured. Fields that change
# nothing a client can observe (user, metadata, store, service_tier,
# prompt_cache_key, safety_identifier, request_id, cache_salt) are accepted.
NOT_YET = [
    ("min_tokens", (None, 0), "a minimum answer length is not supported"),
    ("ignore_eos", (None, False), "generating past EOS is not supported"),
    ("repetition_penalty", (None, 1, 1.0), "repetition penalties are not supported"),
    ("min_p", (None, 0, 0.0), "min-p sampling is not supported (use top_p)"),
    (
        "include_stop_str_in_output",
        (None, False),
        "answers always end before their stop string",
    ),
    ("skip_special_tokens", (None, True), "special tokens are never in the text"),
    ("modalities", (None, ["text"]), "this model answers in text only"),
    ("audio", (None,), "this model answers in text only"),
    ("prediction", (None,), "predicted outputs are not supported"),
    ("reasoning_effort", (None,), "this model does not reason before answering"),
    ("verbosity", (None, "medium"), "answer length is set by max_tokens"),
    ("web_search_options", (None,), "this server does not search the web"),
    ("best_of", (None, 1), "one answer is generated per request"),
    ("use_beam_search", (None, False), "beam search is not supported"),
    (
        "length_penalty",
        (None, 1, 1.0),
        "length penalties (beam search) are not supported",
    ),
    ("stop_token_ids", (None, []), "stop at token ids is not supported (use stop)"),
    ("bad_words", (None, []), "banned words are not supported"),
    ("allowed_token_ids", (None,), "token allow-lists are not supported"),
    ("truncate_prompt_tokens", (None,), "prompts are never truncated"),
    ("prompt_logprobs", (None,), "log-probabilities are not returned"),
    (
        "spaces_between_special_tokens",
        (None, True),
        "special tokens are never in the text",
    ),
    ("echo", (None, False), "the prompt is not echoed back"),
    ("add_generation_prompt", (None, True), "the assistant's turn is always opened"),
    ("continue_final_message", (None, False), "a final message is not continued"),
    ("documents", (None,), "documents are not passed to the template"),
    ("chat_template", (None,), "the model's own chat template is used"),
    ("chat_template_kwargs", (None, {}), "the template takes no options here"),
    ("logits_processors", (None,), "logits processors are not supported"),
    ("return_tokens_as_token_ids", (None, False), "tokens are returned as text"),
    ("guided_whitespace_pattern", (None,), "JSON answers are compact (no whitespace)"),
    ("mm_processor_kwargs", (None, {}), "this model reads text only"),
    ("kv_transfer_params", (None, {}), "KV transfer between servers is not supported"),
    ("vllm_xargs", (None, {}), "no extra arguments are read"),
]


def number_field(
    body: dict,
    name: str,
    default: float,
    low: float,
    high: float,
    open_low: bool = False,
) -> float:
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise wrong_type(name, value, "a number")
    bracket = "(" if open_low else "["
    try:
        number = float(value)
    except OverflowError:  # an integer of hundreds of digits
        number = math.inf
    too_low = number <= low if open_low else number < low
    if not math.isfinite(number) or too_low or number > high:
        raise invalid(
            f"{name} must be in {bracket}{low:g}, {high:g}], got {short(value)}", name
        )
    return number


def stop_strings(stop) -> list[str]:
    if stop is None:
        return []
    stops = [stop] if isinstance(stop, str) else stop
    if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
        raise wrong_type("stop", stop, "a string or a list of strings")
    if len(stops) > MAX_STOP_STRINGS:
        raise invalid(
            f"stop has {len(stops)} strings: send at most {MAX_STOP_STRINGS}", "stop"
        )
    if any(s == "" for s in stops):
        raise invalid(
            "stop holds an empty string: every stop string needs text", "stop"
        )
    return [valid_text(s, "stop") for s in stops]


@dataclass(frozen=True)
class ConstraintRequest:
    """A structured-output option as the body gave it. kind: "json_schema" (value a
    schema object), "json_object" (value None), "regex" (a pattern) or "choice" (a
    list of strings); param: the field to name in an error."""

    kind: str
    value: object
    param: str


RESPONSE_FORMATS = '"text", "json_object" or "json_schema"'


def constraint_fields(body: dict) -> ConstraintRequest | None:
    """The one structured-output option of a body, checked for shape (the app
    compiles it); None without one."""
    found = []
    response_format = body.get("response_format")
    if response_format is not None:
        found += response_format_constraint(response_format)
    if body.get("guided_json") is not None:
        found.append(json_schema_constraint(body["guided_json"], "guided_json"))
    if body.get("guided_regex") is not None:
        found.append(regex_constraint(body["guided_regex"], "guided_regex"))
    if body.get("guided_choice") is not None:
        found.append(choice_constraint(body["guided_choice"], "guided_choice"))
    for name in ("guided_grammar", "guided_decoding_backend"):
        if body.get(name) is not None:
            raise unsupported(
                name, "use guided_json, guided_regex or guided_choice instead"
            )
    outputs = body.get("structured_outputs")
    if outputs is not None:
        found += structured_outputs_constraint(outputs)
    if len(found) > 1:
        names = ", ".join(c.param for c in found)
        raise invalid(
            f"give at most one structured-output option per request, got {names}",
            found[1].param,
        )
    return found[0] if found else None


def response_format_constraint(value) -> list[ConstraintRequest]:
    param = "response_format"
    if not isinstance(value, dict):
        raise wrong_type(param, value, 'an object like {"type": "json_object"}')
    kind = value.get("type")
    if kind == "text":
        return []
    if kind == "json_object":
        return [ConstraintRequest("json_object", None, param)]
    if kind != "json_schema":
        raise invalid(
            f"response_format.type is {short(kind)}: use {RESPONSE_FORMATS}",
            "response_format.type",
        )
    spec = value.get("json_schema")
    if not isinstance(spec, dict):
        raise invalid(
            'response_format.json_schema is required with "type": "json_schema": '
            '{"name": "...", "schema": {...}, "strict": true}',
            "response_format.json_schema",
        )
    name = spec.get("name")
    if name is not None and not isinstance(name, str):
        raise wrong_type("response_format.json_schema.name", name, "a string")
    strict = spec.get("strict")
    if strict is not None and not isinstance(strict, bool):
        raise wrong_type("response_format.json_schema.strict", strict, "true or false")
    if "schema" not in spec:
        raise invalid(
            "response_format.json_schema.schema is required: the JSON Schema the "
            'answer must follow, such as {"type": "object", "properties": {...}}',
            "response_format.json_schema.schema",
            code="missing_required_parameter",
        )
    # strict or not, the answer is held to the schema: a mask cannot half-enforce.
    return [
        json_schema_constraint(spec["schema"], "response_format.json_schema.schema")
    ]


def structured_outputs_constraint(value) -> list[ConstraintRequest]:
    param = "structured_outputs"
    if not isinstance(value, dict):
        raise wrong_type(param, value, 'an object like {"regex": "[0-9]+"}')
    found = []
    for key, item in value.items():
        where = f"{param}.{key}"
        if item is None or item is False:
            continue
        if key == "json":
            found.append(json_schema_constraint(item, where))
        elif key == "regex":
            found.append(regex_constraint(item, where))
        elif key == "choice":
            found.append(choice_constraint(item, where))
        elif key == "json_object":
            found.append(ConstraintRequest("json_object", None, where))
        else:
            raise unsupported(where, "supported: json, regex, choice and json_object")
    return found


def json_schema_constraint(schema, param: str) -> ConstraintRequest:
    if isinstance(schema, str):
        try:
            schema = json.loads(schema)
        except json.JSONDecodeError as error:
            raise invalid(
                f"{param} is a string that is not JSON ({error}): send the schema "
                "as an object",
                param,
            ) from None
    if not isinstance(schema, (dict, bool)):
        raise wrong_type(param, schema, "a JSON Schema object")
    return ConstraintRequest("json_schema", schema, param)


def regex_constraint(pattern, param: str) -> ConstraintRequest:
    if not isinstance(pattern, str):
        raise wrong_type(param, pattern, "a string (a regular expression)")
    return ConstraintRequest("regex", valid_text(pattern, param), param)


def choice_constraint(options, param: str) -> ConstraintRequest:
    if not isinstance(options, list) or not all(isinstance(o, str) for o in options):
        raise wrong_type(param, options, "a list of strings")
    if not options:
        raise invalid(
            f"{param} is an empty list: give at least one string the answer may be",
            param,
        )
    return ConstraintRequest("choice", [valid_text(o, param) for o in options], param)


def refuse_unsupported(body: dict, names: tuple[str, ...], what: str) -> None:
    for name in names:
        if body.get(name):
            raise unsupported(name, f"{what} are not supported by this server")


def unsupported(param: str, why: str) -> ApiError:
    return invalid(f"{param}: {why}", param, code="unsupported_parameter")


def wrong_type(param: str, value, expected: str) -> ApiError:
    return invalid(
        f"{param} must be {expected}, got {json_type(value)}",
        param,
        code="invalid_type",
    )


def is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def short(value, limit: int = 40) -> str:
    """A client's value for a message, cut to `limit` characters."""
    text = repr(value)
    return text if len(text) <= limit else f"{text[: limit - 3]}... ({len(text)} chars)"


def json_type(value) -> str:
    """The JSON name of a decoded value's type, as a client wrote it."""
    names = {bool: "a boolean", int: "a number", float: "a number", str: "a string"}
    names.update({list: "an array", dict: "an object", type(None): "null"})
    return names.get(type(value), type(value).__name__)


# The response objects.


def new_id(endpoint: str) -> str:
    prefix = "chatcmpl" if endpoint == "chat" else "cmpl"
    return f"{prefix}-{uuid.uuid4().hex}"


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int) -> dict:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "prompt_tokens_details": {"cached_tokens": cached_tokens},
    }


def response_object(
    request: GenerationRequest,
    response_id: str,
    model: str,
    text: str,
    finish_reason: str,
    usage_: dict,
) -> dict:
    """The whole (non-streamed) answer."""
    if request.endpoint == "chat":
        choice = {
            "index": 0,
            "message": {"role": "assistant", "content": text},
            "logprobs": None,
            "finish_reason": finish_reason,
        }
        kind = "chat.completion"
    else:
        choice = {
            "index": 0,
            "text": text,
            "logprobs": None,
            "finish_reason": finish_reason,
        }
        kind = "text_completion"
    return {
        "id": response_id,
        "object": kind,
        "created": int(time.time()),
        "model": model,
        "choices": [choice],
        "usage": usage_,
    }


def chunk_object(
    request: GenerationRequest,
    response_id: str,
    model: str,
    text: str | None,
    finish_reason: str | None = None,
    usage_: dict | None = None,
    first: bool = False,
) -> dict:
    """One streamed chunk. text None: a chunk with no choices (the usage chunk)."""
    if text is None:
        choices = []
    elif request.endpoint == "chat":
        delta = {"role": "assistant", "content": text} if first else {"content": text}
        if finish_reason is not None and not text:
            delta = {}
        choices = [
            {
                "index": 0,
                "delta": delta,
                "logprobs": None,
                "finish_reason": finish_reason,
            }
        ]
    else:
        choices = [
            {"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason}
        ]
    chunk = {
        "id": response_id,
        "object": "chat.completion.chunk"
        if request.endpoint == "chat"
        else "text_completion",
        "created": int(time.time()),
        "model": model,
        "choices": choices,
    }
    if usage_ is not None:
        chunk["usage"] = usage_
    return chunk
