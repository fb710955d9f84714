"""Chat once with a model through the course's hand-written Qwen2.

pdm run main --prompt "What is the capital of France?"
echo "Why is the sky blue?" | pdm run main
pdm run main --solution learner      # the newest model src/tiny_llm can run
pdm run main --solution mlx          # mlx-lm's own model, for comparison

By default the week 2 model answers, with its KV cache and mx.fast kernels. With
--solution learner, main tries the week 2 model with fast kernels, then with the
hand-written ones, then the week 1 model, and says on stderr which one answers;
--loader picks one.
"""

from scripts.commands.interrupt import exit_on_interrupt, unwind_on_interrupt

exit_on_interrupt()  # first: Ctrl-C during the imports below never shows a traceback

import argparse  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402

import tiny_llm_base  # noqa: E402  (before mlx.core: loads the fast BLAS)

from scripts.commands.solution import (  # noqa: E402
    add_solution_option,
    check_solution,
    not_written_yet,
    solution_package,
)
from scripts.commands.cli import (  # noqa: E402
    fail,
    fail_with_options,
    option_parser,
    read_piped_stdin,
    read_stdin,
    require_at_least,
    require_finite,
    require_model_name,
)
from scripts.commands.model_loading import (  # noqa: E402
    MODEL_KINDS,
    context_length,
    load_model_or_exit,
    newest_model,
    note_slow_blas,
)

DEFAULT_PROMPT = "Give me three tips for a good night's sleep."


def parse_args() -> argparse.Namespace:
    parser = option_parser("Generate with tiny-llm.")
    parser.add_argument(
        "--model", help="local model folder or Hub repo id (default: embedded SmolLM2)"
    )
    parser.add_argument(
        "--prompt",
        help="the question; '-' reads it from standard input, as does a pipe or a "
        "redirected file when --prompt is left out",
    )
    parser.add_argument(
        "--max-tokens",
        type=int,
        default=128,
        help="the most tokens to generate; the answer may end sooner (default: 128)",
    )
    parser.add_argument(
        "--temp",
        type=float,
        default=0.0,
        help="sampling temperature: 0 always takes the likeliest token (greedy, the "
        "default), higher values pick more varied ones",
    )
    parser.add_argument(
        "--top-p",
        type=float,
        default=1.0,
        help="with --temp above 0: sample only from the likeliest tokens whose "
        "probabilities add up to this, in (0, 1] (default: 1, every token)",
    )
    parser.add_argument(
        "--top-k",
        type=int,
        default=None,
        help="with --temp above 0: sample only from the K likeliest tokens "
        "(default: no limit)",
    )
    add_solution_option(parser, extra=("mlx",))
    parser.add_argument(
        "--loader",
        default="auto",
        help="auto (the newest that runs) | week2-fast | week2 | week1",
    )
    args = parser.parse_args()
    require_model_name(args.model)
    require_at_least(args, 1, "--max-tokens")
    require_finite("--temp", args.temp)
    require_finite("--top-p", args.top_p)
    if args.temp < 0:
        fail(f"--temp must be a number >= 0 (0 means greedy), got {args.temp}")
    if not 0 < args.top_p <= 1:
        fail(f"--top-p must be in (0, 1] (1 keeps every token), got {args.top_p}")
    if args.top_k is not None and args.top_k < 1:
        fail(
            f"--top-k must be at least 1 (leave it out for no limit), got {args.top_k}"
        )
    check_solution(args, extra=("mlx",))
    if args.loader not in ("auto", *MODEL_KINDS):
        fail(f"unknown --loader {args.loader!r}: choose auto, {', '.join(MODEL_KINDS)}")
    args.prompt = read_prompt(args.prompt)
    return args


def read_prompt(option: str | None) -> str:
    """--prompt, else standard input when piped (or with `--prompt -`), else the default."""
    if option == "-":
        prompt, source = read_stdin(), "standard input"
    elif option is None:
        prompt, source = read_piped_stdin(), "standard input"
        if prompt is None:
            return DEFAULT_PROMPT
    else:
        prompt, source = option, "--prompt"
    if not prompt.strip():
        fail(f"the prompt on {source} is empty: give the model something to answer")
    return prompt.strip()


def main() -> None:
    unwind_on_interrupt()  # the imports are done
    args = parse_args()
    sampler = make_sampler(args)
    note_slow_blas()
    mlx_model, tokenizer = load_model_or_exit(args.model)
    check_context_length(mlx_model, tokenizer, args)

    if args.solution == "mlx":
        stats = generate_with_mlx_lm(mlx_model, tokenizer, args, sampler)
    else:
        package = solution_package(args.solution)
        kinds = list(MODEL_KINDS) if args.loader == "auto" else [args.loader]
        try:
            model, kind = newest_model(package, mlx_model, kinds)
            generate = (
                package.simple_generate
                if kind == "week1"
                else package.simple_generate_with_kv_cache
            )
            stats = generate_with_course(generate, model, tokenizer, args, sampler)
        except NotImplementedError as error:
            not_written_yet(error)
        except ValueError as error:  # a model the hand-written code does not support
            fail(str(error), status=1)
    prompt_tokens, prompt_tps, gen_tokens, gen_tps = stats
    print(
        f"\n\nprompt: {prompt_tokens} tokens, {prompt_tps:.1f} tokens/s | "
        f"generation: {gen_tokens} tokens, {gen_tps:.1f} tokens/s",
        file=sys.stderr,
    )


def make_sampler(args):
    """The sampler of --solution's package (mlx-lm's for mlx). Greedy needs no day
    written: --temp 0 takes the likeliest token whatever the package has."""
    if args.solution == "mlx":
        from mlx_lm.sample_utils import make_sampler as mlx_lm_sampler

        return mlx_lm_sampler(args.temp, args.top_p, top_k=args.top_k or 0)
    if args.temp == 0:
        return tiny_llm_base.greedy
    try:
        return solution_package(args.solution).make_sampler(
            args.temp, args.top_p, args.top_k
        )
    except ValueError as error:
        fail_with_options(error, ("--temp", "--top-p", "--top-k"))
    except NotImplementedError as error:
        not_written_yet(error)


def check_context_length(mlx_model, tokenizer, args) -> None:
    """The prompt and every token generated after it need a position the model knows."""
    limit = context_length(mlx_model)
    prompt_tokens = len(chat_prompt(tokenizer, args.prompt))
    if prompt_tokens + args.max_tokens > limit:
        fail(
            f"the prompt ({prompt_tokens} tokens) plus --max-tokens {args.max_tokens} "
            f"needs {prompt_tokens + args.max_tokens} positions, beyond the model's "
            f"context of {limit} (max_position_embeddings): shorten the prompt or "
            "lower --max-tokens"
        )


def print_text(segment: str) -> None:
    print(segment, end="", flush=True)


def generate_with_course(generate, model, tokenizer, args, sampler):
    """Time the sampler's calls: the first one ends the prefill, each one is a token."""
    sample_times = []

    def timed_sampler(logprobs):
        token = sampler(logprobs)
        token.item()
        sample_times.append(time.perf_counter())
        return token

    start = time.perf_counter()
    generate(model, tokenizer, args.prompt, timed_sampler, args.max_tokens, print_text)
    prompt_tokens = len(chat_prompt(tokenizer, args.prompt))
    prefill_s = sample_times[0] - start
    decode_s = sample_times[-1] - sample_times[0]
    gen_tokens = len(sample_times)
    return (
        prompt_tokens,
        prompt_tokens / prefill_s,
        gen_tokens,
        (gen_tokens - 1) / decode_s if decode_s else 0.0,
    )


def generate_with_mlx_lm(mlx_model, tokenizer, args, sampler):
    import mlx_lm

    response = None
    for response in mlx_lm.stream_generate(
        mlx_model,
        tokenizer,
        chat_prompt(tokenizer, args.prompt),
        max_tokens=args.max_tokens,
        sampler=sampler,
    ):
        print_text(response.text)
    return (
        response.prompt_tokens,
        response.prompt_tps,
        response.generation_tokens,
        response.generation_tps,
    )


def chat_prompt(tokenizer, prompt: str) -> list[int]:
    return tokenizer.apply_chat_template(
        [{"role": "user", "content": prompt}], add_generation_prompt=True
    )


if __name__ == "__main__":
    main()
