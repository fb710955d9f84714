"""Draw the book's concept figures: `python -m scripts.tools.draw_figures`.

Pictures of ideas, drawn with matplotlib alone (Agg, no network) from the reference
code's rules, named in a comment above each function (scripts/tools/figures/, one
module per week's ideas). Into book/src/images (--out):

- concept-fast-paths.png: fast_exp's bits and cpu_attention's blocks (week 2 day 3).
- concept-step-ahead.png: the engine's steps in sequence and a step ahead (week 2
  day 6's given step_ahead.py, and the mixed step's decode-only steps).
- concept-continuous-batching.png: static against continuous batching (week 2 day 6).
- concept-chunked-prefill.png: whole prompts against chunks (week 2 day 7).
- concept-mixed-step.png: one mixed forward, and the alternate policy (week 3 day 1).
- concept-latency-sharing.png: a chat's first token beside a long prompt (week 3 day 1).
- concept-block-table.png: block tables into a pool of KV blocks (week 3 day 2).
- concept-prefix-cache.png: full blocks named by a hash chain, shared (week 3 day 3).
- concept-draft-verification.png: prompt-lookup drafts checked in one forward (day 4).
- concept-dfa-token-index.png: a regex's DFA and one state's token index (day 5).
- concept-tensor-parallel.png: one block over 2 ranks, two all_sums (week 4 day 1).
- concept-tool-calls.png: an answer's grammar under tool_choice (week 4 day 2).
- concept-learned-drafter.png: a draft head's k calls on the model's hidden state
  (week 4 day 3).
"""

import argparse
from pathlib import Path

from scripts.tools.figures.week2 import fast_paths, step_ahead
from scripts.tools.figures.week2_engine import chunked_prefill, continuous_batching
from scripts.tools.figures.week3_batching import (
    block_table,
    latency_sharing,
    mixed_step,
    prefix_cache,
)
from scripts.tools.figures.week3_decoding import dfa_token_index, draft_verification
from scripts.tools.figures.week4 import learned_drafter, tensor_parallel, tool_calls

ROOT = Path(__file__).resolve().parents[2]
FIGURES = [
    fast_paths,
    step_ahead,
    continuous_batching,
    chunked_prefill,
    mixed_step,
    latency_sharing,
    block_table,
    prefix_cache,
    draft_verification,
    dfa_token_index,
    tensor_parallel,
    tool_calls,
    learned_drafter,
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "book/src/images")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    for draw in FIGURES:
        print(draw(args.out))


if __name__ == "__main__":
    main()
