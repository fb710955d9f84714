"""Week 3 day 5, part 1: a regular expression (or a list of choices) as a character
automaton, the DFA that constrained decoding walks.

A pattern becomes a DFA in three small steps:

    "ab|c+"  --parse-->  a tree: alt(concat(a, b), repeat(c, 1, None))
             --Thompson-->  an NFA: states joined by character-set edges and empty
                            (epsilon) edges, one fragment per tree node
             --subsets-->  a DFA: each of its states is the set of NFA states the
                           text so far can be in; one table lookup per character

The one idea that matters: a DFA state says everything about a prefix's future. Two
texts that end in the same state accept exactly the same continuations, so the token
index (constrained.py) can ask, once per state, which tokens are allowed.

Characters are Unicode code points, but the table cannot have a column for each of
1.1 million of them. The edges' character sets cut the code points into intervals
(every boundary of every set is a cut), and the characters of one interval behave
alike in every state: the table has one column per interval.

The parse (a pattern, or a list of choices, as a tree) is regex_parser.py; this
module takes the tree to the DFA.
"""

from bisect import bisect_left, bisect_right
from dataclasses import dataclass

from .regex_parser import UNICODE_END, Ranges, choices_tree, parse_regex

# The table's entry for "no continuation": the text can no longer match.
DEAD = -1
# Limits that turn a pathological pattern into a clear error instead of a long wait.
MAX_NFA_STATES = 50_000
MAX_DFA_STATES = 10_000


# --- Thompson's construction: tree -> NFA -------------------------------------------


class Nfa:
    """States 0..n-1; edges[s]: (ranges, target) pairs a character in ranges
    follows; empty[s]: the states s reaches reading nothing."""

    def __init__(self):
        self.edges: list[list[tuple[Ranges, int]]] = []
        self.empty: list[list[int]] = []

    def new_state(self) -> int:
        if len(self.edges) >= MAX_NFA_STATES:
            raise ValueError(
                f"the constraint needs more than {MAX_NFA_STATES:,} automaton states "
                "(about two per character it spells, repetitions included): send a "
                "shorter pattern, lower repetition counts or fewer choices"
            )
        self.edges.append([])
        self.empty.append([])
        return len(self.edges) - 1

    def build(self, node: tuple) -> tuple[int, int]:
        """A fragment for `node`: (its start, its end) states; the text read from
        start to end is exactly what the node matches. A concatenation of nothing
        (the empty choice "") is its start joined to its end by one empty edge.
        `node` is one of the four kinds regex_parser.py makes: chars, concat, alt,
        repeat."""
        raise NotImplementedError(
            "Week 3 Day 5 Task 1: Nfa.build: chars: start -c-> end; concat: the "
            "parts' fragments chained by empty edges; alt: start -> each branch -> "
            "end; repeat: min copies in a row, then either a loop (no max) or max - "
            "min optional copies"
        )

    def closure(self, states) -> frozenset[int]:
        """`states` and every state they reach by empty edges."""
        seen, stack = set(states), list(states)
        while stack:
            for target in self.empty[stack.pop()]:
                if target not in seen:
                    seen.add(target)
                    stack.append(target)
        return frozenset(seen)


# --- subset construction: NFA -> DFA ------------------------------------------------


@dataclass
class Dfa:
    """A deterministic automaton over characters; state 0 is the start.

    bounds: [I + 1] code points, from 0 to UNICODE_END with every edge range's low
        and high + 1 between: interval i holds bounds[i] .. bounds[i + 1] - 1, and
        all its characters lead to the same state from every state.
    table: [S][I]: the state after reading a character of interval i in state s,
        DEAD when the text can no longer match.
    accepting: [S]: the text read so far is a whole match.
    Every state but DEAD can still reach an accepting one.
    """

    bounds: list[int]
    table: list[list[int]]
    accepting: list[bool]

    @property
    def num_states(self) -> int:
        return len(self.table)

    def step(self, state: int, char: str) -> int:
        """The state after reading one character in `state` (a live state: DEAD
        has no row of its own, table[-1] is the last state's; walk stops at DEAD)."""
        raise NotImplementedError(
            "Week 3 Day 5 Task 1: Dfa.step: find the character's interval (bisect on "
            "bounds) and look it up in the table"
        )

    def walk(self, state: int, text: str) -> int:
        """The state after reading `text` from `state` (DEAD once it cannot match)."""
        raise NotImplementedError(
            "Week 3 Day 5 Task 1: Dfa.walk: step through the characters, stop at DEAD"
        )

    def forced_text(self, state: int, limit: int) -> str:
        """The characters every match must read next from `state`, at most `limit`:
        read while the state does not accept and exactly one character leads
        anywhere but DEAD (a fixed key, a closing quote)."""
        raise NotImplementedError(
            "Week 3 Day 5 Task 1: Dfa.forced_text: the docstring's rule, one "
            "character at a time"
        )

    def fullmatch(self, text: str) -> bool:
        """Does the whole text match (re.fullmatch's question)?"""
        raise NotImplementedError(
            "Week 3 Day 5 Task 1: Dfa.fullmatch: walk from 0, then the state is "
            "accepting"
        )


def determinize(nfa: Nfa, start: int, accept: int) -> Dfa:
    """The subset construction: the DFA whose states are the sets of NFA states a
    text can lead to. ValueError when a new set would be state number
    MAX_DFA_STATES: f"the pattern needs more than {MAX_DFA_STATES} DFA states:
    simplify it (fewer nested repetitions or alternatives)"."""
    raise NotImplementedError(
        "Week 3 Day 5 Task 1: determinize: cut the code points at every edge range's "
        "ends (bounds); from the start's closure, for each set and each interval "
        "gather the targets of the edges covering it, take their closure, and number "
        "each new set as it is found; an empty set is DEAD"
    )


def compile_tree(tree: tuple) -> Dfa:
    """A parsed tree (parse_regex, choices_tree) as a DFA."""
    raise NotImplementedError(
        "Week 3 Day 5 Task 1: compile_tree: Nfa().build(tree), then determinize from "
        "its start to its end state"
    )


def compile_regex(pattern: str) -> Dfa:
    """The DFA of a pattern of the supported subset (whole-text match)."""
    return compile_tree(parse_regex(pattern))


def compile_choices(choices) -> Dfa:
    """The DFA that accepts exactly the given strings."""
    return compile_tree(choices_tree(choices))
