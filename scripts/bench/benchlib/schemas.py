"""A suite of JSON schemas for structured outputs (week 3 day 5), shared by the tests
(tests/test_week_3_day_5_json.py) and `pdm run bench-structured`.

Each entry is (name, schema, request): the request asks a chat model for that
object in words. Every schema bounds what a random model could otherwise run on
forever: strings have maxLength, an enum, a const or an anchored pattern; numbers a
minimum and maximum; arrays maxItems; objects additionalProperties false. So an
answer that follows the schema finishes within MAX_TOKENS tokens whatever the
model says, which is what lets tests on random weights check validity, not luck.
"""

MAX_TOKENS = 96  # enough for any schema below, even spelled a character a token

WORD = {"type": "string", "maxLength": 8}
NAME = {"type": "string", "minLength": 1, "maxLength": 12}
AGE = {"type": "integer", "minimum": 0, "maximum": 120}
SCORE = {"type": "number", "minimum": 0, "maximum": 1}
TEMP = {"type": "number", "minimum": -50, "maximum": 50}
COUNT = {"type": "integer", "minimum": 1, "maximum": 9}
FLAG = {"type": "boolean"}
NOTHING = {"type": "null"}
COLOR = {"type": "string", "enum": ["red", "green", "blue"]}
DATE = {"type": "string", "pattern": r"^\d{4}-\d{2}-\d{2}$"}
CODE = {"type": "string", "pattern": r"^[A-Z]{3}-\d{2}$"}


def obj(properties: dict, required: list[str] | None = None) -> dict:
    """A closed object: those properties only, `required` (default: all)."""
    return {
        "type": "object",
        "properties": properties,
        "required": list(properties) if required is None else required,
        "additionalProperties": False,
    }


def array(items: dict, low: int = 0, high: int = 3) -> dict:
    return {"type": "array", "items": items, "minItems": low, "maxItems": high}


PERSON = obj({"name": NAME, "age": AGE})
POINT = obj({"x": TEMP, "y": TEMP})

SUITE: list[tuple[str, dict, str]] = [
    # scalars
    ("boolean", FLAG, "Is water wet? Answer true or false."),
    ("null", NOTHING, "Reply with null."),
    ("integer range", AGE, "How old is a typical student? A number."),
    ("number range", SCORE, "A probability that it rains tomorrow, 0 to 1."),
    ("negative number", TEMP, "A winter temperature in Celsius."),
    ("short string", WORD, "One word for a happy feeling."),
    ("enum string", COLOR, "The color of the sky: red, green or blue."),
    ("const", {"const": "ok"}, "Reply with the string ok."),
    ("date pattern", DATE, "Today's date as YYYY-MM-DD."),
    ("code pattern", CODE, "A flight code like ABC-12."),
    ("enum mixed", {"enum": [1, "two", None, True]}, "Pick one: 1, two, null, true."),
    (
        "type list",
        {"type": ["integer", "null"], "minimum": 0, "maximum": 9},
        "A digit.",
    ),
    # flat objects
    ("person", PERSON, "A person with a name and an age."),
    ("point", POINT, "A point with x and y coordinates."),
    (
        "optional fields",
        obj({"name": NAME, "nickname": WORD, "age": AGE}, ["name"]),
        "A person: name required, nickname and age if you like.",
    ),
    ("all optional", obj({"a": FLAG, "b": COUNT}, []), "An object with a and b."),
    ("empty object", obj({}), "An empty JSON object."),
    ("flags", obj({"done": FLAG, "late": FLAG, "paid": FLAG}), "Status flags."),
    ("with null", obj({"value": NOTHING, "ok": FLAG}), "An empty value and ok."),
    (
        "enum field",
        obj({"color": COLOR, "count": COUNT}),
        "A color and how many items.",
    ),
    (
        "integer enum",
        obj({"level": {"type": "integer", "enum": [1, 2, 3]}}),
        "A level from 1 to 3.",
    ),
    (
        "exclusive bounds",
        obj(
            {
                "p": {
                    "type": "number",
                    "exclusiveMinimum": 0,
                    "exclusiveMaximum": 1,
                }
            }
        ),
        "A probability strictly between 0 and 1.",
    ),
    (
        "string lengths",
        obj({"code": {"type": "string", "minLength": 2, "maxLength": 4}}),
        "A code of 2 to 4 letters.",
    ),
    ("dated event", obj({"event": WORD, "date": DATE}), "An event and its date."),
    ("flight", obj({"flight": CODE, "seats": COUNT}), "A flight code and seats."),
    (
        "long keys",
        obj(
            {
                "customer_identifier_code": CODE,
                "customer_loyalty_member": FLAG,
                "customer_lifetime_orders": COUNT,
            }
        ),
        "A customer record.",
    ),
    # arrays
    ("int array", array(COUNT), "Up to three small numbers."),
    ("bounded array", array(WORD, 1, 2), "One or two words."),
    ("exact array", array(FLAG, 2, 2), "Exactly two booleans."),
    ("empty array", array(COUNT, 0, 0), "An empty list."),
    ("enum array", array(COLOR, 1, 3), "One to three colors."),
    (
        "tuple",
        {
            "type": "array",
            "prefixItems": [NAME, AGE],
            "items": False,
            "minItems": 2,
        },
        "A name and an age as a two-element list.",
    ),
    ("array of people", array(PERSON, 1, 2), "One or two people."),
    ("array of points", array(POINT, 0, 2), "Up to two points."),
    ("nested arrays", array(array(COUNT, 1, 2), 1, 2), "A small matrix of digits."),
    (
        "object with array",
        obj({"tags": array(WORD, 0, 3), "count": COUNT}),
        "Tags and a count.",
    ),
    # nesting
    ("nested person", obj({"person": PERSON, "active": FLAG}), "A person, active?"),
    (
        "three levels",
        obj({"a": obj({"b": obj({"c": COUNT})})}),
        "An object a holding b holding c.",
    ),
    ("line", obj({"start": POINT, "end": POINT}), "A line from start to end."),
    (
        "order",
        obj(
            {
                "id": COUNT,
                "items": array(obj({"sku": CODE, "qty": COUNT}), 1, 2),
                "paid": FLAG,
            }
        ),
        "An order with its items.",
    ),
    (
        "team",
        obj({"lead": PERSON, "members": array(PERSON, 0, 2)}),
        "A team lead and members.",
    ),
    (
        "address book",
        obj(
            {
                "owner": NAME,
                "entries": array(obj({"name": NAME, "phone": CODE}, ["name"]), 0, 2),
            }
        ),
        "An address book.",
    ),
    (
        "weather",
        obj(
            {
                "city": NAME,
                "temperature": TEMP,
                "sky": {"enum": ["clear", "cloudy", "rain"]},
                "wind": obj({"speed": COUNT, "gusts": FLAG}),
            }
        ),
        "The weather in a city.",
    ),
    # unions
    (
        "anyOf scalar",
        {"anyOf": [AGE, {"type": "string", "maxLength": 5}, NOTHING]},
        "An age, a short word or null.",
    ),
    (
        "anyOf objects",
        {"anyOf": [obj({"cat": NAME}), obj({"dog": COUNT})]},
        "A cat's name or a dog count.",
    ),
    (
        "nullable field",
        obj({"middle_name": {"anyOf": [WORD, NOTHING]}, "age": AGE}),
        "A middle name or null, and an age.",
    ),
    (
        "union array",
        array({"anyOf": [COUNT, FLAG]}, 1, 3),
        "A list of digits and booleans.",
    ),
    (
        "oneOf kinds",
        {
            "oneOf": [
                obj({"kind": {"const": "circle"}, "r": COUNT}),
                obj({"kind": {"const": "square"}, "side": COUNT}),
            ]
        },
        "A circle or a square.",
    ),
    (
        "allOf",
        {"allOf": [{"type": "integer"}, {"minimum": 3, "maximum": 7}]},
        "A number from 3 to 7.",
    ),
    # references
    (
        "defs",
        {
            "$defs": {"pt": POINT},
            "type": "object",
            "properties": {"a": {"$ref": "#/$defs/pt"}, "b": {"$ref": "#/$defs/pt"}},
            "required": ["a", "b"],
            "additionalProperties": False,
        },
        "Two points a and b.",
    ),
    (
        "defs in array",
        {
            "$defs": {"p": PERSON},
            "type": "array",
            "items": {"$ref": "#/$defs/p"},
            "maxItems": 2,
        },
        "Up to two people.",
    ),
    (
        "everything",
        obj(
            {
                "name": NAME,
                "age": AGE,
                "score": SCORE,
                "member": FLAG,
                "color": COLOR,
                "joined": DATE,
                "tags": array(WORD, 0, 2),
                "note": {"anyOf": [WORD, NOTHING]},
            },
            ["name", "age", "member"],
        ),
        "A club member's record.",
    ),
]

assert len(SUITE) >= 50, len(SUITE)
