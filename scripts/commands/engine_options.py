"""The engine's options, shared by batch-main and serve: the KV cache's memory and
dtype, the policy and the mixed step's limits, speculation, and the prefill step and
token budget; each checked into one `error:` line before the slow imports."""

import argparse

from scripts.commands.cli import dest, fail, require_at_least, require_finite
from scripts.commands.probes import has_jump_forward, has_speculation

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
        choices=("ngram", "learned", NO_LIMIT),
        help="ngram: each decoding request drafts tokens by prompt lookup and the "
        "mixed step verifies them, same output (week 3 day 4; the default once the "
        "package has it, with the mixed policy); learned: prompt lookup of runs of "
        "2 tokens or more, else a draft head's guesses (week 4 day 3; --draft-head); "
        "none: one token a step",
    )
    parser.add_argument(
        "--draft-head",
        metavar="PATH",
        help="with --speculative learned: the head's file (default: the embedded "
        "model's shipped head; pdm run train-drafter makes one)",
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
    if args.speculative in ("ngram", "learned") and args.policy == "alternate":
        fail("--speculative verifies drafts in a mixed step: add --policy mixed")
    if args.draft_head is not None and args.speculative != "learned":
        fail(
            "--draft-head drafts with --speculative learned: add it, or leave the head out"
        )
    if args.jump_forward == "on" and args.policy == "alternate":
        fail("--jump-forward feeds drafts in a mixed step: add --policy mixed")


def scheduling_settings(
    args: argparse.Namespace, policy: str, package, model=None
) -> dict:
    """The Engine's keyword settings for the policy, the limits, the patience, the
    step ahead and speculation: a limit not given is MIXED_STEP_DEFAULTS' under the
    mixed policy and None under the alternate one; speculation is on under the
    mixed policy unless --speculative none (or the package has no week 3 day 4 yet),
    and jump-forward unless --jump-forward off (or no week 3 day 5 yet). With
    --speculative learned, the draft head (--draft-head, or the embedded model's)
    loaded onto `model`: one error line when it is missing or another model's."""
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
    if args.speculative == "learned":
        settings["draft_head"] = load_head(package, model, args.draft_head)
    if args.speculative in ("ngram", "learned") or (
        args.speculative is None and policy == "mixed" and has_speculation(package)
    ):
        settings.update(
            speculative=args.speculative or "ngram",
            num_speculative_tokens=args.num_speculative_tokens,
            prompt_lookup_max=args.prompt_lookup_max,
            prompt_lookup_min=args.prompt_lookup_min,
        )
    if args.jump_forward == "on" or (
        args.jump_forward is None and policy == "mixed" and has_jump_forward(package)
    ):
        settings["jump_forward"] = True
    return settings


# The options that set an engine argument of the same name in both batch-main and
# serve: an engine's error names them as typed (each command adds its own).
ENGINE_OPTIONS = (
    "--batch-size",
    "--max-seq-len",
    "--prefill-step",
    "--token-budget",
    "--kv-cache",
    "--block-size",
    "--kv-memory",
    "--kv-dtype",
    *STEP_LIMIT_OPTIONS,
    "--batch-patience",
)


def parse_prefill_step(value: str) -> int | None:
    """--prefill-step: tokens per chunk, or None for 'none' (whole prompts)."""
    if value.strip().lower() == "none":
        return None
    try:
        step = int(value)
    except ValueError:
        fail(f"--prefill-step must be a number of tokens or 'none', got {value!r}")
    if step < 1:
        fail(f"--prefill-step must be at least 1 (or 'none'), got {step}")
    return step


def parse_token_budget(args: argparse.Namespace) -> int | None:
    """batch-main's --token-budget ('none': no limit): a mixed step's budget, with
    room for one decode token per slot and a prefill token. (serve's is an int the
    engine checks.)"""
    if args.token_budget is None or args.token_budget.strip().lower() == "none":
        return None
    if args.policy == "alternate":
        fail("--token-budget limits a mixed step: add --policy mixed")
    try:
        budget = int(args.token_budget)
    except ValueError:
        fail(f"--token-budget must be a number of tokens, got {args.token_budget!r}")
    if budget <= args.batch_size:
        fail(
            f"--token-budget must be more than --batch-size ({args.batch_size}): each "
            f"step runs one decode token per slot and needs room for a prompt token, "
            f"got {budget}"
        )
    return budget


def load_head(package, model, path: str | None):
    """The draft head at `path` (default: the embedded model's shipped head) on
    `model`; one error line when it cannot be had."""
    from tiny_llm_base.draft_heads import EMBEDDED_HEAD

    try:
        return package.load_draft_head(model, path or EMBEDDED_HEAD)
    except (FileNotFoundError, ValueError) as error:
        fail(str(error))
    except NotImplementedError as error:
        fail(f"not implemented yet in src/tiny_llm: {error}", status=1)
