"""How the request bodies' pydantic models refuse, in the client's terms.

The bodies (openai_bodies.py, structured_options.py) are pydantic models with
strict types: a string is never read as a number, nor 1 as true. A value pydantic
or a validator refuses becomes one OpenAI-shaped 400 (`refused`) that says which
field (the path pydantic reports, `messages[0].content`), what is wrong and what
to send.

A validator refuses by raising a Refusal: its text follows the field's path in the
message ("must be 1, got 2" becomes "n must be 1, got 2"); pydantic records it with
that path, however deep the field is. `expect(what)` gives a field's wrong-type
message ("must be true or false, got a string") instead of pydantic's own.
"""

import json
import math
from typing import Annotated

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    PlainValidator,
    ValidationError,
    WrapValidator,
    model_validator,
)

from .errors import ApiError, invalid, json_type, short

# pydantic's errors for a value of the wrong JSON type (strict mode: no coercion).
TYPE_ERRORS = frozenset(
    ("string_type", "int_type", "float_type", "bool_type", "list_type", "dict_type")
    + ("model_type", "model_attributes_type")
)


class Refusal(ValueError):
    """A field's value refused. says: the message after the field's path.
    code: the error object's code. at: a place inside the field the message names
    (prompt[1]) while param stays the field. field: a field below the one being
    validated (a model's own validator naming one of its fields)."""

    code = "invalid_value"

    def __init__(
        self, says: str, code: str | None = None, at: str = "", field: str = ""
    ):
        super().__init__(says)
        self.says, self.at, self.field = says, at, field
        self.code = code or self.code

    def message(self, param: str) -> str:
        return f"{param}{self.at} {self.says}"


class Unsupported(Refusal):
    """A field the server cannot honour: "<field>: <why>"."""

    code = "unsupported_parameter"

    def message(self, param: str) -> str:
        return f"{param}{self.at}: {self.says}"


class RequestModel(BaseModel):
    """A JSON object of a request body: strict types, unknown fields ignored
    (clients send many this server has no use for; those it cannot honour are
    refused by name, see unhonoured.py), and defaults validated like given values,
    so that a missing field and a null one are refused alike."""

    model_config = ConfigDict(strict=True, extra="ignore", validate_default=True)


class OptionsObject(RequestModel, extra="allow"):
    """An object of options (stream_options, structured_outputs). A key set to
    null or false asks for nothing and is dropped; a subclass refuses any other
    key it does not know by typing `__pydantic_extra__` with a validator that
    raises Unsupported (pydantic then names the key: stream_options.x)."""

    @model_validator(mode="before")
    @classmethod
    def asking_for_something(cls, value):
        if not isinstance(value, dict):
            return value  # refused as the wrong type by the field's expect()
        return {k: v for k, v in value.items() if v is not None and v is not False}


def expect(what: str) -> WrapValidator:
    """A field annotation: a value of the wrong JSON type (at any depth of the
    field's type: [1] for a list of strings) is refused as "must be <what>, got
    <its JSON type>". Refusals from deeper validators pass through."""

    def check(value, handler):
        try:
            return handler(value)
        except ValidationError as error:
            if any(e["type"] not in TYPE_ERRORS for e in error.errors()):
                raise
            raise Refusal(
                f"must be {what}, got {json_type(value)}{wrong_item(value, error)}",
                "invalid_type",
            ) from None

    return WrapValidator(check)


def wrong_item(value, error: ValidationError) -> str:
    """Where inside a list or object the first wrong value is (", whose [1] is a
    number"), or "" when the value itself has the wrong type."""
    place, inner = "", value
    for key in error.errors()[0]["loc"]:
        try:
            inner = inner[key]
        except (KeyError, IndexError, TypeError):
            break
        place += f"[{key}]" if isinstance(key, int) else f".{key}"
    if not place:
        return ""
    text = json.dumps(inner)
    text = text if len(text) <= 40 else text[:37] + "..."
    return f", whose item {place} is {json_type(inner)} ({text})"


def required(example: str) -> WrapValidator:
    """A field annotation: left out or null, the field is refused as "is required:
    <example>" (declare it with default None)."""

    def check(value, handler):
        if value is None:
            raise Refusal(f"is required: {example}", "missing_required_parameter")
        return handler(value)

    return WrapValidator(check)


def valid_text(text: str) -> str:
    """`text` if it is valid Unicode: JSON may escape half a surrogate pair
    ("\\ud800"), which no tokenizer can encode."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as error:
        raise Refusal(
            f"holds an unpaired surrogate ({text[error.start]!a}) at character "
            f"{error.start}: send valid Unicode text (a \\ud800-\\udbff escape must "
            "be followed by a \\udc00-\\udfff one)",
            "invalid_text",
        ) from None
    return text


# A string of valid Unicode; add expect() for its wrong-type message.
Text = Annotated[str, AfterValidator(valid_text)]


def number_in(low: float, high: float, default: float, open_low: bool = False):
    """A field annotation: a JSON number in [low, high] ((low, high] with
    open_low) read as a float, `default` when left out or null."""
    bracket = "(" if open_low else "["

    def check(value) -> float:
        if value is None:
            return default
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise Refusal(f"must be a number, got {json_type(value)}", "invalid_type")
        try:
            number = float(value)
        except OverflowError:  # an integer of hundreds of digits
            number = math.inf
        too_low = number <= low if open_low else number < low
        if not math.isfinite(number) or too_low or number > high:
            raise Refusal(f"must be in {bracket}{low:g}, {high:g}], got {short(value)}")
        return number

    return PlainValidator(check)


def is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def field_path(loc: tuple) -> str:
    """pydantic's location as the client names the field: messages[0].content."""
    path = ""
    for part in loc:
        path += f"[{part}]" if isinstance(part, int) else f".{part}"
    return path.removeprefix(".")


def validated(model: type[RequestModel], body) -> RequestModel:
    """`body` (decoded JSON) as `model`, or the ApiError for its first problem."""
    try:
        return model.model_validate(body)
    except ValidationError as error:
        raise refused(error) from None


def refused(error: ValidationError) -> ApiError:
    """The 400 for a body's first problem: a Refusal's own message, or one for
    what pydantic itself refused (a body that is not an object; any other is a
    field without its expect())."""
    first = error.errors(include_url=False)[0]
    param = field_path(first["loc"])
    refusal = first.get("ctx", {}).get("error")
    if isinstance(refusal, Refusal):
        if refusal.field:
            param = f"{param}.{refusal.field}" if param else refusal.field
        return invalid(refusal.message(param), param, refusal.code)
    got = json_type(first["input"])
    if not param:  # pydantic's model_type: the body itself
        message = f"the request body must be a JSON object, got {got}"
        return invalid(message, None, code="invalid_type")
    return invalid(f"{param}: {first['msg'].lower()}, got {got}", param)


def at_least_one_or_scoring(value: int | None) -> int | None:
    """max_tokens: at least 1, and 0 passes here too, for a prompt scored alone
    (echoes_prompt); a body that does not echo refuses it."""
    if value is not None and value < 0:
        raise Refusal(f"must be at least 0, got {value}")
    return value


def not_negative(value: int | None) -> int | None:
    if value is not None and value < 0:
        raise Refusal(f"must be at least 0, got {value}")
    return value


def at_least_one(value: int | None) -> int | None:
    if value is not None and value < 1:
        raise Refusal(f"must be at least 1, got {value}")
    return value


def top_k_limit(top_k: int | None) -> int | None:
    """None for no limit (0 and -1 say so too)."""
    if top_k is not None and top_k < -1:
        raise Refusal(f"must be at least 1 (or -1 for no limit), got {top_k}")
    return top_k if top_k is not None and top_k >= 1 else None
