"""The scripts' options as a user types them: every bad value is refused before any
model or benchmark work, in one `error:` line on stderr naming the option, with exit
status 2 and no traceback; `book --build --dest` never deletes what it did not write,
and `book --dest` without --build is refused."""

import os
from pathlib import Path

import pytest

from scripts.commands.ports import free_port

from .cli_runs import assert_one_line_error, run_in_process
from .cli_runs import run_in_subprocess as run

ROOT = Path(__file__).resolve().parents[1]
CONTEXT = 8192  # the embedded SmolLM2's max_position_embeddings


BENCH = "scripts.bench.bench"
CHUNKED = "scripts.bench.bench_chunked_prefill"
SERVE_BENCH = "scripts.bench.bench_serve"
QUANTIZED = "scripts.bench.bench_quantized"
LATENCY = "scripts.bench.bench_latency"
LOAD_TEST = "scripts.commands.load_test"
SERVE = "scripts.commands.serve"
BOOK = "scripts.commands.book"
CHECK_INSTALLATION = "scripts.commands.check_installation"
DETERMINISM = "scripts.tools.greedy_determinism"
URL = ["--url", "http://127.0.0.1:9"]

# (module, arguments, what the one line says)
BAD_OPTIONS = {
    "speculative negative time limit": (
        "scripts.bench.bench_speculative",
        ["--quick", "--time-limit", "-5"],
        "--time-limit must be more than 0, got -5.0",
    ),
    "bench negative decode tokens": (
        BENCH,
        ["--decode-tokens", "-5"],
        "--decode-tokens must be at least 1, got -5",
    ),
    "bench zero repeats": (BENCH, ["--repeats", "0"], "--repeats must be at least 1"),
    "bench negative repeats": (
        BENCH,
        ["--repeats", "-1"],
        "--repeats must be at least 1, got -1",
    ),
    "bench zero prompt length": (
        BENCH,
        ["--prompt-lengths", "128", "0"],
        "--prompt-lengths must be at least 1, got 0",
    ),
    "bench prompt past the context": (
        BENCH,
        ["--prompt-lengths", "100000"],
        f"--prompt-lengths 100000 is beyond the model's context of {CONTEXT} "
        f"positions (max_position_embeddings): give at most {CONTEXT}",
    ),
    "bench-engine zero tokens": (
        "scripts.bench.bench_engine",
        ["--tokens", "0"],
        "--tokens must be at least 1, got 0",
    ),
    "bench-engine short long row": (
        "scripts.bench.bench_engine",
        ["--long-row", "10"],
        "--long-row must be at least 200, got 10",
    ),
    "bench-quantized zero repeats": (
        QUANTIZED,
        ["--repeats", "0"],
        "--repeats must be at least 1, got 0",
    ),
    "bench-chunked-prefill timeline without configurations": (
        CHUNKED,
        ["--timeline", "x"],
        "--timeline must be CASE:CONFIG,CONFIG with CASE one of a, b, c",
    ),
    "bench-latency set without a value": (
        LATENCY,
        ["--set", "prefill_step"],
        "--set takes [NAME:]KEY=VALUE",
    ),
    "bench-latency set an unknown setting": (
        LATENCY,
        ["--set", "chunk=64"],
        "--set: defaults: unknown engine setting 'chunk'",
    ),
    "bench-latency set an unknown row": (
        LATENCY,
        ["--set", "fast:prefill_step=64"],
        "--set fast:prefill_step=64: no row 'fast'",
    ),
    "bench-latency set a bad value": (
        LATENCY,
        ["--set", "fcfs:max_num_partial_prefills=0"],
        "--set: fcfs: max_num_partial_prefills must be at least 1, got 0",
    ),
    "bench-latency zero rate": (LATENCY, ["--rate", "0"], "--rate must be more than 0"),
    "bench-chunked-prefill timeline unknown case": (
        CHUNKED,
        ["--timeline", "z:alternate:128"],
        "--timeline must be CASE:CONFIG,CONFIG",
    ),
    "bench-chunked-prefill timeline bad configuration": (
        CHUNKED,
        ["--timeline", "b:fast:1"],
        "--timeline: unknown configuration 'fast:1'",
    ),
    "bench-chunked-prefill bad configuration": (
        CHUNKED,
        ["--configs", "alternate:0"],
        "--configs: a size must be a number of tokens >= 1 or none, got '0'",
    ),
    "bench-chunked-prefill zero repeats": (
        CHUNKED,
        ["--repeats", "0"],
        "--repeats must be at least 1, got 0",
    ),
    "bench-chunked-prefill negative time limit": (
        CHUNKED,
        ["--time-limit", "-1"],
        "--time-limit must be more than 0, got -1.0",
    ),
    "bench-chunked-prefill unknown case": (
        CHUNKED,
        ["--cases", "a,d"],
        "--cases: unknown case 'd': choose from a, b, c",
    ),
    "bench-serve zero soak requests": (
        SERVE_BENCH,
        ["--soak-requests", "0"],
        "--soak-requests must be at least 1, got 0",
    ),
    "bench-serve zero soak rate": (
        SERVE_BENCH,
        ["--soak-rate", "0"],
        "--soak-rate must be more than 0, got 0.0",
    ),
    "bench-serve soak cancel past 1": (
        SERVE_BENCH,
        ["--soak-cancel", "2"],
        "--soak-cancel must be between 0 and 1, got 2.0",
    ),
    "bench-serve budget below the batch": (
        SERVE_BENCH,
        ["--token-budget", "3"],
        "--token-budget must be more than --batch-size (8), or 0 for no limit, got 3",
    ),
    "bench-serve nothing to run": (
        SERVE_BENCH,
        ["--skip-soak", "--soak-only"],
        "--skip-soak and --soak-only leave nothing to run",
    ),
    "bench-serve zero requests": (
        SERVE_BENCH,
        ["--requests", "0"],
        "--requests must be at least 1, got 0",
    ),
    "load-test zero requests": (
        LOAD_TEST,
        [*URL, "--requests", "0"],
        "--requests must be at least 1, got 0",
    ),
    "load-test nan rate": (
        LOAD_TEST,
        [*URL, "--rate", "nan"],
        "--rate must be a finite number, got nan",
    ),
    "load-test cancel past 1": (
        LOAD_TEST,
        [*URL, "--cancel", "1.5"],
        "--cancel must be between 0 and 1, got 1.5",
    ),
    "load-test empty record": (
        LOAD_TEST,
        [*URL, "--json", ""],
        "argument --json: is empty: give the path of a file to write",
    ),
    "load-test plot into a folder": (
        LOAD_TEST,
        [*URL, "--plot", "."],
        "--plot . is a folder: give a file in it, e.g. load-test.png",
    ),
    "serve zero max seq len": (
        SERVE,
        ["--max-seq-len", "0"],
        "--max-seq-len must be at least 1, got 0",
    ),
    "serve zero blocks": (
        SERVE,
        ["--num-blocks", "0"],
        "--num-blocks must be at least 1, got 0",
    ),
    "serve kv memory not a size": (
        SERVE,
        ["--kv-memory", "12 parsecs"],
        "--kv-memory must be a size such as '512MiB', '2GiB' or '1.5GB', got "
        "'12 parsecs'",
    ),
    "serve zero kv memory": (
        SERVE,
        ["--kv-memory", "0"],
        "--kv-memory must be at least 1 byte, got '0'",
    ),
    "serve negative kv memory": (
        SERVE,
        ["--kv-memory=-5MiB"],
        "--kv-memory must be a size such as '512MiB', '2GiB' or '1.5GB', got '-5MiB'",
    ),
    "serve negative kv memory read as an option": (
        SERVE,
        ["--kv-memory", "-5MiB"],
        "argument --kv-memory: expected one argument",
    ),
    "serve kv memory and num blocks": (
        SERVE,
        ["--kv-memory", "64MiB", "--num-blocks", "64"],
        "--num-blocks and --kv-memory both size the pool: pass one of them",
    ),
    "serve unknown kv dtype": (
        SERVE,
        ["--kv-dtype", "int3"],
        "argument --kv-dtype: invalid choice: 'int3'",
    ),
    "serve jump-forward under the alternate policy": (
        SERVE,
        ["--policy", "alternate", "--jump-forward", "on"],
        "--jump-forward feeds drafts in a mixed step: add --policy mixed",
    ),
    "serve disk budget without a folder": (
        SERVE,
        ["--kv-disk-budget", "1GiB"],
        "--kv-disk-budget sizes the disk tier: add --kv-disk-dir",
    ),
    # --port 0 after the name: a command that took the name would stop there
    # instead of serving.
    "serve empty model name": (
        SERVE,
        ["--model-name", "", "--port", "0"],
        "--model-name is empty: give the id clients should send, or leave "
        "--model-name out",
    ),
    "serve blank model name": (
        SERVE,
        ["--model-name", "  ", "--port", "0"],
        "--model-name is empty",
    ),
    "book port out of range": (BOOK, ["--port", "0"], "--port must be in 1..65535"),
    "check-installation unknown option": (
        CHECK_INSTALLATION,
        ["--bogus"],
        "unrecognized arguments: --bogus",
    ),
    "greedy-determinism more prompts than it has": (
        DETERMINISM,
        ["--prompts", "17"],
        "--prompts must be at most 16, got 17",
    ),
    "greedy-determinism no tokens": (
        DETERMINISM,
        ["--tokens", "0"],
        "--tokens must be at least 1, got 0",
    ),
}


# The first case of each module also runs in a new interpreter: the one-line,
# no-traceback wrapper is what a user meets.
IN_A_SUBPROCESS = {
    next(case for case, (m, _, _) in BAD_OPTIONS.items() if m == module)
    for module, _, _ in BAD_OPTIONS.values()
}


@pytest.mark.parametrize("case", BAD_OPTIONS)
def test_scripts_refuse_bad_options_with_one_line(case):
    module, args, message = BAD_OPTIONS[case]
    runner = run if case in IN_A_SUBPROCESS else run_in_process
    assert_one_line_error(runner(module, *args), 2, message)


def test_load_test_against_a_closed_port_names_it_and_writes_nothing(tmp_path):
    url = f"http://127.0.0.1:{free_port()}"  # free: nothing listens there
    record, plot = tmp_path / "load-test.json", tmp_path / "load-test.png"
    record.write_text("an earlier run's record")
    result = run_in_process(
        LOAD_TEST, "--url", url, "--json", str(record), "--plot", str(plot)
    )
    assert_one_line_error(result, 1, f"error: cannot reach {url} (")  # httpx's words
    assert result.stderr.endswith(
        "): is the server running? Start it with `pdm run serve`, or give its "
        "address with --url\n"
    )
    assert record.read_text() == "an earlier run's record"
    assert not plot.exists() and result.stdout == ""


ENGINE_REFUSALS = [
    (
        ["--policy", "mixed", "--token-budget", "5"],
        "error: --token-budget must be at least 9, got 5",
    ),
    (
        ["--kv-cache", "paged", "--max-seq-len", "512", "--kv-memory", "1MiB"],
        "error: --kv-memory 1.0 MiB holds 16 tokens at ",
    ),
    (
        ["--kv-cache", "dense", "--max-seq-len", "512", "--kv-memory", "1MiB"],
        "error: a dense cache of --batch-size 8 x --max-seq-len 512 needs ",
    ),
    (
        ["--kv-cache", "dense", "--kv-disk-dir", "never-made"],
        "error: --kv-disk-dir keeps the prefix cache's blocks: it needs --kv-cache "
        "paged with prefix caching",
    ),
    (
        ["--kv-disk-dir", "never-made", "--kv-disk-budget", "lots"],
        "error: --kv-disk-budget must be a size such as '512MiB'",
    ),
    (
        ["--kv-cache", "dense", "--kv-dtype", "int8"],
        "error: --kv-dtype int8 stores the paged pool's keys and values: leave "
        "--kv-cache dense out",
    ),
]


@pytest.mark.parametrize("args, message", ENGINE_REFUSALS)
def test_serve_names_the_option_when_the_engine_refuses_a_setting(args, message):
    """The engine's refusal, after the model loaded, in this process (serve's
    one-line wrapper in a new interpreter is BAD_OPTIONS' first serve case)."""
    # A free port: the server may bind before it.
    result = run_in_process(SERVE, "--port", str(free_port()), *args)
    assert_one_line_error(result, 2, message)
    if "--kv-memory 1.0 MiB" in message:  # the engine's advice, in option names
        assert (
            "one request of --max-seq-len=512 needs 32 blocks of 16: pass "
            "--kv-memory of at least"
        ) in result.stderr


def test_check_installation_help_describes_it_and_measures_nothing():
    result = run_in_process(CHECK_INSTALLATION, "--help")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("usage: ")
    words = " ".join(result.stdout.split())  # argparse wraps the description
    assert "device, BLAS in use and the measured float32 matmul rate" in words
    assert "GFLOP/s" not in result.stdout


def test_book_build_refuses_a_folder_it_did_not_write(tmp_path):
    mine = tmp_path / "notes" / "mine.txt"
    mine.parent.mkdir()
    mine.write_text("keep me")
    result = run(BOOK, "--build", "--dest", str(mine.parent))
    assert_one_line_error(
        result,
        2,
        f"--dest {mine.parent} is not empty and holds no book written by",
    )
    assert mine.read_text() == "keep me"
    assert os.listdir(mine.parent) == ["mine.txt"]


def test_book_build_refuses_a_file_as_its_folder(tmp_path):
    file = tmp_path / "book.html"
    file.write_text("keep me")
    result = run(BOOK, "--build", "--dest", str(file))
    assert_one_line_error(result, 2, f"--dest {file} is a file, not a folder")
    assert file.read_text() == "keep me"


def test_book_dest_without_build_is_refused_and_writes_nothing(tmp_path):
    dest = tmp_path / "html"
    # --port 0 after --dest: a command that ignored --dest would stop there
    # instead of serving.
    result = run_in_process(BOOK, "--dest", str(dest), "--port", "0")
    assert_one_line_error(
        result,
        2,
        f"--dest {dest}: only --build writes the HTML into a folder; add "
        "--build, or leave --dest out to serve the book",
    )
    assert not dest.exists()
    assert "refused without --build" in run_in_process(BOOK, "--help").stdout


def test_book_build_rebuilds_its_own_output(tmp_path):
    dest = tmp_path / "html"
    for _ in range(2):  # the second build replaces the first one's folder
        result = run(BOOK, "--build", "--dest", str(dest))
        assert result.returncode == 0, result.stdout + result.stderr
        assert (dest / "index.html").is_file() and (dest / ".tiny-llm-book").is_file()


# Settings that ran with no word (issue 30), checked in-process: the option parser
# and EngineConfig, not a new interpreter per case.


def scheduling_args(*argv: str):
    from scripts.commands import engine_options
    from scripts.commands.cli import option_parser

    parser = option_parser("test")
    engine_options.add_scheduling_options(parser)
    args = parser.parse_args(list(argv))
    engine_options.check_scheduling_options(args)
    return args


@pytest.mark.parametrize(
    "argv, words",
    [
        (["--speculative", "none", "--num-speculative-tokens", "8"],
         "--num-speculative-tokens sets how drafts are proposed, but --speculative "
         "none proposes none"),
        (["--policy", "alternate", "--prompt-lookup-max", "5"],
         "--prompt-lookup-max sets how drafts are proposed, but --policy alternate "
         "never drafts"),
    ],
)  # fmt: skip
def test_draft_options_without_drafting_are_refused(capsys, argv, words):
    with pytest.raises(SystemExit) as exit:
        scheduling_args(*argv)
    assert exit.value.code == 2
    assert words in capsys.readouterr().err


def test_step_ahead_option_reaches_the_engine_settings():
    from scripts.commands import engine_options

    for argv, expected in (([], True), (["--step-ahead", "off"], False)):
        args = scheduling_args(*argv)
        settings = engine_options.scheduling_settings(args, "alternate", package=None)
        assert settings["step_ahead"] is expected


def test_draft_options_keep_their_defaults_when_not_given():
    args = scheduling_args("--speculative", "ngram", "--prompt-lookup-min", "2")
    assert (args.num_speculative_tokens, args.prompt_lookup_max) == (4, 3)
    assert args.prompt_lookup_min == 2


@pytest.mark.parametrize(
    "settings, error, words",
    [
        ({"jump_forward": "no"}, TypeError, "jump_forward must be True or False"),
        ({"prefix_caching": 0}, TypeError, "prefix_caching must be True or False"),
        ({"step_ahead": "off"}, TypeError, "step_ahead must be True or False"),
        ({"num_speculative_tokens": 8}, ValueError, "speculative is None"),
        ({"policy": "alternate", "speculative": "ngram"}, ValueError, "mixed step"),
    ],
)
def test_engine_config_refuses_settings_that_would_do_nothing(settings, error, words):
    from tiny_llm_base import EngineConfig

    with pytest.raises(error, match=words):
        EngineConfig(**{"policy": "mixed", **settings})


def test_make_skeleton_refuses_a_day_the_course_does_not_have():
    before = {p: p.read_bytes() for p in (ROOT / "src" / "tiny_llm").glob("*.py")}
    result = run("scripts.tools.make_skeleton", "--done-through", "9.9")
    assert result.returncode == 2, result.stderr
    assert "the course has no week 9 day 9: its days run from 1.1 to" in result.stderr
    after = {p: p.read_bytes() for p in (ROOT / "src" / "tiny_llm").glob("*.py")}
    assert after == before
