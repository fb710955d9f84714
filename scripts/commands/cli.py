"""What the command-line programs share: options checked into one-line errors, model
loading with progress, and the notes a user should see about speed and context length.

Imports nothing from MLX at module level: main.py and batch-main.py import this module
before the project, which must load the fast BLAS before mlx.core.
"""

import argparse
import math
import os
import re
import stat
import sys
import time
from collections.abc import Iterable
from typing import NoReturn

from tqdm import tqdm

STAGES = {
    "verify": "checking the embedded model file",
    "convert": "converting the GGUF model for MLX",
}
MODEL_KINDS = {
    "week2-fast": "the week 2 model with the KV cache and fast kernels",
    "week2": "the week 2 model with the KV cache and hand-written kernels",
    "week1": "the week 1 model (no KV cache: every token reruns the whole sequence)",
}
LOG_INTERVAL = 2.0  # seconds between engine lines, like vLLM's periodic stats


def fail(message: str, status: int = 2) -> NoReturn:
    """Print one line to stderr and exit: bad input (2) or a failure to load (1)."""
    print(f"error: {message}", file=sys.stderr)
    sys.exit(status)


def option_parser(description: str) -> argparse.ArgumentParser:
    """An ArgumentParser whose every complaint is one `error:` line and status 2."""
    parser = argparse.ArgumentParser(description=description)
    parser.error = fail
    return parser


def dest(option: str) -> str:
    """The argparse attribute of an option as typed: `--max-tokens` -> max_tokens."""
    return option.removeprefix("--").replace("-", "_")


def option_values(args: argparse.Namespace, option: str) -> list:
    """The values given for `option` as typed (`--max-tokens`); a list option's items."""
    value = getattr(args, dest(option))
    return value if isinstance(value, list) else [value]


def require_at_least(args: argparse.Namespace, minimum: int, *options: str) -> None:
    """Each of `options` (as typed, `--max-tokens`) is at least `minimum` or unset."""
    for option in options:
        for value in option_values(args, option):
            if value is not None and value < minimum:
                fail(f"{option} must be at least {minimum}, got {value}")


def require_finite(option: str, value: float) -> None:
    """NaN and infinity pass every `<` and `>` check a range makes: refuse them first."""
    if not math.isfinite(value):
        fail(f"{option} must be a finite number, got {value}")


def require_positive(args: argparse.Namespace, *options: str) -> None:
    """Each of `options` is a finite number above 0 (seconds, rates) or unset."""
    for option in options:
        for value in option_values(args, option):
            if value is not None:
                require_finite(option, value)
                if value <= 0:
                    fail(f"{option} must be more than 0, got {value}")


def require_fraction(args: argparse.Namespace, *options: str) -> None:
    """Each of `options` is a fraction from 0 to 1."""
    for option in options:
        for value in option_values(args, option):
            if not 0 <= value <= 1:
                fail(f"{option} must be between 0 and 1, got {value}")


def fail_with_options(error: Exception, options: Iterable[str]) -> NoReturn:
    """fail() with a library's error, its parameter names (`max_seq_len`) put back
    as the options the user typed (`--max-seq-len`)."""
    message = str(error)
    for option in options:
        message = re.sub(rf"(?<![\w-]){dest(option)}\b", option, message)
    fail(message)


KV_MEMORY_HELP = (
    "the keys and values' budget, e.g. 512MiB or 2GB; paged: the pool grows towards "
    "it as it is used (default: half the available memory, a GPU's own on a GPU); "
    "dense: --batch-size x --max-seq-len positions must fit it"
)


def add_kv_memory_option(parser: argparse.ArgumentParser) -> None:
    """--kv-memory SIZE, read by parse_kv_memory, and --kv-dtype."""
    parser.add_argument("--kv-memory", metavar="SIZE", help=KV_MEMORY_HELP)
    parser.add_argument(
        "--kv-dtype",
        choices=("float32", "float16", "int8", "int4"),
        default="float32",
        help="with --kv-cache paged: how the pool stores keys and values: float32 "
        "(default: as the model computes them); float16: 2x the tokens in the same "
        "memory; int8 / int4, quantized in groups of 32 numbers: 3.2x / 5.3x the "
        "tokens (the embedded model), less accurate (the paged-cache chapter "
        "measures it)",
    )


def check_kv_dtype(args: argparse.Namespace) -> None:
    """--kv-dtype other than float32 stores the paged pool's keys and values:
    refused beside --kv-cache dense (once the KV cache to run is known)."""
    if args.kv_dtype != "float32" and args.kv_cache == "dense":
        fail(
            f"--kv-dtype {args.kv_dtype} stores the paged pool's keys and values: "
            "leave --kv-cache dense out (or use --kv-cache paged), or --kv-dtype "
            "float32"
        )


def parse_kv_memory(value: str | None) -> int | None:
    """--kv-memory in bytes (None when not given); a bad size is one `error:` line.

    Imports tiny_llm_base (and MLX) only when the option is given: a command's other
    bad options still fail before the slow imports."""
    if value is None:
        return None
    from tiny_llm_base.memory import parse_bytes

    try:
        return parse_bytes("--kv-memory", value)
    except ValueError as error:
        fail(str(error))


# What a mixed step runs with unless told otherwise: the threshold and the number of
# partial prefills are the best row of `pdm run bench-latency --sweep` (book:
# week3-01-latency.md). Long ones may take all places but one: with 1, every prompt
# past 64 tokens (a chat's later turns) would queue behind one long prompt. The
# attention budget is a full 64-token chunk's scores at position 4,032: deeper, the
# chunk shrinks (44 tokens at 5,900), so a step that carries one costs about what
# it costs there instead of growing with the position (bench-latency: the long
# prompt's finish is what a smaller budget costs, in steps).
MIXED_STEP_DEFAULTS = {
    "long_prefill_token_threshold": 64,
    "max_num_partial_prefills": 4,
    "max_long_partial_prefills": 3,
    "long_prefill_attention_budget": 64 * 4096,
}
STEP_LIMIT_OPTIONS = tuple(
    "--" + name.replace("_", "-") for name in MIXED_STEP_DEFAULTS
)
NO_LIMIT = "none"
DEFAULT_BATCH_PATIENCE = 30.0  # seconds; --batch-patience not given


def add_scheduling_options(parser: argparse.ArgumentParser) -> None:
    """--policy, the mixed step's partial-prefill limits and --batch-patience; read
    them with check_scheduling_options, then scheduling_settings."""
    parser.add_argument(
        "--policy",
        choices=("alternate", "mixed"),
        help="mixed: one forward a step with every decode and prefill chunks (week 3 "
        "day 1; the default once the package has it); alternate: a prefill chunk's "
        "forward, then the decodes' (week 2 day 7)",
    )
    limits = {
        "long_prefill_token_threshold": "a prompt of more tokens is long, and its "
        "chunk per step is at most this many tokens",
        "max_num_partial_prefills": "at most this many prompts partly prefilled at "
        "once (1: one at a time, first come first served)",
        "max_long_partial_prefills": "at most this many of them long",
        "long_prefill_attention_budget": "a long prompt's chunk of L tokens at "
        "offset o keeps L x (o + L) attention scores within this many (at least one "
        "token a chunk)",
    }
    for name, text in limits.items():
        parser.add_argument(
            "--" + name.replace("_", "-"),
            metavar="N",
            help=f"with --policy mixed: {text}, or 'none' "
            f"(default: {MIXED_STEP_DEFAULTS[name]})",
        )
    parser.add_argument(
        "--batch-patience",
        type=float,
        metavar="SECONDS",
        help="a batch request yields to interactive ones (they go first and may "
        "preempt it) for this long after it arrives; 0: arrival order (default: "
        f"{DEFAULT_BATCH_PATIENCE:g}; the server under mlx.launch: 0)",
    )
    parser.add_argument(
        "--speculative",
        choices=("ngram", NO_LIMIT),
        help="ngram: each decoding request drafts tokens by prompt lookup and the "
        "mixed step verifies them, same output (week 3 day 4; the default once the "
        "package has it, with the mixed policy); none: one token a step",
    )
    parser.add_argument(
        "--num-speculative-tokens",
        type=int,
        metavar="K",
        help="with --speculative ngram: the most draft tokens a request feeds a step "
        "(default: 4)",
    )
    parser.add_argument(
        "--prompt-lookup-max",
        type=int,
        metavar="N",
        help="with --speculative ngram: the longest run of last tokens looked up "
        "(default: 3)",
    )
    parser.add_argument(
        "--prompt-lookup-min",
        type=int,
        metavar="N",
        help="with --speculative ngram: the shortest run that counts (default: 1)",
    )
    parser.add_argument(
        "--jump-forward",
        choices=("on", "off"),
        help="on: a constrained request feeds the tokens its constraint forces (a "
        "JSON key, punctuation) as drafts, verified in the mixed step, same output "
        "(week 3 day 5; the default once the package has it, with the mixed policy)",
    )
    parser.add_argument(
        "--step-ahead",
        choices=("on", "off"),
        default="on",
        help="on: a decode forward starts before the step's tokens are read, so the "
        "engine's Python runs while the model computes (same tokens; not beside "
        "--speculative ngram); off: every step read before the next starts "
        "(default: on; bench-engine measures both)",
    )


# The draft options and their defaults (EngineConfig's).
DRAFT_OPTIONS = {
    "--num-speculative-tokens": 4,
    "--prompt-lookup-max": 3,
    "--prompt-lookup-min": 1,
}


def check_scheduling_options(args: argparse.Namespace) -> None:
    """Each limit given as an int of at least 1 or 'none' (then NO_LIMIT); the
    patience finite and >= 0. Before the slow imports: a bad value fails at once."""
    for option in STEP_LIMIT_OPTIONS:
        name = dest(option)
        value = getattr(args, name)
        if value is None:
            continue
        if value.strip().lower() == NO_LIMIT:
            setattr(args, name, NO_LIMIT)
            continue
        if not value.strip().isdigit() or int(value) < 1:
            fail(f"{option} must be a number of at least 1 or 'none', got {value!r}")
        setattr(args, name, int(value))
        if args.policy == "alternate":
            fail(f"{option} limits a mixed step: add --policy mixed, or leave it out")
    if (
        args.long_prefill_token_threshold == NO_LIMIT
        and args.long_prefill_attention_budget not in (None, NO_LIMIT)
    ):
        fail(
            "--long-prefill-attention-budget caps a long prompt's chunks, and with "
            "--long-prefill-token-threshold none no prompt is long: give a threshold, "
            "or leave the budget out"
        )
    if args.batch_patience is not None:
        require_finite("--batch-patience", args.batch_patience)
        if args.batch_patience < 0:
            fail(
                f"--batch-patience must be at least 0 seconds, got {args.batch_patience}"
            )
    given = [
        option for option in DRAFT_OPTIONS if getattr(args, dest(option)) is not None
    ]
    if given and (args.speculative == NO_LIMIT or args.policy == "alternate"):
        fail(
            f"{given[0]} sets how drafts are proposed, but "
            + (
                "--speculative none proposes none"
                if args.speculative == NO_LIMIT
                else "--policy alternate never drafts"
            )
            + f": leave {given[0]} out, or use --speculative ngram with --policy mixed"
        )
    for option, default in DRAFT_OPTIONS.items():
        if getattr(args, dest(option)) is None:
            setattr(args, dest(option), default)
    require_at_least(args, 1, *DRAFT_OPTIONS)
    if args.prompt_lookup_min > args.prompt_lookup_max:
        fail(
            f"--prompt-lookup-min ({args.prompt_lookup_min}) cannot pass "
            f"--prompt-lookup-max ({args.prompt_lookup_max})"
        )
    if args.speculative == "ngram" and args.policy == "alternate":
        fail("--speculative verifies drafts in a mixed step: add --policy mixed")
    if args.jump_forward == "on" and args.policy == "alternate":
        fail("--jump-forward feeds drafts in a mixed step: add --policy mixed")


def scheduling_settings(args: argparse.Namespace, policy: str, package) -> dict:
    """The Engine's keyword settings for the policy, the limits, the patience, the
    step ahead and speculation: a limit not given is MIXED_STEP_DEFAULTS' under the mixed policy and
    None under the alternate one; speculation is on under the mixed policy unless
    --speculative none (or the package has no week 3 day 4 yet), and jump-forward
    unless --jump-forward off (or no week 3 day 5 yet)."""
    patience = args.batch_patience
    settings = {
        "policy": policy,
        "batch_patience": DEFAULT_BATCH_PATIENCE if patience is None else patience,
        "step_ahead": args.step_ahead == "on",
    }
    for name, default in MIXED_STEP_DEFAULTS.items():
        value = getattr(args, name)
        if value is None:
            value = default if policy == "mixed" else None
        settings[name] = None if value == NO_LIMIT else value
    if settings["long_prefill_token_threshold"] is None:  # no prompt is long
        settings["long_prefill_attention_budget"] = None
    if args.speculative == "ngram" or (
        args.speculative is None and policy == "mixed" and has_speculation(package)
    ):
        settings.update(
            speculative="ngram",
            num_speculative_tokens=args.num_speculative_tokens,
            prompt_lookup_max=args.prompt_lookup_max,
            prompt_lookup_min=args.prompt_lookup_min,
        )
    if args.jump_forward == "on" or (
        args.jump_forward is None and policy == "mixed" and has_jump_forward(package)
    ):
        settings["jump_forward"] = True
    return settings


def has_built(package, probe, missing: str) -> bool:
    """Does probe(package) run, that is, has the learner built the day it needs?
    When not, says on stderr that the package has no `missing`."""
    try:
        probe(package)
    except NotImplementedError:
        print(f"{package.__name__}: no {missing}", file=sys.stderr)
        return False
    return True


def has_speculation(package) -> bool:
    """Has the package week 3 day 4 (prompt lookup runs)?"""
    return has_built(
        package,
        lambda p: p.find_drafts([1, 1], 1, 1, 1),
        "speculative decoding (week 3 day 4)",
    )


def has_jump_forward(package) -> bool:
    """Has the package week 3 day 5's forced text (Dfa.forced_text runs)?"""
    return has_built(
        package,
        lambda p: p.compile_choices(["a"]).forced_text(0, 1),
        "jump-forward (week 3 day 5)",
    )


def newest_policy(package, asked: str | None) -> str:
    """The policy to run: `asked` if given, else "mixed" when `package` has week 3
    day 1 (its MixedPolicy's plan and step limits run) and "alternate" when not yet
    (said on stderr)."""
    if asked is not None:
        return asked
    from types import SimpleNamespace

    try:
        planner = package.Planner(package.EngineConfig(policy="mixed"), kv=None)
        policy = package.MixedPolicy(planner)
        policy.plan()
        policy.chunk_limit(SimpleNamespace(prefill_tokens=[], offset=0), 1)
    except NotImplementedError:
        print(
            f"{package.__name__}: policy alternate (the mixed step is week 3 day 1)",
            file=sys.stderr,
        )
        return "alternate"
    return "mixed"


def kv_cache_line(
    metrics,
    model,
    batch_size: int,
    max_seq_len: int,
    kv_memory: int | None = None,
    num_blocks: int | None = None,
    source: str | None = None,
    kv_dtype: str = "float32",
) -> str:
    """How many tokens the engine's KV cache holds, said once it is built: a paged
    pool's budget in bytes, tokens and blocks (from the engine's `metrics`), or a
    dense cache's batch_size x max_seq_len. The bytes a token are the model's, at
    kv_dtype (a quantized pool's are fewer, so the same budget holds more tokens).
    source: what sized the pool, when not kv_memory, num_blocks or the default."""
    from tiny_llm_base.memory import format_bytes, kv_bytes_per_token, tokens_by_dtype

    per_token = kv_bytes_per_token(model, kv_dtype)
    at = f" at {per_token:,} bytes a token" if per_token else ""
    if metrics.kv_blocks_total:
        blocks, size = metrics.kv_blocks_total, metrics.kv_block_size
        tokens = blocks * size
        fits = tokens_by_dtype(model, kv_memory or tokens * (per_token or 0), size)
        if kv_dtype != "float32":
            at += f" ({kv_dtype}"
            if fits.get("float32"):
                at += f": {tokens / fits['float32']:.1f}x float32's {fits['float32']:,}"
            at += ")"
        if kv_memory is not None:
            budget = f"budget {format_bytes(kv_memory)} = "
        elif per_token:
            source = source or (
                "--num-blocks" if num_blocks else "half the available memory"
            )
            budget = f"budget {format_bytes(tokens * per_token)} ({source}) = "
        else:
            budget = ""
        return (
            f"KV cache: paged, {budget}{tokens:,} tokens ({blocks:,} blocks of "
            f"{size}){at}; the pool grows as it is used"
        )
    tokens = metrics.kv_dense_tokens or batch_size * max_seq_len
    full = f" ({format_bytes(tokens * per_token)} when full)" if per_token else ""
    return (
        f"KV cache: dense, batch_size x max_seq_len = {batch_size} x {max_seq_len} "
        f"= {tokens:,} tokens{at}{full}"
    )


def require_model_name(name: str | None) -> None:
    if name is not None and not name.strip():
        fail(
            "--model is empty: give a model folder or a Hub repo id, or leave --model "
            "out for the embedded model"
        )


def note_slow_blas() -> None:
    """One line on stderr when float32 matmul runs on MLX's slow reference BLAS."""
    from tiny_llm_base.device import gpu_paths
    from tiny_llm_base.fast_blas import STATUS

    if STATUS.hint and not gpu_paths():
        print(f"note: {STATUS.hint}", file=sys.stderr)


def context_length(mlx_model) -> int:
    """The positions the model was trained for: its config's max_position_embeddings."""
    from tiny_llm_base import DEFAULT_MAX_SEQ_LEN

    return getattr(mlx_model.args, "max_position_embeddings", None) or (
        DEFAULT_MAX_SEQ_LEN
    )


class ModelProgress:
    """Renders load_model's progress(stage, done, total) reports on stderr: tqdm bars
    on a terminal; in a pipe or a log, where bars come out as noise, one line a stage.
    """

    def __init__(self) -> None:
        self.bars: dict[str, tqdm] = {}
        self.plain = not sys.stderr.isatty()
        self.said: set[str] = set()

    def __call__(self, stage: str, done: int, total: int) -> None:
        if stage in ("rebuild", "replace-file", "wait"):
            print(self.announcement(stage), file=sys.stderr)
            return
        if self.plain:
            if stage not in self.said:
                self.said.add(stage)
                print(self.plain_line(stage, total), file=sys.stderr, flush=True)
            return
        if stage not in self.bars:
            unit = "B" if stage == "verify" else "tensor"
            self.bars[stage] = tqdm(
                total=total,
                desc=STAGES.get(stage, stage),
                unit=unit,
                unit_scale=stage == "verify",
                leave=False,
            )
        bar = self.bars[stage]
        bar.update(done - bar.n)

    @staticmethod
    def plain_line(stage: str, total: int) -> str:
        if stage == "verify":
            return f"{STAGES[stage]} ({total / 1e6:.0f} MB)"
        if stage == "convert":
            from tiny_llm_base.embedded_model import MODEL_DIR_NAME, default_models_dir

            folder = default_models_dir() / MODEL_DIR_NAME
            return (
                f"{STAGES[stage]} into {folder} ({total} tensors): once, on first use"
            )
        return STAGES.get(stage, stage)

    @staticmethod
    def announcement(stage: str) -> str:
        from tiny_llm_base.embedded_model import MODEL_DIR_NAME, default_models_dir

        folder = default_models_dir() / MODEL_DIR_NAME
        if stage == "rebuild":
            return (
                f"the converted model folder {folder} is incomplete, damaged or from "
                "an older tiny-llm: rebuilding it"
            )
        if stage == "replace-file":
            return f"{folder} is a file, not the converted model folder: replacing it"
        return (
            f"another process is converting the embedded model into {folder}: waiting"
        )

    def __enter__(self) -> "ModelProgress":
        return self

    def __exit__(self, *exc) -> None:
        for bar in self.bars.values():
            bar.close()


def load_model_or_exit(name: str | None):
    """load_model with progress bars; a model that cannot be loaded exits with status 1."""
    from tiny_llm_base import EmbeddedModelError, ModelLoadError, load_model

    try:
        with ModelProgress() as progress:
            return load_model(name, progress=progress)
    except (ModelLoadError, EmbeddedModelError) as error:
        fail(str(error), status=1)


def build_model(package, mlx_model, kind: str):
    """`package`'s model of `kind` (a MODEL_KINDS key), after one token through it.

    The token raises NotImplementedError where the learner has not written that day
    yet, and dequantizes the lazily loaded weights before anything is timed.
    """
    import mlx.core as mx

    token = mx.array([[0]])
    if kind == "week1":
        model = package.Qwen2ModelWeek1(mlx_model)
        mx.eval(model(token))
    else:
        fast = kind == "week2-fast"
        model = package.Qwen2ModelWeek2(mlx_model, use_fast_kernels=fast)
        mx.eval(model(token, 0, model.create_kv_cache()))
    return model


def newest_model(package, mlx_model, kinds: list[str]):
    """(model, kind) for the first of `kinds` that `package` runs; says which on stderr.

    Exits with status 1 and the last NotImplementedError when none runs yet.
    """
    for kind in kinds:
        try:
            model = build_model(package, mlx_model, kind)
        except NotImplementedError as error:
            if kind == kinds[-1]:
                fail(f"not implemented yet in src/tiny_llm: {error}", status=1)
            continue
        print(f"{package.__name__}: {MODEL_KINDS[kind]}", file=sys.stderr)
        return model, kind


def newest_kv_cache(
    package, asked: str | None, prefix_caching: bool = True
) -> tuple[str, bool]:
    """(KV cache, prefix caching) to run: the KV cache `asked` if given, else "paged"
    when `package` has built week 3 day 2's block pool and "dense" when not yet;
    prefix caching as asked where the package has week 3 day 3's lookup. A
    fallback is said on stderr."""
    try:
        pool = package.BlockPool(1, 1)
    except NotImplementedError:
        if asked is None:
            print(
                f"{package.__name__}: dense KV cache (the paged one is week 3 day 2)",
                file=sys.stderr,
            )
            return "dense", False
        return asked, prefix_caching
    kv_cache = asked or "paged"
    if kv_cache == "paged" and prefix_caching:
        try:
            pool.lookup([])
        except NotImplementedError:
            print(
                f"{package.__name__}: no prefix caching (it is week 3 day 3)",
                file=sys.stderr,
            )
            return kv_cache, False
    return kv_cache, prefix_caching


def read_piped_stdin() -> str | None:
    """The text on standard input when it is a pipe or a redirected file, else None.

    A terminal, /dev/null or a closed stdin is not read: `pdm run main` alone must
    not wait for input nobody is going to type.
    """
    try:
        mode = os.fstat(sys.stdin.fileno()).st_mode
    except (OSError, ValueError, AttributeError):
        return None
    if not (stat.S_ISFIFO(mode) or stat.S_ISREG(mode)):
        return None
    return read_stdin()


def read_stdin() -> str:
    try:
        return sys.stdin.buffer.read().decode("utf-8")
    except UnicodeDecodeError:
        fail("standard input is not UTF-8 text")


def step_time(metrics) -> str:
    """The mixed policy's average step time, or the alternate policy's chunk time
    (its moving average), for the engine log line."""
    if metrics.mixed_steps:
        return f"step avg: {1000 * metrics.mixed_seconds / metrics.mixed_steps:.0f} ms"
    return f"chunk avg: {1000 * metrics.chunk_time_average:.0f} ms"


class EngineLog:
    """Every LOG_INTERVAL seconds, one line of throughput over the interval and queue
    sizes, in the style of vLLM's engine log."""

    def __init__(self, write) -> None:
        self.write = write
        self.last_time = time.perf_counter()
        self.last_prompt_tokens = 0
        self.last_generated_tokens = 0

    def update(self, snapshot, force: bool = False) -> None:
        now = time.perf_counter()
        elapsed = now - self.last_time
        if elapsed < LOG_INTERVAL and not force:
            return
        metrics = snapshot.metrics
        prompt_rate = (metrics.prefill_tokens - self.last_prompt_tokens) / elapsed
        generation_rate = (
            metrics.generated_tokens - self.last_generated_tokens
        ) / elapsed
        self.write(
            f"Avg prompt throughput: {prompt_rate:.1f} tokens/s, "
            f"Avg generation throughput: {generation_rate:.1f} tokens/s, "
            f"Running: {metrics.running} reqs, Waiting: {metrics.waiting} reqs, "
            f"Finished: {snapshot.finished}/{snapshot.total}, "
            f"{step_time(metrics)}, "
            f"longest stall: {1000 * metrics.longest_decode_stall:.0f} ms"
        )
        self.last_time = now
        self.last_prompt_tokens = metrics.prefill_tokens
        self.last_generated_tokens = metrics.generated_tokens
