"""A JSON schema screened before it reaches native code, in the client's own terms.

llguidance compiles schemas in Rust: some inputs crash it (an integer range at or
below i64's minimum ends the process), some are answered wrongly (integer bounds
pass through a float, so 2**53 + 1 becomes 2**53), and the rest of its refusals
name its internals ("anyOf is empty" for an empty enum). `screen_schema` walks the
schema first and raises ValueError naming the place (`properties.age.minimum`),
what is wrong and what to send; `explain` rewrites the library's remaining messages.

A schema may not carry `x-guidance`, llguidance's own options (`lenient`
ignores every keyword it cannot enforce): they are the server's to choose, and a
client's would switch these checks off.

It also refuses a schema no finite value satisfies: a required property whose
schema refers back to itself (`{"$ref": "#"}` is the smallest), which the library
accepts and then cannot finish.
"""

import math
import re

# Integer bounds within +-2**53 stay exact through a float.
MAX_INTEGER_BOUND = 2**53
# llguidance builds no pattern for number bounds outside these (measured: 1e18 and
# 1e-300 are refused, -9e18 and 1e15 work).
MAX_NUMBER_BOUND = 1e15
MIN_NUMBER_BOUND = 1e-6
MAX_DEPTH = 64
MAX_PATTERN_CHARS = 10_000
MAX_REPEAT = 1000
# llguidance writes length counts into a regex, whose repeat counts stop at 2**32.
MAX_COUNT = 2**31 - 1
LIBRARY_OPTIONS = "x-guidance"  # llguidance reads its compile options from this key
BOUNDS = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum")
COUNTS = (
    "minLength",
    "maxLength",
    "minItems",
    "maxItems",
    "minProperties",
    "maxProperties",
)
SUBSCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems")
SUBSCHEMA_MAPS = ("properties", "$defs", "definitions")
SUBSCHEMAS = ("items", "additionalProperties", "not", "contains")
SUPPORTED = (
    "type, properties, required, additionalProperties, items, prefixItems, minItems, "
    "maxItems, enum, const, minimum, maximum, exclusiveMinimum, exclusiveMaximum, "
    "minLength, maxLength, pattern, format, anyOf, oneOf, allOf, $ref, $defs"
)
COUNT = re.compile(r"\{(\d*),?(\d*)\}")


def screen_schema(schema) -> None:
    """ValueError for a schema (a dict or a bool) that llguidance would crash on,
    answer wrongly, or that no finite JSON value satisfies."""
    if schema is False:
        raise ValueError(
            "the schema is false, which no value satisfies: send {} (or true) for any "
            "JSON value, or a schema that describes the answer"
        )
    if schema is True:
        return
    _walk(schema, "", 0)
    _check_integers(schema, "")
    if not _Finite(schema).of(schema, frozenset()):
        raise ValueError(
            "no finite JSON value satisfies this schema: a part every answer must "
            "contain (a required property, the items of minItems) admits no value: it "
            "is false, or a $ref back to a schema it is inside, which would nest "
            "forever; make that part optional or give it a schema that can end"
        )


def _where(path: str) -> str:
    if len(path) > 80:
        path = "..." + path[-60:]
    return f"`{path}`" if path else "the schema"


def _walk(schema, path: str, depth: int) -> None:
    if isinstance(schema, bool):
        return
    if not isinstance(schema, dict):
        raise ValueError(
            f"{_where(path)} must be a schema object (or true/false), got "
            f"{type(schema).__name__}"
        )
    if depth > MAX_DEPTH:
        raise ValueError(
            f"{_where(path)} is nested more than {MAX_DEPTH} schemas deep: flatten it "
            "or name the repeated part in $defs"
        )
    if LIBRARY_OPTIONS in schema:
        raise ValueError(
            f"{_where(_join(path, LIBRARY_OPTIONS))} sets the grammar library's own "
            "options, which this server chooses (they could switch its schema checks "
            f"off): remove {LIBRARY_OPTIONS} from the schema"
        )
    _check_bounds(schema, path)
    for key in ("enum", "anyOf", "oneOf"):
        if schema.get(key) == []:
            raise ValueError(
                f"{_where(_join(path, key))} is an empty list, so no value can match: "
                "list at least one"
            )
    pattern = schema.get("pattern")
    if isinstance(pattern, str):
        _check_pattern(pattern, _join(path, "pattern"))
    for key in SUBSCHEMAS:
        if key in schema:
            _walk(schema[key], _join(path, key), depth + 1)
    for key in SUBSCHEMA_LISTS:
        if isinstance(schema.get(key), list):
            for i, sub in enumerate(schema[key]):
                _walk(sub, f"{_join(path, key)}[{i}]", depth + 1)
    for key in SUBSCHEMA_MAPS:
        if isinstance(schema.get(key), dict):
            for name, sub in schema[key].items():
                _walk(sub, _join(_join(path, key), name), depth + 1)


def _check_integers(value, path: str) -> None:
    """Every integer anywhere in the schema (const, enum, examples, a bound, under
    any keyword) within +-2**53: the library reads integers as i64 and crashes the
    process on one beyond it; within 2**53 every integer is also exact as a float."""
    if isinstance(value, dict):
        for key, item in value.items():
            _check_integers(item, _join(path, str(key)))
    elif isinstance(value, list):
        for i, item in enumerate(value):
            _check_integers(item, f"{path}[{i}]")
    elif isinstance(value, int) and not isinstance(value, bool):
        if abs(value) > MAX_INTEGER_BOUND:
            raise ValueError(
                f"{_where(path)} is {value}: integers in a schema must lie within "
                f"+-{MAX_INTEGER_BOUND} (2**53), where every integer is exact; send "
                "a smaller number (or the value as a string)"
            )


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def _check_bounds(schema: dict, path: str) -> None:
    for key in COUNTS:
        count = schema.get(key)
        if isinstance(count, (int, float)) and count > MAX_COUNT:
            raise ValueError(
                f"{_where(_join(path, key))} is {count}: at most {MAX_COUNT} (2**31 - "
                "1) is accepted, more than any answer can hold; send a smaller count "
                "or leave it out"
            )
    types = schema.get("type")
    types = types if isinstance(types, list) else [types]
    integer_only = "integer" in types and "number" not in types
    for key in BOUNDS:
        if key not in schema:
            continue
        bound, where = schema[key], _where(_join(path, key))
        if isinstance(bound, bool) or not isinstance(bound, (int, float)):
            raise ValueError(f"{where} must be a number, got {bound!r}")
        if not math.isfinite(bound):
            raise ValueError(f"{where} must be a finite number")
        if integer_only:
            if abs(bound) > MAX_INTEGER_BOUND:
                raise ValueError(
                    f"{where} is {bound}: integer bounds must lie within "
                    f"+-{MAX_INTEGER_BOUND} (2**53), where every integer is exact; "
                    "send a bound in that range or leave it out"
                )
        elif abs(bound) > MAX_NUMBER_BOUND or 0 < abs(bound) < MIN_NUMBER_BOUND:
            raise ValueError(
                f"{where} is {bound}: number bounds must be 0 or lie between "
                f"{MIN_NUMBER_BOUND:g} and {MAX_NUMBER_BOUND:g} in size; send a bound "
                "in that range or leave it out"
            )


def _check_pattern(pattern: str, path: str) -> None:
    if len(pattern) > MAX_PATTERN_CHARS:
        raise ValueError(
            f"`{path}` is {len(pattern):,} characters long; at most "
            f"{MAX_PATTERN_CHARS:,} are accepted: send a shorter pattern"
        )
    for match in COUNT.finditer(pattern):
        counts = [int(c) for c in match.groups() if c]
        if counts and max(counts) > MAX_REPEAT:
            raise ValueError(
                f"`{path}` repeats {match.group(0)} times; the most is {MAX_REPEAT}: "
                "lower its repetition counts"
            )


def _resolve(root, ref: str):
    """The schema a local $ref ("#" or "#/a/b") points at; None for another ref."""
    if ref == "#":
        return root
    if not ref.startswith("#/"):
        return None
    node = root
    for part in ref[2:].split("/"):
        part = part.replace("~1", "/").replace("~0", "~")
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    return node


class _Finite:
    """Can some finite value satisfy a schema? Follows only what every value must
    contain (required properties, minItems items); `visiting` holds the $refs on
    the way here, and meeting one again means the value nests forever. A $ref found
    finite is remembered (fewer refs on the way cannot change that), and a schema
    too large to decide in MAX_STEPS is let through to the library."""

    MAX_STEPS = 10_000

    def __init__(self, root):
        self.root, self.steps, self.finite_refs = root, 0, set()

    def of(self, schema, visiting: frozenset) -> bool:
        self.steps += 1
        if self.steps > self.MAX_STEPS or not isinstance(schema, dict):
            return schema is not False
        ref = schema.get("$ref")
        target = _resolve(self.root, ref) if isinstance(ref, str) else None
        if target is not None and ref not in self.finite_refs:
            if ref in visiting or not self.of(target, visiting | {ref}):
                return False
            self.finite_refs.add(ref)
        if not all(self.of(sub, visiting) for sub in _list(schema.get("allOf"))):
            return False
        for key in ("anyOf", "oneOf"):
            if key in schema and not any(
                self.of(sub, visiting) for sub in _list(schema[key])
            ):
                return False
        properties = schema.get("properties")
        properties = properties if isinstance(properties, dict) else {}
        for name in _list(schema.get("required")):
            sub = properties.get(name, schema.get("additionalProperties", True))
            if not self.of(sub, visiting):
                return False
        min_items = schema.get("minItems", 0)
        if isinstance(min_items, int) and min_items > 0:
            prefix = _list(schema.get("prefixItems"))
            needed = prefix[:min_items]
            if min_items > len(prefix):
                needed.append(schema.get("items", True))
            if not all(self.of(sub, visiting) for sub in needed):
                return False
        return True


def _list(value) -> list:
    return value if isinstance(value, list) else []


LIBRARY_MESSAGES = [
    (
        re.compile(r"Unimplemented keys: \[(.*)\]"),
        lambda m: (
            f"unsupported keywords {m.group(1)}: remove them (supported: {SUPPORTED})"
        ),
    ),
    (
        re.compile(r"Failed to generate regex for (integer|float) range.*"),
        lambda m: "a number range the grammar cannot express: send smaller bounds",
    ),
    (
        re.compile(r"Unsatisfiable schema: (.*)"),
        lambda m: f"no value satisfies the schema ({m.group(1)})",
    ),
]


def explain(message: str) -> str:
    """llguidance's message in a client's terms, where it has a known shape."""
    for shape, rewrite in LIBRARY_MESSAGES:
        match = shape.search(message)
        if match:
            return rewrite(match)
    return message
