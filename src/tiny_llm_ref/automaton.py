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
        # Week 3 Day 5 Task 1: Nfa.build: chars: start -c-> end; concat: the parts'
        # fragments chained by empty edges; alt: start -> each branch -> end; repeat:
        # min copies in a row, then either a loop (no max) or max - min optional copies
        start, end = self.new_state(), self.new_state()
        kind = node[0]
        if kind == "chars":
            self.edges[start].append((node[1], end))
        elif kind == "concat":
            at = start
            for part in node[1]:
                part_start, part_end = self.build(part)
                self.empty[at].append(part_start)
                at = part_end
            self.empty[at].append(end)
        elif kind == "alt":
            for branch in node[1]:
                branch_start, branch_end = self.build(branch)
                self.empty[start].append(branch_start)
                self.empty[branch_end].append(end)
        else:
            _, child, low, high = node
            at = start
            for _ in range(low):
                part_start, part_end = self.build(child)
                self.empty[at].append(part_start)
                at = part_end
            if high is None:  # a loop: go round any number of times
                part_start, part_end = self.build(child)
                self.empty[at].append(part_start)
                self.empty[part_end].append(at)
            else:  # each optional copy may be skipped straight to the end
                for _ in range(high - low):
                    part_start, part_end = self.build(child)
                    self.empty[at].append(part_start)
                    self.empty[at].append(end)
                    at = part_end
            self.empty[at].append(end)
        return start, end

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
        # Week 3 Day 5 Task 1: Dfa.step: find the character's interval (bisect on
        # bounds) and look it up in the table
        return self.table[state][bisect_right(self.bounds, ord(char)) - 1]

    def walk(self, state: int, text: str) -> int:
        """The state after reading `text` from `state` (DEAD once it cannot match)."""
        # Week 3 Day 5 Task 1: Dfa.walk: step through the characters, stop at DEAD
        for char in text:
            state = self.step(state, char)
            if state == DEAD:
                return DEAD
        return state

    def forced_text(self, state: int, limit: int) -> str:
        """The characters every match must read next from `state`, at most `limit`:
        read while the state does not accept and exactly one character leads
        anywhere but DEAD (a fixed key, a closing quote)."""
        # Week 3 Day 5 Task 1: Dfa.forced_text: the docstring's rule, one character at a
        # time
        text = []
        while len(text) < limit and not self.accepting[state]:
            live = [i for i, after in enumerate(self.table[state]) if after != DEAD]
            if len(live) != 1 or self.bounds[live[0] + 1] - self.bounds[live[0]] != 1:
                break
            text.append(chr(self.bounds[live[0]]))
            state = self.table[state][live[0]]
        return "".join(text)

    def fullmatch(self, text: str) -> bool:
        """Does the whole text match (re.fullmatch's question)?"""
        # Week 3 Day 5 Task 1: Dfa.fullmatch: walk from 0, then the state is accepting
        state = self.walk(0, text)
        return state != DEAD and self.accepting[state]


def determinize(nfa: Nfa, start: int, accept: int) -> Dfa:
    """The subset construction: the DFA whose states are the sets of NFA states a
    text can lead to. ValueError when a new set would be state number
    MAX_DFA_STATES: f"the pattern needs more than {MAX_DFA_STATES} DFA states:
    simplify it (fewer nested repetitions or alternatives)"."""
    # Week 3 Day 5 Task 1: determinize: cut the code points at every edge range's ends
    # (bounds); from the start's closure, for each set and each interval gather the
    # targets of the edges covering it, take their closure, and number each new set
    # as it is found; an empty set is DEAD
    cuts = {0, UNICODE_END}
    for edges in nfa.edges:
        for ranges, _ in edges:
            for low, high in ranges:
                cuts.update((low, high + 1))
    bounds = sorted(cuts)
    intervals = len(bounds) - 1
    first = nfa.closure([start])
    numbers = {first: 0}
    order = [first]
    table: list[list[int]] = []
    while len(table) < len(order):
        current = order[len(table)]
        moves: dict[int, set[int]] = {}
        for state in current:
            for ranges, target in nfa.edges[state]:
                for low, high in ranges:
                    # bounds holds low and high + 1, so these are whole intervals.
                    first_cut = bisect_left(bounds, low)
                    for interval in range(first_cut, bisect_left(bounds, high + 1)):
                        moves.setdefault(interval, set()).add(target)
        row = [DEAD] * intervals
        for interval, targets in moves.items():
            subset = nfa.closure(targets)
            if subset not in numbers:
                if len(order) >= MAX_DFA_STATES:
                    raise ValueError(
                        f"the pattern needs more than {MAX_DFA_STATES} DFA states: "
                        "simplify it (fewer nested repetitions or alternatives)"
                    )
                numbers[subset] = len(order)
                order.append(subset)
            row[interval] = numbers[subset]
        table.append(row)
    accepting = [accept in subset for subset in order]
    return Dfa(bounds, table, accepting)


def compile_tree(tree: tuple) -> Dfa:
    """A parsed tree (parse_regex, choices_tree) as a DFA."""
    # Week 3 Day 5 Task 1: compile_tree: Nfa().build(tree), then determinize from its
    # start to its end state
    nfa = Nfa()
    start, accept = nfa.build(tree)
    return determinize(nfa, start, accept)


def compile_regex(pattern: str) -> Dfa:
    """The DFA of a pattern of the supported subset (whole-text match)."""
    return compile_tree(parse_regex(pattern))


def compile_choices(choices) -> Dfa:
    """The DFA that accepts exactly the given strings."""
    return compile_tree(choices_tree(choices))
