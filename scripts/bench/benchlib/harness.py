"""What every benchmark does around its experiment, written once: its options, the
machine it ran on, the model it loads, its goals and its JSON record.

    bench = Bench(__doc__, quick=True, out="bench-results/x.json", repeats=(3, "..."))
    bench.option("--tokens", 48, "tokens per prompt", least=1)  # its own, checked
    args = bench.parse()                          # --solution chosen: course.X
    console = bench.start()                       # the machine line, load before
    models = bench.models()                       # the embedded model, each form
    bench.table(title, {"column": cell}, items)   # the experiment, its tables
    bench.keep("part", part_record, part_goals)   # a part done: kept on Ctrl-C
    return bench.finish(record, goals)            # goals, JSON, the exit status

A goal is a named ratio with a bound; a missed one says what limited it and makes
the exit status 1. Imports MLX only inside functions (a script imports
tiny_llm_base first).
"""

import argparse
import math
import os
import shlex
import statistics
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

from rich.console import Console

from scripts.commands import cli, interrupt

from .course import add_option, course, use
from .record import machine, out_path, unwritable, without, write_json
from .goals import Goal

BOOK_IMAGES = Path(__file__).resolve().parents[3] / "book" / "src" / "images"


def clocked(fn: Callable, *args, **kwargs) -> tuple[object, float]:
    """fn(*args, **kwargs)'s result and the wall seconds it took (MLX work it
    leaves lazy is not counted: fn evaluates what it times)."""
    start = time.perf_counter()
    result = fn(*args, **kwargs)
    return result, time.perf_counter() - start


def timed(
    fn: Callable[[], object], repeats: int, warmups: int = 1, budget_s: float = math.inf
) -> list[float]:
    """Seconds of each of `repeats` calls of fn, its result evaluated, after
    `warmups` calls; past budget_s of timing, stops once two calls are timed."""
    import mlx.core as mx

    for _ in range(warmups):
        mx.eval(fn())
    times, started = [], time.perf_counter()
    while len(times) < repeats and (
        len(times) < 2 or time.perf_counter() - started < budget_s
    ):
        start = time.perf_counter()
        mx.eval(fn())
        times.append(time.perf_counter() - start)
    return times


def interleaved(
    jobs: dict,
    repeats: int,
    budget_s: float = math.inf,
    console=None,
    line: Callable[[object, object], str] | None = None,
) -> dict:
    """{name: [each round's result]}: every round runs every job once, in turn, so
    that a busy spell of the machine slows one run of each, not every run of one.
    A job whose runs took more than budget_s stops repeating; console: a status
    line naming the round and the job, and line(name, result) printed after each
    run (a long benchmark's progress)."""
    results = {name: [] for name in jobs}
    spent = dict.fromkeys(jobs, 0.0)
    for round_number in range(1, repeats + 1):
        for name, job in jobs.items():
            if spent[name] > budget_s:
                continue
            start = time.perf_counter()
            if console is None:
                results[name].append(job())
            else:
                label = ", ".join(map(str, name)) if isinstance(name, tuple) else name
                with console.status(f"round {round_number}/{repeats}: {label}"):
                    results[name].append(job())
                if line is not None:
                    console.print(line(name, results[name][-1]))
            spent[name] += time.perf_counter() - start
    return results


def medians(runs: dict[str, list[float]]) -> dict[str, float]:
    return {name: statistics.median(values) for name, values in runs.items()}


@dataclass
class Models:
    """The embedded model as mlx-lm loads it, and each form a benchmark runs, each
    built on first use."""

    mlx_model: object
    tokenizer: object

    huge_page_bytes: int = 0  # of our models' weights, on 2 MB pages (huge_pages.py)

    @cached_property
    def float32(self):
        """Ours in float32 on the fast path: the same weights as the peer."""
        return self.on_huge_pages(
            course.Qwen2ModelWeek2(
                self.mlx_model, weights="float32", use_fast_kernels=True
            )
        )

    @cached_property
    def served(self):
        """Ours as main and serve run it (the weights' own format)."""
        return self.on_huge_pages(
            course.Qwen2ModelWeek2(self.mlx_model, use_fast_kernels=True)
        )

    def on_huge_pages(self, model):
        """`model`, its weights moved onto huge pages as serve's are."""
        from tiny_llm_base.huge_pages import arrays_of, back_with_huge_pages

        self.huge_page_bytes += back_with_huge_pages(arrays_of(model))
        return model

    @cached_property
    def peer(self):
        """mlx-lm's model holding the float32 weights ours computes with."""
        from tiny_llm_base.mlx_lm_reference import float32_copy

        return float32_copy(self.mlx_model)

    @cached_property
    def no_eos(self):
        """Greedy, EOS never picked: every request runs to max_tokens."""
        from tiny_llm_base.mlx_lm_reference import greedy_without

        vocab = self.mlx_model.args.vocab_size
        return greedy_without(self.tokenizer.eos_token_ids, vocab)


class Bench:
    """One run of a benchmark: parse, start, (the experiment), finish."""

    def __init__(
        self,
        doc: str,
        *,
        quick: bool = False,
        out: str | None = None,
        repeats: tuple[int | None, str] | None = None,
        time_limit: tuple[float | None, str] | None = None,
    ):
        """quick: a --quick option; out: --out's default (None: no record unless
        asked); repeats: a --repeats option, (its default, what it repeats);
        time_limit: a --time-limit option in seconds, (its default, its help)."""
        self.parser = cli.option_parser(doc.strip().splitlines()[0])
        self.checks: list[Callable[[argparse.Namespace], None]] = []
        if repeats is not None:
            self.option("--repeats", repeats[0], repeats[1], type=int, least=1)
        if time_limit is not None:
            limit, help = time_limit
            self.option("--time-limit", limit, help, type=float, positive=True)
        if quick:
            self.parser.add_argument(
                "--quick", action="store_true", help="smaller sizes: a smoke run"
            )
        self.parser.add_argument(
            "--out",
            "--json",
            type=out_path,
            help=f"write the record as JSON here (default: {out or 'not written'}"
            + (", -quick before .json with --quick)" if quick and out else ")"),
        )
        self.parser.add_argument(
            "--book-figures",
            action="store_true",
            help="draw the figures into book/src/images, replacing the book's own "
            "(default: beside the JSON record)",
        )
        add_option(self.parser)
        self.out = None if out is None else Path(out)
        self.kept: dict = {}  # the finished parts (keep), by name
        self.kept_goals: list[Goal] = []

    def option(
        self,
        name: str,
        default=None,
        help: str | None = None,
        *,
        least: int | None = None,
        positive: bool = False,
        fraction: bool = False,
        **settings,
    ) -> None:
        """An option of the benchmark's own and its range, checked by parse() in one
        `error:` line. Its type is its default's (a list: one or more of its items'
        type; False: a flag) unless settings give it or an action; least: at least
        this; positive: a finite number above 0; fraction: from 0 to 1."""
        if default is False:
            settings.setdefault("action", "store_true")
        elif "action" in settings or default is None:
            pass
        elif isinstance(default, list):
            settings = dict(type=type(default[0]), nargs="+") | settings
        else:
            settings.setdefault("type", type(default))
        self.parser.add_argument(name, default=default, help=help, **settings)
        if least is not None:
            self.checks.append(lambda args: cli.require_at_least(args, least, name))
        if positive:
            self.checks.append(lambda args: cli.require_positive(args, name))
        if fraction:
            self.checks.append(lambda args: cli.require_fraction(args, name))

    def parse(self) -> argparse.Namespace:
        """The options, --solution's package chosen (course.X), each option's range
        checked; a quick run's default record is named -quick."""
        self.args = self.parser.parse_args()
        use(self.args)
        for check in self.checks:
            check(self.args)
        if self.args.out is None and self.out is not None:
            quick = getattr(self.args, "quick", False)
            self.args.out = self.out.with_stem(self.out.stem + "-quick" * quick)
        if self.args.out is not None:  # found out now, not after the run
            problem = unwritable(self.args.out)
            if problem is not None:
                cli.fail(f"--out {problem}")
        return self.args

    def image(self, name: str) -> Path:
        """Where the figure `name` goes: beside the JSON record (named -quick for
        --quick); the book's images only with --book-figures, so a learner's run
        never changes the book's tracked figures."""
        if getattr(self.args, "book_figures", False):
            folder = BOOK_IMAGES
        else:
            folder = (self.args.out or Path("bench-results/x")).parent
            if getattr(self.args, "quick", False):
                name = f"{Path(name).stem}-quick{Path(name).suffix}"
        folder.mkdir(parents=True, exist_ok=True)
        return folder / name

    def start(self) -> Console:
        """The console (tables kept whole when piped) and the machine line."""
        wide = None if sys.stdout.isatty() else 170
        self.console = Console(width=wide, highlight=False)
        self.machine = machine()
        m = self.machine
        self.console.print(
            f"mlx {m['mlx']} on {m['device']}; {m['cpu']} ({m['machine']}), "
            f"{m['cores']} CPUs; {m['blas']}; load average "
            f"{m['load_average']['before'][0]:.1f}"
        )
        return self.console

    def table(self, title: str, columns, rows) -> None:
        """render.grid's table on the console: columns a list of headers and rows of
        cells, or {header: cell(row)} and rows of anything; None: a section line."""
        from .render import grid  # render imports MLX (through its workloads)

        self.console.print(grid(title, columns, rows))

    def models(self) -> Models:
        with self.console.status("loading the embedded model"):
            return Models(*course.load_model())

    def finish(
        self,
        record: dict,
        goals: Iterable[Goal] = (),
        wrote: Iterable = (),
        leave_out: str | None = None,
    ) -> int:
        """The load average after, every goal one line, the JSON record (--out)
        with the machine, the command and the goals; 1 when a goal was missed.
        leave_out: a key left out of every dict in the record (token ids)."""
        goals = list(goals)
        load = self.machine["load_average"]
        load["after"] = os.getloadavg()
        self.console.print(
            f"load average {load['before'][0]:.1f} before, {load['after'][0]:.1f} "
            "after: a busy machine makes every figure noisy"
        )
        for goal in goals:
            self.console.print(goal.line(), markup=False)
        wrote = [str(path) for path in wrote]
        if self.args.out:
            self.write(record, goals, leave_out)
            wrote.insert(0, str(self.args.out))
        if wrote:
            self.console.print(f"wrote {', '.join(wrote)}")
        return int(not all(goal.met for goal in goals))

    def keep(
        self, name: str, part, goals: Iterable[Goal] = (), leave_out: str | None = None
    ) -> None:
        """A part of the run that has finished, with its goals: written at once to
        --out as a partial record (its parts under "parts"), which finish()'s
        replaces, so that Ctrl-C or a failure later loses no finished part; the
        Ctrl-C line then says where they are."""
        self.kept[name] = part
        self.kept_goals += goals
        if self.args.out:
            partial = dict(partial=True, finished_parts=list(self.kept))
            self.write(partial | {"parts": self.kept}, self.kept_goals, leave_out)
            interrupt.say_when_interrupted(
                f"the finished parts ({', '.join(self.kept)}) are in {self.args.out}"
            )

    def write(self, record: dict, goals: list[Goal], leave_out: str | None) -> None:
        """The JSON record at --out: the command, the date, the machine, `record`
        (`leave_out` left out of every dict in it) and the goals."""
        module = f"scripts.bench.{Path(sys.argv[0]).stem}"
        command = shlex.join(["python", "-m", module, *sys.argv[1:]])
        write_json(
            self.args.out,
            dict(
                command=command,
                date=time.strftime("%Y-%m-%d %H:%M"),
                machine=self.machine,
                **without(record, leave_out),
                goals=goals,
            ),
        )
