"""Train a draft head for the model (week 4 day 3): `pdm run train-drafter`.

pdm run train-drafter                  # the full recipe: writes the shipped head
pdm run train-drafter --quick          # minutes: a small run, to models/draft-heads/
pdm run train-drafter --solution learner --out my-head.safetensors

1. The model answers the training prompts (drafter_prompts.py; the benchmark's
   open questions are not among them), greedy, through your batch_generate.
2. One forward over each prompt and answer gives the hidden states
   (hidden_states); the draft vocabulary is the answers' most common tokens
   (draft_vocabulary); one prompt in ten is held out.
3. train_head on the examples, then the held-out acceptance: the share of
   positions whose first draft, and first two drafts, the model itself produced.

Prints the figures (tokens of data, minutes per stage, final loss, held-out
acceptance) and writes them as JSON beside the head, with a plot of the loss.
"""

from scripts.commands.interrupt import exit_on_interrupt

exit_on_interrupt()  # first: Ctrl-C during the imports below never shows a traceback

import argparse  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import tiny_llm_base  # noqa: E402, F401  (before mlx.core: the fast BLAS)
import mlx.core as mx  # noqa: E402
from tqdm import tqdm  # noqa: E402

from scripts.bench.benchlib.record import out_path, unwritable  # noqa: E402
from scripts.commands.cli import fail, require_at_least  # noqa: E402
from scripts.commands.drafter_prompts import training_prompts  # noqa: E402
from scripts.commands.model_loading import load_model_or_exit  # noqa: E402
from scripts.commands.solution import (  # noqa: E402
    add_solution_option,
    check_solution,
    not_written_yet,
    solution_package,
)
from tiny_llm_base.draft_heads import EMBEDDED_HEAD  # noqa: E402

# prompts, max_tokens, epochs: the full recipe and --quick's
RECIPES = {False: (478, 192, 16), True: (48, 64, 3)}
QUICK_OUT = Path("models/draft-heads/quick.safetensors")
VOCAB, HIDDEN, SEED = 4096, 1536, 0
GENERATE_BATCH = 32


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="a small run in minutes")
    parser.add_argument("--model", help="a model folder (default: the embedded one)")
    parser.add_argument("--out", type=out_path, help="where the head goes")
    parser.add_argument("--prompts", type=int, help="training prompts")
    parser.add_argument("--max-tokens", type=int, help="tokens an answer may have")
    parser.add_argument("--epochs", type=int, help="passes over the examples")
    parser.add_argument("--vocab", type=int, default=VOCAB, help="draft vocabulary")
    parser.add_argument("--hidden", type=int, default=HIDDEN, help="the MLP's width")
    add_solution_option(parser)
    args = parser.parse_args()
    check_solution(args)
    recipe = zip(("prompts", "max_tokens", "epochs"), RECIPES[args.quick])
    for name, default in recipe:
        if getattr(args, name) is None:
            setattr(args, name, default)
    require_at_least(args, 1, "--max-tokens", "--epochs", "--vocab", "--hidden")
    if args.prompts < 10:
        fail("--prompts must be at least 10: one in ten is held out")
    if args.out is None:
        args.out = QUICK_OUT if args.quick or args.model else EMBEDDED_HEAD
    problem = unwritable(args.out, "head.safetensors")
    if problem:
        fail(problem)
    return args


def answer(tiny, model, tokenizer, prompts: list[str], max_tokens: int) -> list:
    """Each prompt's chat-templated ids and the model's greedy answer."""
    ids = [
        tokenizer.apply_chat_template(
            [{"role": "user", "content": p}], add_generation_prompt=True
        )
        for p in prompts
    ]
    bar = tqdm(total=len(ids), desc="answers", unit="prompt")

    def on_step(snapshot) -> None:
        bar.update(snapshot.finished - bar.n)

    results = tiny.batch_generate(
        model,
        tokenizer,
        ids,
        batch_size=GENERATE_BATCH,
        max_tokens=max_tokens,
        max_seq_len=max(map(len, ids)) + max_tokens + 1,
        policy="mixed",
        on_step=on_step,
    )
    bar.close()
    return ids, [r.tokens for r in results]


def plot_loss(losses: list[float], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(6, 3.5))
    axes.plot(range(1, len(losses) + 1), losses, marker="o")
    axes.set_xlabel("epoch")
    axes.set_ylabel("mean training loss")
    axes.set_title("draft head training")
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def main() -> int:
    args = parse_args()
    tiny = solution_package(args.solution)
    mx.random.seed(SEED)
    mlx_model, tokenizer = load_model_or_exit(args.model)
    clock = {"start": time.perf_counter()}

    def lap(name: str) -> None:
        now = time.perf_counter()
        clock[name] = (now - clock.pop("last", clock["start"])) / 60
        clock["last"] = now

    try:
        model = tiny.Qwen2ModelWeek2(
            mlx_model, weights="float32", use_fast_kernels=True
        )
        prompts, answers = answer(
            tiny, model, tokenizer, training_prompts(args.prompts), args.max_tokens
        )
        lap("answers")
        sequences = [p + a for p, a in zip(prompts, answers)]
        held = len(sequences) // 10
        train = slice(0, len(sequences) - held)
        test = slice(len(sequences) - held, None)
        vocab = tiny.draft_vocabulary(answers[train], args.vocab)
        head = tiny.DraftHead.for_model(model, vocab, args.hidden)
        hidden = []
        for start in tqdm(range(0, len(sequences), 8), desc="hidden states"):
            hidden += tiny.hidden_states(model, sequences[start : start + 8])
        lengths = [len(p) for p in prompts]
        examples = {
            name: tiny.draft_examples(
                head, sequences[part], lengths[part], hidden[part]
            )
            for name, part in (("train", train), ("held out", test))
        }
        lap("hidden states")
        batches = -(-len(examples["train"]) // 256) * args.epochs
        bar = tqdm(total=batches, desc="training", unit="batch")

        def on_batch(done: int, loss: float) -> None:
            bar.update(done - bar.n)
            bar.set_postfix(loss=f"{loss:.3f}")

        losses = tiny.train_head(
            head, examples["train"], args.epochs, on_batch=on_batch
        )
        bar.close()
        lap("training")
        first, both = tiny.acceptance(head, examples["held out"])
    except NotImplementedError as error:
        not_written_yet(error)
    tiny.save_draft_head(head, args.out)
    record = {
        "prompts": len(prompts),
        "answer_tokens": sum(map(len, answers)),
        "train_examples": len(examples["train"]),
        "held_out_examples": len(examples["held out"]),
        "draft_vocabulary": len(vocab),
        "epochs": args.epochs,
        "minutes": {
            k: round(v, 2) for k, v in clock.items() if k not in ("start", "last")
        },
        "final_loss": round(losses[-1], 4),
        "held_out_first_draft": round(first, 3),
        "held_out_two_drafts": round(both, 3),
        "head": os.path.relpath(args.out),
    }
    record["minutes"]["total"] = round(sum(record["minutes"].values()), 2)
    args.out.with_suffix(".json").write_text(json.dumps(record, indent=2) + "\n")
    plot_loss(losses, args.out.with_suffix(".png"))
    print(json.dumps(record, indent=2))
    print(f"wrote {args.out} (and its .json, .png)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
