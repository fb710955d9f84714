"""An answer's tool calls, read out of its text: whole, or as a stream goes.

The calls are read by the package's parse_tool_calls (week 4 day 2); under the
tool-call grammar every call parses. Each is the package's ToolCall (.name, and
.arguments, a dict); every API writes them in its own shape (OpenAI's
tool_calls, the Responses API's function_call items, Anthropic's tool_use
blocks). A stream holds back text from an opening tag until its call is
complete, so a client never sees a call's raw text as content, and gets each call
whole.

The grammar makes every call valid; CallCheck checks it again against what the
client sent (jsonschema, an implementation independent of the grammar's), so a
call the server returns always names an offered tool and validates: a call that
does not fails the request instead. An answer cut by max_tokens inside a call
returns that call's text as content, with finish_reason "length": nothing the
model wrote is dropped, and nothing unchecked is called a call.
"""

from collections.abc import Callable

import jsonschema
from jsonschema.validators import validator_for

from tiny_llm_base.tool_prompts import CLOSE, OPEN

from .errors import ApiError, invalid
from .request import ConstraintRequest

NO_PARAMETERS = {"type": "object", "properties": {}}


class CallCheck:
    """What a returned call must be: a function of the request's tools (under a
    named tool_choice, that one; under "none", none), arguments the client's own
    parameters schema accepts, and one call at most without parallel_tool_calls.
    Made from the request's "tools" constraint (its value: the chat's tools,
    tool_choice, parallel_tool_calls); any other constraint offers no tool."""

    def __init__(self, constraint: ConstraintRequest | None):
        tools, choice, parallel = [], "none", False
        if constraint is not None and constraint.kind == "tools":
            tools, choice, parallel = constraint.value
        chosen = choice["function"]["name"] if isinstance(choice, dict) else None
        self.param = constraint.param if constraint is not None else "tools"
        self.worded = constraint.worded if constraint is not None else str
        self.parallel = parallel
        self.validators = {}
        for i, tool in enumerate(tools if choice != "none" else []):
            function = tool["function"]
            if chosen is None or function["name"] == chosen:
                schema = function.get("parameters", NO_PARAMETERS)
                self.validators[function["name"]] = self.validator(schema, i)
        self.count = 0

    def validator(self, schema: dict, i: int):
        """A jsonschema validator of `schema` (its own $schema's draft, else 2020-12);
        an invalid schema is a 400 before any work: no answer could be checked."""
        kind = validator_for(schema, default=jsonschema.Draft202012Validator)
        try:
            kind.check_schema(schema)
        except jsonschema.SchemaError as error:
            where = "".join(
                f"[{key}]" if isinstance(key, int) else f".{key}"
                for key in error.absolute_path
            )
            place = f"tools[{i}].function.parameters{where}"
            message = f"{place} is not valid JSON Schema: {error.message}; fix it"
            raise invalid(self.worded(message), self.param) from None
        return kind(schema)

    def check(self, calls: list) -> None:
        """Count and check the answer's next `calls`; ApiError (500, naming the call
        and what is wrong with it) for the first that fails."""
        for call in calls:
            self.count += 1
            problem = self.problem(call)
            if problem is None and self.count > 1 and not self.parallel:
                problem = "a second call, and parallel_tool_calls is false"
            if problem is not None:
                raise ApiError(
                    500,
                    f"the model's tool call {self.count} ({call.name!r}) was not "
                    f"returned: {problem}. This is a fault of the server's tool-call "
                    "grammar; the request failed instead of returning it",
                    "server_error",
                    code="invalid_tool_call",
                )

    def problem(self, call) -> str | None:
        validator = self.validators.get(call.name)
        if validator is None:
            return f"it names no tool this request offered ({sorted(self.validators)})"
        try:
            error = jsonschema.exceptions.best_match(
                validator.iter_errors(call.arguments)
            )
        except jsonschema.exceptions.JsonSchemaException as failure:
            return f"its arguments could not be checked: {failure}"
        if error is not None:
            where = error.json_path
            return f"its arguments fail the tool's schema at {where}: {error.message}"
        return None


def split_calls(text: str, parse: Callable) -> tuple[str, list]:
    """A finished answer -> (its content, its calls). With calls, the content is
    the text outside them, stripped ("" when there is none). A call the answer
    opened but never closed (cut at max_tokens) is content, as the model wrote it,
    with or without calls before it, as in a stream (CallSplitter.flush)."""
    content, calls = parse(text)
    if not calls:
        return text, []
    last = text.rfind(OPEN)
    cut = "" if parse(text[last:])[1] else text[last:]
    return content.partition(OPEN)[0].strip() + cut, calls


class CallSplitter:
    """Feeds a streamed answer's pieces; gives back the text that is surely content
    and the calls completed, holding back a possible call until it closes."""

    def __init__(self, parse: Callable):
        self.parse = parse
        self.buffer = ""
        self.calls = 0

    def feed(self, piece: str) -> tuple[str, list]:
        self.buffer += piece
        text, calls = "", []
        while (start := self.buffer.find(OPEN)) >= 0:
            read = self.whole_call(start)
            if read is None:
                break
            end, found = read
            text += self.buffer[:start]
            calls += found
            self.buffer = self.buffer[end:]
        if OPEN not in self.buffer:
            held = max(
                (n for n in range(1, len(OPEN)) if self.buffer.endswith(OPEN[:n])),
                default=0,
            )
            text += self.buffer[: len(self.buffer) - held]
            self.buffer = self.buffer[len(self.buffer) - held :]
        self.calls += len(calls)
        if self.calls and not text.strip():
            text = ""  # the newlines between calls
        return text, calls

    def whole_call(self, start: int) -> tuple[int, list] | None:
        """(the index past the first CLOSE after `start` whose block is a call, the
        calls), or None while no CLOSE ends one: a CLOSE inside an argument's string
        ends no call, and the grammar always closes the call later."""
        end = start
        while (end := self.buffer.find(CLOSE, end)) >= 0:
            end += len(CLOSE)
            _, found = self.parse(self.buffer[start:end])
            if found:
                return end, found
        return None

    def flush(self) -> str:
        """The text held back when the answer ended: a call it opened but never
        closed (cut at max_tokens), or the start of its tag, is content."""
        rest, self.buffer = self.buffer, ""
        return rest
