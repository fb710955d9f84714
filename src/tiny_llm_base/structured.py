"""JSON Schema constraints through a library: llguidance compiles a schema to a
grammar and computes each step's token mask, behind the interface of the course's
ConstraintState (week 3 day 5), so the engine does not care which produced a mask.

Not course material: the learner writes the automaton and the token index for
regular expressions and choices; JSON Schema (nested objects, unions, number ranges,
string patterns) is a grammar, and its masks come from llguidance, the library vLLM,
SGLang and llama.cpp use. Measured on this project's CPU (2 cores, the embedded
model's 49,152-token vocabulary): a schema compiles in under 1 ms and a step's mask
takes 0.15-0.9 ms, beside a ~70 ms forward (outlines-core: 110-220 ms to compile a
small schema and 11.7 s for `{"type": "object"}`; xgrammar needs torch).

    state = JsonSchema({"type": "object", ...}).start(tokenizer, vocab_size)
    logits = state.mask(logits)   # [1, V]: tokens the schema refuses at -inf
    state.advance(token)          # a kept (non-EOS) token
    state.is_accepting            # the answer so far is a whole JSON value

Answers are compact JSON (no whitespace: "," and ":" separators), so a detokenizer
that drops the answer's first space never changes what the grammar sees.
"""

import json
import weakref
from abc import ABC, abstractmethod
from dataclasses import dataclass

import llguidance
import mlx.core as mx
import numpy as np
from llguidance.numpy import allocate_token_bitmask, fill_next_token_bitmask

from .schema_checks import explain, screen_schema

# Compact JSON: no whitespace between tokens, "," between items, ":" after keys.
JSON_OPTIONS = {
    "whitespace_flexible": False,
    "item_separator": ",",
    "key_separator": ":",
}


def _schema_text(schema) -> str:
    if isinstance(schema, str):
        try:
            schema = json.loads(schema)
        except json.JSONDecodeError as error:
            raise ValueError(f"the JSON schema is not valid JSON: {error}") from None
    if not isinstance(schema, (dict, bool)):
        raise ValueError(
            "a JSON schema must be an object (or true/false), got "
            f"{type(schema).__name__}"
        )
    screen_schema(schema)
    return json.dumps({} if schema is True else schema)


class UnsatisfiableConstraint(ValueError):
    """A constraint that cannot go on from where the answer is: no token of the
    vocabulary continues it (or the grammar refused the only tokens its mask left).
    The client's constraint is at fault, not the sampler: a server answers it as
    the client's error, naming the constraint's field."""


class NoConstraint:
    """The constraint state of a request without a constraint: every token allowed,
    nothing forced. It has ConstraintState's interface, so a request samples,
    accepts and verifies drafts the same way with or without a constraint.
    reads_each_token: False, its mask never depends on the tokens sampled (a
    ConstraintState's does: True)."""

    reads_each_token = False

    @property
    def is_accepting(self) -> bool:
        return True

    def mask(self, logits: mx.array) -> mx.array:
        return logits

    def advance(self, token: int) -> None:
        pass

    def forced_tokens(self) -> list[int]:
        return []

    def masks_along(self, tokens: list[int]) -> mx.array:
        """True: broadcast against [1 + len(tokens), V], it masks nothing."""
        return mx.array(True)


class CompiledConstraint(ABC):
    """A constraint llguidance compiles: a subclass gives grammar(), the llguidance
    grammar, and `what` it is, for the messages."""

    what = "constraint"

    @abstractmethod
    def grammar(self) -> str:
        """The llguidance grammar."""

    def check(self) -> None:
        """ValueError saying what is wrong when it cannot be compiled (for a schema:
        not a schema, an unsupported keyword, a $ref to nothing, nothing can
        match). Once it passed, the object remembers it: a tool constraint is
        checked where it is made, then started by the server and the engine."""
        if self.__dict__.get("_checked"):
            return
        is_error, messages = llguidance.LLMatcher.validate_grammar_with_warnings(
            self.grammar()
        )
        if is_error:
            reasons = "; ".join(explain(message) for message in messages)
            raise ValueError(f"invalid {self.what}: {reasons}")
        object.__setattr__(self, "_checked", True)  # frozen, and not a field

    def start(self, tokenizer, vocab_size: int) -> "GrammarState":
        """This request's state at the start of its answer (see GrammarState)."""
        self.check()
        return GrammarState(self.grammar(), tokenizer, vocab_size)


@dataclass(frozen=True)
class JsonSchema(CompiledConstraint):
    """A request option: the answer must be JSON that validates against `schema`
    (a dict, or its JSON text; kept as JSON text so the option is hashable).

    Supported: type (object, array, string, number, integer, boolean, null, or a
    list of them), properties, required, additionalProperties, items, prefixItems,
    minItems, maxItems, enum, const, minimum, maximum, exclusiveMinimum,
    exclusiveMaximum, minLength, maxLength, pattern, format (some), anyOf, oneOf,
    allOf, $ref/$defs. Unsupported keywords (uniqueItems, not, patternProperties...)
    are refused by `check`, never silently ignored.
    """

    schema: str
    what = "JSON schema"

    def __post_init__(self) -> None:
        object.__setattr__(self, "schema", _schema_text(self.schema))

    def grammar(self) -> str:
        """The llguidance grammar of this schema (compact JSON)."""
        return llguidance.LLMatcher.grammar_from_json_schema(
            self.schema, defaults=JSON_OPTIONS
        )


class JsonObject(JsonSchema):
    """A request option: the answer must be a JSON object, any keys and values
    (OpenAI's response_format {"type": "json_object"})."""

    def __init__(self) -> None:
        super().__init__('{"type": "object"}')

    def __repr__(self) -> str:
        return "JsonObject()"


@dataclass(frozen=True)
class Grammar(CompiledConstraint):
    """A request option: the answer must match `lark`, a grammar in llguidance's
    Lark dialect (rules, terminals as regexes, `%json {schema}` for a JSON value, lazy
    rules that end at a delimiter). Week 4 day 2's tool calls are one."""

    lark: str
    what = "grammar"

    def grammar(self) -> str:
        """The llguidance grammar of this Lark text."""
        try:
            return llguidance.grammar_from("lark", self.lark)
        except Exception as error:  # llguidance's own syntax check
            raise ValueError(f"invalid grammar: {error}") from None


# One llguidance tokenizer per tokenizer and size (building one takes ~0.25 s).
_tokenizers: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def guidance_tokenizer(tokenizer, vocab_size: int) -> "llguidance.LLTokenizer":
    """llguidance's view of a Hugging Face fast tokenizer (or an mlx-lm wrapper of
    one), for a model whose logits cover max(vocab_size, the tokenizer's size)."""
    by_size = _tokenizers.setdefault(tokenizer, {})
    if vocab_size not in by_size:
        hf = getattr(tokenizer, "_tokenizer", tokenizer)
        backend = getattr(hf, "backend_tokenizer", None)
        if backend is None:
            raise TypeError(
                "JSON schema constraints need a Hugging Face fast tokenizer "
                f"(tokenizer.json); got {type(hf).__name__}"
            )
        eos = getattr(tokenizer, "eos_token_ids", None) or [hf.eos_token_id]
        size = max(vocab_size, backend.get_vocab_size(with_added_tokens=True))
        by_size[vocab_size] = llguidance.LLTokenizer(
            backend.to_str(), n_vocab=size, eos_token=sorted(eos)
        )
    return by_size[vocab_size]


@dataclass
class GrammarTokens:
    """The tokens allowed at one position, like the course's StateTokens: mask [V]
    (bool, EOS included when the answer may end), count, and the allowed ids."""

    mask: mx.array
    count: int
    ids: np.ndarray

    @property
    def next_state(self) -> dict[int, None]:
        """The allowed ids as keys (a grammar has no state numbers to give)."""
        return dict.fromkeys(self.ids.tolist())


class GrammarState:
    """One request's place in a grammar: llguidance's matcher for its answer so far.

    The interface of the course's ConstraintState: allowed(), mask(logits),
    advance(token), is_accepting. A position's mask is computed once (llguidance
    fills a bitmask of ceil(V / 32) words) and kept until the next advance. Tokens at
    or past vocab_size (a model with fewer logits than the tokenizer has tokens)
    are never allowed. reads_each_token: True, as a ConstraintState's.
    """

    reads_each_token = True

    def __init__(self, grammar: str, tokenizer, vocab_size: int):
        self.vocab_size = vocab_size
        self.tokenizer = guidance_tokenizer(tokenizer, vocab_size)
        self.matcher = llguidance.LLMatcher(self.tokenizer, grammar, log_level=0)
        self.bitmask = allocate_token_bitmask(1, self.tokenizer.vocab_size)
        self._allowed: GrammarTokens | None = None
        if self.matcher.is_error():
            raise ValueError(f"invalid constraint: {self.matcher.get_error()}")
        self.allowed()

    @property
    def is_accepting(self) -> bool:
        """The answer so far is whole (EOS may end it)."""
        return self.matcher.is_accepting()

    def allowed(self) -> GrammarTokens:
        """The allowed tokens from here; ValueError when there are none."""
        if self._allowed is None:
            fill_next_token_bitmask(self.matcher, self.bitmask, 0)
            bits = np.unpackbits(self.bitmask.view(np.uint8), bitorder="little")
            bits = bits[: self.vocab_size].astype(bool)
            ids = np.flatnonzero(bits)
            self._allowed = GrammarTokens(mx.array(bits), len(ids), ids)
        if self._allowed.count == 0:
            raise UnsatisfiableConstraint(
                "no token of the model's vocabulary can continue the JSON answer "
                f"here{': ' + self.matcher.get_error() if self.matcher.is_error() else ''}"
            )
        return self._allowed

    def forced_tokens(self) -> list[int]:
        """Tokens that spell the text the grammar forces from here (a schema's fixed
        keys and punctuation, in llguidance's tokenization): jump-forward's drafts,
        verified like any draft, since the model may spell the same text otherwise."""
        tokens = []
        for token in self.matcher.compute_ff_tokens():
            if token >= self.vocab_size:
                break
            tokens.append(token)
        return tokens

    def masks_along(self, tokens: list[int]) -> mx.array:
        """[1 + len(tokens), V] bool: row j is the mask after tokens[:j] (row 0: here).
        The matcher consumes the tokens, then rolls them back."""
        here = self.allowed()
        masks, consumed = [here.mask], 0
        try:
            for token in tokens:
                self.advance(token)
                consumed += 1
                masks.append(self.allowed().mask)
        finally:
            if consumed:
                self.matcher.rollback(consumed)
            self._allowed = here
        return mx.stack(masks)

    def mask(self, logits: mx.array) -> mx.array:
        """logits: [1, V] -> the same with every token not allowed at -inf."""
        return mx.where(self.allowed().mask, logits, mx.array(-mx.inf, logits.dtype))

    def advance(self, token: int) -> None:
        """A kept (non-EOS) token; ValueError for one the grammar refuses."""
        if not self.matcher.consume_token(int(token)):
            raise UnsatisfiableConstraint(
                f"the JSON schema cannot be continued after {self.matcher.get_error() or 'this token'}"
                if self.matcher.is_error()
                else f"token {token} is not allowed by the JSON schema here"
            )
        self._allowed = None
