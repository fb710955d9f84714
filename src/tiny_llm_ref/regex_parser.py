"""Week 3 day 5, part 1a: a regular expression (or a list of choices) as a tree,
the first of the three steps automaton.py takes to a DFA.

A tree node is a tuple: ("chars", ranges), ("concat", [nodes]), ("alt", [nodes]) or
("repeat", node, min, max), max None for no upper bound. A character set is its
sorted, disjoint (low, high) code point ranges, so `.` or `[^"]` is two ranges, not a
million characters.

The supported subset, always matched against the whole text (as re.fullmatch does):
literals; escapes of punctuation (\\. \\\\ \\[ ...), \\n \\t \\r \\f \\v, \\xHH,
\\uHHHH; the ASCII classes \\d \\w \\s and their negations \\D \\W \\S (as with
re.ASCII); `.` (any character but a newline); classes [a-z0-9_] and [^...];
alternation |; groups (...) and (?:...); repetition * + ? {m} {m,} {,n} {m,n}
(a lazy ? after one is accepted: for a whole match it changes nothing). A ^ at the
start and a $ at the end are accepted and mean nothing more. Anything else
(backreferences, lookaround, \\b, flags) is a ValueError naming the position.

The parser is given; the day writes choices_tree.
"""

import re


# One past the highest code point.
UNICODE_END = 0x110000
# Limits that turn a pathological pattern into a clear error instead of a long wait.
MAX_REPEAT = 1000
MAX_PATTERN_CHARS = 100_000
MAX_NESTING = 100

# A character set: sorted, disjoint, inclusive (low, high) code point ranges.
Ranges = tuple[tuple[int, int], ...]

DIGITS: Ranges = ((48, 57),)  # 0-9
WORD: Ranges = ((48, 57), (65, 90), (95, 95), (97, 122))  # 0-9 A-Z _ a-z
SPACE: Ranges = ((9, 13), (32, 32))
# A counted repetition at the cursor: {m}, {m,}, {,n} or {m,n}.
COUNT = re.compile(r"\{(\d*)(,?)(\d*)\}")
SIMPLE_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "f": "\f", "v": "\v"}


def normalized(ranges) -> Ranges:
    """Sorted, merged ranges (overlapping or touching ones become one)."""
    merged: list[list[int]] = []
    for low, high in sorted(ranges):
        if merged and low <= merged[-1][1] + 1:
            merged[-1][1] = max(merged[-1][1], high)
        else:
            merged.append([low, high])
    return tuple((low, high) for low, high in merged)


def complement(ranges: Ranges) -> Ranges:
    """Every code point not in `ranges` (which must be normalized)."""
    result, next_low = [], 0
    for low, high in ranges:
        if low > next_low:
            result.append((next_low, low - 1))
        next_low = high + 1
    if next_low < UNICODE_END:
        result.append((next_low, UNICODE_END - 1))
    return tuple(result)


CLASS_ESCAPES = {
    "d": DIGITS,
    "w": WORD,
    "s": SPACE,
    "D": complement(DIGITS),
    "W": complement(WORD),
    "S": complement(SPACE),
}
ANY_BUT_NEWLINE = complement(((10, 10),))


# --- parsing: pattern -> tree -----------------------------------------------------


class RegexParser:
    """A recursive-descent parser for the supported subset (see the module's
    docstring). parse() -> the tree; ValueError for anything outside the subset.

    Given, not written on the day: the day's work starts from the tree. One method
    per rule: alternation = sequence ("|" sequence)*, sequence = repeat*, repeat =
    atom quantifier?, atom = group | class | "." | escape | literal.
    """

    def __init__(self, pattern: str):
        self.pattern = pattern
        self.at = 0
        self.depth = 0  # groups open at the cursor

    def error(self, what: str) -> ValueError:
        shown = self.pattern if len(self.pattern) <= 60 else self.pattern[:57] + "..."
        return ValueError(
            f"regex {shown!r}, position {self.at}: {what} (supported: "
            "literals, escapes, classes, . | () (?:) * + ? {m,n})"
        )

    def peek(self) -> str | None:
        return self.pattern[self.at] if self.at < len(self.pattern) else None

    def take(self) -> str:
        char = self.peek()
        if char is None:
            raise self.error("the pattern ends too early")
        self.at += 1
        return char

    def parse(self) -> tuple:
        if self.peek() == "^":
            self.at += 1
        tree = self.alternation()
        if self.peek() == "$":
            self.at += 1
        if self.peek() is not None:
            raise self.error(f"unexpected {self.peek()!r} (an unmatched ')'?)")
        return tree

    def alternation(self) -> tuple:
        branches = [self.sequence()]
        while self.peek() == "|":
            self.at += 1
            branches.append(self.sequence())
        return branches[0] if len(branches) == 1 else ("alt", branches)

    def sequence(self) -> tuple:
        items = []
        while self.peek() not in (None, "|", ")"):
            if self.peek() == "$" and self.at == len(self.pattern) - 1:
                break
            items.append(self.repeat())
        return items[0] if len(items) == 1 else ("concat", items)

    def repeat(self) -> tuple:
        if self.peek() in ("*", "+", "?") or self.counted() is not None:
            raise self.error(f"{self.peek()!r} has nothing to repeat")
        node = self.atom()
        bounds = {"*": (0, None), "+": (1, None), "?": (0, 1)}.get(self.peek())
        if bounds is not None:
            self.at += 1
        else:
            bounds = self.counted()
            if bounds is None:
                return node
            self.at = COUNT.match(self.pattern, self.at).end()
        if self.peek() == "?":
            self.at += 1  # lazy: the same set of whole matches
        if self.peek() in ("*", "+", "?") or self.counted() is not None:
            raise self.error("a repetition cannot be repeated; use a group")
        low, high = bounds
        if high is not None and high < low:
            raise self.error(f"{{{low},{high}}}: the maximum is below the minimum")
        if max(low, high or 0) > MAX_REPEAT:
            raise self.error(f"a count above {MAX_REPEAT}")
        return ("repeat", node, low, high)

    def counted(self) -> tuple[int, int | None] | None:
        """The (min, max) of a {m}, {m,}, {,n} or {m,n} at the cursor; None when the
        text there is not a count (then, as in Python, '{' is a literal)."""
        match = COUNT.match(self.pattern, self.at)
        if match is None:
            return None
        low, comma, high = match.groups()
        if not (low or comma):
            return None
        if not comma:
            return int(low), int(low)
        return int(low or 0), int(high) if high else None

    def atom(self) -> tuple:
        char = self.take()
        if char == "(":
            if self.depth >= MAX_NESTING:
                raise self.error(f"groups nested more than {MAX_NESTING} deep")
            if self.pattern.startswith("?:", self.at):
                self.at += 2
            elif self.peek() == "?":
                raise self.error("only (?:...) groups are supported")
            self.depth += 1
            node = self.alternation()
            self.depth -= 1
            if self.peek() != ")":
                raise self.error("a '(' is never closed")
            self.at += 1
            return node
        if char == "[":
            return ("chars", self.char_class())
        if char == ".":
            return ("chars", ANY_BUT_NEWLINE)
        if char == "\\":
            return ("chars", self.escape())
        if char in "^$":
            self.at -= 1
            raise self.error(f"{char!r} is supported only at the pattern's edge")
        return ("chars", ((ord(char), ord(char)),))

    def escape(self) -> Ranges:
        """The character set of the escape after a backslash."""
        char = self.take()
        if char in CLASS_ESCAPES:
            return CLASS_ESCAPES[char]
        if char in SIMPLE_ESCAPES:
            code = ord(SIMPLE_ESCAPES[char])
        elif char in ("x", "u"):
            digits = self.pattern[self.at : self.at + (2 if char == "x" else 4)]
            if len(digits) != (2 if char == "x" else 4) or any(
                d not in "0123456789abcdefABCDEF" for d in digits
            ):
                raise self.error(f"\\{char} needs {2 if char == 'x' else 4} hex digits")
            self.at += len(digits)
            code = int(digits, 16)
        elif char.isalnum():
            raise self.error(f"the escape \\{char} is not supported")
        else:
            code = ord(char)
        return ((code, code),)

    def char_class(self) -> Ranges:
        """A [...] class after its '['; ValueError for one that matches nothing."""
        negated = self.peek() == "^"
        if negated:
            self.at += 1
        ranges: list[tuple[int, int]] = []
        first = True
        while first or self.peek() != "]":
            first = False
            item = self.class_item()
            if self.peek() == "-" and self.pattern[self.at + 1 : self.at + 2] not in (
                "]",
                "",
            ):
                self.at += 1
                end = self.class_item()
                if len(item) != 1 or len(end) != 1 or item[0][0] != item[0][1]:
                    raise self.error("a range needs single characters at both ends")
                if end[0][0] < item[0][0]:
                    raise self.error("a range whose end comes before its start")
                item = ((item[0][0], end[0][0]),)
            ranges.extend(item)
        self.at += 1
        result = normalized(ranges)
        if negated:
            result = complement(result)
        if not result:
            raise self.error(
                "this class matches no character: the regex matches nothing"
            )
        return result

    def class_item(self) -> Ranges:
        char = self.take()
        if char == "\\":
            return self.escape()
        return ((ord(char), ord(char)),)


def parse_regex(pattern: str) -> tuple:
    """The tree of a pattern of the supported subset; TypeError for a non-string,
    ValueError saying where the pattern leaves the subset."""
    if not isinstance(pattern, str):
        raise TypeError(f"a regex must be a string, got {type(pattern).__name__}")
    if len(pattern) > MAX_PATTERN_CHARS:
        raise ValueError(
            f"the regex is {len(pattern):,} characters long; at most "
            f"{MAX_PATTERN_CHARS:,} are accepted: send a shorter pattern"
        )
    return RegexParser(pattern).parse()


def choices_tree(choices) -> tuple:
    """The tree of "exactly one of these strings": an alternation of literals.
    Any iterable of strings will do. A lone string (or anything not iterable) is a
    TypeError, f"choices must be a list of strings, got {type name}"; an empty list
    a ValueError, "the list of choices is empty: give at least one string"; an item
    that is not a string a TypeError, f"every choice must be a string, got
    {item!r}"."""
    # Week 3 Day 5 Task 1: choices_tree: check the list (not a lone string, not empty,
    # only strings), then ("alt", [("concat", [("chars", ((c, c),)) per character])])
    if isinstance(choices, str) or not hasattr(choices, "__iter__"):
        raise TypeError(
            f"choices must be a list of strings, got {type(choices).__name__}"
        )
    choices = list(choices)
    if not choices:
        raise ValueError("the list of choices is empty: give at least one string")
    for choice in choices:
        if not isinstance(choice, str):
            raise TypeError(f"every choice must be a string, got {choice!r}")
    literals = [
        ("concat", [("chars", ((ord(c), ord(c)),)) for c in s]) for s in choices
    ]
    return ("alt", literals)
