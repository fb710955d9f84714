"""main.py and batch-main.py as a user runs them: each bad input gets one line on
stderr and an exit status (2: bad input, 1: a model that cannot be loaded or a request
that failed, 130: Ctrl-C), never a traceback.

Most checks run the script's main in this process, piped input through a real pipe
(tests/cli_runs.py); what only a process shows runs in one: the one-line wrapper
(each script's first bad input), a piped prompt answered, Ctrl-C, the slow-BLAS
note, the first run's conversion."""

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from scripts.commands import engine_options, model_loading, probes
from scripts.commands.interrupt import READY_LINE, READY_VARIABLE

from .cli_runs import assert_one_line_error, run_in_process, run_in_subprocess
from .helpers import WAIT_S
from tiny_llm_base import PromptSpec, fast_blas
from tiny_llm_base.device import gpu_paths
from tiny_llm_base import embedded_model as store

tiny_llm_ref = pytest.importorskip(
    "tiny_llm_ref",
    reason="needs src/tiny_llm_ref: runs the commands on src/tiny_llm_ref's engine",
)

ROOT = Path(__file__).resolve().parents[1]
CONTEXT = 8192  # the embedded SmolLM2's max_position_embeddings (its GGUF metadata)
DEFAULT_PROMPT = "Give me three tips for a good night's sleep."


def stderr_lines(result) -> list[str]:
    return result.stderr.splitlines()


def slow_blas_is_reported() -> bool:
    """Linux on the CPU's side of the device switch: where MLX's bundled BLAS would
    do the matmuls."""
    return fast_blas.needs_openblas() and not gpu_paths()


@pytest.fixture(scope="module")
def damaged_models(tmp_path_factory) -> Path:
    """Copies of the embedded model folder, each with one thing wrong."""
    source = store.ensure_embedded_model()
    config = json.loads((source / "config.json").read_text())
    root = tmp_path_factory.mktemp("damaged")

    def copy(name: str, config_text: str | None, skip=("config.json",)) -> None:
        folder = root / name
        folder.mkdir()
        for file in source.iterdir():
            if file.name not in skip:
                (folder / file.name).symlink_to(file)
        if config_text is not None:
            (folder / "config.json").write_text(config_text)

    copy("not-json", '{"model_type": "llama",')
    copy("a-list", "[1, 2]")
    copy(
        "no-model-type",
        json.dumps({k: v for k, v in config.items() if k != "model_type"}),
    )
    copy("more-layers", json.dumps({**config, "num_hidden_layers": 40}))
    copy("other-vocab", json.dumps({**config, "vocab_size": 1000}))
    copy("unknown-type", json.dumps({**config, "model_type": "no-such-architecture"}))
    copy(
        "no-tokenizer",
        json.dumps(config),
        skip=("config.json", "tokenizer.json", "tokenizer_config.json"),
    )
    copy("negative-context", json.dumps({**config, "max_position_embeddings": -5}))
    copy("word-context", json.dumps({**config, "max_position_embeddings": "big"}))
    copy("cut-weights", None, skip=("model.safetensors",))
    with open(source / "model.safetensors", "rb") as weights:
        (root / "cut-weights" / "model.safetensors").write_bytes(
            weights.read(50_000_000)
        )
    (root / "empty").mkdir()
    return root


# Bad input to main: (arguments, standard input, exit status, what the one line says).
MAIN_BAD_INPUT = {
    "blank prompt": (["--prompt", "  "], None, 2, "the prompt on --prompt is empty"),
    "zero max tokens": (
        ["--max-tokens", "0"],
        None,
        2,
        "--max-tokens must be at least 1",
    ),
    "max tokens not a number": (["--max-tokens", "many"], None, 2, "invalid int value"),
    "negative temp": (["--temp", "-1"], None, 2, "error: --temp must be"),
    "temp nan": (["--temp", "nan"], None, 2, "--temp must be a finite number, got nan"),
    "temp inf": (["--temp", "inf"], None, 2, "--temp must be a finite number, got inf"),
    "top-p above 1": (["--top-p", "1.5"], None, 2, "error: --top-p must be in (0, 1]"),
    "top-p nan": (["--top-p", "nan"], None, 2, "--top-p must be a finite number"),
    "top-k zero": (["--top-k", "0"], None, 2, "error: --top-k must be"),
    "unknown solution": (["--solution", "nope"], None, 2, "unknown --solution 'nope'"),
    "unknown loader": (["--loader", "week9"], None, 2, "unknown --loader 'week9'"),
    "unknown option": (["--prompts", "x"], None, 2, "unrecognized arguments"),
    "empty model": (["--model", ""], None, 2, "--model is empty"),
    "blank piped prompt": ([], " \n", 2, "the prompt on standard input is empty"),
    "empty --prompt -": (
        ["--prompt", "-"],
        "",
        2,
        "the prompt on standard input is empty",
    ),
    "piped bytes not UTF-8": ([], b"\xff\xfe", 2, "standard input is not UTF-8 text"),
    "beyond context (ref)": (
        ["--max-tokens", "9000"],
        None,
        2,
        f"plus --max-tokens 9000 needs {{needed}} positions, beyond the model's "
        f"context of {CONTEXT}",
    ),
    "beyond context (learner)": (
        ["--max-tokens", "9000", "--solution", "learner"],
        None,
        2,
        f"beyond the model's context of {CONTEXT}",
    ),
    "beyond context (mlx)": (
        ["--max-tokens", "9000", "--solution", "mlx"],
        None,
        2,
        f"beyond the model's context of {CONTEXT}",
    ),
    "long piped prompt beyond context": (
        ["--max-tokens", "1"],
        "hello " * (CONTEXT + 10),
        2,
        f"beyond the model's context of {CONTEXT}",
    ),
    "model neither folder nor repo id": (
        ["--model", "no-such-model"],
        None,
        1,
        "'no-such-model' is neither a local folder nor a Hub repo id",
    ),
    "model folder without a model": (
        ["--model", "{damaged}/empty"],
        None,
        1,
        "{damaged}/empty is not a model folder: it needs config.json",
    ),
    "config.json not JSON": (
        ["--model", "{damaged}/not-json"],
        None,
        1,
        "{damaged}/not-json/config.json is not valid JSON",
    ),
    "config.json a JSON list": (
        ["--model", "{damaged}/a-list"],
        None,
        1,
        "{damaged}/a-list/config.json holds a JSON list, not an object",
    ),
    "config.json without model_type": (
        ["--model", "{damaged}/no-model-type"],
        None,
        1,
        '{damaged}/no-model-type/config.json has no "model_type"',
    ),
    "config.json with more layers than the weights": (
        ["--model", "{damaged}/more-layers"],
        None,
        1,
        "more-layers/config.json does not match the weights in {damaged}/more-layers: "
        "Missing 90 parameters",
    ),
    "config.json with another vocabulary size": (
        ["--model", "{damaged}/other-vocab"],
        None,
        1,
        "other-vocab/config.json does not match the weights",
    ),
    "config.json with an unknown model_type": (
        ["--model", "{damaged}/unknown-type"],
        None,
        1,
        "Model type no-such-architecture not supported",
    ),
    "model folder without tokenizer files": (
        ["--model", "{damaged}/no-tokenizer"],
        None,
        1,
        "the tokenizer files in {damaged}/no-tokenizer could not be loaded",
    ),
    "negative context in config.json": (
        ["--model", "{damaged}/negative-context"],
        None,
        1,
        '{damaged}/negative-context/config.json gives "max_position_embeddings": -5, '
        "where it must be a whole number of at least 1: restore",
    ),
    "context not a number in config.json": (
        ["--model", "{damaged}/word-context"],
        None,
        1,
        '{damaged}/word-context/config.json gives "max_position_embeddings": "big"',
    ),
    "weights cut short": (
        ["--model", "{damaged}/cut-weights"],
        None,
        1,
        "{damaged}/cut-weights/model.safetensors is cut short: 50,000,000 bytes where "
        "its header needs",
    ),
}


@pytest.mark.parametrize("case", MAIN_BAD_INPUT)
def test_main_refuses_bad_input_with_one_line(case, damaged_models, embedded_model):
    args, stdin, status, message = MAIN_BAD_INPUT[case]
    args = [arg.format(damaged=damaged_models) for arg in args]
    runner = run_in_subprocess if case == next(iter(MAIN_BAD_INPUT)) else run_in_process
    result = runner("main.py", *args, stdin=stdin)
    if "{needed}" in message:  # the default prompt's tokens, counted here
        _, tokenizer = embedded_model
        turn = {"role": "user", "content": DEFAULT_PROMPT}
        prompt = tokenizer.apply_chat_template([turn], add_generation_prompt=True)
        message = message.replace("{needed}", str(len(prompt) + 9000))
    assert_one_line_error(result, status, message.format(damaged=damaged_models))


BATCH_MAIN_BAD_INPUT = {
    "empty model": (["--model", ""], 2, "--model is empty"),
    "zero batch size": (["--batch-size", "0"], 2, "--batch-size must be at least 1"),
    "zero max tokens": (["--max-tokens", "0"], 2, "--max-tokens must be at least 1"),
    "zero max seq len": (["--max-seq-len", "0"], 2, "--max-seq-len must be at least 1"),
    "prefill step not a number": (
        ["--prefill-step", "abc"],
        2,
        "--prefill-step must be a number of tokens or 'none', got 'abc'",
    ),
    "zero prefill step": (
        ["--prefill-step", "0"],
        2,
        "--prefill-step must be at least 1",
    ),
    "unknown solution": (["--solution", "mlx"], 2, "unknown --solution 'mlx'"),
    "missing prompts file": (
        ["--prompts-file", "{tmp}/absent.txt"],
        2,
        "cannot read --prompts-file {tmp}/absent.txt",
    ),
    "empty prompts file": (["--prompts-file", "{tmp}/blank.txt"], 2, "has no prompts"),
    "prompts file not UTF-8": (["--prompts-file", "{tmp}/latin1.txt"], 2, "not UTF-8"),
    "config.json not JSON": (
        ["--model", "{damaged}/not-json"],
        1,
        "not-json/config.json is not valid JSON",
    ),
    "kv memory not a size": (
        ["--kv-memory", "12 parsecs"],
        2,
        "--kv-memory must be a size such as '512MiB', '2GiB' or '1.5GB', got "
        "'12 parsecs'",
    ),
    "zero kv memory": (
        ["--kv-memory", "0"],
        2,
        "--kv-memory must be at least 1 byte, got '0'",
    ),
    "negative kv memory": (
        ["--kv-memory=-5MiB"],
        2,
        "--kv-memory must be a size such as '512MiB', '2GiB' or '1.5GB', got '-5MiB'",
    ),
    "negative kv memory read as an option": (
        ["--kv-memory", "-5MiB"],
        2,
        "argument --kv-memory: expected one argument",
    ),
    "kv memory too small for one request": (
        ["--kv-cache", "paged", "--kv-memory", "1MiB"],
        2,
        "--kv-memory 1.0 MiB holds 16 tokens at {per_token:,} bytes a token, but one "
        "request of --max-seq-len=512 needs 32 blocks of 16: pass --kv-memory of at "
        "least",
    ),
    "dense cache past kv memory": (
        ["--kv-cache", "dense", "--kv-memory", "1MiB"],
        2,
        "a dense cache of --batch-size 5 x --max-seq-len 512 needs",
    ),
    "two constraints": (
        ["--regex", "a", "--choice", "b"],
        2,
        "argument --choice: not allowed with argument --regex",
    ),
    "missing schema file": (
        ["--json-schema", "{tmp}/absent.json"],
        2,
        "argument --json-schema: cannot read {tmp}/absent.json",
    ),
    "schema with an unsupported keyword": (
        ["--json-schema", "{tmp}/unique.json"],
        2,
        'invalid JSON schema: unsupported keywords "uniqueItems": remove them',
    ),
    "choice with a character no token holds": (
        ["--choice", "\U0001f999", "--choice", "yes"],
        2,
        "--choice '\U0001f999': no text the model's tokens can spell matches the "
        "constraint: it needs '\U0001f999' (U+1F999), which no token holds",
    ),
    "choice the tokens cannot finish": (
        ["--choice", "yes", "--choice", "a\U0001f642"],
        2,
        "--choice 'a\U0001f642': a request could get stuck writing it: after 'a' no "
        "token continues it (its next characters come only inside longer tokens); "
        "change or leave out that choice",
    ),
    "schema whose bounds crashed the grammar library": (
        ["--json-schema", "{tmp}/i64.json"],
        2,
        "`minimum` is -1000000000000000000000: integer bounds must lie within",
    ),
}


@pytest.mark.parametrize("case", BATCH_MAIN_BAD_INPUT)
def test_batch_main_refuses_bad_input_with_one_line(
    case, damaged_models, tmp_path, kv_bytes_a_token
):
    (tmp_path / "blank.txt").write_text("\n  \n")
    (tmp_path / "latin1.txt").write_bytes("caf\xe9?".encode("latin-1"))
    (tmp_path / "unique.json").write_text('{"type": "array", "uniqueItems": true}')
    (tmp_path / "i64.json").write_text(
        '{"type": "integer", "minimum": -1000000000000000000000, '
        '"maximum": -999999999999999999999}'
    )
    args, status, message = BATCH_MAIN_BAD_INPUT[case]
    names = {"damaged": damaged_models, "tmp": tmp_path, "per_token": kv_bytes_a_token}
    runner = (
        run_in_subprocess
        if case == next(iter(BATCH_MAIN_BAD_INPUT))
        else run_in_process
    )
    result = runner("batch-main.py", *[arg.format(**names) for arg in args])
    assert_one_line_error(result, status, message.format(**names))


@pytest.fixture(scope="module")
def kv_bytes_a_token(embedded_model) -> int:
    """Keys and values of one token over all layers, from the embedded model's
    config: 2 (keys, values) x KV heads x head_dim x layers x the bytes of a number
    the week 2 model computes in (its embedding's dtype: float32 on the CPU)."""
    mlx_model, _ = embedded_model
    args = mlx_model.args
    head_dim = getattr(args, "head_dim", None) or (
        args.hidden_size // args.num_attention_heads
    )
    model = tiny_llm_ref.Qwen2ModelWeek2(mlx_model, use_fast_kernels=True)
    element = model.embedding.weight.dtype.size
    return 2 * args.num_key_value_heads * head_dim * args.num_hidden_layers * element


def paged_batch_main(tmp_path, prompts_text: str, *options: str):
    """batch-main on these prompts, 2 tokens each, a paged cache of 64 MiB."""
    prompts = tmp_path / "prompts.txt"
    prompts.write_text(prompts_text)
    result = run_in_process(
        *("batch-main.py", "--prompts-file", str(prompts), "--max-tokens", "2"),
        *("--kv-cache", "paged", "--kv-memory", "64MiB", *options),
    )
    assert result.returncode == 0, result.stderr
    return result


def test_batch_main_says_how_many_tokens_its_kv_memory_holds(
    tmp_path, kv_bytes_a_token
):
    result = paged_batch_main(tmp_path, "Hi!\nWhat is 2 plus 2?\n")
    blocks = 64 * 2**20 // (kv_bytes_a_token * 16)
    tokens = blocks * 16
    lines = result.stdout.splitlines()
    assert lines[0] == (
        f"KV cache: paged, budget 64.0 MiB = {tokens:,} tokens ({blocks:,} blocks of "
        f"16) at {kv_bytes_a_token:,} bytes a token; the pool grows as it is used"
    )
    summary = " ".join(result.stdout[result.stdout.index("paged KV:") :].split())
    assert f"of {blocks} blocks of 16 (" in summary
    assert f"positions of a {tokens:,}-token budget" in summary


def test_an_int8_pool_says_its_tokens_against_float32s(tmp_path, kv_bytes_a_token):
    """int8 keeps each head's 64 numbers in 64 bytes and two float32s per group of
    32 (80 bytes against 256), so the KV line says the tokens 64 MiB holds at 80
    bytes and at 256, and their ratio."""
    result = paged_batch_main(tmp_path, "Hi!\n", "--kv-dtype", "int8")
    per_token = kv_bytes_a_token * 80 // 256
    blocks = 64 * 2**20 // (per_token * 16)
    float32 = 64 * 2**20 // (kv_bytes_a_token * 16) * 16
    assert result.stdout.splitlines()[0] == (
        f"KV cache: paged, budget 64.0 MiB = {blocks * 16:,} tokens ({blocks:,} "
        f"blocks of 16) at {per_token:,} bytes a token (int8: "
        f"{blocks * 16 / float32:.1f}x float32's {float32:,}); the pool grows as it "
        "is used"
    )


def test_kv_dtype_takes_every_kv_dtype_the_engine_takes():
    """--kv-dtype's choices (written out: the options import no MLX) take each of
    the engine's KV_DTYPES and refuse a name outside them."""
    from tiny_llm_base.memory import KV_DTYPES

    parser = argparse.ArgumentParser()
    engine_options.add_kv_memory_option(parser)
    for kv_dtype in KV_DTYPES:
        assert parser.parse_args(["--kv-dtype", kv_dtype]).kv_dtype == kv_dtype
    with pytest.raises(SystemExit):
        parser.parse_args(["--kv-dtype", "int3"])


def test_batch_main_says_a_dense_cache_holds_batch_size_x_max_seq_len(
    tmp_path, kv_bytes_a_token
):
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("Hi!\n")
    result = run_in_process(
        "batch-main.py",
        "--prompts-file",
        str(prompts),
        "--max-tokens",
        "2",
        "--kv-cache",
        "dense",
        "--batch-size",
        "2",
        "--max-seq-len",
        "256",
        "--kv-memory",
        "64MiB",
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[0].startswith(
        f"KV cache: dense, batch_size x max_seq_len = 2 x 256 = 512 tokens at "
        f"{kv_bytes_a_token:,} bytes a token"
    )


def test_main_answers_a_piped_prompt_through_the_fast_week2_model():
    result = run_in_process(
        "main.py", "--max-tokens", "8", stdin="What is the capital of France?\n"
    )
    assert result.returncode == 0, result.stderr
    assert "Paris" in result.stdout
    assert stderr_lines(result)[0] == (
        "tiny_llm_ref: the week 2 model with the KV cache and fast kernels"
    )


def test_main_reads_the_prompt_from_stdin_with_prompt_dash():
    result = run_in_process(
        "main.py",
        "--prompt",
        "-",
        "--max-tokens",
        "8",
        stdin="What is the capital of France?",
    )
    assert result.returncode == 0, result.stderr
    assert "Paris" in result.stdout


def test_main_prefers_prompt_over_piped_input():
    result = run_in_process(
        "main.py",
        "--prompt",
        "What is the capital of France?",
        "--max-tokens",
        "8",
        stdin="Name a color.",
    )
    assert result.returncode == 0, result.stderr
    assert "Paris" in result.stdout


def test_batch_main_clamps_max_seq_len_to_the_context(tmp_path):
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("Hi!\n")
    result = run_in_process(
        "batch-main.py",
        "--prompts-file",
        str(prompts),
        "--max-tokens",
        "2",
        "--max-seq-len",
        "30000",
    )
    assert result.returncode == 0, result.stderr
    assert stderr_lines(result)[0] == (
        f"note: --max-seq-len 30000 is beyond the model's context of {CONTEXT} "
        f"positions (max_position_embeddings): using {CONTEXT}"
    )


def test_a_choice_the_tokens_cannot_finish_fails_its_requests_part_way(
    embedded_week2_model, tokenizer
):
    """Why batch-main refuses --choice 'a🙂' (BATCH_MAIN_BAD_INPUT): the
    embedded vocabulary holds '🙂' only in the token ' 🙂', so a run
    starts every request, writes 'a', and fails at the next token."""
    choice = tiny_llm_ref.Choice(["a\U0001f642"])
    specs = [PromptSpec(q, max_tokens=4, constraint=choice) for q in ("Hi", "Pick")]
    model = embedded_week2_model(True, package=tiny_llm_ref)
    for result in tiny_llm_ref.batch_generate(model, tokenizer, specs):
        assert result.finish_reason == "error"
        assert "no token of the vocabulary can continue the constraint" in result.error
        assert tokenizer.decode(result.tokens) == "a"


def test_batch_main_fails_when_a_request_fails_and_prints_its_whole_error(tmp_path):
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("Hi!\n" + "word " * 60 + "\n")
    result = run_in_process(
        "batch-main.py",
        "--prompts-file",
        str(prompts),
        "--max-tokens",
        "2",
        "--max-seq-len",
        "40",
    )
    assert result.returncode == 1, result.stderr
    assert "Traceback" not in result.stderr
    failures = [line for line in stderr_lines(result) if "failed" in line]
    assert len(failures) == 1 and failures[0].startswith("request #1 failed: ")
    assert len(failures[0]) > 100  # the table's column would have cut it
    assert failures[0].rstrip().endswith("shorten the prompt")
    assert "length" in result.stdout  # the good request finished normally


def interrupt(
    script: str, *args: str, after: str, wait_s: float = 0.0, env=None
) -> tuple[int, str, float]:
    """Start a CLI, send SIGINT wait_s after its stderr shows `after`; returns its
    status, its stderr and how long it took to exit after the signal."""
    process = subprocess.Popen(
        [sys.executable, script, *args],
        cwd=ROOT,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env={**os.environ, **(env or {})},
    )
    seen = b""
    while after.encode() not in seen:
        byte = process.stderr.read(1)
        assert byte, f"{script} ended before {after!r}: {seen.decode()}"
        seen += byte
    time.sleep(wait_s)
    sent = time.perf_counter()
    process.send_signal(signal.SIGINT)
    rest = process.stderr.read()
    status = process.wait(timeout=WAIT_S)
    return status, (seen + rest).decode(), time.perf_counter() - sent


@pytest.mark.parametrize("script", ["main.py", "batch-main.py"])
def test_ctrl_c_during_generation_exits_at_once_with_status_130(script):
    status, stderr, delay = interrupt(
        script, "--max-tokens", "1000", after="fast kernels\n", wait_s=0.3
    )
    assert status == 130
    assert stderr.splitlines()[-1] == "interrupted"
    assert "Traceback" not in stderr and "KeyboardInterrupt" not in stderr
    # The watcher ends the process FORCED_EXIT_AFTER_S (0.5 s) after the signal; 30 s
    # leaves room for a loaded machine's scheduling (load 25 on 2 cores).
    assert delay < 30


def test_ctrl_c_during_the_first_conversion_leaves_a_folder_the_next_run_repairs(
    tmp_path,
):
    status, stderr, _ = interrupt(
        "main.py",
        "--max-tokens",
        "1",
        after="converting",
        env={"TINY_LLM_MODELS": str(tmp_path)},
    )
    assert status == 130 and stderr.splitlines()[-1].endswith("interrupted")
    assert "Traceback" not in stderr
    assert not store.folder_is_intact(tmp_path / store.MODEL_DIR_NAME)
    result = run_in_process(
        "main.py", "--max-tokens", "1", env={"TINY_LLM_MODELS": str(tmp_path)}
    )
    assert result.returncode == 0, result.stderr
    assert store.folder_is_intact(tmp_path / store.MODEL_DIR_NAME)
    assert not (tmp_path / (store.MODEL_DIR_NAME + ".partial")).exists()


def test_importing_mlx_first_warns_in_one_line_that_blas_is_slow():
    late = subprocess.run(
        [sys.executable, "-c", "import mlx.core\nimport tiny_llm_ref"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    in_order = subprocess.run(
        [sys.executable, "-W", "error", "-c", "import tiny_llm_ref\nimport mlx.core"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert late.returncode == 0 and in_order.returncode == 0, late.stderr
    assert in_order.stderr == ""
    if not slow_blas_is_reported():  # Accelerate, or a GPU: nothing to warn about
        assert late.stderr == ""
        return
    # Reported at the line that imported the project, on one line.
    assert late.stderr.splitlines()[0] == (
        f"<string>:2: SlowBlasWarning: {fast_blas.IMPORTED_TOO_LATE}"
    )


def test_main_says_in_one_line_when_blas_is_slow():
    result = run_in_subprocess(
        "main.py", "--max-tokens", "9000", env={"TINY_LLM_FAST_BLAS": "0"}
    )
    lines = stderr_lines(result)
    if not slow_blas_is_reported():
        assert not lines[0].startswith("note:")
        return
    assert lines[0] == "note: fast BLAS disabled by TINY_LLM_FAST_BLAS=0"


def fake_learner(fast: bool, week2: bool, week1: bool) -> SimpleNamespace:
    """A learner package that has implemented some of the reference's models."""

    def not_yet(day: str):
        def raise_not_implemented(*args, **kwargs):
            raise NotImplementedError(f"{day}: not implemented")

        return raise_not_implemented

    def week2_model(mlx_model, use_fast_kernels=False):
        if use_fast_kernels and not fast:
            not_yet("Week 2 Day 3")()
        return tiny_llm_ref.Qwen2ModelWeek2(
            mlx_model, use_fast_kernels=use_fast_kernels
        )

    return SimpleNamespace(
        __name__="tiny_llm",
        Qwen2ModelWeek2=week2_model if week2 else not_yet("Week 2 Day 1"),
        Qwen2ModelWeek1=tiny_llm_ref.Qwen2ModelWeek1
        if week1
        else not_yet("Week 1 Day 5"),
    )


@pytest.mark.parametrize(
    "done, expected",
    [
        ((True, True, True), "week2-fast"),
        ((False, True, True), "week2"),
        ((False, False, True), "week1"),
    ],
)
def test_learner_gets_the_newest_model_it_has_implemented(
    done, expected, embedded_model, capsys
):
    mlx_model, _ = embedded_model
    model, kind = model_loading.newest_model(
        fake_learner(*done), mlx_model, list(model_loading.MODEL_KINDS)
    )
    assert kind == expected
    week2 = expected != "week1"
    assert isinstance(
        model, tiny_llm_ref.Qwen2ModelWeek2 if week2 else tiny_llm_ref.Qwen2ModelWeek1
    )
    if week2:
        assert model.fast == (expected == "week2-fast")
    assert (
        capsys.readouterr().err == f"tiny_llm: {model_loading.MODEL_KINDS[expected]}\n"
    )


def test_learner_with_no_model_yet_is_told_the_first_day_to_write(
    embedded_model, capsys
):
    mlx_model, _ = embedded_model
    with pytest.raises(SystemExit) as exit_info:
        model_loading.newest_model(
            fake_learner(False, False, False),
            mlx_model,
            list(model_loading.MODEL_KINDS),
        )
    assert exit_info.value.code == 1
    assert capsys.readouterr().err == (
        "error: not implemented yet in src/tiny_llm: Week 1 Day 5: not implemented\n"
    )


class UnbuiltPool:
    def __init__(self, num_blocks, block_size):
        raise NotImplementedError("Week 3 Day 2: BlockPool")


class PoolWithoutLookup(tiny_llm_ref.BlockPool):
    def lookup(self, tokens):
        raise NotImplementedError("Week 3 Day 3: lookup")


@pytest.mark.parametrize(
    "pool, asked, prefix_caching, expected, said",
    [
        (tiny_llm_ref.BlockPool, None, True, ("paged", True), ""),
        (tiny_llm_ref.BlockPool, "dense", True, ("dense", True), ""),
        (tiny_llm_ref.BlockPool, None, False, ("paged", False), ""),
        (UnbuiltPool, None, True, ("dense", False), "the paged one is week 3 day 2"),
        (PoolWithoutLookup, None, True, ("paged", False), "it is week 3 day 3"),
        (PoolWithoutLookup, None, False, ("paged", False), ""),
    ],
)
def test_learner_runs_the_newest_kv_cache_it_has_built(
    pool, asked, prefix_caching, expected, said, capsys
):
    package = SimpleNamespace(__name__="tiny_llm", BlockPool=pool)
    assert probes.newest_kv_cache(package, asked, prefix_caching) == expected
    err = capsys.readouterr().err
    assert (said in err) if said else err == ""


def test_main_help_describes_the_sampling_options():
    result = run_in_process("main.py", "--help")
    assert result.returncode == 0, result.stderr
    # Each option's block: its line and the indented lines after it, up to the next.
    blocks = {}
    for line in result.stdout.splitlines():
        if line.lstrip().startswith("-"):
            option = line.split()[0].rstrip(",")
            blocks[option] = line
        elif blocks and line.startswith(" " * 8):
            blocks[option] += line
    described = {
        "--max-tokens": "generate",
        "--temp": "greedy",
        "--top-p": "probabilities",
        "--top-k": "likeliest",
    }
    for option, word in described.items():
        assert word in blocks[option], (option, blocks[option])


def test_main_answers_the_default_question_on_topic():
    result = run_in_process("main.py", "--max-tokens", "16")
    assert result.returncode == 0, result.stderr
    assert "sleep" in result.stdout.lower()


def test_first_run_in_a_pipe_says_what_it_is_doing_in_plain_lines(tmp_path):
    result = run_in_subprocess(
        "main.py", "--max-tokens", "1", env={"TINY_LLM_MODELS": str(tmp_path)}
    )
    assert result.returncode == 0, result.stderr
    folder = tmp_path / store.MODEL_DIR_NAME
    lines = stderr_lines(result)
    assert lines[:2] == [
        f"{model_loading.STAGES['verify']} (98 MB)",
        f"{model_loading.STAGES['convert']} into {folder} (694 tensors): once, on first use",
    ]
    assert "\r" not in result.stderr and "\x1b" not in result.stderr


INTERRUPTED_INSIDE_SET_NAME = """
import os, signal
from scripts.commands.interrupt import exit_on_interrupt, unwind_on_interrupt
exit_on_interrupt()
unwind_on_interrupt()

class Field:
    def __set_name__(self, owner, name):
        os.kill(os.getpid(), signal.SIGINT)
        for _ in range(1000):  # the handler runs between two bytecodes
            pass

class Endpoint:  # as a lazily imported module defines its dataclasses
    name = Field()
print("not interrupted")
"""


def test_ctrl_c_inside_a_class_definition_is_still_one_line():
    """An interrupt that lands in a descriptor's __set_name__ (a lazy import's
    dataclass, after the program's imports: seen once in a suite run) reaches the
    top as RuntimeError('Error calling __set_name__'), not SystemExit: still
    status 130, one line, no traceback."""
    done = subprocess.run(
        [sys.executable, "-c", INTERRUPTED_INSIDE_SET_NAME],
        cwd=Path(__file__).resolve().parents[1],
        capture_output=True,
        text=True,
        timeout=WAIT_S,
    )
    assert (done.returncode, done.stderr, done.stdout) == (130, "interrupted\n", "")


SLOW_GRACEFUL_STOP = """
import signal, sys, time
from scripts.commands.interrupt import (
    exit_on_interrupt, stop_gracefully_within, unwind_on_interrupt,
)
exit_on_interrupt()
unwind_on_interrupt()
stop_gracefully_within(60)
asked = []
signal.signal(signal.SIGINT, lambda sig, frame: asked.append(sig))  # as uvicorn does
print("ready", flush=True)
while not asked:
    signal.pause()
time.sleep(1.5)  # a stop slowed by a loaded machine: 3 x FORCED_EXIT_AFTER_S
print("stopped cleanly", flush=True)
signal.signal(signal.SIGINT, signal.default_int_handler)
"""


def test_a_graceful_stop_slower_than_the_watcher_is_not_cut():
    """serve answers Ctrl-C with its own graceful stop (open streams get an error
    event): once a program says so (stop_gracefully_within), the watcher that
    ends a stuck program FORCED_EXIT_AFTER_S after the signal waits for the stop
    instead of cutting it (seen in CI: a stream cut before its error event)."""
    process = subprocess.Popen(
        [sys.executable, "-c", SLOW_GRACEFUL_STOP],
        cwd=Path(__file__).resolve().parents[1],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert process.stdout.readline() == "ready\n", process.stderr.read()
    process.send_signal(signal.SIGINT)
    out, err = process.communicate(timeout=WAIT_S)
    assert (process.returncode, out, err) == (0, "stopped cleanly\n", "")


@pytest.mark.parametrize("script", ["main.py", "batch-main.py"])
def test_ctrl_c_in_the_first_second_never_shows_a_traceback(script):
    """SIGINT at moments across the slow imports (the project, MLX, tqdm, rich),
    each sent a set time after the program says its handler is in place (the
    interpreter's own start, before a line of the program runs, is out of any
    program's reach): each run ends at once, in one line, status 130."""
    for delay in (0.0, 0.05, 0.1, 0.2, 0.35, 0.5):
        status, stderr, _ = interrupt(
            script,
            "--max-tokens",
            "1",
            after=READY_LINE.decode(),
            wait_s=delay,
            env={READY_VARIABLE: "1"},
        )
        assert "Traceback" not in stderr and "KeyboardInterrupt" not in stderr, (
            delay,
            stderr,
        )
        assert status == 130, (delay, stderr)
        assert stderr.splitlines()[-1] == "interrupted", (delay, stderr)
