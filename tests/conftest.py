import os

# Float32 means float32 in these tests: they compare float32 models with mlx-lm's and
# numpy's at tolerances (1e-5 to 1e-4) and greedy tokens at near ties, and MLX's
# default on GPUs with TF32 units (CUDA sm80+, Apple M5) runs float32 matmuls in
# TF32, with ~1e-3 relative error. Set before anything imports mlx (the package
# under test, next) and inherited by the CLIs, servers and ranks the tests start.
os.environ["MLX_ENABLE_TF32"] = "0"

from .solution import SOLUTION, tiny  # noqa: E402, F401, I001  (first: the fast BLAS must load before mlx)

import gc

import mlx.core as mx
import pytest

from .later_days import checked_day, later_days_stubbed


# Files whose wall time is long, longest first (a quiet run's --durations, 2 workers):
# the parallel run hands out whole files in collection order, so the long ones go
# first and the many short ones fill in at the end; one long file collected last
# kept a worker busy alone while the other had finished. Week 4 day 1's launch
# ranks in processes of their own, which share the cores best early on.
LONG_FILES = [
    "test_week_4_day_1.py",
    "test_week_4_day_1_cli.py",
    "test_cli.py",
    "test_serve_tools.py",
    "test_serve_responses.py",
    "test_serve_anthropic.py",
    "test_serve_hostile.py",
    "test_client_check.py",
    "test_week_3_day_5.py",
    "test_week_3_day_1.py",
    "test_serve.py",
    "test_week_2_day_7.py",
    "test_week_3_day_1_engine.py",
    "test_week_3_day_2_attention.py",
    "test_serve_structured.py",
    "test_serve_sampling.py",
    "test_scripts_options.py",
]


def pytest_addoption(parser):
    parser.addoption(
        "--task",
        type=int,
        help="run only the tests marked @pytest.mark.task(TASK) (tests/tasks.py)",
    )


def pytest_collection_modifyitems(config, items):
    def rank(item) -> int:
        name = item.path.name
        return LONG_FILES.index(name) if name in LONG_FILES else len(LONG_FILES)

    items.sort(key=rank)  # stable: the other files keep their order
    task = config.getoption("--task")
    if task is None:
        return

    def task_of(item) -> int | None:
        marker = item.get_closest_marker("task")
        return marker.args[0] if marker is not None else None

    deselected = [item for item in items if task_of(item) != task]
    if deselected:
        config.hook.pytest_deselected(items=deselected)
        items[:] = [item for item in items if task_of(item) == task]


def pytest_collection_finish(session):
    """What collection imported (the packages, the test modules) stays out of the
    garbage collector's full passes from here on: a test process holds a large heap
    of long-lived objects (tokenizers, schemas, hypothesis), and each full pass
    walked it again (about half of the GC time, measured on two files). The young
    generation is collected every 50,000 allocations, not 700: the tests allocate
    millions of short-lived objects (JSON, tokens, HTTP), and three files spent
    5.5 s in 2,561 collections, 1.1 s in 35 after."""
    gc.freeze()
    gc.set_threshold(50_000, 50, 100)


@pytest.fixture(scope="session")
def embedded_model():
    """(mlx_model, tokenizer) of the embedded SmolLM2 model, loaded once per run."""
    from tiny_llm_base import load_model

    return load_model()


@pytest.fixture(scope="session")
def protocol_model(embedded_model):
    """(mlx_model, tokenizer): a random two-layer Qwen2 at the embedded tokenizer's
    vocabulary, beside that tokenizer. For server tests whose answers a grammar
    forces or whose checks are the protocol's, not the model's words: a forward
    costs a hundredth of the embedded model's, and a long tool prompt no longer
    dominates a test."""
    from .random_models import random_model

    tokenizer = embedded_model[1]
    vocab = embedded_model[0].args.vocab_size
    # Heads of 32: kv_dtype int8 and int4 quantize keys in groups of 32.
    return random_model("qwen2", 128, 4, 2, 256, 2, vocab, True), tokenizer


@pytest.fixture(scope="module")
def model_client(embedded_model):
    """An openai client of the embedded model's server (tests/servers.py), for the
    server tests whose answers need a model that ends its strings (on
    protocol_model a string runs on to max_tokens)."""
    from .servers import package_server

    with package_server(embedded_model) as running:
        yield running.openai_client()


@pytest.fixture(scope="session")
def random_pairs():
    """(mlx-lm model, tiny model) for every random size of random_models.SIZES,
    Qwen2 and Llama, sharpened, the same float32 weights in both; built once."""
    from .helpers import sharpened
    from .random_models import SIZES, random_model

    pairs = []
    for seed, size in enumerate(SIZES):
        mlx_model = sharpened(random_model(*size, seed=seed))
        pairs.append((mlx_model, tiny.Qwen2ModelWeek2(mlx_model, weights="float32")))
    return pairs


@pytest.fixture(scope="session")
def pair(random_pairs):
    """The first random pair: a small Qwen2 model."""
    return random_pairs[0]


@pytest.fixture(autouse=True)
def seeded():
    mx.random.seed(0)


@pytest.fixture(scope="module", autouse=True)
def only_earlier_days(request):
    """In the reference run, a day of later_days.CHECKED_DAYS runs its tests with
    every function the skeleton labels later made to raise."""
    day = checked_day(request.module.__name__)
    if SOLUTION != "ref" or day is None:
        yield
        return
    with later_days_stubbed(*day):
        yield


@pytest.fixture(scope="session")
def tokenizer(embedded_model):
    """The embedded tokenizer: it detokenizes the small ids of random models too."""
    return embedded_model[1]


@pytest.fixture(scope="session")
def embedded_week2_model(embedded_model):
    """make(fast, weights="float32", package=tiny): the embedded model as that
    package's Qwen2ModelWeek2, built once a session for each setting ("auto"
    weights are what they mean on this device). A new one dequantizes every weight
    at its first forward (about a CPU-second), and a model keeps no state between
    calls (the KV caches are its callers'), so the tests share them."""
    from tiny_llm_base.weights import choose_weight_format

    built = {}

    def make(fast: bool, weights: str = "float32", package=tiny):
        if weights == "auto":
            weights = choose_weight_format()
        key = (package.__name__, weights, fast)
        if key not in built:
            built[key] = package.Qwen2ModelWeek2(
                embedded_model[0], weights=weights, use_fast_kernels=fast
            )
        return built[key]

    return make


@pytest.fixture(scope="session")
def embedded_float32_reference(embedded_model):
    """mlx-lm's own model with the embedded weights dequantized to float32, once per run.

    The same weights our float32 models use, so greedy outputs can be compared token
    for token.
    """
    from tiny_llm_base.mlx_lm_reference import float32_copy

    return float32_copy(embedded_model[0])


@pytest.fixture(scope="module")
def no_eos(pair, tokenizer):
    """For a module whose `pair` fixture is (mlx-lm model, tiny model): a greedy
    sampler that never picks EOS (lengths fixed by max_tokens), and the banned ids."""
    from tiny_llm_base.mlx_lm_reference import greedy_without

    banned = sorted(tokenizer.eos_token_ids)
    return greedy_without(banned, pair[0].args.vocab_size), banned
