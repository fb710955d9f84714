"""The structured-output options of a request body (both endpoints), as pydantic
models.

OpenAI's `response_format` ({"type": "json_object"} or {"type": "json_schema",
"json_schema": {"name", "schema", "strict"}}), and vLLM's extra fields `guided_json`
(a schema), `guided_regex`, `guided_choice` (a list of strings) and the newer
`structured_outputs` ({"json"}, {"regex"}, {"choice"} or {"json_object": true}).
At most one per request: StructuredOutputFields.constraint_request() gives it as a
ConstraintRequest, which the generation turns into the engine's package's
constraint and checks against the tokenizer (constraints.py; a bad one is a 400).
"""

import json
from typing import Annotated, Any

from pydantic import AfterValidator, Field, PlainValidator, model_validator

from .errors import json_type, short
from .request import ConstraintRequest
from .validation import (
    OptionsObject,
    RequestModel,
    Refusal,
    Text,
    Unsupported,
    expect,
)

RESPONSE_FORMATS = ("text", "json_object", "json_schema")


def schema_value(schema) -> object:
    """A JSON Schema: an object or a boolean, or the same as JSON text."""
    if schema is None:
        return None
    if isinstance(schema, str):
        try:
            schema = json.loads(schema)
        except json.JSONDecodeError as error:
            raise Refusal(
                f"is a string that is not JSON ({error}): send the schema as an object"
            ) from None
    if not isinstance(schema, (dict, bool)):
        raise Refusal(
            f"must be a JSON Schema object, got {json_type(schema)}", "invalid_type"
        )
    return schema


def not_empty(options: list[str] | None) -> list[str] | None:
    if options == []:
        raise Refusal("is an empty list: give at least one string the answer may be")
    return options


Schema = Annotated[Any, PlainValidator(schema_value)]
Regex = Annotated[Text | None, expect("a string (a regular expression)")]
Choice = Annotated[
    list[Text] | None, expect("a list of strings"), AfterValidator(not_empty)
]


def response_format_type(kind) -> str:
    if kind not in RESPONSE_FORMATS:
        raise Refusal(f'is {short(kind)}: use "text", "json_object" or "json_schema"')
    return kind


class JsonSchemaSpec(RequestModel):
    """response_format.json_schema: the schema and its name. strict or not, the
    answer is held to the schema: a mask cannot half-enforce."""

    name: Annotated[str | None, expect("a string")] = None
    strict: Annotated[bool | None, expect("true or false")] = None
    schema_: Schema = Field(None, alias="schema")

    @model_validator(mode="before")
    @classmethod
    def schema_given(cls, spec):
        if isinstance(spec, dict) and spec.get("schema") is None:
            raise Refusal(
                "is required: the JSON Schema the answer must follow, such as "
                '{"type": "object", "properties": {...}}',
                "missing_required_parameter",
                field="schema",
            )
        return spec


class ResponseFormat(RequestModel):
    """OpenAI's response_format: "text" (no constraint), "json_object" or
    "json_schema" with its json_schema."""

    type: Annotated[str, PlainValidator(response_format_type)] = None
    json_schema: Annotated[
        JsonSchemaSpec | None,
        expect('an object: {"name": "...", "schema": {...}, "strict": true}'),
    ] = None

    @model_validator(mode="after")
    def schema_given(self) -> "ResponseFormat":
        if self.type == "json_schema" and self.json_schema is None:
            raise Refusal(
                'is required with "type": "json_schema": '
                '{"name": "...", "schema": {...}, "strict": true}',
                field="json_schema",
            )
        return self


def no_other_kind(value) -> None:
    raise Unsupported("supported: json, regex, choice and json_object")


class StructuredOutputs(OptionsObject):
    """vLLM's structured_outputs: one of its keys."""

    __pydantic_extra__: dict[str, Annotated[Any, AfterValidator(no_other_kind)]]

    json_: Schema = Field(None, alias="json")
    regex: Regex = None
    choice: Choice = None
    json_object: Annotated[bool | None, expect("true or false")] = None


class StructuredOutputFields(RequestModel):
    """The structured-output fields both endpoints' bodies share."""

    response_format: Annotated[
        ResponseFormat | None, expect('an object like {"type": "json_object"}')
    ] = None
    guided_json: Schema = None
    guided_regex: Regex = None
    guided_choice: Choice = None
    structured_outputs: Annotated[
        StructuredOutputs | None, expect('an object like {"regex": "[0-9]+"}')
    ] = None

    def constraint_requests(self) -> list[ConstraintRequest]:
        """Every option the body gives, in the order of the fields."""
        found = []
        form = self.response_format
        if form is not None and form.type == "json_object":
            found.append(ConstraintRequest("json_object", None, "response_format"))
        if form is not None and form.type == "json_schema":
            param = "response_format.json_schema.schema"
            found.append(
                ConstraintRequest("json_schema", form.json_schema.schema_, param)
            )
        outputs = self.structured_outputs or StructuredOutputs()
        for kind, value, param in (
            ("json_schema", self.guided_json, "guided_json"),
            ("regex", self.guided_regex, "guided_regex"),
            ("choice", self.guided_choice, "guided_choice"),
            ("json_schema", outputs.json_, "structured_outputs.json"),
            ("regex", outputs.regex, "structured_outputs.regex"),
            ("choice", outputs.choice, "structured_outputs.choice"),
        ):
            if value is not None:
                found.append(ConstraintRequest(kind, value, param))
        if outputs.json_object:
            param = "structured_outputs.json_object"
            found.append(ConstraintRequest("json_object", None, param))
        return found

    def constraint_request(self) -> ConstraintRequest | None:
        found = self.constraint_requests()
        return found[0] if found else None

    @model_validator(mode="after")
    def at_most_one(self) -> "StructuredOutputFields":
        found = self.constraint_requests()
        if len(found) > 1:
            raise Refusal(
                f"cannot be combined with {found[0].param}: give at most one "
                "structured-output option per request",
                field=found[1].param,
            )
        return self
