"""What the test files share: closeness of arrays, NumPy oracles of attention and of
the sampling penalties, random models made to decide clearly, generated tokens
compared with mlx-lm's, a free port, one TLS context for the HTTP clients, and the
mark of the tests that CI runs again on the GPU's side of the device switch.

The mlx-lm side (the float32 reference model, chat prompts, greedy generation alone)
lives in tiny_llm_base.mlx_lm_reference, which the benchmarks use too.
"""

import json
import ssl

import mlx.core as mx
import numpy as np
import pytest
from mlx import nn

from tiny_llm_base import UnsatisfiableConstraint
from tiny_llm_base.mlx_lm_reference import mlx_lm_greedy
from tiny_llm_base.tool_prompts import CLOSE, OPEN

# The longest any one wait may take (a server's answer, a thread, a process): a bound
# for what hangs, never a speed goal; a step of the embedded model can take seconds
# on a 2-core machine at a load of 20.
WAIT_S = 300
# The HTTP clients' TLS context (httpx's verify=), made once: httpx makes one for each
# client otherwise, loading the CA bundle (~28 ms of CPU), though the servers under
# test speak plain HTTP on 127.0.0.1.
TLS = ssl.create_default_context()
TOLERANCE = {mx.float32: 1e-5, mx.float16: 2e-3, mx.bfloat16: 2e-2}
# Where mlx-lm's best two logits are closer than this, float32 rounding may pick
# either token: a divergence is accepted there (and the rest of that sequence with it).
NEAR_TIE = 1e-3
# use_fast_kernels off and on, "hand-written" and "mx.fast": the fast side takes the
# device switch's branches (swiglu, fast_attention), so it is marked device_branch and
# CI runs it again on the GPU's side (`pdm run test-refsol --gpu-paths`).
FAST_DEVICE_BRANCH = pytest.mark.parametrize(
    "fast",
    [False, pytest.param(True, marks=pytest.mark.device_branch)],
    ids=["hand-written", "mx.fast"],
)


def as_float32(x) -> np.ndarray:
    """An mx or NumPy array as a float32 NumPy array."""
    if isinstance(x, mx.array):
        return np.array(x.astype(mx.float32))
    return np.asarray(x, dtype=np.float32)


def assert_within(
    actual,
    expected,
    atol: float,
    what: str = "",
    *,
    rtol: float = 0.0,
    same_dtype: bool = False,
) -> None:
    """Same shape (and dtype if same_dtype), and |actual - expected| <= atol +
    rtol * |expected| everywhere, compared in float32. Arrays: mx or NumPy."""
    assert actual.shape == expected.shape, (
        f"{what}: shape {actual.shape}, expected {expected.shape}"
    )
    if same_dtype:
        assert actual.dtype == expected.dtype, (
            f"{what}: dtype {actual.dtype}, expected {expected.dtype}"
        )
    np.testing.assert_allclose(
        as_float32(actual), as_float32(expected), atol=atol, rtol=rtol, err_msg=what
    )


def assert_close(
    actual: mx.array,
    expected: mx.array,
    dtype: mx.Dtype,
    scale: float = 1.0,
    tolerance: dict = TOLERANCE,
) -> None:
    """Same shape and dtype, and values within tolerance[dtype] * scale (abs and rel)."""
    tol = tolerance[dtype] * scale
    assert_within(actual, expected, tol, rtol=tol, same_dtype=True)


def random_qkv(batch, q_heads, kv_heads, L, S, dim, dtype):
    """Normal queries [batch, q_heads, L, dim], keys and values [batch, kv_heads, S,
    dim], in dtype."""
    q = mx.random.normal((batch, q_heads, L, dim)).astype(dtype)
    k = mx.random.normal((batch, kv_heads, S, dim)).astype(dtype)
    v = mx.random.normal((batch, kv_heads, S, dim)).astype(dtype)
    return q, k, v


def numpy_chunk_mask(L: int, S: int) -> np.ndarray:
    """[L, S] float32: queries at absolute positions S - L .. S - 1; query i sees
    key j (0) iff j <= S - L + i, else -inf."""
    query_pos = np.arange(L)[:, None] + (S - L)
    key_pos = np.arange(S)[None, :]
    return np.where(key_pos <= query_pos, 0.0, -np.inf).astype(np.float32)


def numpy_attention(query, key, value, scale: float, mask=None) -> np.ndarray:
    """softmax(q k^T * scale + mask) v in float64, key/value heads repeated per
    query head. mask: None; "causal" (numpy_chunk_mask); a boolean mx array, True
    where a query sees a key; or additive, mx or NumPy."""
    q, k, v = (as_float32(x).astype(np.float64) for x in (query, key, value))
    L, S = q.shape[2], k.shape[2]
    n_repeats = q.shape[1] // k.shape[1]
    k, v = np.repeat(k, n_repeats, axis=1), np.repeat(v, n_repeats, axis=1)
    scores = q @ k.swapaxes(-1, -2) * scale
    if isinstance(mask, str):
        scores = scores + numpy_chunk_mask(L, S)
    elif isinstance(mask, mx.array) and mask.dtype == mx.bool_:
        scores = np.where(np.array(mask), scores, -np.inf)
    elif isinstance(mask, mx.array):
        scores = scores + as_float32(mask).astype(np.float64)
    elif mask is not None:
        scores = scores + np.asarray(mask, dtype=np.float64)
    weights = np.exp(scores - scores.max(axis=-1, keepdims=True))
    return weights / weights.sum(axis=-1, keepdims=True) @ v


def numpy_penalized(
    logits: np.ndarray,
    prompt: list[int],
    answer: list[int],
    frequency: float = 0.0,
    presence: float = 0.0,
    repetition: float = 1.0,
    bias: dict[int, float] | None = None,
) -> np.ndarray:
    """logits [V] after vLLM's order of processors: the logit bias, then the
    repetition penalty (vLLM's and Hugging Face's: a token of the prompt or the
    answer has a positive logit divided by it, another multiplied), then OpenAI's
    frequency and presence penalties over the answer's token counts."""
    out = np.array(logits, np.float64)
    for token, value in (bias or {}).items():
        out[token] += value
    for token in set(prompt) | set(answer):
        out[token] = (
            out[token] / repetition if out[token] > 0 else out[token] * repetition
        )
    counts = np.bincount(np.array(answer, int), minlength=len(out))
    return out - frequency * counts - presence * (counts > 0)


def mlx_lm_logprobs(mlx_model: nn.Module, tokens: list[int]) -> np.ndarray:
    """[L, V]: mlx-lm's log-softmax of the next token at each position of `tokens`,
    one forward without a cache."""
    logits = mlx_model(mx.array([tokens]))[0].astype(mx.float32)
    return np.array(logits - mx.logsumexp(logits, axis=-1, keepdims=True))


LOGPROB_TOLERANCE = 1e-4  # our float32 model against mlx-lm's, in log-probability


def assert_token_logprob(entry, token: int, row: np.ndarray, k: int) -> None:
    """A TokenLogprob against one row of mlx-lm's log-probabilities: the token, its
    logprob and the k most likely tokens' logprobs."""
    assert entry.token == token
    assert abs(entry.logprob - row[token]) <= LOGPROB_TOLERANCE, (entry, row[token])
    assert len(entry.top) == k
    values = [v for _, v in entry.top]
    np.testing.assert_allclose(values, row[[t for t, _ in entry.top]], atol=1e-4)
    np.testing.assert_allclose(values, np.sort(row)[::-1][:k], atol=1e-4)


def assert_prompt_logprobs(entries, prompt: list[int], mlx_model, k: int) -> None:
    """A request's prompt_logprobs: None, then each prompt token's logprob after the
    tokens before it, as mlx-lm's forward over the prompt gives them."""
    assert len(entries) == len(prompt) and entries[0] is None
    expected = mlx_lm_logprobs(mlx_model, prompt)
    for position in range(1, len(prompt)):
        assert_token_logprob(
            entries[position], prompt[position], expected[position - 1], k
        )


def sharpened(model: nn.Module) -> nn.Module:
    """Norm weights of 2 instead of ~0.1: logits spread by ~10, so greedy tokens
    vary with the context and rarely tie, and a wrong mask or offset shows."""
    for _, module in model.named_modules():
        if isinstance(module, nn.RMSNorm):
            module.weight = mx.full(module.weight.shape, 2.0)
    mx.eval(model.parameters())
    return model


def token_ids(rng: np.random.Generator, vocab: int, length: int) -> list[int]:
    return [int(t) for t in rng.integers(0, vocab, length)]


def expected_tokens(mlx_model, prompts, max_tokens, tokenizer, banned=()):
    """mlx_lm_greedy of each prompt alone: [(tokens, gaps)], one per prompt."""
    return [
        mlx_lm_greedy(mlx_model, p, max_tokens, tokenizer.eos_token_ids, banned)
        for p in prompts
    ]


def assert_same_tokens(actual, expected, gaps, what):
    """Equal token lists; a divergence is allowed only where mlx-lm nearly tied.

    A list that ends early stopped at EOS: that counts as a divergence too.
    """
    for i in range(max(len(actual), len(expected))):
        ours = actual[i] if i < len(actual) else "the end"
        theirs = expected[i] if i < len(expected) else "the end"
        if ours != theirs:
            assert i < len(gaps) and gaps[i] < NEAR_TIE, (
                f"{what}: token {i} is {ours}, mlx-lm's greedy choice is {theirs} "
                f"(ours: {actual}, mlx-lm: {expected})"
            )
            return


def assert_like_mlx_lm(
    results,
    mlx_model,
    prompts,
    max_tokens: int,
    tokenizer,
    banned=(),
    finish_reasons=("stop", "length"),
) -> None:
    """Each result's tokens are mlx-lm's greedy tokens for its prompt alone, and it
    finished for one of finish_reasons."""
    expected = expected_tokens(mlx_model, prompts, max_tokens, tokenizer, banned)
    for i, (result, (tokens, gaps)) in enumerate(zip(results, expected)):
        assert result.finish_reason in finish_reasons, (i, result.error)
        assert_same_tokens(result.tokens, tokens, gaps, f"prompt {i}")


def run_engine(engine, specs, after_step=None, max_steps: int = 3000) -> list:
    """Add every spec, step until all finish (calling after_step(engine) after each
    step, when given), and return their GenerationResults in spec order."""
    ids = [engine.add_request(spec) for spec in specs]
    results = {}
    for _ in range(max_steps):
        if not engine.has_unfinished():
            break
        for output in engine.step():
            if output.result is not None:
                results[output.request_id] = output.result
        if after_step is not None:
            after_step(engine)
    assert not engine.has_unfinished(), f"not done after {max_steps} steps"
    return [results[i] for i in ids]


def kv_bytes_a_token(model) -> int:
    """Keys and values of one token over all layers, from the config of a
    Qwen2ModelWeek2 (`model.args`, as mlx-lm read it): 2 (keys, values) x KV heads
    x head_dim x layers x the bytes of a number the model computes in (its
    embedding's dtype)."""
    args = model.args
    head_dim = getattr(args, "head_dim", None) or (
        args.hidden_size // args.num_attention_heads
    )
    element = model.embedding.weight.dtype.size
    return 2 * args.num_key_value_heads * head_dim * args.num_hidden_layers * element


def call_text(name: str, arguments) -> str:
    """A tool call as a model writes it: compact JSON, characters as they are (the
    grammar's strings take "é", not the escape "\\u00e9")."""
    call = {"name": name, "arguments": arguments}
    body = json.dumps(call, separators=(",", ":"), ensure_ascii=False)
    return f"{OPEN}\n{body}\n{CLOSE}"


def grammar_accepts(constraint, tokenizer, text: str, vocab: int = 49152) -> bool:
    """Does `constraint` (a Grammar, JsonSchema...) accept `text` as a whole answer,
    over a vocabulary of `vocab` ids (the embedded tokenizer's by default)?"""
    state = constraint.start(tokenizer, vocab)
    try:
        for token in tokenizer.encode(text, add_special_tokens=False):
            state.advance(token)
    except UnsatisfiableConstraint:
        return False
    return state.is_accepting
