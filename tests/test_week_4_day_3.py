"""Week 4 Day 3: a learned drafter.

The head against the same formulas in NumPy (its features against mlx-lm's own
final norm), its drafts against a NumPy greedy loop, its file refused for another
model or when missing; the examples against NumPy slicing of mlx-lm's hidden
states, the loss against NumPy, a tiny training run whose loss falls; the engine
with speculative "learned": mixed_forward's hidden rows equal mlx-lm's, each
request keeps the hidden state its next token came from, greedy tokens equal plain
decoding and mlx-lm's (random models with random heads, the embedded model with
its shipped head, arrivals, aborts, EOS, constraints), and sampled tokens follow
the model's distribution (chi-square).
"""

import threading
from types import SimpleNamespace

import mlx.core as mx
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from mlx.utils import tree_flatten, tree_map_with_path

from tiny_llm_base import EngineConfig, NoConstraint, PromptSpec, prompt_token_ids
from tiny_llm_base.draft_heads import EMBEDDED_HEAD, TRAIN_COMMAND

from .helpers import assert_same_tokens, assert_within, expected_tokens, run_engine
from .random_models import SIZES, random_model
from .solution import tiny
from .speculation_checks import (
    CHI_SQUARE_999,
    third_token_counts,
    third_token_distribution,
    check_rows,
    chi_square,
    engine_tokens,
)


def random_head(model, vocab: int, seed: int, hidden: int = 24) -> "tiny.DraftHead":
    """A head over half the vocabulary (a random half, so that some tokens have no
    draft index), its weights drawn at scale 0.3 (mlp_norm's around 1, out_norm's
    around 4: peaked logits, so that it is sure enough to draft)."""
    rng = np.random.default_rng(seed)
    ids = [int(t) for t in rng.permutation(vocab)[: vocab // 2]]
    head = tiny.DraftHead.for_model(model, ids, hidden)
    mx.random.seed(seed)
    head.update(
        tree_map_with_path(
            lambda path, p: (
                ("mlp_norm" in path)
                + 4 * ("out_norm" in path)
                + 0.3 * mx.random.normal(p.shape)
            ),
            head.parameters(),
        )
    )
    mx.eval(head.parameters())
    return head


def rms(x: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * weight


def numpy_head(head, feature: np.ndarray, token: np.ndarray) -> np.ndarray:
    """The head's __call__ in NumPy, from its parameters and the model's table."""
    p = {
        name: np.array(v, dtype=np.float64)
        for name, v in tree_flatten(head.parameters())
    }
    table = np.array(head._table, dtype=np.float64)
    eps = head.mlp_norm.eps
    z = np.concatenate([feature, table[token]], axis=-1) @ p["fc.weight"].T
    y = rms(z, p["mlp_norm.weight"], eps)
    gate, up = y @ p["gate.weight"].T, y @ p["up.weight"].T
    z = z + (gate / (1 + np.exp(-gate)) * up) @ p["down.weight"].T
    return rms(z, p["out_norm.weight"], eps)


@pytest.fixture(scope="module")
def qwen(pair):
    """(mlx-lm model, tiny model, head) on the first random pair."""
    mlx_model, model = pair
    return mlx_model, model, random_head(model, mlx_model.args.vocab_size, 1)


# --- the head -----------------------------------------------------------------------


@pytest.mark.task(1)
@given(
    answers=st.lists(st.lists(st.integers(0, 30), max_size=12), max_size=6),
    size=st.integers(1, 40),
)
def test_draft_vocabulary_is_the_most_common_tokens(answers, size):
    flat = np.array([t for a in answers for t in a], dtype=np.int64)
    ids, counts = np.unique(flat, return_counts=True)
    order = np.lexsort((ids, -counts))  # most common, then the smaller id
    assert tiny.draft_vocabulary(answers, size) == ids[order][:size].tolist()


@pytest.mark.task(1)
def test_the_head_trains_only_its_own_weights(qwen):
    _, model, head = qwen
    names = {name for name, _ in tree_flatten(head.trainable_parameters())}
    assert names == {
        "fc.weight",
        "mlp_norm.weight",
        "gate.weight",
        "up.weight",
        "down.weight",
        "out_norm.weight",
    }
    E = model.embedding.weight.shape[1]
    assert head.fc.weight.shape == (E, 2 * E)
    assert head.gate.weight.shape == (24, E)


@pytest.mark.task(1)
def test_features_are_mlx_lms_final_norm(qwen):
    """head.features of the last layer's output is what mlx-lm's model returns
    after its final norm."""
    mlx_model, model, head = qwen
    tokens = [[5, 17, 3, 99, 42, 8]]
    hidden = tiny.hidden_states(model, tokens)[0]
    expected = mlx_model.model(mx.array(tokens))[0]
    assert_within(head.features(hidden), expected, 1e-4, "features")


@pytest.mark.task(1)
def test_the_head_and_its_logits_follow_the_formula(qwen):
    _, _, head = qwen
    rng = np.random.default_rng(0)
    E = head._table.shape[1]
    feature = rng.normal(size=(7, E)).astype(np.float32)
    token = rng.integers(0, head._table.shape[0], 7)
    out = head(mx.array(feature), mx.array(token))
    expected = numpy_head(head, feature.astype(np.float64), token)
    assert_within(out, expected, 1e-4, "the head")
    rows = np.array(head._table, dtype=np.float64)[head.draft_ids]
    assert_within(head.logits(out), np.array(out, np.float64) @ rows.T, 1e-4, "logits")
    index = np.array(head.index_of(mx.arange(head._table.shape[0])))
    for position, token_id in enumerate(head.draft_ids):
        assert index[token_id] == position
    assert (index == -1).sum() == head._table.shape[0] - len(head.draft_ids)


@pytest.mark.task(1)
@pytest.mark.parametrize("k", [1, 3, 6])
def test_drafts_are_a_greedy_loop_over_its_own_predictions(qwen, k):
    """The drafts of a NumPy greedy loop; with a confidence, cut before the first
    whose softmax probability under the head is below it."""
    mlx_model, model, head = qwen
    hidden = tiny.hidden_states(model, [[4, 8, 15, 16, 23]])[0][-1]
    feature = rms(
        np.array(hidden, np.float64)[None],
        np.array(head._norm_weight, np.float64),
        head._eps,
    )
    table = np.array(head._table, dtype=np.float64)[head.draft_ids]
    token, expected, sure = np.array([42]), [], []
    for _ in range(k):
        feature = numpy_head(head, feature, token)
        logits = (feature @ table.T)[0]
        token = np.array([head.draft_ids[int(np.argmax(logits))]])
        expected.append(int(token[0]))
        sure.append(1 / np.exp(logits - logits.max()).sum())
    assert head.draft(hidden, 42, k) == expected
    for confidence in sorted(sure):
        cut = next((j for j, p in enumerate(sure) if p < confidence - 1e-6), k)
        assert head.draft(hidden, 42, k, confidence - 1e-6) == expected[:cut]
    assert head.draft(hidden, 42, k, 1.01) == []


@pytest.mark.task(1)
def test_guess_drafts_many_rows_as_draft_does_one(qwen):
    """Each row of guess is what draft gives that row alone, its probabilities the
    head's softmax (in (0, 1])."""
    _, model, head = qwen
    hidden = tiny.hidden_states(model, [[4, 8, 15, 16, 23, 42, 7]])[0]
    tokens = [9, 30, 77, 5]
    drafts, sure = head.guess(head.features(hidden[:4]), mx.array(tokens), 3)
    assert drafts.shape == sure.shape == (4, 3)
    for row, token in enumerate(tokens):
        assert drafts[row].tolist() == head.draft(hidden[row], token, 3)
    assert ((sure > 0) & (sure <= 1 + 1e-6)).all().item()


@pytest.mark.task(1)
def test_a_head_file_round_trips_and_refuses_another_model(
    qwen, random_pairs, tmp_path
):
    _, model, head = qwen
    path = tmp_path / "head.safetensors"
    tiny.save_draft_head(head, path)
    loaded = tiny.load_draft_head(model, path)
    hidden = tiny.hidden_states(model, [[1, 2, 3]])[0][-1]
    assert loaded.draft_ids == head.draft_ids
    assert loaded.draft(hidden, 7, 4) == head.draft(hidden, 7, 4)
    with pytest.raises(ValueError, match=f"another model.*{TRAIN_COMMAND}"):
        tiny.load_draft_head(random_pairs[2][1], path)
    # The same model with its table in bfloat16 (a GPU's weights) is the same model.
    table = model.embedding.weight.astype(mx.bfloat16)
    in_bfloat16 = SimpleNamespace(
        embedding=SimpleNamespace(weight=table), norm=model.norm
    )
    assert tiny.load_draft_head(in_bfloat16, path).draft_ids == head.draft_ids
    with pytest.raises(FileNotFoundError, match=TRAIN_COMMAND):
        tiny.load_draft_head(model, tmp_path / "nowhere.safetensors")


@pytest.mark.task(1)
def test_a_loaded_head_drafts_on_another_thread(embedded):
    """The server's engine thread drafts with a head loaded on the main thread
    (every array the head holds is computed at load, none left to a thread
    without the main thread's stream)."""
    _, model, _ = embedded
    head = tiny.load_draft_head(model, EMBEDDED_HEAD)
    hidden = tiny.hidden_states(model, [[1, 2, 3]])[0][-1]
    mx.eval(hidden)
    got = []
    worker = threading.Thread(target=lambda: got.append(head.draft(hidden, 7, 3)))
    worker.start()
    worker.join()
    assert got == [head.draft(hidden, 7, 3)]


# --- training -----------------------------------------------------------------------


@pytest.mark.task(2)
def test_examples_are_the_positions_of_the_answers(qwen):
    mlx_model, model, head = qwen
    sequences = [[3, 9, 27, 81, 50, 7, 11, 2], [5, 6, 7, 8, 9], [1, 2, 3]]
    prompts = [3, 1, 2]
    hidden = tiny.hidden_states(model, sequences)
    examples = tiny.draft_examples(head, sequences, prompts, hidden)
    features, tokens, targets = [], [], []
    for seq, start in zip(sequences, prompts):
        normed = np.array(mlx_model.model(mx.array([seq]))[0])
        for t in range(start - 1, len(seq) - 3):
            features.append(normed[t])
            tokens.append(seq[t + 1 : t + 4])
            targets.append(normed[t + 1 : t + 3])
    assert len(examples) == len(features) == 3 + 2 + 0
    assert np.array(examples.tokens).tolist() == tokens
    assert_within(examples.features, np.array(features), 1e-4, "features")
    assert_within(examples.targets, np.array(targets), 1e-4, "targets")


def smooth_l1(a: np.ndarray, b: np.ndarray) -> float:
    d = np.abs(a - b)
    return float(np.where(d < 1, 0.5 * d * d, d - 0.5).mean())


def cross_entropy(logits: np.ndarray, wanted: np.ndarray) -> float:
    known = wanted >= 0
    if not known.any():
        return 0.0
    top = logits.max(-1, keepdims=True)
    logp = logits - top - np.log(np.exp(logits - top).sum(-1, keepdims=True))
    return float(-logp[known, wanted[known]].mean())


@pytest.mark.task(2)
def test_the_loss_drafts_twice_as_drafting_will(qwen):
    mlx_model, model, head = qwen
    sequences = [[3, 9, 27, 81, 50, 7, 11, 2, 40, 41], [5, 6, 7, 8, 9, 10, 1]]
    hidden = tiny.hidden_states(model, sequences)
    batch = tiny.draft_examples(head, sequences, [2, 2], hidden)
    f = np.array(batch.features, np.float64)
    x = np.array(batch.tokens)
    y = np.array(batch.targets, np.float64)
    rows = np.array(head._table, np.float64)[head.draft_ids]
    index = {t: i for i, t in enumerate(head.draft_ids)}
    wanted = np.vectorize(lambda t: index.get(int(t), -1))(x)
    p1 = numpy_head(head, f, x[:, 0])
    p2 = numpy_head(head, p1, x[:, 1])
    expected = smooth_l1(p1, y[:, 0]) + smooth_l1(p2, y[:, 1])
    expected += 0.1 * cross_entropy(p1 @ rows.T, wanted[:, 1])
    expected += 0.1 * cross_entropy(p2 @ rows.T, wanted[:, 2])
    assert abs(tiny.draft_loss(head, batch).item() - expected) < 1e-4 * max(1, expected)


def greedy_answers(model, vocab: int, count: int, seed: int) -> list[list[int]]:
    """`count` random 4-token prompts, each with the model's 20 greedy tokens."""
    rng = np.random.default_rng(seed)
    sequences = []
    for _ in range(count):
        seq = [int(t) for t in rng.integers(0, vocab, 4)]
        cache = model.create_kv_cache()
        logits = model(mx.array([seq]), 0, cache)
        for _ in range(20):
            seq.append(int(mx.argmax(logits[0, -1]).item()))
            logits = model(mx.array([seq[-1:]]), len(seq) - 1, cache)
        sequences.append(seq)
    return sequences


def trained_head(model, sequences, epochs: int) -> tuple:
    """A head of width 64 over the answers' 64 most common tokens, trained on the
    sequences (prompts of 4 tokens): (head, examples, each epoch's loss, the
    acceptance before training)."""
    answers = [s[4:] for s in sequences]
    head = tiny.DraftHead.for_model(model, tiny.draft_vocabulary(answers, 64), 64)
    hidden = tiny.hidden_states(model, sequences)
    examples = tiny.draft_examples(head, sequences, [4] * len(sequences), hidden)
    before = tiny.acceptance(head, examples)[0]
    losses = tiny.train_head(head, examples, epochs, batch_size=32, learning_rate=3e-3)
    return head, examples, losses, before


@pytest.mark.task(2)
def test_a_tiny_training_run_learns_its_examples(pair):
    """A model's own greedy continuations, 10 epochs: the loss falls by 40% and the
    head drafts a fifth more of its training tokens than before."""
    mlx_model, model = pair
    sequences = greedy_answers(model, mlx_model.args.vocab_size, 12, 3)
    head, examples, losses, before = trained_head(model, sequences, 10)
    assert len(losses) == 10
    assert losses[-1] < 0.6 * losses[0], losses
    assert tiny.acceptance(head, examples)[0] > before + 0.2


@pytest.mark.task(2)
def test_acceptance_counts_what_greedy_drafting_keeps(qwen):
    mlx_model, model, head = qwen
    sequences = [[3, 9, 27, 81, 50, 7, 11, 2, 40, 41]]
    hidden = tiny.hidden_states(model, sequences)
    examples = tiny.draft_examples(head, sequences, [2], hidden)
    firsts = boths = 0
    for row in range(len(examples)):
        position = 1 + row  # t of this example
        drafts = head.draft(hidden[0][position], sequences[0][position + 1], 2)
        first = drafts[0] == sequences[0][position + 2]
        firsts += first
        boths += first and drafts[1] == sequences[0][position + 3]
    first, both = tiny.acceptance(head, examples)
    assert first == pytest.approx(firsts / len(examples))
    assert both == pytest.approx(boths / len(examples))


# --- in the engine ------------------------------------------------------------------


@pytest.mark.task(3)
def test_learned_drafts_quote_runs_of_two_tokens_else_ask_the_head(qwen):
    """Under "learned", prompt lookup drafts after a run of at least
    LEARNED_LOOKUP_MIN (2) tokens that occurred before, never a run shorter than
    prompt_lookup_min; otherwise the head drafts from the request's hidden state."""
    _, model, head = qwen
    hidden = tiny.hidden_states(model, [[4, 8, 15, 16, 23]])[0][-1]
    config = SimpleNamespace(
        speculative="learned",
        prompt_lookup_max=3,
        prompt_lookup_min=1,
        draft_head=head,
        jump_forward=False,
    )

    def drafts(tokens):
        request = SimpleNamespace(
            tokens=tokens,
            next_token=tokens[-1],
            constraint_state=NoConstraint(),
            drafting=SimpleNamespace(hidden=hidden),
        )
        return tiny.speculative.propose_drafts(request, 3, config)

    assert tiny.speculative.LEARNED_LOOKUP_MIN == 2
    heads = head.draft(hidden, 30, 3, tiny.speculative.DRAFT_CONFIDENCE)
    quoting = [5, 9, 30, 31, 2, 9, 30]  # "9 30" came before, then 31 2 9
    assert drafts(quoting) == [31, 2, 9]
    assert drafts([5, 9, 30, 31, 2, 7, 30]) == heads  # only "30" came before
    config.prompt_lookup_min = 3
    assert drafts(quoting) == heads


@pytest.mark.task(3)
def test_mixed_forward_hands_back_the_rows_it_sampled(qwen):
    """A decode row and a chunk ending its prompt: the hidden rows, normed, are
    mlx-lm's final-norm output at those positions."""
    mlx_model, model, head = qwen
    first, second = [3, 9, 27, 81], [5, 6, 7, 8, 9, 10]
    batch_cache = [tiny.BatchingKvCache(2, 64) for _ in range(model.num_layers)]
    prefill = model.create_kv_cache()
    model(mx.array([first]), 0, prefill)
    for layer, cache in zip(batch_cache, prefill):
        layer.add_request(cache, 0)
    chunk_cache = model.create_kv_cache()
    chunk = tiny.PrefillChunk(second, 0, chunk_cache, logit_rows=2)
    logits, chunk_logits, hidden = tiny.mixed_forward(
        model, [11], [4], batch_cache, [chunk], with_hidden=True
    )
    assert hidden.shape == (3, model.embedding.weight.shape[1])
    expected_row = mlx_model.model(mx.array([first + [11]]))[0, -1]
    expected_chunk = mlx_model.model(mx.array([second]))[0, -2:]
    assert_within(head.features(hidden[0]), expected_row, 1e-4, "decode row")
    assert_within(head.features(hidden[1:]), expected_chunk, 1e-4, "chunk rows")
    assert_within(model.logits(hidden[:1]), logits, 1e-4, "the same rows' logits")
    assert len(tiny.mixed_forward(model, [11], [5], batch_cache, [])) == 2


def check_hidden(mlx_model, head):
    """After every step: each decoding request's kept hidden state is, normed,
    mlx-lm's final-norm output at its last fed position."""

    def check(engine):
        for request in engine.slots:
            if request is None or request.drafting.hidden is None:
                continue
            fed = request.tokens[: request.offset]
            expected = mlx_model.model(mx.array([fed]))[0, -1]
            assert_within(
                head.features(request.drafting.hidden),
                expected,
                2e-4,
                "kept hidden",
                rtol=1e-4,
            )

    return check


@pytest.mark.task(3)
@settings(
    max_examples=10,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(data=st.data())
def test_greedy_tokens_equal_plain_decoding_and_mlx_lm(data, random_pairs, tokenizer):
    index = data.draw(st.integers(0, len(SIZES) - 1), label="model")
    mlx_model, model = random_pairs[index]
    vocab = mlx_model.args.vocab_size
    head = random_head(model, vocab, data.draw(st.integers(0, 100), label="head"))
    rng = np.random.default_rng(data.draw(st.integers(0, 1000), label="seed"))
    count = data.draw(st.integers(1, 5), label="prompts")
    prompts = [
        PromptSpec(
            [int(t) for t in rng.integers(0, vocab, int(rng.integers(1, 30)))],
            arrival_step=int(rng.integers(0, 6)),
        )
        for _ in range(count)
    ]
    settings = dict(
        batch_size=data.draw(st.integers(1, 5), label="batch"),
        kv_cache=data.draw(st.sampled_from(["dense", "paged"]), label="kv"),
        block_size=4,
        max_tokens=20,
        max_seq_len=128,
        step_ahead=data.draw(st.booleans(), label="step_ahead"),
    )
    k = data.draw(st.sampled_from([1, 2, 4]), label="k")

    def check(engine):
        check_rows(engine)
        check_hidden(mlx_model, head)(engine)

    plain, _, _ = engine_tokens(model, tokenizer, prompts, **settings)
    drafted, results, metrics = engine_tokens(
        model,
        tokenizer,
        prompts,
        check,
        speculative="learned",
        draft_head=head,
        num_speculative_tokens=k,
        **settings,
    )
    assert drafted == plain
    assert all(r.finish_reason in ("stop", "length") for r in results)
    assert metrics.accepted_draft_tokens <= metrics.draft_tokens
    ids = [p.prompt for p in prompts]
    for (tokens, gaps), ours in zip(
        expected_tokens(mlx_model, ids, 20, tokenizer), drafted
    ):
        assert_same_tokens(ours, tokens, gaps, "learned drafts vs mlx-lm")


@pytest.mark.task(3)
@pytest.mark.parametrize("kv_cache,batch", [("dense", 6), ("paged", 6), ("paged", 1)])
def test_a_trained_head_drafts_and_rows_hold_the_accepted_tokens(
    pair, tokenizer, kv_cache, batch
):
    """A head trained (30 epochs, so that it is sure of what it learned) on the
    model's own answers to 12 prompts; three of those prompts again and three new
    ones: drafts are kept and rejected, and after every step each row holds
    exactly its accepted tokens and each request the hidden state of its last fed
    position. At batch 1 every step that drafts drafts in every row (the step-ahead
    runner's verify_alone)."""
    mlx_model, model = pair
    vocab = mlx_model.args.vocab_size
    sequences = greedy_answers(model, vocab, 12, 3)
    head = trained_head(model, sequences, 30)[0]
    new = greedy_answers(model, vocab, 3, 4)
    prompts = [s[:4] for s in sequences[:3] + new]
    plain, _, _ = engine_tokens(
        model, tokenizer, prompts, batch_size=batch, max_tokens=24, kv_cache=kv_cache
    )

    def check(engine):
        check_rows(engine, model)
        check_hidden(mlx_model, head)(engine)

    drafted, _, metrics = engine_tokens(
        model,
        tokenizer,
        prompts,
        check,
        batch_size=batch,
        max_tokens=24,
        kv_cache=kv_cache,
        block_size=4,
        speculative="learned",
        draft_head=head,
    )
    assert drafted == plain
    assert metrics.draft_tokens > metrics.accepted_draft_tokens > 0


@pytest.fixture(scope="module")
def embedded(embedded_model, embedded_week2_model):
    """(tokenizer, the embedded model's fast week 2 model, its shipped head)."""
    _, tokenizer = embedded_model
    model = embedded_week2_model(True)
    return tokenizer, model, tiny.load_draft_head(model, EMBEDDED_HEAD)


CHAT = ("Tell me about the seasons of the year.", "How do I make a cup of tea?")


@pytest.mark.task(3)
def test_the_embedded_head_drafts_chat_with_the_same_tokens(
    embedded, embedded_float32_reference
):
    """Open chat, where prompt lookup finds little: the shipped head's drafts are
    accepted often, and the tokens are mlx-lm's."""
    tokenizer, model, head = embedded
    prompts = [prompt_token_ids(tokenizer, q) for q in CHAT]
    tokens, results, metrics = engine_tokens(
        model,
        tokenizer,
        prompts,
        batch_size=2,
        max_tokens=24,
        max_seq_len=256,
        speculative="learned",
        draft_head=head,
        num_speculative_tokens=2,
    )
    for prompt, ours in zip(prompts, tokens):
        ((expected, gaps),) = expected_tokens(
            embedded_float32_reference, [prompt], 24, tokenizer
        )
        assert_same_tokens(ours, expected, gaps, "embedded, learned drafts")
    assert metrics.accepted_draft_tokens >= 0.2 * metrics.draft_tokens > 0


@pytest.mark.task(3)
def test_aborts_eos_and_constraints_keep_their_tokens(embedded):
    """An abort mid-run, a constrained request and requests that end at EOS: the
    same tokens with the learned drafter as without, the aborted one excepted."""
    tokenizer, model, head = embedded
    specs = [
        PromptSpec(prompt_token_ids(tokenizer, CHAT[0]), max_tokens=40),
        PromptSpec(
            prompt_token_ids(tokenizer, "Is water wet? Answer yes or no."),
            max_tokens=8,
            constraint=tiny.Regex("(yes|no), because [a-z ]{1,30}"),
        ),
        PromptSpec(prompt_token_ids(tokenizer, "Say hi."), max_tokens=64),
    ]

    def run(**drafting):
        engine = tiny.Engine(
            model,
            tokenizer,
            policy="mixed",
            batch_size=3,
            max_seq_len=256,
            **drafting,
        )
        ids = [engine.add_request(s) for s in specs]
        results, steps = {}, 0
        while engine.has_unfinished():
            if steps == 6:
                engine.abort(ids[0])
            for output in engine.step():
                if output.result is not None:
                    results[output.request_id] = output.result
            steps += 1
        return [results[i] for i in ids], engine.metrics

    plain, _ = run()
    drafted, metrics = run(speculative="learned", draft_head=head)
    assert drafted[0].finish_reason == "abort"
    assert [r.tokens for r in drafted[1:]] == [r.tokens for r in plain[1:]]
    assert drafted[2].finish_reason == "stop"
    assert metrics.draft_tokens > 0


@pytest.mark.task(3)
def test_sampled_tokens_follow_the_model(tokenizer):
    """A vocabulary of 8 and temp 1: the third generated token's frequencies over
    600 requests, over a hundred verifying a random head's drafts, match the exact
    distribution from mlx-lm's logits (EOS ending a request early counted apart),
    chi-square."""
    mlx_model = random_model("qwen2", 32, 2, 1, 48, 1, 8, False, seed=11)
    model = tiny.Qwen2ModelWeek2(mlx_model, weights="float32")
    head = random_head(model, 8, 4)
    prompt = [0, 1, 2, 3, 4, 5, 6, 7, 1, 2]
    [eos] = [t for t in tokenizer.eos_token_ids if t < 8]
    expected = third_token_distribution(mlx_model, prompt, eos)
    engine = tiny.Engine(
        model,
        tokenizer,
        policy="mixed",
        batch_size=32,
        max_seq_len=32,
        speculative="learned",
        draft_head=head,
        num_speculative_tokens=2,
        prompt_lookup_min=3,
        prompt_lookup_max=3,
    )
    mx.random.seed(1)
    sampler = tiny.make_sampler(1.0)
    specs = [
        PromptSpec(prompt, max_tokens=3, sampler=sampler, arrival_step=i // 10)
        for i in range(600)
    ]
    results = run_engine(engine, specs)
    counts = third_token_counts(results, eos)
    statistic, freedom = chi_square(counts, expected)
    assert engine.metrics.drafts > 100
    assert statistic < CHI_SQUARE_999[freedom], (counts, expected * 600)


@pytest.mark.task(3)
def test_learned_speculation_needs_its_head():
    head = object()  # the config checks only that a head is there
    with pytest.raises(ValueError, match="draft_head=load_draft_head"):
        EngineConfig(policy="mixed", speculative="learned")
    with pytest.raises(ValueError, match="speculative='learned'"):
        EngineConfig(policy="mixed", speculative="ngram", draft_head=head)
