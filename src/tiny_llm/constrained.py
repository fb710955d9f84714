"""Week 3 day 5, part 2: constrained decoding. From a character automaton (automaton.py)
to the tokens a request may sample next: the request options (Regex, Choice), what
constraints need of a tokenizer (the Vocabulary: each token's text, in a trie), and
one request's place in its constraint (ConstraintState). The token index, which
tokens each DFA state allows, is token_index.py.

Each step, a constrained request's logits [1, V] keep the allowed tokens and every
other token becomes -inf before its sampler runs (greedy or sampled alike); EOS is
allowed only where the text so far is a whole match. So whatever the model and the
sampler, the answer matches, or it runs out of max_tokens first ("length").

The text a token adds is what the request's detokenizer shows, found by
detokenizing it after a plain anchor token. Tokens whose bytes are only part of a
UTF-8 character (their text alone is "\\ufffd") and special tokens are never
allowed; mlx-lm's streaming detokenizers drop the one space a text starts with, so
at the start a token's leading space is not part of the text the pattern sees.
"""

import weakref
from functools import cached_property
from dataclasses import dataclass, field

import mlx.core as mx

from tiny_llm_base import Grammar, GrammarState, JsonSchema, UnsatisfiableConstraint

from .automaton import Dfa, compile_choices, compile_regex
from .token_index import StateCache, StateTokens, TokenIndex, check_spellable

# A token index kept per vocabulary for this many distinct constraints.
MAX_CACHED_INDEXES = 64
# The most forced characters jump-forward looks ahead (a long fixed key fits).
FORCED_CHARS = 64


@dataclass(frozen=True)
class Regex:
    """A request option: the answer must match `pattern` as a whole (the subset in
    automaton.py)."""

    pattern: str

    def compile(self) -> Dfa:
        return compile_regex(self.pattern)


@dataclass(frozen=True)
class Choice:
    """A request option: the answer must be exactly one of `options`."""

    options: tuple[str, ...]

    def __post_init__(self) -> None:
        if isinstance(self.options, (list, tuple)):
            object.__setattr__(self, "options", tuple(self.options))

    def compile(self) -> Dfa:
        return compile_choices(self.options)


class TrieNode:
    """One prefix of the vocabulary's token texts: `children` by next character,
    `tokens` the ids whose text ends here."""

    __slots__ = ("children", "tokens")

    def __init__(self):
        self.children: dict[str, TrieNode] = {}
        self.tokens: list[int] = []


@dataclass(eq=False)
class Vocabulary:
    """What constraints need of a tokenizer, for a model with `size` logits.

    texts: [size]: the text each token adds in the middle of an answer, None for a
        token never allowed (special, past the tokenizer, empty, or part of a
        UTF-8 character).
    eos: the tokenizer's EOS ids below size.
    drops_first_space: the detokenizer drops the space an answer starts with.
    trie: the texts' prefix tree (None tokens left out).
    indexes: a TokenIndex per constraint already compiled for this vocabulary.
    states: the StateCache all of its token indexes keep their built states in.
    """

    size: int
    texts: list[str | None]
    eos: list[int]
    drops_first_space: bool
    trie: TrieNode = field(init=False)
    indexes: dict = field(init=False, default_factory=dict)
    states: "StateCache" = field(init=False, default_factory=lambda: StateCache())

    def __post_init__(self) -> None:
        raise NotImplementedError(
            "Week 3 Day 5 Task 2: Vocabulary: a TrieNode root; insert each token id "
            "under its text, one node per character"
        )

    def longest_tokens(self, text: str) -> list[int]:
        """`text` cut into tokens left to right, each the longest token text that
        starts the rest (the lowest id among equal texts); it stops early where no
        token starts the rest."""
        raise NotImplementedError(
            "Week 3 Day 5 Task 2: Vocabulary.longest_tokens: the docstring's cut, on "
            "the trie"
        )

    def index(self, constraint) -> "TokenIndex":
        """The constraint's TokenIndex for this vocabulary, compiled once (up to
        MAX_CACHED_INDEXES kept, oldest dropped first)."""
        if constraint not in self.indexes:
            dfa = constraint.compile()
            check_spellable(dfa, self)
            if len(self.indexes) >= MAX_CACHED_INDEXES:
                del self.indexes[next(iter(self.indexes))]
            self.indexes[constraint] = TokenIndex(dfa, self)
        return self.indexes[constraint]

    @cached_property
    def alphabet(self) -> list[int]:
        """The code points that some token's text contains, sorted."""
        return sorted(map(ord, set().union(*(text for text in self.texts if text))))


def token_texts(tokenizer, size: int) -> list[str | None]:
    """The text each of `size` token ids adds to an answer (see Vocabulary.texts):
    the detokenizer's text of [anchor, token] minus that of [anchor], the anchor
    being tokenizer.encode("a", add_special_tokens=False)[-1]. None for: special ids
    (all_special_ids, the added tokens whose AddedToken.special is true, in
    tokenizer.added_tokens_decoder), the EOS ids (eos_token_ids), ids past
    len(tokenizer), a text that does not start with the anchor's, an empty text,
    and a text holding "\ufffd" (part of a character)."""
    raise NotImplementedError(
        "Week 3 Day 5 Task 2: token_texts: special ids (all_special_ids and the added"
        " tokens marked special, where the tokenizer has them) and ids past "
        "len(tokenizer) are None; for the others detokenize an anchor token then the "
        "token (reset, add_token each, then finalize(): mlx-lm's streaming "
        "detokenizers hold the last text back until then), keep what it added, None "
        'for "" or text with "\\ufffd"'
    )


def drops_first_space(tokenizer) -> bool:
    """Does the tokenizer's detokenizer drop the space an answer starts with?"""
    spaced = tokenizer.encode(" a", add_special_tokens=False)
    detokenizer = tokenizer.detokenizer
    for token in spaced:
        detokenizer.add_token(token)
    detokenizer.finalize()
    return detokenizer.text == "a"


# Vocabularies already built, per tokenizer and size (building one takes a second).
vocabularies: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def vocabulary_of(tokenizer, size: int) -> Vocabulary:
    """The tokenizer's Vocabulary for a model of `size` logits, built once."""
    by_size = vocabularies.setdefault(tokenizer, {})
    if size not in by_size:
        eos = sorted(t for t in tokenizer.eos_token_ids if 0 <= t < size)
        texts = token_texts(tokenizer, size)
        by_size[size] = Vocabulary(size, texts, eos, drops_first_space(tokenizer))
    return by_size[size]


class ConstraintState:
    """One request's place in its constraint: the DFA state of its answer so far.

    mask(logits) before each sample, advance(token) after each kept token.
    reads_each_token: True, the next mask depends on the token sampled (a request
    without a constraint has NoConstraint, whose is False).
    """

    reads_each_token = True

    def __init__(self, index: TokenIndex):
        raise NotImplementedError(
            "Week 3 Day 5 Task 2: ConstraintState: keep the index, state 0, at_start "
            "from the vocabulary's drops_first_space"
        )

    @property
    def is_accepting(self) -> bool:
        """The answer so far is a whole match (EOS may end it)."""
        return self.index.dfa.accepting[self.state]

    def allowed(self) -> StateTokens:
        """The allowed tokens from here; UnsatisfiableConstraint (tiny_llm_base, a
        ValueError) when there are none (count 0): the vocabulary cannot spell any
        continuation, which is the constraint's fault, not the sampler's: "no token
        of the vocabulary can continue the constraint here (its characters are not
        in any whole token): change the pattern"."""
        raise NotImplementedError(
            "Week 3 Day 5 Task 2: ConstraintState.allowed: index.allowed(state, "
            "at_start); raise UnsatisfiableConstraint when its count is 0"
        )

    def mask(self, logits: mx.array) -> mx.array:
        """logits: [1, V] -> the same with every token not allowed at -inf."""
        raise NotImplementedError(
            "Week 3 Day 5 Task 2: ConstraintState.mask: mx.where(allowed().mask, "
            "logits, -inf)"
        )

    def forced_tokens(self) -> list[int]:
        """Tokens that spell the text every answer must continue with from here (at
        most FORCED_CHARS characters; Dfa.forced_text cut by
        Vocabulary.longest_tokens): jump-forward's drafts. [] at the start, where a
        first token's space is read differently. They stop before a token that leads
        where no token goes on (index.allowed of the state the token leads to, its
        next_state, has count 0): plain decoding fails there one token later. Each
        token's state is index.allowed(the state before it).next_state[token]."""
        raise NotImplementedError(
            "Week 3 Day 5 Task 2: ConstraintState.forced_tokens: [] at_start; else "
            "the vocabulary's longest_tokens of dfa.forced_text(state, FORCED_CHARS),"
            " kept while the state each leads to allows some token"
        )

    def masks_along(self, tokens: list[int]) -> mx.array:
        """[1 + len(tokens), V] bool: row j is the mask after tokens[:j] (row 0: here),
        what verifying those tokens as drafts needs: advance through them, reading
        allowed() after each; their errors go through. The state does not move
        (state and at_start are put back in a finally)."""
        raise NotImplementedError(
            "Week 3 Day 5 Task 2: ConstraintState.masks_along: the docstring's rows; "
            "the state ends where it started"
        )

    def advance(self, token: int) -> None:
        """A kept (non-EOS) token: move to the state it leads to; for a token the
        constraint does not allow (a sampler that ignored the mask), a ValueError
        naming it: f"token {token} is not allowed by the constraint here (the sampler
        must pick a token the mask leaves finite)"."""
        raise NotImplementedError(
            "Week 3 Day 5 Task 2: ConstraintState.advance: next_state[token] of "
            "allowed(), a ValueError naming the token when it is missing; at_start "
            "becomes False"
        )


def start_constraint(
    constraint, tokenizer, vocab_size: int
) -> ConstraintState | GrammarState:
    """A request's constraint state at the start of its answer.

    constraint: Regex or Choice. The DFA and its token index are compiled once per
    tokenizer and constraint and shared by every request that uses them. A
    JsonSchema, JsonObject or Grammar (tiny_llm_base: llguidance's masks behind the
    same interface) starts itself: constraint.start(tokenizer, vocab_size).
    TypeError for another kind of constraint, naming the kinds ("constraint must be
    Regex(pattern), Choice(options), JsonSchema(schema), JsonObject(),
    Grammar(lark) or None", then f", got {type(constraint).__name__}"); ValueError
    for a bad pattern or schema, an empty choice list, or a constraint that no token
    can start (allowed() checked now).
    """
    raise NotImplementedError(
        "Week 3 Day 5 Task 3: start_constraint: a JsonSchema (JsonObject too) or a "
        "Grammar returns constraint.start(tokenizer, vocab_size); TypeError unless "
        "Regex or Choice; the vocabulary's index for it; a ConstraintState whose "
        "allowed() is checked now"
    )
