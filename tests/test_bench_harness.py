"""The benchmarks' harness (scripts/bench/benchlib/harness.py) without a model: a
goal is met on its side of the bound and missed otherwise (never measured: missed),
a missed one says what limited it and makes the exit status 1; the JSON record
holds the machine, the load average before and after, the command and every goal;
interleaved runs give every job one run a round; run_to_end returns every result
in the order the requests were added, whatever order they finish in; an option is
typed by its default and refused out of its range in one line; a table reads its
rows through column functions; a chat turn's reusable tokens."""

import io
import json
import os
import sys
import time
from types import SimpleNamespace

import mlx.core as mx
import pytest
from rich.console import Console

from scripts.bench.benchlib.harness import BOOK_IMAGES, Bench, interleaved
from scripts.bench.benchlib.goals import at_least, at_most, identical
from scripts.bench.benchlib.runners import run_to_end

from .solution import SOLUTION


@pytest.mark.parametrize(
    "goal, met",
    [
        (at_most("x", 1.1, 1.2, "why"), True),
        (at_most("x", 1.2, 1.2, "why"), True),
        (at_most("x", 1.3, 1.2, "why"), False),
        (at_least("x", 2.0, 2.0, "why"), True),
        (at_least("x", 1.9, 2.0, "why"), False),
        (at_least("x", None, 2.0, "never measured"), False),
        (at_most("x", float("nan"), 1.0, "no tokens"), False),
        (identical("x", 4, 4), True),
        (identical("x", 3, 4), False),
        (identical("x", 0, 0), False),
    ],
)
def test_a_goal_is_met_on_its_side_of_the_bound(goal, met):
    assert goal.met is met
    assert goal.line().startswith("met: " if met else "MISSED: ")


def test_a_missed_goal_says_what_limited_it():
    goal = at_most("TTFT p99, ours / peer", 3.256, 2, "1.2 s vs 0.37 s")
    assert goal.line() == (
        "MISSED: TTFT p99, ours / peer: 3.26 (at most 2); limited by 1.2 s vs 0.37 s"
    )
    assert identical("tokens", 3, 4).line().endswith("; limited by 3 of 4 the same")
    assert at_least("hit", 0.95, 0.9, "19 of 20").line().endswith("; 19 of 20")
    # A value that rounds to its bound shows the digits that decide it.
    assert "0.8979 (at least 0.9)" in at_least("speed", 0.89791, 0.9, "x").line()


def run_bench(monkeypatch, argv: list[str], goals, **options):
    """A benchmark with no experiment: parse argv, start, finish with `goals`."""
    monkeypatch.setattr(sys, "argv", ["bench_x.py", "--solution", SOLUTION, *argv])
    bench = Bench("A benchmark.\n\nWhat it does.", **options)
    args = bench.parse()
    bench.start()
    return args, bench.finish({"figure": 1.5}, goals)


def test_finish_writes_the_record_and_exits_1_on_a_missed_goal(
    tmp_path, monkeypatch, capsys
):
    path = tmp_path / "record.json"
    goals = [at_least("a", 2.5, 2, "x"), at_most("b", 1.4, 1.2, "the stall")]
    _, status = run_bench(monkeypatch, ["--out", str(path)], goals)
    assert status == 1
    assert (
        "MISSED: b: 1.40 (at most 1.2); limited by the stall" in capsys.readouterr().out
    )
    record = json.loads(path.read_text())
    assert record["figure"] == 1.5
    assert [(g["name"], g["met"]) for g in record["goals"]] == [
        ("a", True),
        ("b", False),
    ]
    machine = record["machine"]
    assert set(machine["load_average"]) == {"before", "after"}
    assert len(machine["load_average"]["after"]) == 3
    assert (machine["cores"], machine["mlx"]) == (os.cpu_count(), mx.__version__)
    assert machine["device"] == str(mx.default_device())
    assert record["command"].endswith(f"--out {path}")


def test_finish_exits_0_when_every_goal_is_met(monkeypatch):
    assert run_bench(monkeypatch, [], [at_least("a", 2.5, 2, "x")])[1] == 0
    assert run_bench(monkeypatch, [], [])[1] == 0


def test_a_quick_run_names_its_default_record_quick(tmp_path, monkeypatch):
    default = tmp_path / "x.json"
    args, _ = run_bench(monkeypatch, ["--quick"], [], quick=True, out=str(default))
    assert args.out == tmp_path / "x-quick.json" and args.out.exists()
    argv = ["--quick", "--json", str(default)]  # named: kept as it is
    args, _ = run_bench(monkeypatch, argv, [], quick=True, out=str(default))
    assert args.out == default and default.exists()


def test_a_run_draws_beside_its_record_and_in_the_book_only_when_asked(
    tmp_path, monkeypatch
):
    monkeypatch.setattr(sys, "argv", ["bench_x.py", "--quick"])
    bench = Bench("A benchmark.", quick=True, out=str(tmp_path / "x.json"))
    bench.parse()
    assert bench.image("week3-x.png") == tmp_path / "week3-x-quick.png"
    monkeypatch.setattr(sys, "argv", ["bench_x.py"])
    bench.parse()
    assert bench.image("week3-x.png") == tmp_path / "week3-x.png"
    monkeypatch.setattr(sys, "argv", ["bench_x.py", "--book-figures"])
    bench.parse()
    assert bench.image("week3-x.png") == BOOK_IMAGES / "week3-x.png"
    assert BOOK_IMAGES.parent.name == "src" and BOOK_IMAGES.is_dir()


def test_repeats_below_one_are_refused_with_one_line(monkeypatch, capsys):
    with pytest.raises(SystemExit) as exit:
        run_bench(monkeypatch, ["--repeats", "0"], [], repeats=(3, "runs"))
    assert exit.value.code == 2
    assert "error: --repeats must be at least 1, got 0" in capsys.readouterr().err


def test_an_out_whose_folder_cannot_be_made_is_refused_before_the_run(
    tmp_path, monkeypatch, capsys
):
    blocked = tmp_path / "a-file"
    blocked.write_text("")
    with pytest.raises(SystemExit) as exit:
        run_bench(monkeypatch, ["--out", str(blocked / "x.json")], [])
    assert exit.value.code == 2
    error = capsys.readouterr().err.strip()
    assert error.startswith(f"error: --out {blocked / 'x.json'}: its folder cannot")
    assert "give a path you can write" in error


@pytest.mark.parametrize(
    "out, message",
    [
        ("", "argument --out/--json: is empty: give the path of a file to write"),
        ("{tmp}", "--out {tmp} is a folder: give a file in it, e.g. {tmp}/record.json"),
        # Too long a name for any file system: no user, root neither, can write it.
        ("{tmp}/" + "x" * 300 + ".json", "--out {tmp}/" + "x" * 300 + ".json: it "
         "cannot be written ("),
    ],
)  # fmt: skip
def test_an_out_that_cannot_be_written_is_refused_before_the_run(
    tmp_path, monkeypatch, capsys, out, message
):
    with pytest.raises(SystemExit) as exit:
        run_bench(monkeypatch, ["--out", out.format(tmp=tmp_path)], [])
    assert exit.value.code == 2
    error = capsys.readouterr().err.strip()
    assert error.startswith("error: " + message.format(tmp=tmp_path)), error
    assert os.listdir(tmp_path) == []  # the probe left nothing behind


def test_a_finished_part_is_written_at_once_and_the_whole_record_replaces_it(
    tmp_path, monkeypatch
):
    path = tmp_path / "record.json"
    argv = ["bench_x.py", "--solution", SOLUTION, "--out", str(path)]
    monkeypatch.setattr(sys, "argv", argv)
    bench = Bench("A benchmark.")
    bench.parse()
    bench.start()
    bench.keep("a", {"ms": 2.5, "tokens": [1, 2]}, [at_least("a", 3, 2, "x")], "tokens")
    partial = json.loads(path.read_text())
    assert (partial["partial"], partial["finished_parts"]) == (True, ["a"])
    assert partial["parts"] == {"a": {"ms": 2.5}}
    assert [g["name"] for g in partial["goals"]] == ["a"]
    assert partial["command"].endswith(f"--out {path}")
    bench.finish({"figure": 1.5}, [at_least("b", 1, 2, "y")])
    whole = json.loads(path.read_text())
    assert "partial" not in whole and whole["figure"] == 1.5
    assert [g["name"] for g in whole["goals"]] == ["b"]
    assert os.listdir(tmp_path) == ["record.json"]


def test_interleaved_runs_every_job_once_a_round():
    calls = []

    def job(name: str):
        calls.append(name)
        return len(calls)

    runs = interleaved({"a": lambda: job("a"), "b": lambda: job("b")}, 3)
    assert calls == ["a", "b"] * 3
    assert runs == {"a": [1, 3, 5], "b": [2, 4, 6]}


def test_interleaved_names_any_job_on_its_status_line():
    console = Console(file=io.StringIO())
    jobs = {False: lambda: 0, True: lambda: 1, ("prefill 8", "tiny"): lambda: 2}
    runs = interleaved(jobs, 2, console=console)
    assert runs == {False: [0, 0], True: [1, 1], ("prefill 8", "tiny"): [2, 2]}


def test_interleaved_stops_repeating_a_job_past_its_budget():
    def slow() -> str:
        time.sleep(0.01)  # at least 10 ms: past the budget once it has run
        return "slow"

    assert interleaved({"slow": slow}, 3, budget_s=0.005) == {"slow": ["slow"]}


class ReversedEngine:
    """Finishes one request a step, the newest first; request ids count up."""

    def __init__(self):
        self.waiting: list[int] = []
        self.next_id = 0

    def add_request(self, spec) -> int:
        self.waiting.append(self.next_id)
        self.next_id += 1
        return self.waiting[-1]

    def has_unfinished(self) -> bool:
        return bool(self.waiting)

    def step(self) -> list:
        done = self.waiting.pop()
        return [SimpleNamespace(request_id=done, result=f"result {done}")]


def test_run_to_end_returns_results_in_the_order_added():
    engine = ReversedEngine()
    added = []

    def on_step(engine, outputs, seconds):  # one more request after the first step
        assert seconds >= 0 and outputs
        if not added:
            added.append(engine.add_request("late"))

    results = run_to_end(engine, ["a", "b", "c"], on_step)
    assert results == ["result 0", "result 1", "result 2", "result 3"]


def _run(config: str, engine: str, stall: float, total: float, unfinished: int = 0):
    from scripts.bench.benchlib.measure import Run

    return Run(
        config,
        engine,
        total,
        0,
        0,
        0.0,
        0.0,
        0.0,
        [],
        0.0,
        0.0,
        stall,
        0.0,
        unfinished,
        (0.0, 0.0),
        [],
    )


def test_dominance_never_picks_a_cut_run_of_ours_and_names_a_cut_peer():
    from scripts.bench.benchlib.measure import dominance_goals

    peer = _run("mlx-lm 32", "mlx-lm", stall=2.0, total=60.0, unfinished=4)
    cut = _run("alternate 32", "ours", stall=0.1, total=10.0, unfinished=1)
    done = _run("alternate 128", "ours", stall=1.0, total=50.0)
    [goal] = dominance_goals("b", [peer, cut, done])
    assert "best of ours alternate 128" in goal.name
    assert "cut with 4 unfinished" in goal.name
    assert goal.value == pytest.approx(50.0 / 60.0)
    [goal] = dominance_goals("b", [peer, cut])
    assert not goal.met and "no run of ours finished" in goal.line()


def test_an_option_is_typed_by_its_default_and_refused_out_of_range(
    monkeypatch, capsys
):
    def parse(*argv: str):
        monkeypatch.setattr(sys, "argv", ["bench_x.py", "--solution", SOLUTION, *argv])
        bench = Bench("A benchmark.")
        bench.option("--tokens", 48, "per prompt", least=1)
        bench.option("--rate", 1.0, positive=True)
        bench.option("--share", 0.5, fraction=True)
        bench.option("--lengths", [128, 1024], least=1)
        bench.option("--no-peer", False, "skip the peer")
        return bench.parse()

    args = parse("--tokens", "3", "--lengths", "8", "9", "--no-peer")
    assert (args.tokens, args.rate, args.lengths, args.no_peer) == (
        3,
        1.0,
        [8, 9],
        True,
    )
    for argv, message in [
        (["--tokens", "0"], "--tokens must be at least 1, got 0"),
        (["--rate", "0"], "--rate must be more than 0, got 0.0"),
        (["--share", "1.5"], "--share must be between 0 and 1, got 1.5"),
        (["--lengths", "8", "0"], "--lengths must be at least 1, got 0"),
    ]:
        with pytest.raises(SystemExit) as exit:
            parse(*argv)
        assert exit.value.code == 2
        assert capsys.readouterr().err.strip() == f"error: {message}"


def test_a_table_reads_its_rows_through_column_functions():
    from scripts.bench.benchlib.render import grid

    console = Console(file=io.StringIO(), width=80)
    columns = {"runner": lambda name, _: name, "ms": lambda _, s: f"{1e3 * s:.0f}"}
    console.print(grid("steps", columns, {"dense": 0.25, "paged": 0.5}))
    lines = console.file.getvalue().splitlines()
    assert any("dense" in line and "250" in line for line in lines)
    assert any("paged" in line and "500" in line for line in lines)


def test_the_record_leaves_out_the_key_asked_wherever_it_is(tmp_path, monkeypatch):
    path = tmp_path / "record.json"
    argv = ["bench_x.py", "--solution", SOLUTION, "--out", str(path)]
    monkeypatch.setattr(sys, "argv", argv)
    bench = Bench("A benchmark.")
    bench.parse()
    bench.start()
    runs = {"dense": {"tokens": [[1, 2]], "seconds": 1.0}, "list": [{"tokens": []}]}
    bench.finish({"runs": runs}, leave_out="tokens")
    record = json.loads(path.read_text())
    assert record["runs"] == {"dense": {"seconds": 1.0}, "list": [{}]}


def test_a_turn_reuses_what_the_turn_before_computed_but_its_last_token():
    from scripts.bench.benchlib.chats import reusable

    # The answer's last token is sampled, never fed: it is not in the cache.
    assert reusable([1, 2, 3, 4, 5, 6], previous=[1, 2, 3], answer=[4, 5]) == 4
    # The prompt's last token is always computed, for its logits.
    assert reusable([1, 2, 3], previous=[1, 2, 3], answer=[7]) == 2
    assert reusable([9, 2], previous=[1, 2], answer=[3]) == 0


def test_bench_speed_reads_each_benchmarks_goals_and_a_failure_is_no_record(tmp_path):
    """bench-speed's runner: a benchmark's goals come from the record it wrote in
    this run; one that fails (here a refused option, status 2) gives no goals,
    even with an earlier run's record in the folder."""
    from scripts.bench.benchlib.speed_goals import run_each

    stale = dict(name="old", value=1.0, bound=1.0, why="", at_most=True)
    (tmp_path / "speed-engine-quick.json").write_text(json.dumps({"goals": [stale]}))
    parts = {
        "fake": ["tests.fake_benchmark"],
        "engine": ["scripts.bench.bench_engine", "--tokens", "0"],
    }
    console, kept = Console(file=io.StringIO()), []
    goals, failed = run_each(
        console, parts, tmp_path, True, SOLUTION, lambda *part: kept.append(part)
    )
    [(part, goal)] = goals
    assert part == "fake" and (goal.name, goal.value, goal.met) == ("step", 2.0, False)
    assert failed == ["engine (exit status 2)"]
    record = str(tmp_path / "speed-fake-quick.json")
    assert kept == [("fake", {"record": record}, [goal])]
