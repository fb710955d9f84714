"""Chat once with a model through the course's hand-written Qwen2.

pdm run main --prompt "What is the capital of France?"
pdm run main --solution learner --loader week2
pdm run main --solution mlx          # mlx-lm's own model, for comparison
"""

import argparse
import importlib
import sys
import time

import tiny_llm_ref  # first: loads the fast BLAS before mlx.core
from scripts.cli import fail, load_model_or_exit

DEFAULT_PROMPT = "Give me a short introduction to large language models."


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="Generate with tiny-llm.")
    parser.add_argument(
        "--model", help="local model folder or Hub repo id (default: embedded SmolLM2)"
    )
    parser.add_argument("--prompt", default=DEFAULT_PROMPT)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--temp", type=float, default=0.0)
    parser.add_argument("--top-p", type=float, default=1.0)
    parser.add_argument("--top-k", type=int, default=None)
    parser.add_argument("--solution", default="ref", help="ref | learner | mlx")
    parser.add_argument(
        "--loader", default="week1", help="week1 (no cache) | week2 (KV cache)"
    )
    parser.error = fail
    args = parser.parse_args()
    if not args.prompt.strip():
        fail("--prompt is empty: give the model something to answer")
    if args.max_tokens < 1:
        fail(f"--max-tokens must be at least 1, got {args.max_tokens}")
    if args.solution not in ("ref", "learner", "mlx"):
        fail(f"unknown --solution {args.solution!r}: choose ref, learner or mlx")
    if args.loader not in ("week1", "week2"):
        fail(f"unknown --loader {args.loader!r}: choose week1 or week2")
    return args


def main() -> None:
    args = parse_args()
    try:
        sampler = tiny_llm_ref.make_sampler(args.temp, args.top_p, args.top_k)
    except ValueError as error:
        fail(str(error))
    mlx_model, tokenizer = load_model_or_exit(args.model)

    if args.solution == "mlx":
        stats = generate_with_mlx_lm(mlx_model, tokenizer, args, sampler)
    else:
        package = importlib.import_module(
            "tiny_llm" if args.solution == "learner" else "tiny_llm_ref"
        )
        try:
            stats = generate_with_course(package, mlx_model, tokenizer, args, sampler)
        except NotImplementedError as error:
            fail(f"not implemented yet in src/tiny_llm: {error}", status=1)
    prompt_tokens, prompt_tps, gen_tokens, gen_tps = stats
    print(
        f"\n\nprompt: {prompt_tokens} tokens, {prompt_tps:.1f} tokens/s | "
        f"generation: {gen_tokens} tokens, {gen_tps:.1f} tokens/s",
        file=sys.stderr,
    )


def print_text(segment: str) -> None:
    print(segment, end="", flush=True)


def generate_with_course(package, mlx_model, tokenizer, args, sampler):
    """Time the sampler's calls: the first one ends the prefill, each one is a token."""
    sample_times = []

    def timed_sampler(logprobs):
        token = sampler(logprobs)
        token.item()
        sample_times.append(time.perf_counter())
        return token

    if args.loader == "week1":
        model = package.Qwen2ModelWeek1(mlx_model)
        generate = package.simple_generate
    else:
        model = package.Qwen2ModelWeek2(mlx_model)
        generate = package.simple_generate_with_kv_cache
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
