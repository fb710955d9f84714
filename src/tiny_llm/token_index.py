"""Week 3 day 5, part 2b: the token index. For each state of a constraint's DFA, the
tokens whose whole text keeps it alive and the state each leads to.

The model picks tokens, not characters, and one token can be many characters ("Ġname"
is " name"), so a token is allowed in DFA state s when walking all of its characters
from s never reaches DEAD; it leads to the state where the walk ends. Walking every
token of a 49,152-token vocabulary one by one costs a few hundred thousand steps, so
the tokens share their prefixes in a trie (the Vocabulary's, constrained.py), and
the walk drops a whole branch (every token that starts with " x") at the first
character the DFA refuses. A state's entry is built the first time a request
reaches it and kept, within a byte budget, for every later request with the same
constraint.
"""

import sys
from bisect import bisect_left
from collections import OrderedDict
from dataclasses import dataclass

import mlx.core as mx
import numpy as np

from .automaton import DEAD, Dfa


# The built states of every token index of a vocabulary, at most this many bytes in
# all (a permissive state maps nearly every token: ~2.5 MB); least recent go first.
MAX_CACHED_STATE_BYTES = 128 * 2**20


@dataclass
class StateTokens:
    """The tokens allowed in one index state: mask [V] (bool, EOS included when the
    state accepts), next_state: token id -> the DFA state it leads to, and count:
    the allowed ids in mask, EOS included (an accepting state with no other
    continuation is not unsatisfiable)."""

    mask: mx.array
    next_state: dict[int, int]
    count: int

    @property
    def nbytes(self) -> int:
        """About what this entry holds in memory."""
        return self.mask.nbytes + sys.getsizeof(self.next_state)


class StateCache:
    """Built StateTokens, least recently used first, at most max_bytes in all: a
    server sees constraints without end, and each permissive state is megabytes."""

    def __init__(self, max_bytes: int = MAX_CACHED_STATE_BYTES):
        self.max_bytes = max_bytes
        self.bytes = 0
        self.entries: OrderedDict = OrderedDict()

    def get(self, key) -> "StateTokens | None":
        entry = self.entries.get(key)
        if entry is not None:
            self.entries.move_to_end(key)
        return entry

    def put(self, key, tokens: "StateTokens") -> None:
        self.entries[key] = tokens
        self.bytes += tokens.nbytes
        while self.bytes > self.max_bytes and len(self.entries) > 1:
            _, dropped = self.entries.popitem(last=False)
            self.bytes -= dropped.nbytes


class TokenIndex:
    """dfa's token index over vocabulary (a Vocabulary, constrained.py: passed in,
    never imported, since constrained.py builds TokenIndexes), built state by state
    as requests reach them.

    A position is (DFA state, at_start): at_start only before the first token of a
    vocabulary whose detokenizer drops the first space. Built states are kept in
    the vocabulary's StateCache (bounded in bytes), so a state may be built again.
    """

    def __init__(self, dfa: Dfa, vocabulary):
        self.dfa = dfa
        self.vocabulary = vocabulary

    def allowed(self, state: int, at_start: bool = False) -> StateTokens:
        """The allowed tokens in `state` (built when not in the cache)."""
        key = (self, state, at_start)
        tokens = self.vocabulary.states.get(key)
        if tokens is None:
            tokens = self.build(state, at_start)
            self.vocabulary.states.put(key, tokens)
        return tokens

    def build(self, state: int, at_start: bool) -> StateTokens:
        """Walk the vocabulary's trie from `state`: a branch is followed while the DFA
        is not DEAD, and every token on a followed node is allowed, leading to the
        state there. At the start a leading " " is read without moving the DFA (the
        token " " itself is then allowed, leading to `state`)."""
        raise NotImplementedError(
            "Week 3 Day 5 Task 2: TokenIndex.build: the docstring's walk of the trie "
            '(the chapter\'s "From characters to tokens"); the StateTokens of what it '
            "found"
        )


def check_spellable(dfa: Dfa, vocabulary) -> None:
    """ValueError, before any request runs, when no text the vocabulary can spell
    matches: walked only on characters that some token contains, the DFA never
    reaches an accepting state (an emoji or a NUL that no token holds). Given, not
    written on the day: it needs nothing the day teaches."""
    alphabet = vocabulary.alphabet
    bounds = dfa.bounds
    spellable = [
        bisect_left(alphabet, bounds[i]) < bisect_left(alphabet, bounds[i + 1])
        for i in range(len(bounds) - 1)
    ]
    seen, stack, missing = {0}, [0], None
    while stack:
        state = stack.pop()
        if dfa.accepting[state]:
            return
        for interval, after in enumerate(dfa.table[state]):
            if after == DEAD or after in seen:
                continue
            if not spellable[interval]:
                missing = missing or chr(bounds[interval])
                continue
            seen.add(after)
            stack.append(after)
    raise ValueError(
        "no text the model's tokens can spell matches the constraint"
        + (
            f": it needs {missing!r} (U+{ord(missing):04X}), which no token holds"
            if missing
            else ""
        )
        + "; change the pattern or choices"
    )
