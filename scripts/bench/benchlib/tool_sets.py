"""A suite of tool sets for tool calls (week 4 day 2), shared by the tests
(tests/test_week_4_day_2.py) and `pdm run bench-tools`.

Each function's parameters are one of the structured-output suite's object schemas
(schemas.py: bounded strings, numbers and arrays, closed objects, nested objects,
enums, unions, $defs), so a call that follows its schema ends within
CALL_MAX_TOKENS tokens whatever the model says. The sets have one to four
functions: consecutive windows over those schemas.
"""

from .schemas import MAX_TOKENS, SUITE

# A call is its JSON (at most MAX_TOKENS tokens, even a character a token), the
# name and the tags around it.
CALL_MAX_TOKENS = MAX_TOKENS + 48


def function_name(schema_name: str) -> str:
    return "get_" + schema_name.replace(" ", "_")


def tool(schema_name: str, schema: dict) -> dict:
    """An OpenAI function tool whose parameters are `schema`."""
    return {
        "type": "function",
        "function": {
            "name": function_name(schema_name),
            "description": f"Look up a {schema_name}.",
            "parameters": schema,
        },
    }


OBJECTS = [
    (name, schema) for name, schema, _ in SUITE if schema.get("type") == "object"
]
TOOL_SETS: list[list[dict]] = [
    [tool(*OBJECTS[(start + i) % len(OBJECTS)]) for i in range(size)]
    for size in (1, 2, 4)
    for start in range(0, len(OBJECTS), 2 if size == 1 else 3)
]
