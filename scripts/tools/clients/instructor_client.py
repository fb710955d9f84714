"""instructor: the README's extraction (a pydantic model from a sentence) through
instructor.from_openai, once per mode.

JSON_SCHEMA and TOOLS send a schema the server enforces; JSON sends
response_format json_object (any object: the server holds it to compact JSON,
not to the schema, which is only in the prompt); MD_JSON asks in words for a
```json block and sends no constraint. Where the server kept its side (an object
that ended by itself; or no constraint at all), a refused answer is the model's.
"""

import json

import instructor
from instructor.core.exceptions import IncompleteOutputException
from openai import OpenAI
from pydantic import BaseModel

from scripts.tools.clients import ModelAnswer, ServerAddress, cut_short

MAX_TOKENS = 96


class User(BaseModel):
    name: str
    age: int


def extract(server: ServerAddress, mode: instructor.Mode) -> User:
    client = instructor.from_openai(
        OpenAI(base_url=server.v1, api_key=server.api_key, max_retries=0), mode=mode
    )
    return client.chat.completions.create(
        model=server.model,
        response_model=User,
        messages=[{"role": "user", "content": "John is 25 years old"}],
        max_tokens=MAX_TOKENS,
        max_retries=0,
    )


def enforced(mode: instructor.Mode):
    def feature(server: ServerAddress) -> None:
        try:
            assert isinstance(extract(server, mode), User)
        except IncompleteOutputException as error:
            message = error.last_completion.choices[0].message
            text = message.content or str(message.tool_calls)
            raise cut_short(text, MAX_TOKENS) from None

    return feature


def json_object(server: ServerAddress) -> None:
    try:
        extract(server, instructor.Mode.JSON)
    except Exception as error:
        completion = getattr(error, "last_completion", None)
        if completion is None:
            raise
        choice = completion.choices[0]
        text = choice.message.content or ""
        if choice.finish_reason == "length":
            raise cut_short(text, MAX_TOKENS) from None
        if choice.finish_reason == "stop" and isinstance(json.loads(text), dict):
            raise ModelAnswer(f"a JSON object, not a User: {text[:80]}") from None
        raise


def markdown_json(server: ServerAddress) -> None:
    try:
        extract(server, instructor.Mode.MD_JSON)
    except Exception as error:
        completion = getattr(error, "last_completion", None)
        if completion is None:
            raise
        choice = completion.choices[0]
        text = (choice.message.content or "").replace("\n", " ")
        raise ModelAnswer(
            f"unconstrained ({choice.finish_reason}); it wrote: {text[:80]}"
        ) from None


FEATURES = {
    "Mode.JSON_SCHEMA": enforced(instructor.Mode.JSON_SCHEMA),
    "Mode.TOOLS": enforced(instructor.Mode.TOOLS),
    "Mode.JSON": json_object,
    "Mode.MD_JSON": markdown_json,
}
