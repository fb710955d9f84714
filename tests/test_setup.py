"""The machinery around the course: fast BLAS, the embedded model, load_model, the CLI."""

import ctypes
import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import threading
from contextlib import nullcontext
from pathlib import Path

import pytest

from tiny_llm_base import ModelLoadError, fast_blas, load_model
from tiny_llm_base import embedded_model as store
from scripts.tools import check_platform
from tiny_llm_base.device import PATHS, PATHS_VARIABLE, gpu_paths

ROOT = Path(__file__).resolve().parents[1]


def symbol_address(library: ctypes.CDLL, name: str) -> int:
    return ctypes.cast(getattr(library, name), ctypes.c_void_p).value


def test_fast_blas_serves_mlx_where_openblas_is_available():
    if not fast_blas.needs_openblas():
        assert fast_blas.STATUS == fast_blas.BlasStatus(None, None)
        return
    path = fast_blas.find_openblas()
    if path is None:
        assert (
            not fast_blas.STATUS.active
            and fast_blas.DEBIAN_PACKAGE in fast_blas.STATUS.hint
        )
        return
    assert fast_blas.STATUS.library == path
    # Where a C compiler is, the few-row forwarder is built and serves MLX.
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler and os.environ.get(fast_blas.GEMV_VARIABLE) != "0":
        assert fast_blas.STATUS.gemv_forward, fast_blas.STATUS.gemv_hint
    serving = fast_blas.STATUS.gemv_forward or path
    # libmlx binds cblas_sgemm through the global scope: the forwarder's, or
    # OpenBLAS's without it.
    process = ctypes.CDLL(None)
    assert symbol_address(process, "cblas_sgemm") == symbol_address(
        ctypes.CDLL(serving), "cblas_sgemm"
    )
    # OpenBLAS's own default, a thread per core, unless the environment names a
    # count (OpenBLAS keeps it, at most a thread per core).
    threads = ctypes.CDLL(path).openblas_get_num_threads()
    named = [os.environ[v] for v in fast_blas.THREAD_VARIABLES if os.environ.get(v)]
    cores = len(os.sched_getaffinity(0))
    expected = min(int(named[0]), cores) if named else cores
    assert fast_blas.STATUS.threads == threads == expected


# (M, K, N, A transposed, B transposed, goes around OpenBLAS's sgemm)
FEW_ROW_CASES = [
    (1, 576, 1536, False, True, True),  # x @ W.T, the model's projections: few_rows
    (2, 576, 1536, False, True, True),
    (1, 1539, 583, False, True, True),  # K and N not multiples of the kernel's 8
    (5, 1539, 583, False, True, True),
    (7, 203, 45, False, True, True),  # an odd last row, K past one block of 128
    (16, 64, 37, False, True, True),  # the most rows few_rows takes
    (17, 576, 1536, False, True, False),  # one more: sgemm
    (1, 576, 1536, False, False, True),  # one row in another layout: sgemv
    (1, 64, 37, True, False, True),  # A a column: its row is strided
    (1, 300, 5, True, True, True),
    (3, 64, 37, False, False, False),  # several rows in another layout: sgemm
    # 2^18 to 2^21 multiply-adds, where OpenBLAS would start its threads: on the
    # calling thread alone, in every layout
    (305, 64, 15, False, True, True),  # a chunk's scores: keys @ queries.T
    (15, 305, 64, True, False, True),  # its weights.T @ values
    (20, 300, 70, False, False, True),  # N past the kernel's 32 and 8 columns
    (40, 1000, 50, True, True, True),
    (64, 64, 513, False, False, False),  # past 2^21: sgemm
    (70, 4100, 2, False, False, False),  # K past small_product's row: sgemm
]


def forwarder():
    return ctypes.CDLL(fast_blas.STATUS.gemv_forward)


@pytest.mark.skipif(
    not fast_blas.STATUS.gemv_forward,
    reason="no few-row forwarder here (test_fast_blas_serves_mlx_... says why)",
)
@pytest.mark.parametrize("m,k,n,trans_a,trans_b,around", FEW_ROW_CASES)
def test_few_row_products_match_numpy_in_every_layout(
    m, k, n, trans_a, trans_b, around
):
    """An [M, K] @ [K, N] product in the layouts MLX hands BLAS, plain and as addmm
    (alpha and beta), equals numpy's in float64, with the forwarder's kernels on and
    off (fast_blas.openblas_alone: OpenBLAS's sgemm); on, it went around sgemm
    exactly where the forwarder promises."""
    import mlx.core as mx
    import numpy as np

    rng = np.random.default_rng(m * k + n)
    a, b = rng.standard_normal((m, k)), rng.standard_normal((k, n))
    c = rng.standard_normal((m, n))

    def stored(x, transposed):  # transposed: x.T's rows in memory, viewed as x
        if transposed:
            return mx.array(np.ascontiguousarray(x.T, np.float32)).T
        return mx.array(x, mx.float32)

    left, right = stored(a, trans_a), stored(b, trans_b)
    scale = np.abs(a) @ np.abs(b)  # float32 rounding grows with it
    for enabled, path in ((True, nullcontext), (False, fast_blas.openblas_alone)):
        with path():
            before = forwarder().gemv_forward_count()
            product = np.array(left @ right)
            added = np.array(mx.addmm(mx.array(c, mx.float32), left, right, 2.0, 0.5))
            went_around = forwarder().gemv_forward_count() - before
        assert went_around == (2 if around and enabled else 0)
        assert np.all(np.abs(product - a @ b) <= 1e-5 * scale + 1e-6)
        expected = 2.0 * (a @ b) + 0.5 * c
        assert np.all(np.abs(added - expected) <= 3e-5 * scale + 1e-5)


@pytest.mark.skipif(
    not fast_blas.STATUS.gemv_forward,
    reason="no few-row forwarder here (test_fast_blas_serves_mlx_... says why)",
)
def test_a_decode_step_through_the_forwarder_matches_sgemm(tmp_path):
    """mlx-lm's float32 model, one batch-1 decode step after a prompt, with
    TINY_LLM_GEMV_FORWARD=0 (a child process: OpenBLAS's sgemm) and with the
    forwarder (here): the same greedy token, logits float32 rounding apart."""
    import numpy as np

    from .decode_step import decode_step_logits

    saved = tmp_path / "logits.npy"
    env = dict(os.environ, **{fast_blas.GEMV_VARIABLE: "0"})
    done = subprocess.run(
        [sys.executable, "-m", "tests.decode_step", str(saved)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    before = forwarder().gemv_forward_count()
    logits = decode_step_logits()
    assert forwarder().gemv_forward_count() > before  # the step went around sgemm
    expected = np.load(saved)
    assert logits.argmax() == expected.argmax()
    assert np.abs(logits - expected).max() <= 1e-3 * np.abs(expected).max()


@pytest.mark.skipif(
    not fast_blas.STATUS.gemv_forward,
    reason="no few-row forwarder here (test_fast_blas_serves_mlx_... says why)",
)
def test_products_on_many_streams_at_once_share_one_pool_of_helpers():
    """Four threads, each on its own MLX stream, multiply at the same time on two
    BLAS threads: every product equals numpy's, and the forwarder has started at
    most one helper per thread it was ever asked for, not a team per stream (with
    OpenMP's teams, a second stream made every product wait for a sleeping
    helper)."""
    import mlx.core as mx
    import numpy as np

    rng = np.random.default_rng(7)
    weight = rng.standard_normal((1536, 576)).astype(np.float32)
    w = mx.array(weight)
    rows = rng.standard_normal((4, 20, 576)).astype(np.float32)
    start, results = threading.Barrier(4), [None] * 4

    def multiply(stream: int) -> None:
        start.wait()
        results[stream] = [np.array(mx.array(x[None]) @ w.T)[0] for x in rows[stream]]

    before = fast_blas.set_threads(2)
    try:
        threads = [threading.Thread(target=multiply, args=(s,)) for s in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=120)
    finally:
        fast_blas.set_threads(before)
    for stream in range(4):
        expected = rows[stream].astype(np.float64) @ weight.T.astype(np.float64)
        assert np.allclose(np.array(results[stream]), expected, rtol=1e-4, atol=1e-3)
    helpers = forwarder().gemv_forward_helpers()
    assert 1 <= helpers <= max(2, before) - 1


@pytest.mark.skipif(
    not fast_blas.STATUS.gemv_forward,
    reason="no few-row forwarder here (test_fast_blas_serves_mlx_... says why)",
)
def test_a_chain_of_products_repeated_stays_exact_while_the_pool_learns():
    """The same weights multiplied in the same order, round after round, as decode
    steps do, on two BLAS threads: the pool learns which weight follows which (its
    helper reads the next one ahead) and moves each weight's split between its
    threads. Every product still equals numpy's: no row lost or computed twice,
    for row counts that are not multiples of 8, 1 to 16 rows, and a view of a
    weight's first rows (the same address, fewer rows)."""
    import mlx.core as mx
    import numpy as np

    rng = np.random.default_rng(11)
    shapes = [(960, 576), (576, 576), (3072, 576), (583, 1539), (577, 64 * 9)]
    weights = [rng.standard_normal(s).astype(np.float32) for s in shapes]
    held = [mx.array(w) for w in weights]
    chain = [*zip(held, weights), (held[0][:576], weights[0][:576])]
    before = fast_blas.set_threads(2)
    try:
        for round_number in range(40):
            rows = 1 + round_number % 16
            for w, weight in chain:
                x = rng.standard_normal((rows, weight.shape[1])).astype(np.float32)
                got = np.array(mx.array(x) @ w.T)
                expected = x.astype(np.float64) @ weight.T.astype(np.float64)
                scale = np.abs(x) @ np.abs(weight.T)
                assert np.all(np.abs(got - expected) <= 1e-5 * scale + 1e-6)
    finally:
        fast_blas.set_threads(before)


def test_weights_moved_onto_huge_pages_keep_their_values():
    """back_with_huge_pages over arrays_of a model-like object (a 64 MB array, more
    in a list of layers and a dict, one array reachable twice): arrays_of finds each
    once, and every value is unchanged after the move (numpy copies taken before).
    Where the system offers transparent huge pages and the kernel can collapse
    (Linux 6.1+), some bytes moved; elsewhere none."""
    import platform

    import mlx.core as mx
    import numpy as np

    from tiny_llm_base import huge_pages

    class Layer:
        def __init__(self, seed):
            self.w = mx.random.normal((512, 1536), key=mx.random.key(seed))
            self.extra = {"b": mx.arange(1000, dtype=mx.float32)}

    class Model:
        def __init__(self):
            self.table = mx.random.normal((8192, 2048), key=mx.random.key(0))
            self.layers = [Layer(s) for s in range(1, 5)]
            self.tied = self.table

    model = Model()
    extra = model.layers[0].extra
    extra["loop"] = extra  # a cycle ends the walk, not Python's recursion limit
    found = huge_pages.arrays_of(model)
    assert len(found) == 9 and len({id(a) for a in found}) == 9
    before = [np.array(a) for a in found]
    moved = huge_pages.back_with_huge_pages(found)
    for array, copy in zip(found, before):
        assert np.array_equal(np.array(array), copy)
    release = tuple(int(p) for p in platform.release().split(".")[:2] if p.isdigit())
    if not huge_pages.huge_pages_offered():
        assert moved == 0
    elif release >= (6, 1):
        assert moved >= huge_pages.HUGE_PAGE


@pytest.mark.parametrize("device", ["cpu", "gpu"])
def test_the_device_switch_follows_the_device_unless_the_environment_says(
    monkeypatch, device
):
    """Unset, gpu_paths() answers from MLX's default device; TINY_LLM_DEVICE_PATHS
    of cpu or gpu overrides it; any other value is an error naming the allowed
    ones."""
    import mlx.core as mx

    monkeypatch.delenv(PATHS_VARIABLE, raising=False)
    monkeypatch.setattr(mx, "default_device", lambda: mx.Device(getattr(mx, device)))
    assert gpu_paths() == (device == "gpu")
    for paths in PATHS:
        monkeypatch.setenv(PATHS_VARIABLE, paths)
        assert gpu_paths() == (paths == "gpu")
    for wrong in ("GPU", "cuda", ""):
        monkeypatch.setenv(PATHS_VARIABLE, wrong)
        with pytest.raises(ValueError, match="set it to 'cpu' or 'gpu'"):
            gpu_paths()


# The install hook on a machine without OpenBLAS, where apt-get would install it.
HOOK_WITHOUT_OPENBLAS = """
import sys
from scripts.tools import setup_fast_blas as hook

hook.fast_blas.needs_openblas = lambda: True
hook.fast_blas.find_openblas = lambda: None
hook.apt_command = lambda: print("asked for apt-get")
sys.exit(hook.main())
"""


@pytest.mark.parametrize("paths", ["cpu", "gpu"])
def test_the_install_hook_fetches_openblas_only_for_the_cpu(paths):
    """MLX's BLAS serves only the CPU: on the GPU's side of the device switch the
    hook neither installs nor hints."""
    result = subprocess.run(
        [sys.executable, "-c", HOOK_WITHOUT_OPENBLAS],
        cwd=ROOT,
        env=os.environ | {PATHS_VARIABLE: paths},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    if paths == "cpu":
        assert result.stdout == "asked for apt-get\n"
        assert fast_blas.DEBIAN_PACKAGE in result.stderr
    else:
        assert (result.stdout, result.stderr) == ("", "")


@pytest.mark.parametrize(
    "system, machine, release, words",
    [
        ("Darwin", "arm64", "14.5", None),
        ("Darwin", "arm64", "26.1", None),
        ("Linux", "x86_64", "", None),
        ("Linux", "aarch64", "", None),
        ("Darwin", "arm64", "13.6", "macOS 14 or newer"),
        ("Darwin", "x86_64", "14.2", "Apple silicon"),
        ("Linux", "riscv64", "", "x86-64 and arm64"),
        ("Windows", "AMD64", "", "WSL 2"),
    ],
)
def test_the_install_names_an_unsupported_platform(system, machine, release, words):
    """MLX 0.32.4 has wheels for macOS 14+ on Apple silicon and Linux x86-64/arm64
    (PyPI's file list); anywhere else the install's first step says so in a line."""
    found = check_platform.problem(system, machine, release)
    assert (found is None) == (words is None), found
    assert words is None or words in found
    if words is not None:
        result = subprocess.run(
            [
                sys.executable,
                "-c",
                "import sys; from scripts.tools import "
                "check_platform as c; c.problem = lambda *a: "
                + repr(found)
                + "; sys.exit(c.main())",
            ],
            capture_output=True,
            text=True,
            cwd=ROOT,
            timeout=60,
        )
        assert result.returncode == 1
        assert result.stderr == f"error: tiny-llm cannot be installed here: {found}\n"


def test_embedded_model_folder_is_intact_and_pinned(embedded_model):
    folder = store.default_models_dir() / store.MODEL_DIR_NAME  # the fixture's
    assert store.folder_is_intact(folder)
    manifest = json.loads((folder / store.MANIFEST).read_text())
    for name, recorded in manifest["files"].items():
        data = (folder / name).read_bytes()
        assert recorded == {
            "size": len(data),
            "sha256": hashlib.sha256(data).hexdigest(),
        }
    config = json.loads((folder / "config.json").read_text())
    assert (
        config["num_hidden_layers"],
        config["hidden_size"],
        config["num_attention_heads"],
    ) == (30, 576, 9)
    tokenizer_config = json.loads((folder / "tokenizer_config.json").read_text())
    assert (
        tokenizer_config["eos_token"] == "<|im_end|>"
        and "im_start" in tokenizer_config["chat_template"]
    )


@pytest.fixture(scope="module")
def converted(tmp_path_factory) -> Path:
    """One conversion for this module's folder tests; each test damages a copy."""
    return store.ensure_embedded_model(tmp_path_factory.mktemp("models"))


@pytest.fixture
def models_dir(converted, tmp_path) -> Path:
    shutil.copytree(converted, tmp_path / store.MODEL_DIR_NAME)
    return tmp_path


def ensure_with_events(models_dir: Path) -> tuple[Path, list[str]]:
    events = []
    folder = store.ensure_embedded_model(models_dir, lambda *e: events.append(e[0]))
    return folder, events


def overwrite_middle(path: Path, garbage: bytes) -> None:
    """Same size, other bytes: what a size check cannot see."""
    size = path.stat().st_size
    with open(path, "r+b") as f:
        f.seek(size // 2 - len(garbage) // 2)
        f.write(garbage)
    assert path.stat().st_size == size


def assert_rebuilt(folder: Path, original: Path, events: list[str], first: str):
    assert events[0] == first and "convert" in events
    assert store.folder_is_intact(folder)
    for name in ("model.safetensors", "config.json"):
        assert (folder / name).read_bytes() == (original / name).read_bytes()


def test_a_folder_that_checks_out_is_used_without_converting(models_dir):
    folder, events = ensure_with_events(models_dir)
    assert folder == models_dir / store.MODEL_DIR_NAME and events == []


def test_corrupt_weights_of_the_same_size_are_detected_and_rebuilt(
    converted, models_dir
):
    folder = models_dir / store.MODEL_DIR_NAME
    assert store.folder_is_intact(folder)
    overwrite_middle(folder / "model.safetensors", bytes(4 << 20))
    assert not store.folder_is_intact(folder)
    folder, events = ensure_with_events(models_dir)
    assert_rebuilt(folder, converted, events, "rebuild")


def test_corruption_that_keeps_size_and_mtime_is_caught_by_a_new_process(models_dir):
    """Within a process, an unchanged size and mtime skip the digests; a new process
    (simulated by forgetting what this one checked) hashes again."""
    folder = models_dir / store.MODEL_DIR_NAME
    weights = folder / "model.safetensors"
    assert store.folder_is_intact(folder)
    stat = weights.stat()
    overwrite_middle(weights, b"\xff" * 4096)
    os.utime(weights, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    store.intact_stamps.clear()
    assert not store.folder_is_intact(folder)


def test_a_garbage_config_of_the_same_size_is_detected_and_rebuilt(
    converted, models_dir
):
    folder = models_dir / store.MODEL_DIR_NAME
    config = folder / "config.json"
    config.write_bytes(b"#" * config.stat().st_size)
    folder, events = ensure_with_events(models_dir)
    assert_rebuilt(folder, converted, events, "rebuild")


def test_a_truncated_file_is_detected_and_rebuilt(converted, models_dir):
    folder = models_dir / store.MODEL_DIR_NAME
    (folder / "model.safetensors").write_bytes(b"truncated")
    folder, events = ensure_with_events(models_dir)
    assert_rebuilt(folder, converted, events, "rebuild")


def test_a_file_where_the_folder_should_be_is_replaced(converted, tmp_path):
    (tmp_path / store.MODEL_DIR_NAME).write_text("not a folder")
    folder, events = ensure_with_events(tmp_path)
    assert_rebuilt(folder, converted, events, "replace-file")


def test_an_interrupted_conversion_is_rebuilt(converted, tmp_path):
    """What a killed first run leaves: a half-written folder and a staging folder."""
    folder = tmp_path / store.MODEL_DIR_NAME
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    staging = tmp_path / (store.MODEL_DIR_NAME + ".partial")
    staging.mkdir()
    (staging / "model.safetensors").write_bytes(b"half")
    folder, events = ensure_with_events(tmp_path)
    assert_rebuilt(folder, converted, events, "rebuild")
    assert not staging.exists()


def test_an_old_manifest_without_digests_is_rebuilt(converted, models_dir):
    folder = models_dir / store.MODEL_DIR_NAME
    sizes = {p.name: p.stat().st_size for p in folder.iterdir()}
    old = {"source_sha256": store.GGUF_SHA256, "sizes": sizes}
    (folder / store.MANIFEST).write_text(json.dumps(old))
    folder, events = ensure_with_events(models_dir)
    assert_rebuilt(folder, converted, events, "rebuild")


CONVERT_AND_REPORT = """
import sys
from pathlib import Path
from tiny_llm_base.embedded_model import ensure_embedded_model

def report(stage, done, total):
    if stage in ("wait", "rebuild", "replace-file") or done == 1:
        print(stage, flush=True)

ensure_embedded_model(Path(sys.argv[1]), report)
print("done", flush=True)
"""


def test_two_first_runs_at_once_convert_once(converted, tmp_path):
    """The test holds the lock until both runs wait on it, then lets them race: one
    converts, the other waits for it and uses its folder."""
    lock_path = tmp_path / (store.MODEL_DIR_NAME + ".lock")
    with open(lock_path, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        runs = [
            subprocess.Popen(
                [sys.executable, "-c", CONVERT_AND_REPORT, str(tmp_path)],
                cwd=ROOT,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for _ in range(2)
        ]
        watchdogs = [threading.Timer(180, run.kill) for run in runs]
        for watchdog in watchdogs:
            watchdog.start()
        try:
            assert [run.stdout.readline() for run in runs] == ["wait\n", "wait\n"]
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
        outputs = [run.communicate() for run in runs]
        for watchdog in watchdogs:
            watchdog.cancel()
    for run, (_, stderr) in zip(runs, outputs):
        assert run.returncode == 0, stderr
        assert "Traceback" not in stderr
    reports = sorted(stdout.split() for stdout, _ in outputs)
    assert reports == [["convert", "done"], ["done"]]
    folder = tmp_path / store.MODEL_DIR_NAME
    assert store.folder_is_intact(folder)
    assert (folder / "model.safetensors").read_bytes() == (
        converted / "model.safetensors"
    ).read_bytes()


def test_load_model_explains_a_folder_that_is_not_a_model(tmp_path):
    with pytest.raises(ModelLoadError, match="not a model folder"):
        load_model(str(tmp_path))


@pytest.mark.parametrize(
    "config_text, message",
    [
        ('{"model_type": "llama",', "config.json is not valid JSON"),
        ('"llama"', "config.json holds a JSON str, not an object"),
        ('{"hidden_size": 576}', 'config.json has no "model_type"'),
    ],
)
def test_load_model_names_a_broken_config_json(tmp_path, config_text, message):
    (tmp_path / "config.json").write_text(config_text)
    (tmp_path / "model.safetensors").write_bytes(b"")
    with pytest.raises(ModelLoadError, match=message) as error:
        load_model(str(tmp_path))
    assert str(tmp_path / "config.json") in str(error.value)
    assert "\n" not in str(error.value)


def test_load_model_explains_an_empty_name():
    with pytest.raises(ModelLoadError, match="the model name is empty"):
        load_model("")


def test_load_model_explains_a_name_that_is_neither_folder_nor_repo():
    with pytest.raises(
        ModelLoadError, match="neither a local folder nor a Hub repo id"
    ):
        load_model("no-such-model")


def test_load_model_explains_an_unreachable_hub_repo(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(
        ModelLoadError, match="could not load 'tiny-llm-test/absent-model'"
    ):
        load_model("tiny-llm-test/absent-model")


def test_check_installation_reports_device_blas_rate_and_one_token():
    """It names the backend and the device and runs one token of the embedded model
    on it, which must be mlx-lm's."""
    result = subprocess.run(
        [sys.executable, "-m", "scripts.commands.check_installation"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert (
        "default device" in result.stdout
        and "BLAS:" in result.stdout
        and "GFLOP/s" in result.stdout
        and "backend: " in result.stdout
    )
    [token] = [line for line in result.stdout.splitlines() if "one token:" in line]
    assert token.endswith(", mlx-lm's too"), result.stdout


@pytest.mark.skipif(
    fast_blas.STATUS.threads is None, reason="OpenBLAS's thread count only"
)
def test_tensor_parallel_ranks_share_the_cores_unless_the_environment_says(
    monkeypatch,
):
    """share_cores(n): OpenBLAS on cores // n threads (at least one) in each of n
    ranks; a thread count the environment names wins; one process changes nothing."""
    library = ctypes.CDLL(fast_blas.STATUS.library)
    before = library.openblas_get_num_threads()
    try:
        for name in fast_blas.THREAD_VARIABLES:
            monkeypatch.delenv(name, raising=False)
        cores = os.cpu_count() or 1
        assert fast_blas.share_cores(1) is None
        assert fast_blas.share_cores(2) == max(1, cores // 2)
        assert library.openblas_get_num_threads() == max(1, cores // 2)
        assert fast_blas.share_cores(cores * 4) == 1
        assert library.openblas_get_num_threads() == 1
        monkeypatch.setenv("OPENBLAS_NUM_THREADS", str(cores))
        assert fast_blas.share_cores(2) is None
        assert library.openblas_get_num_threads() == 1  # left as it was
    finally:
        library.openblas_set_num_threads(before)


@pytest.mark.skipif(
    not (shutil.which("cc") or shutil.which("gcc")) or not fast_blas.needs_openblas(),
    reason="builds the forwarder with this machine's C compiler (Linux only)",
)
def test_the_forwarder_builds_without_march_native_and_says_why_it_cannot_build(
    monkeypatch, tmp_path
):
    """A compiler that refuses -march=native (older clangs on arm64) still builds
    the forwarder, with the next flags; one that builds nothing gives (None, a hint
    naming it)."""
    real = shutil.which("cc") or shutil.which("gcc")
    calls = tmp_path / "calls"
    picky = tmp_path / "picky-cc"
    picky.write_text(
        "#!/bin/sh\n"
        f'echo "$*" >> {calls}\n'
        'case " $* " in *" -march=native "*) echo "unknown CPU" >&2; exit 1;; esac\n'
        f'exec {real} "$@"\n'
    )
    picky.chmod(0o755)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setenv("CC", str(picky))
    path, hint = fast_blas.build_gemv_forward()
    assert hint is None and path is not None and path.exists()
    tried = calls.read_text().splitlines()
    assert "-march=native" in tried[0] and "-march=native" not in tried[-1]
    assert ctypes.CDLL(str(path)).gemv_forward_count() == 0

    broken = tmp_path / "broken-cc"
    broken.write_text('#!/bin/sh\necho "cannot compile" >&2\nexit 1\n')
    broken.chmod(0o755)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache2"))
    monkeypatch.setenv("CC", str(broken))
    path, hint = fast_blas.build_gemv_forward()
    assert path is None and "could not build gemv_forward.c: cannot compile" in hint
