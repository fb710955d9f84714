"""Tool calls (week 4 day 2): a call is text in the model's call format, so day 5's
mask can make every call parse and validate by construction.

A chat model trained for tools (Qwen2.5's Hermes format, which this course uses for
every model) answers a call as a tagged JSON object:

    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>

A server that parses that text after the fact fails whenever the model errs: a
misspelled name, a missing argument, an unclosed brace. Here the tools become a
grammar (tool_grammar) and the answer is sampled under its mask (tiny_llm_base's
Grammar: llguidance runs a Lark grammar with JSON Schemas inside), so:

    tool_choice "auto"      any text, and wherever the model writes "<tool_call>",
                            a call that validates, then "</tool_call>"
    "required" / a name     only calls (to that function), one or more
    "none"                  any text that never opens a call

parse_tool_calls then splits an answer into its text and its calls.
"""

import json
from dataclasses import dataclass

from tiny_llm_base import Grammar, JsonSchema
from tiny_llm_base.tool_prompts import CLOSE, OPEN

# Compact JSON inside a call, as the course's JSON Schema answers are.
JSON_STYLE = {"whitespace_flexible": False, "item_separator": ",", "key_separator": ":"}
NO_PARAMETERS = {"type": "object", "properties": {}}
DEFS_KEYWORDS = ("$defs", "definitions")
# Calls in one answer at most: a small model that may call again after each call
# (parallel_tool_calls) can repeat the same call until max_tokens; a bound ends it.
MAX_CALLS = 8


@dataclass(frozen=True)
class ToolCall:
    """One call the model made: the function's name and its arguments (a dict)."""

    name: str
    arguments: dict


def check_tools(tools) -> list[dict]:
    """OpenAI's `tools` list -> the functions, each {"name", "parameters"} (a
    function without parameters takes NO_PARAMETERS). ValueError, naming the place
    (`tools[1].function.name`), for anything else: not a non-empty list, a tool whose
    type is not "function", a name that is not 1-64 letters, digits, "_" or "-", a
    name given twice, or parameters that are not a JSON Schema object the
    structured-output library compiles."""
    if not isinstance(tools, list) or not tools:
        raise ValueError("tools must be a non-empty list of function tools")
    functions, names = [], set()
    for i, tool in enumerate(tools):
        where = f"tools[{i}]"
        if not isinstance(tool, dict) or tool.get("type") != "function":
            raise ValueError(f'{where}: each tool must be {{"type": "function", ...}}')
        function = tool.get("function")
        if not isinstance(function, dict):
            raise ValueError(f"{where}.function must be an object with a name")
        name = function.get("name")
        if not (
            isinstance(name, str)
            and 1 <= len(name) <= 64
            and all(c.isascii() and (c.isalnum() or c in "_-") for c in name)
        ):
            raise ValueError(
                f"{where}.function.name must be 1-64 letters, digits, '_' or '-', "
                f"got {name!r}"
            )
        if name in names:
            raise ValueError(f"{where}.function.name {name!r} is given twice")
        names.add(name)
        parameters = function.get("parameters", NO_PARAMETERS)
        if not isinstance(parameters, dict) or parameters.get("type", "object") != (
            "object"
        ):
            raise ValueError(
                f"{where}.function.parameters must be a JSON Schema of an object"
            )
        try:
            JsonSchema(parameters).check()
        except ValueError as error:
            raise ValueError(f"{where}.function.parameters: {error}") from None
        functions.append({"name": name, "parameters": parameters})
    return functions


def call_schema(functions: list[dict]) -> dict:
    """The JSON Schema of ONE call to any of `functions` (check_tools' output): an
    object with exactly the keys "name" (that function's name, a const) and
    "arguments" (its parameters), one anyOf branch per function, and llguidance's
    compact JSON style ("x-guidance": JSON_STYLE).

    A parameters schema's `$ref`s are relative to ITS root ("#/$defs/point", "#"),
    and inside the call's schema its root is no longer the document's. So each
    function's parameters go to the call schema's $defs under the function's name
    (arguments: {"$ref": "#/$defs/NAME"}), their own $defs and definitions beside
    them as "NAME.$defs.X" and "NAME.definitions.X" (two keywords, two places: a
    schema may hold both, with the same X meaning different things; the moved
    parameters no longer hold them), and every $ref inside rewritten to match
    (rooted_refs). A function name has no ".", so no two functions' keys can meet.
    One function still gives an anyOf, of one branch.
    """
    # Week 4 Day 2 Task 2: call_schema: per function, its parameters (and their $defs
    # and definitions) moved to the call schema's $defs with rooted_refs; an anyOf
    # branch {"type": "object", "properties": {"name": {"const": NAME}, "arguments":
    # {"$ref": ...}}, both required, no other property}; "x-guidance": JSON_STYLE
    defs, branches = {}, []
    for f in functions:
        name, parameters = f["name"], dict(f["parameters"])
        for keyword in DEFS_KEYWORDS:
            for key, schema in parameters.pop(keyword, {}).items():
                defs[f"{name}.{keyword}.{key}"] = rooted_refs(schema, name)
        defs[name] = rooted_refs(parameters, name)
        branches.append(
            {
                "type": "object",
                "properties": {
                    "name": {"const": name},
                    "arguments": {"$ref": f"#/$defs/{name}"},
                },
                "required": ["name", "arguments"],
                "additionalProperties": False,
            }
        )
    return {"anyOf": branches, "$defs": defs, "x-guidance": JSON_STYLE}


def rooted_refs(schema, name: str):
    """`schema` (any JSON value) with every local $ref of function `name`'s
    parameters moved under the call schema's $defs: "#/$defs/X..." ->
    "#/$defs/NAME.$defs.X...", "#/definitions/X..." -> "#/$defs/NAME.definitions.X...",
    the root "#" and any other pointer "#/..." ("#/properties/a") ->
    "#/$defs/NAME..."; a ref that is not a local pointer ("other.json#/a", a
    plain-name fragment "#pt") stays as it is; other values copied as they are."""
    # Week 4 Day 2 Task 2: rooted_refs: walk dicts and lists; rewrite each "$ref" string
    if isinstance(schema, list):
        return [rooted_refs(item, name) for item in schema]
    if not isinstance(schema, dict):
        return schema
    out = {}
    for key, value in schema.items():
        if key == "$ref" and isinstance(value, str):
            out[key] = rooted_ref(value, name)
        else:
            out[key] = rooted_refs(value, name)
    return out


def rooted_ref(ref: str, name: str) -> str:
    """One $ref of function `name`'s parameters, as rooted_refs rewrites it."""
    # Week 4 Day 2 Task 2: rooted_ref: the docstring's three cases; a ref that is not
    # a local pointer ("other.json#/a", "#pt") is left as it is
    for keyword in DEFS_KEYWORDS:
        prefix = f"#/{keyword}/"
        if ref.startswith(prefix):
            return f"#/$defs/{name}.{keyword}.{ref[len(prefix) :]}"
    if ref == "#" or ref.startswith("#/"):
        return f"#/$defs/{name}{ref[1:]}"
    return ref


def tool_grammar(
    functions: list[dict], tool_choice="auto", parallel_tool_calls: bool = True
) -> str:
    """The Lark grammar (llguidance's dialect) of an answer under `tool_choice`:

    "auto": any text; each OPEN the model writes starts a call: "\n", one call's
        JSON (call_schema, `%json {...}`), "\n" CLOSE. At most one call without
        parallel_tool_calls, MAX_CALLS with it; the text after the last call never
        contains OPEN, so no call past the limit can be written, not even
        one the user's text asked the model to copy.
    "required", or {"type": "function", "function": {"name": N}} (only N's
        schema): the answer is calls only, OPEN "\n" JSON "\n" CLOSE: one without
        parallel_tool_calls, 1 to MAX_CALLS joined by "\n" with it.
    "none": any text that never contains OPEN.

    The text before a call must end where OPEN begins: a lazy rule
    (`head[lazy]: TEXT "<tool_call>"`) matches as little text as it can, so the
    call's grammar takes over at the first OPEN. The schema goes in inline as
    json.dumps text (`%json {"anyOf": ...}`); Lark's strings take "\n" escapes.

    ValueError for a dict tool_choice that does not name a function of `functions`
    (any dict: a wrong "type" or a missing name too): 'tool_choice names no function
    in tools: {json.dumps(tool_choice)}; name one of {the names, a Python list}';
    for anything else that is none of these: 'tool_choice must be "auto",
    "required", "none" or a named function, got {json.dumps(tool_choice)}'.
    """
    # Week 4 Day 2 Task 2: tool_grammar: the docstring's three grammars (the chapter's
    # "The grammar of an answer"); for a named function, call_schema of that function
    # alone
    no_open = f"/(?s:.*)/ & ~/(?s:.*){OPEN}(?s:.*)/"  # any text without OPEN
    if tool_choice == "none":
        return f"start: TEXT\nTEXT: {no_open}\n"
    if isinstance(tool_choice, dict):
        name = (tool_choice.get("function") or {}).get("name")
        chosen = [f for f in functions if f["name"] == name]
        if tool_choice.get("type") != "function" or not chosen:
            raise ValueError(
                f"tool_choice names no function in tools: {json.dumps(tool_choice)}; "
                f"name one of {[f['name'] for f in functions]}"
            )
        functions, tool_choice = chosen, "required"
    if tool_choice not in ("auto", "required"):
        raise ValueError(
            f'tool_choice must be "auto", "required", "none" or a named function, '
            f"got {json.dumps(tool_choice)}"
        )
    schema = json.dumps(call_schema(functions))
    if tool_choice == "required":
        more = f' ("\\n" call){{0,{MAX_CALLS - 1}}}' if parallel_tool_calls else ""
        return f'start: call{more}\ncall: "{OPEN}\\n" %json {schema} "\\n{CLOSE}"\n'
    calls = f"call{{0,{MAX_CALLS}}}" if parallel_tool_calls else "call?"
    return (
        f"start: {calls} TAIL\n"
        f'call: head "\\n" %json {schema} "\\n{CLOSE}"\n'
        f'head[lazy]: TEXT "{OPEN}"\n'
        "TEXT: /(?s:.*)/\n"
        f"TAIL: {no_open}\n"
    )


def tool_constraint(
    tools, tool_choice="auto", parallel_tool_calls: bool = True
) -> Grammar:
    """The request's constraint for `tools` (OpenAI's list) under tool_choice:
    Grammar(tool_grammar(check_tools(tools), ...)), compiled once here so a bad tool
    set is a ValueError before any compute."""
    grammar = Grammar(
        tool_grammar(check_tools(tools), tool_choice, parallel_tool_calls)
    )
    grammar.check()
    return grammar


def parse_tool_calls(text: str) -> tuple[str, list[ToolCall]]:
    """An answer -> (its text outside the calls, the pieces joined with nothing between
    them and then stripped; the calls in order).

    A call is OPEN, a JSON object with a string "name" and an object "arguments"
    (call_of), then CLOSE, with any whitespace around the JSON. The JSON is read by a
    JSON decoder, not cut at the next CLOSE: a sampled argument may hold the text
    "</tool_call>" inside a string, and the grammar allows it there. A block that is
    not such a call stays in the text as it was, from its OPEN up to and including
    the next CLOSE, which is how an unconstrained answer's broken call shows up: bad
    JSON, missing keys; an OPEN never closed (another OPEN comes first, or none)
    stays as text up to that next OPEN (or the end), and the scan goes on from
    there.
    """
    # Week 4 Day 2 Task 1: parse_tool_calls: at each OPEN, call_of reads a call; else
    # the block up to the next CLOSE is text, or up to the next OPEN when that comes
    # first (or the answer ends)
    calls, kept, rest = [], [], text
    while (start := rest.find(OPEN)) >= 0:
        after = start + len(OPEN)
        read = call_of(rest, after)
        if read is not None:
            call, end = read
            kept.append(rest[:start])
            calls.append(call)
            rest = rest[end:]
            continue
        end, following = rest.find(CLOSE, after), rest.find(OPEN, after)
        if end < 0 or 0 <= following < end:  # never closed
            stop = following if following >= 0 else len(rest)
            kept.append(rest[:stop])
            rest = rest[stop:]
        else:
            kept.append(rest[: end + len(CLOSE)])
            rest = rest[end + len(CLOSE) :]
    kept.append(rest)
    return "".join(kept).strip(), calls


def call_of(text: str, at: int) -> tuple[ToolCall, int] | None:
    """The call whose JSON starts at text[at] (after whitespace) -> (its ToolCall, the
    index just past its CLOSE); None unless the JSON is an object whose keys are
    exactly "name" (a str) and "arguments" (a dict), followed by whitespace and
    CLOSE. parse_tool_calls passes `at` just past an OPEN; whitespace is what
    str.lstrip removes."""
    # Week 4 Day 2 Task 1: call_of: json.JSONDecoder().raw_decode from the first
    # character that is not whitespace (None on a JSONDecodeError), the docstring's
    # checks, then CLOSE after whitespace
    body = len(text) - len(text[at:].lstrip())
    try:
        value, end = json.JSONDecoder().raw_decode(text, body)
    except json.JSONDecodeError:
        return None
    if not isinstance(value, dict) or set(value) != {"name", "arguments"}:
        return None
    if not isinstance(value["name"], str) or not isinstance(value["arguments"], dict):
        return None
    close = len(text) - len(text[end:].lstrip())
    if not text.startswith(CLOSE, close):
        return None
    return ToolCall(value["name"], value["arguments"]), close + len(CLOSE)
