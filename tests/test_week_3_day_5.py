"""Week 3 Day 5: structured outputs.

The automaton against Python's re.fullmatch (random patterns of the subset, random
strings and strings drawn to match); choices; the token index against a brute-force
walk of every token (and, for choices, against plain string prefixes); token texts
against the detokenizer; constrained greedy decoding against mlx-lm's logits masked
by brute force; answers that always match on random models and the embedded model,
greedy and sampled, batched beside unconstrained requests that keep mlx-lm's greedy
tokens; bad constraints failing their request alone; jump-forward (forced text
against every match drawn from the pattern, its tokens, the masks along them, and
the engine's tokens with and without it).
"""

import json
import re

import mlx.core as mx
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tiny_llm_base import PromptSpec, UnsatisfiableConstraint, greedy, prompt_token_ids

from .helpers import assert_same_tokens, expected_tokens, token_ids
from .solution import tiny

# --- random patterns of the supported subset -----------------------------------------

LITERALS = list("abc01") + [r"\.", r"\-", " ", r"\|", r"\(", r"\\"]
CLASSES = [r"[ab]", r"[^a]", r"[a-c0-1]", r"[^\d]", r"\d", r"\w", r"\s", r"\D", "."]
ALPHABET = "abc01 .-|(\\\nZ_"


def patterns():
    """Patterns built from the subset's pieces, each piece grouped where it is
    repeated, so that re and our parser read them the same way."""
    leaf = st.sampled_from(LITERALS + CLASSES)

    def extend(inner):
        quantifier = st.sampled_from(
            ["*", "+", "?", "{2}", "{1,3}", "{0,2}", "{2,}", "*?", "{,2}"]
        )
        return st.one_of(
            st.tuples(inner, inner).map("".join),
            st.tuples(inner, inner).map("|".join),
            inner.map(lambda p: f"({p})"),
            st.tuples(inner, quantifier).map(lambda t: f"(?:{t[0]}){t[1]}"),
        )

    return st.recursive(leaf, extend, max_leaves=8)


@pytest.mark.task(1)
@settings(max_examples=300, deadline=None)
@given(pattern=patterns(), texts=st.lists(st.text(ALPHABET, max_size=8), max_size=20))
def test_the_automaton_matches_what_re_fullmatch_matches(pattern, texts):
    dfa = tiny.compile_regex(pattern)
    for text in texts:
        expected = re.fullmatch(pattern, text, re.ASCII) is not None
        assert dfa.fullmatch(text) == expected, (pattern, text)


@pytest.mark.task(1)
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), pattern=patterns())
def test_the_automaton_accepts_strings_drawn_to_match(data, pattern):
    compiled = re.compile(pattern, re.ASCII)
    text = data.draw(st.from_regex(compiled, fullmatch=True))
    assert tiny.compile_regex(pattern).fullmatch(text), (pattern, text)


@pytest.mark.task(1)
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), pattern=patterns())
def test_forced_text_starts_every_match_from_its_state(data, pattern):
    """Every string that matches, cut anywhere, goes on with the forced text of the
    state its first part reached."""
    dfa = tiny.compile_regex(pattern)
    text = data.draw(st.from_regex(re.compile(pattern, re.ASCII), fullmatch=True))
    for cut in range(len(text) + 1):
        forced = dfa.forced_text(dfa.walk(0, text[:cut]), 40)
        assert text[cut:].startswith(forced), (pattern, text, cut, forced)


@pytest.mark.task(1)
def test_forced_text_stops_at_a_choice_or_a_whole_match():
    dfa = tiny.compile_regex(r'\{"name": "[a-z]+", "id": \d\}')
    assert dfa.forced_text(0, 40) == '{"name": "'
    assert dfa.forced_text(0, 4) == '{"na'
    assert dfa.forced_text(dfa.walk(0, '{"name": "ab'), 40) == ""  # a letter or '"'
    assert dfa.forced_text(dfa.walk(0, '{"name": "ab"'), 40) == ', "id": '
    assert dfa.forced_text(dfa.walk(0, '{"name": "ab", "id": 7'), 40) == "}"
    choices = tiny.compile_choices(["yes", "yesterday"])
    assert choices.forced_text(0, 40) == "yes"  # then it accepts: EOS or "terday"


@pytest.mark.task(1)
def test_anchors_escapes_and_counts():
    cases = {
        r"^\d{3}-\d{4}$": (["555-1234"], ["5551234", "555-123"]),
        r"\x41\u00e9\t": (["A\u00e9\t"], ["Ae\t"]),
        r"[]a]+": (["]a]"], ["b"]),
        r"a{,2}b": (["b", "aab"], ["aaab"]),
        r"x{": (["x{"], ["x"]),
        "": ([""], ["a"]),
        r"(|a)b": (["b", "ab"], ["aab"]),
    }
    for pattern, (good, bad) in cases.items():
        dfa = tiny.compile_regex(pattern)
        for text in good:
            assert dfa.fullmatch(text), (pattern, text)
        for text in bad:
            assert not dfa.fullmatch(text), (pattern, text)


@pytest.mark.task(1)
@pytest.mark.parametrize(
    "pattern, words",
    [
        ("(a", "never closed"),
        ("a)", "unmatched"),
        ("*a", "nothing to repeat"),
        ("a**", "cannot be repeated"),
        ("[b-a]", "range"),
        (r"\b", r"\b is not supported"),
        ("(?=a)", "(?:...)"),
        (r"[^\s\S]", "matches nothing"),
        ("a$b", "edge"),
        ("a{3,2}", "below the minimum"),
        ("a{5000}", "above"),
        ("[abc", "ends too early"),
        (r"\x4", "hex digits"),
    ],
)
def test_unsupported_or_empty_patterns_say_where(pattern, words):
    """The parser is given (regex_parser.RegexParser): its errors name the position."""
    with pytest.raises(ValueError, match=re.escape(words)):
        tiny.parse_regex(pattern)


@pytest.mark.task(1)
@settings(max_examples=100, deadline=None)
@given(
    options=st.lists(st.text("ab1 ", max_size=5), min_size=1, max_size=6),
    texts=st.lists(st.text("ab1 ", max_size=6), max_size=20),
)
def test_choices_accept_exactly_the_options(options, texts):
    dfa = tiny.compile_choices(options)
    for text in texts + options:
        assert dfa.fullmatch(text) == (text in options), (options, text)


@pytest.mark.task(1)
def test_bad_choice_lists_raise():
    with pytest.raises(ValueError, match="empty"):
        tiny.compile_choices([])
    with pytest.raises(TypeError, match="list of strings"):
        tiny.compile_choices("yes")
    with pytest.raises(TypeError, match="must be a string"):
        tiny.compile_choices(["yes", 1])


@pytest.mark.task(1)
def test_a_huge_or_deeply_nested_pattern_is_refused_before_any_work():
    """Limits that keep one request from holding the server's CPU (the parser and
    regex_parser.MAX_PATTERN_CHARS / MAX_NESTING are given): a pattern longer than
    100,000 characters, groups nested past 100, and a constraint needing more than
    50,000 automaton states each raise ValueError saying what to send instead."""
    with pytest.raises(ValueError, match="at most 100,000 are accepted"):
        tiny.parse_regex("{" * 900_000)
    with pytest.raises(ValueError, match="nested more than 100 deep"):
        tiny.parse_regex("(" * 500 + "a" + ")" * 500)
    with pytest.raises(ValueError, match="fewer choices"):
        tiny.compile_choices([f"w{i}" for i in range(10_000)])
    with pytest.raises(ValueError, match="send a shorter pattern"):
        tiny.compile_regex("a" * 60_000)
    # A literal "{" (no count after it) is still a literal, at any length.
    assert tiny.compile_regex("{" * 2_000 + "a").fullmatch("{" * 2_000 + "a")


@pytest.mark.task(1)
def test_a_pattern_past_max_dfa_states_is_refused_with_the_chapters_words():
    """[ab]*a[ab]{13}: the last 14 characters read must be remembered, 2^14 DFA
    states, past MAX_DFA_STATES (10,000), though its NFA is small."""
    with pytest.raises(ValueError) as error:
        tiny.compile_regex("[ab]*a[ab]{13}")
    assert str(error.value) == (
        "the pattern needs more than 10000 DFA states: simplify it (fewer nested "
        "repetitions or alternatives)"
    )


# --- the token index ------------------------------------------------------------------

SMALL_TEXTS = [None, None, "a", "b", "ab", "ba", "abc", "1", "12", "1a", " ", " a",
               "c", "ca", "bb", "aaa", "{", '"', '":', "x", None, "2"]  # fmt: skip
SMALL_EOS = [1]


def small_vocabulary(drops_first_space=False):
    return tiny.Vocabulary(len(SMALL_TEXTS), SMALL_TEXTS, SMALL_EOS, drops_first_space)


def brute_force_allowed(dfa, state, texts, eos):
    """{token: next state} by walking every token's text alone, and the EOS ids."""
    allowed = {}
    for token, text in enumerate(texts):
        if text is None:
            continue
        at = state
        for char in text:
            at = dfa.step(at, char)
            if at == tiny.DEAD:
                break
        if at != tiny.DEAD:
            allowed[token] = at
    return allowed, (list(eos) if dfa.accepting[state] else [])


@pytest.mark.task(2)
@pytest.mark.parametrize(
    "pattern",
    [r"(ab|ba)*c?", r"\d{1,3}a?", r"[abc ]{2,6}", r'\{"a+":\d\}', r"x|1a2|bb"],
)
def test_token_masks_agree_with_a_brute_force_walk(pattern):
    dfa = tiny.compile_regex(pattern)
    index = tiny.TokenIndex(dfa, small_vocabulary())
    for state in range(dfa.num_states):
        entry = index.allowed(state)
        allowed, eos = brute_force_allowed(dfa, state, SMALL_TEXTS, SMALL_EOS)
        expected = np.zeros(len(SMALL_TEXTS), dtype=bool)
        expected[list(allowed) + eos] = True
        np.testing.assert_array_equal(np.array(entry.mask), expected, err_msg=pattern)
        assert entry.next_state == allowed, (pattern, state)


@pytest.mark.task(2)
@settings(max_examples=60, deadline=None)
@given(
    options=st.lists(st.text("ab1 ", min_size=1, max_size=5), min_size=1, max_size=5),
    walk=st.lists(st.integers(0, len(SMALL_TEXTS) - 1), max_size=6),
)
def test_choice_masks_are_the_tokens_that_keep_an_option_reachable(options, walk):
    """Independent of any automaton: a token is allowed after a prefix exactly when
    some option starts with prefix + its text; EOS exactly when the prefix is one."""
    index = tiny.TokenIndex(tiny.compile_choices(options), small_vocabulary())
    state = tiny.ConstraintState(index)
    prefix = ""
    for step in walk:
        mask = np.array(index.allowed(state.state).mask)
        for token, text in enumerate(SMALL_TEXTS):
            if token in SMALL_EOS:
                assert mask[token] == (prefix in options)
            elif text is None:
                assert not mask[token]
            else:
                reachable = any(o.startswith(prefix + text) for o in options)
                assert mask[token] == reachable, (options, prefix, text)
        allowed = [t for t in np.flatnonzero(mask) if t not in SMALL_EOS]
        if not allowed:
            break
        token = int(allowed[step % len(allowed)])
        state.advance(token)
        prefix += SMALL_TEXTS[token]


@pytest.mark.task(2)
def test_a_leading_space_is_dropped_only_at_the_start():
    """With a detokenizer that drops an answer's first space, " a" may start the
    answer "a", and a lone " " leaves the start state but reads nothing."""
    index = tiny.TokenIndex(tiny.compile_choices(["a", " ab"]), small_vocabulary(True))
    state = tiny.ConstraintState(index)
    first = state.allowed().next_state
    assert set(first) == {2, 10, 11}  # "a", " " (reads ""), " a" (reads "a")
    state.advance(10)  # " ": the text is still empty, but no longer at the start
    # "a" (the answer "a"), and " " or " a" (the start of " ab"): no space is dropped
    assert set(state.allowed().next_state) == {2, 10, 11}
    state.advance(11)  # " a": the text is " a"
    assert set(state.allowed().next_state) == {3}  # "b"


@pytest.mark.task(2)
def test_longest_tokens_cut_from_the_left():
    vocabulary = small_vocabulary()
    assert vocabulary.longest_tokens('{"ab":') == [16, 17, 4, 18]
    assert vocabulary.longest_tokens("abca") == [6, 2]  # "abc", "a"
    assert vocabulary.longest_tokens("abz1") == [4]  # no token starts "z1"
    assert vocabulary.longest_tokens("") == []


@pytest.mark.task(2)
def test_masks_along_drafts_are_the_masks_after_each_and_move_nothing():
    index = tiny.TokenIndex(
        tiny.compile_regex(r'\{"(ab|ba)+":\d\}'), small_vocabulary()
    )
    state = tiny.ConstraintState(index)
    state.advance(16)  # "{"
    assert state.forced_tokens() == [17]  # '"'; then "ab" or "ba"
    drafts = [17, 4, 5, 18]  # '"', "ab", "ba", '":'
    masks = np.array(state.masks_along(drafts))
    assert (state.state, state.at_start) == (index.dfa.walk(0, "{"), False)
    walked = tiny.ConstraintState(index)
    walked.advance(16)
    for j in range(len(drafts) + 1):
        assert masks[j].tolist() == np.array(walked.allowed().mask).tolist(), j
        if j < len(drafts):
            walked.advance(drafts[j])
    assert walked.forced_tokens() == []  # a digit comes next: no token is forced


@pytest.mark.task(2)
def test_a_token_outside_the_mask_is_refused():
    index = tiny.TokenIndex(tiny.compile_choices(["ab"]), small_vocabulary())
    state = tiny.ConstraintState(index)
    with pytest.raises(ValueError) as error:
        state.advance(3)  # "b"
    assert str(error.value) == (
        "token 3 is not allowed by the constraint here (the sampler must pick a "
        "token the mask leaves finite)"
    )
    logits = mx.zeros((1, len(SMALL_TEXTS)))
    masked = np.array(state.mask(logits))[0]
    assert np.isfinite(masked).tolist() == [t in (2, 4) for t in range(len(masked))]


@pytest.mark.task(2)
def test_a_state_no_token_can_continue_is_the_constraints_fault():
    """After "a" of the choice "az", no token of the small vocabulary spells "z":
    allowed() (and so mask) raises UnsatisfiableConstraint, a ValueError, with the
    chapter's words."""
    index = tiny.TokenIndex(tiny.compile_choices(["az"]), small_vocabulary())
    state = tiny.ConstraintState(index)
    state.advance(2)  # "a"
    message = (
        "no token of the vocabulary can continue the constraint here (its characters "
        "are not in any whole token): change the pattern"
    )
    for ask in (state.allowed, lambda: state.mask(mx.zeros((1, len(SMALL_TEXTS))))):
        with pytest.raises(UnsatisfiableConstraint) as error:
            ask()
        assert isinstance(error.value, ValueError) and str(error.value) == message


@pytest.mark.task(2)
def test_token_texts_concatenate_to_the_detokenizers_text(tokenizer):
    """Any run of allowed tokens: their texts joined (the first space dropped) are
    exactly what the request's detokenizer shows."""
    vocabulary = tiny.vocabulary_of(tokenizer, 49152)
    texts = vocabulary.texts
    assert vocabulary.drops_first_space
    assert all(texts[t] is None for t in tokenizer.eos_token_ids)
    rng = np.random.default_rng(0)
    usable = [t for t, text in enumerate(texts) if text is not None]
    for _ in range(30):
        run = [usable[i] for i in rng.integers(0, len(usable), 6)]
        detokenizer = tokenizer.detokenizer
        for token in run:
            detokenizer.add_token(token)
        detokenizer.finalize()
        joined = "".join(texts[t] for t in run)
        expected = joined[1:] if joined.startswith(" ") else joined
        assert detokenizer.text == expected, run


# --- decoding ---------------------------------------------------------------------------


def single_char_texts(tokenizer, vocab):
    """An independent token -> text table for a random model's small ids: the
    tokenizer's own decode, special ids and partial characters left out."""
    special = set(tokenizer.all_special_ids) | set(tokenizer.eos_token_ids)
    texts = []
    for token in range(vocab):
        text = tokenizer.decode([token])
        texts.append(None if token in special or "\ufffd" in text else text)
    return texts


def masked_greedy(mlx_model, prompt, max_tokens, texts, eos, viable, accepts):
    """mlx-lm's logits, every step's allowed tokens found by brute force:
    viable(text) says whether text can still grow into a match, accepts(text)
    whether it is one. Returns the tokens and the top-two gaps."""
    tokens, gaps, answer = [], [], ""
    for _ in range(max_tokens):
        logits = mlx_model(mx.array([prompt + tokens]))[0, -1]
        allowed = [
            t for t, text in enumerate(texts) if text and viable(answer + text)
        ] + ([e for e in eos if e < len(texts)] if accepts(answer) else [])
        values = np.array(logits.astype(mx.float32))[allowed]
        order = np.argsort(-values)
        gaps.append(float(values[order[0]] - values[order[1]]) if len(order) > 1 else 9)
        token = allowed[order[0]]
        if token in eos:
            break
        tokens.append(token)
        answer += texts[token]
    return tokens, gaps


CHOICES = ["abc", "ab7", "b!", "zz9z"]
DIGITS = r"\d{1,3}(\.\d\d?)?"


def choice_viable(text):
    return any(o.startswith(text) for o in CHOICES)


def digits_viable(text):
    return re.fullmatch(r"\d{1,3}(\.\d{0,2})?|", text) is not None


@pytest.mark.task(3)
def test_constrained_greedy_masks_mlx_lms_logits(random_pairs, tokenizer):
    """Each random model, a choice and a regex request beside an unconstrained one:
    the constrained tokens are the argmax of mlx-lm's logits over the tokens a
    brute-force check allows, the unconstrained are mlx-lm's greedy tokens."""
    rng = np.random.default_rng(5)
    for mlx_model, model in random_pairs[:2]:
        vocab = mlx_model.args.vocab_size
        texts = single_char_texts(tokenizer, vocab)
        prompts = [token_ids(rng, vocab, n) for n in (5, 9, 7)]
        specs = [
            PromptSpec(prompts[0], constraint=tiny.Choice(CHOICES)),
            PromptSpec(prompts[1], constraint=tiny.Regex(DIGITS)),
            PromptSpec(prompts[2]),
        ]
        results = tiny.batch_generate(
            model, tokenizer, specs, batch_size=3, max_tokens=8, policy="mixed"
        )
        eos = sorted(tokenizer.eos_token_ids)
        expected = [
            masked_greedy(
                mlx_model,
                prompts[0],
                8,
                texts,
                eos,
                choice_viable,
                CHOICES.__contains__,
            ),
            masked_greedy(
                mlx_model,
                prompts[1],
                8,
                texts,
                eos,
                digits_viable,
                lambda t: re.fullmatch(DIGITS, t) is not None,
            ),
            expected_tokens(mlx_model, [prompts[2]], 8, tokenizer)[0],
        ]
        for result, (tokens, gaps), name in zip(results, expected, "crp"):
            assert result.error is None
            assert_same_tokens(result.tokens, tokens, gaps, f"row {name}")
        assert results[0].text in CHOICES and results[0].finish_reason == "stop"


@pytest.mark.task(3)
@pytest.mark.parametrize("temp", [0.0, 1.0])
def test_answers_always_match_on_random_models(random_pairs, tokenizer, temp):
    """Random models' own answers are garbage; under a constraint they match, greedy
    or sampled, in any row of a batch, with both policies."""
    constraints = [
        tiny.Choice(CHOICES),
        tiny.Regex(DIGITS),
        tiny.Regex(r"[a-f]{2,4}-(x|yy)"),
        tiny.Regex(r'\{"k":\[(\d,){0,2}\d\]\}'),  # no space: not in a small vocabulary
        None,
    ]
    rng = np.random.default_rng(7)
    for (mlx_model, model), policy in zip(random_pairs, ["mixed", "alternate"] * 2):
        vocab = mlx_model.args.vocab_size
        specs = [
            PromptSpec(token_ids(rng, vocab, 4 + i), constraint=c)
            for i, c in enumerate(constraints * 2)
        ]
        sampler = tiny.make_sampler(temp, top_k=20) if temp else greedy
        results = tiny.batch_generate(
            model,
            tokenizer,
            specs,
            batch_size=4,
            max_tokens=16,
            policy=policy,
            sampler=sampler,
        )
        for spec, result in zip(specs, results):
            assert result.error is None, result.error
            if spec.constraint is None:
                continue
            dfa = spec.constraint.compile()
            if result.finish_reason == "stop":
                assert dfa.fullmatch(result.text), (spec.constraint, result.text)
            else:
                assert result.finish_reason == "length"
                assert len(result.tokens) == 16
                assert dfa.walk(0, result.text) != tiny.DEAD


@pytest.mark.task(3)
def test_bad_constraints_fail_their_request_alone(pair, tokenizer):
    mlx_model, model = pair
    rng = np.random.default_rng(3)
    prompt = token_ids(rng, mlx_model.args.vocab_size, 6)
    bad = {
        tiny.Regex("(ab"): "never closed",
        tiny.Regex(r"[^\s\S]"): "matches nothing",
        tiny.Regex(r"(?<=a)b"): "(?:...)",
        tiny.Choice([]): "empty",
        tiny.Choice("yes"): "list of strings",
        tiny.Regex(
            "\u00e9+"
        ): "no token",  # no whole token of this vocabulary spells it
        "yes|no": "Regex(pattern), Choice(options), JsonSchema(schema)",
    }
    specs = [PromptSpec(prompt)] + [PromptSpec(prompt, constraint=c) for c in bad]
    specs.append(PromptSpec(prompt, max_tokens=3, constraint=tiny.Regex("[a-c]{9}")))
    results = tiny.batch_generate(model, tokenizer, specs, max_tokens=6)
    tokens, gaps = expected_tokens(mlx_model, [prompt], 6, tokenizer)[0]
    assert_same_tokens(results[0].tokens, tokens, gaps, "unconstrained")
    for result, words in zip(results[1:], bad.values()):
        assert result.finish_reason == "error"
        assert words in result.error
        assert result.tokens == []
    unfinished = results[-1]
    assert unfinished.finish_reason == "length" and len(unfinished.tokens) == 3
    assert re.fullmatch("[a-c]{3}", unfinished.text)


@pytest.mark.task(3)
@pytest.mark.parametrize("kv_cache", ["dense", "paged"])
def test_jump_forward_gives_the_step_by_step_tokens(random_pairs, tokenizer, kv_cache):
    """Forced tokens fed as drafts and verified under the mask: the same greedy
    tokens as one step at a time, with or without prompt lookup beside them."""
    constraints = [
        tiny.Regex(r'\{"name":"[a-c]{1,6}","count":\d\}'),  # no space: see above
        tiny.Choice(["theansweris:yes", "theansweris:no"]),
        None,
    ]
    rng = np.random.default_rng(11)
    config = dict(policy="mixed", batch_size=3, max_tokens=24, kv_cache=kv_cache)
    for mlx_model, model in random_pairs[:2]:
        prompts = [token_ids(rng, mlx_model.args.vocab_size, 6) for _ in range(3)]
        specs = [PromptSpec(p, constraint=c) for p, c in zip(prompts, constraints)]
        plain = tiny.batch_generate(model, tokenizer, specs, **config)
        for speculative in (None, "ngram"):
            jumped = tiny.batch_generate(
                model,
                tokenizer,
                specs,
                **config,
                jump_forward=True,
                speculative=speculative,
            )
            for a, b in zip(plain, jumped):
                assert a.tokens == b.tokens and a.finish_reason == b.finish_reason
            assert jumped[0].metrics.draft_tokens > 0  # the regex forces text
            assert jumped[1].metrics.draft_tokens > 0  # so does the choice
            if speculative is None:
                assert jumped[2].metrics.draft_tokens == 0  # unconstrained


CUSTOMER_PATTERN = r'\{"customer_name": "[A-Z][a-z]{1,12}", "order_count": \d{1,3}\}'
CUSTOMER_SCHEMA = {
    "type": "object",
    "properties": {
        "customer_name": {"type": "string", "maxLength": 16},
        "order_count": {"type": "integer", "minimum": 0, "maximum": 999},
    },
    "required": ["customer_name", "order_count"],
    "additionalProperties": False,
}


@pytest.mark.task(3)
@pytest.mark.parametrize(
    "constraint",
    [tiny.Regex(CUSTOMER_PATTERN), tiny.JsonSchema(CUSTOMER_SCHEMA)],
    ids=["regex", "json-schema"],
)
def test_the_embedded_model_jumps_over_fixed_keys(
    embedded_model, embedded_week2_model, constraint
):
    """A JSON answer's keys are forced (by the course's automaton, or by llguidance
    for a schema): the embedded model accepts most of them as drafts, and the answer
    is token for token the step-by-step one."""
    _, tokenizer = embedded_model
    model = embedded_week2_model(False)
    spec = PromptSpec(
        prompt_token_ids(tokenizer, "One customer as JSON."),
        max_tokens=40,
        constraint=constraint,
    )
    plain, jumped = (
        tiny.batch_generate(model, tokenizer, [spec], policy="mixed", jump_forward=jf)[
            0
        ]
        for jf in (False, True)
    )
    assert jumped.tokens == plain.tokens and jumped.finish_reason == "stop"
    answer = json.loads(jumped.text)
    assert set(answer) == {"customer_name", "order_count"}
    kept = jumped.metrics.accepted_draft_tokens
    assert kept >= jumped.metrics.draft_tokens / 2 and kept >= 6, (
        kept,
        jumped.metrics.draft_tokens,
    )


@pytest.mark.task(3)
def test_the_embedded_model_answers_in_shape(
    embedded_model, embedded_week2_model, embedded_float32_reference
):
    """The embedded model, float32: a choice, a number, a small JSON object and an
    unconstrained chat in one batch; the unconstrained answer is mlx-lm's greedy."""
    _, tokenizer = embedded_model
    model = embedded_week2_model(False)
    json_pattern = r'\{"city": "[A-Z][a-z]{1,15}", "population": \d{1,8}\}'
    questions = [
        ("Is water wet? Answer yes or no.", tiny.Choice(["yes", "no"])),
        ("How many legs does a spider have?", tiny.Regex(r"\d{1,2}")),
        ("Give a city and its population as JSON.", tiny.Regex(json_pattern)),
        ("Name a colour.", None),
    ]
    prompts = [prompt_token_ids(tokenizer, q) for q, _ in questions]
    specs = [
        PromptSpec(p, max_tokens=40 if c else 16, constraint=c)
        for p, (_, c) in zip(prompts, questions)
    ]
    results = tiny.batch_generate(model, tokenizer, specs, batch_size=4, policy="mixed")
    for (_, constraint), result in zip(questions[:3], results):
        assert result.finish_reason == "stop", (result.text, result.finish_reason)
        assert constraint.compile().fullmatch(result.text), result.text
    assert results[0].text in ("yes", "no")
    tokens, gaps = expected_tokens(
        embedded_float32_reference, prompts[3:], 16, tokenizer
    )[0]
    assert_same_tokens(results[3].tokens, tokens, gaps, "unconstrained")


# --- what a vocabulary cannot spell, and what the index may keep ----------------------


@pytest.mark.task(3)
@pytest.mark.parametrize(
    "constraint, missing",
    [
        (tiny.Regex("\U0001f600{1,3}"), "U+1F600"),
        (tiny.Regex("a\x00b"), "U+0000"),
        (tiny.Regex("[\U0001f600-\U0001f602]+"), "U+1F600"),
        (tiny.Choice(["\x00"]), "U+0000"),
    ],
)
def test_a_constraint_the_vocabulary_cannot_spell_is_refused_at_the_start(
    tokenizer, constraint, missing
):
    """Vocabulary.index checks (check_spellable, given) that some text the tokens
    can spell matches, before any request runs: the error names the character."""
    with pytest.raises(ValueError, match="no token holds; change the pattern"):
        try:
            tiny.start_constraint(constraint, tokenizer, tokenizer.vocab_size)
        except ValueError as error:
            assert missing in str(error), str(error)
            raise


@pytest.mark.task(3)
def test_the_token_index_keeps_at_most_its_byte_budget(tokenizer):
    """Every built state of a vocabulary's token indexes lives in one StateCache of
    at most MAX_CACHED_STATE_BYTES (given): a server sees constraints without end,
    and a permissive state maps nearly every token. Walked through 8 states of a
    pattern that allows almost anything, with a 6 MiB budget, the Python memory
    held afterwards stays within the budget and 4 MiB (unbounded: ~2.5 MB a state,
    20 MB), and an evicted state is rebuilt the same."""
    import tracemalloc

    token_index = __import__(tiny.__name__ + ".token_index", fromlist=["StateCache"])
    vocabulary = tiny.vocabulary_of(tokenizer, tokenizer.vocab_size)
    budget = 6 * 2**20
    saved = vocabulary.states
    vocabulary.states = token_index.StateCache(budget)
    try:
        index = vocabulary.index(tiny.Regex("(.|\n){0,60}"))
        first = index.allowed(0)
        tracemalloc.start()
        before = tracemalloc.get_traced_memory()[0]
        state = 0
        for _ in range(8):
            state = index.allowed(state).next_state[tokenizer.encode("a")[-1]]
        held = tracemalloc.get_traced_memory()[0] - before
        tracemalloc.stop()
        assert vocabulary.states.bytes <= budget
        assert held <= budget + 4 * 2**20, f"{held / 2**20:.1f} MiB held"
        again = index.allowed(0)
        assert again is not first  # evicted, then built again
        assert again.next_state == first.next_state
        np.testing.assert_array_equal(np.array(again.mask), np.array(first.mask))
    finally:
        vocabulary.states = saved
