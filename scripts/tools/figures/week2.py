"""Week 2's concept figures: the CPU fast paths and the step ahead."""

from pathlib import Path

from scripts.tools.figures.sketch import (
    BLUE,
    GREEN,
    GREY,
    INK,
    ORANGE,
    RED,
    TEXT,
    Sketch,
)


# cpu_kernels.py: fast_exp: x clipped to [-127 ln2, 128 ln2], n = round(x / ln2) by
# adding and subtracting ROUND_TO_INTEGER, 2^n as the float32 bits (n + 127) << 23
# read with mx.view (which ends a compiled loop), n again from the bits, e^g's Taylor
# polynomial of degree 6. cpu_attention: a causal chunk of L = 1024 queries in blocks
# of QUERY_BLOCK = 128, each attend_block against the keys its last query sees,
# scores k @ q^T (keys down the rows), the mask written over the last n - 1 keys only.
def fast_paths(out: Path) -> Path:
    s = Sketch(
        10, 5.6, "The CPU fast path: an exp of plain arithmetic, attention in blocks"
    )
    s.text(0.3, 4.95, "fast_exp(x): exp(x) = 2ⁿ · eᵍ", size=TEXT, weight="bold")
    s.text(0.3, 4.55, "n = round(x / ln2),  g = x - n ln2,  |g| ≤ ln2 / 2")
    for x, w, label, color in [
        (0.3, 0.35, "0", GREY),
        (0.65, 1.5, "exponent: n + 127", BLUE),
        (2.15, 2.35, "mantissa: 0 … 0", GREY),
    ]:
        s.box(x, 3.75, w, 0.4, label, color, fill=0.2)
    s.text(0.3, 3.55, "sign | 8 bits | 23 bits: the float32 2ⁿ, exactly", GREY)
    s.box(0.3, 2.7, 4.2, 0.45, "eᵍ ≈ 1 + g + g²/2! + … + g⁶/6!   (error < 3e-7)", GREEN)
    s.box(0.3, 1.55, 1.85, 0.75, "loop 1: clip, n\n(+ and - 1.5·2²³),\nbits", ORANGE)
    s.box(2.65, 1.55, 1.85, 0.75, "loop 2: n from bits,\ng, polynomial, · 2ⁿ", ORANGE)
    s.arrow(2.15, 1.92, 2.65, 1.92, INK)
    s.text(2.4, 2.42, "mx.view", ha="center")
    s.note(
        0.3,
        1.3,
        "mx.compile fuses each side of the view into one loop",
        "the C++ compiler vectorizes. -inf clips to n = -127:",
        "every bit 0, so exp gives exactly 0.0, no NaN.",
    )
    x0, y_top, side, blocks = 5.6, 4.5, 3.5, 8
    s.text(
        5.2, 4.95, "cpu_attention: a causal 1024-token chunk", size=TEXT, weight="bold"
    )
    s.box(x0, y_top - side, side, side, "", GREY, fill=0.03, dash=True)
    w = side / blocks
    for b in range(blocks):
        x, seen = x0 + b * w, b * w
        if seen:
            s.box(x, y_top - seen, w, seen, "", BLUE, fill=0.3)
        s.box(x, y_top - seen - w, w, w, "", ORANGE, fill=0.35)
        s.line([x, x + w], [y_top - seen, y_top - seen - w], RED, lw=1)
    s.text(x0 + side / 2, y_top + 0.12, "queries →, blocks of 128", ha="center")
    s.text(x0 - 0.1, y_top - side / 2, "keys ↓", ha="right")
    s.note(
        5.2,
        0.9,
        "A chunk at position 0. Blue: every query of the block sees these",
        "keys. Orange: the block's own keys, the only rows written again under",
        "the mask. Below: never computed. 36 of 64 tiles: 56% of the scores.",
        size=9,
    )
    return s.save(out, "concept-fast-paths.png")


# step_ahead.py: StepAheadRunner.decode: the logits of the forward started last step,
# each row's token drawn lazily and started (mx.async_eval), the next forward built
# on those lazy tokens at offset + 1 and started, and only then the tokens read and
# accepted; then the engine plans the next step. runner.ModelRunner.decode: build,
# mx.eval, accept, in sequence.
def step_ahead(out: Path) -> Path:
    s = Sketch(9, 4.6, "The step ahead: the engine's Python while the model computes")
    s.text(0.25, 3.85, "in sequence (step_ahead=False): build, evaluate, read", INK)
    title = "a step ahead (the default): forward n+1 runs while step n is read"
    s.text(0.25, 2.1, title, INK)
    for y, name in [(3.45, "model"), (2.95, "Python"), (1.7, "model"), (1.2, "Python")]:
        s.text(1.05, y, name, GREY, ha="right")
    x = 1.2
    for n in range(1, 4):
        s.box(x, 3.25, 1.6, 0.4, f"forward {n}", BLUE)
        s.box(x + 1.6, 2.75, 0.75, 0.4, f"step {n}", ORANGE, size=9)
        x += 2.35
    x = 1.2
    for n in range(1, 5):
        s.box(x, 1.5, 1.55, 0.4, f"forward {n}", BLUE)
        if n > 1:
            s.box(x + 0.1, 1.0, 0.75, 0.4, f"step {n - 1}", ORANGE, size=9)
        x += 1.6
    s.text(x + 0.05, 1.7, "...", GREY)
    s.note(
        0.25,
        0.75,
        "step n's Python (read its tokens, accept, detokenize, plan) runs once "
        "forward n+1 is started on its tokens drawn lazily.",
        "In sequence instead: a row that cannot go ahead (a constraint, penalties "
        "or seeds, its last token),",
        "a request waiting for a row, or drafts (speculative decoding).",
        size=9,
    )
    return s.save(out, "concept-step-ahead.png")
