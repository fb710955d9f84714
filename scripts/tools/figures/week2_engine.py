"""Week 2's engine figures: continuous batching and chunked prefill."""

from pathlib import Path

from scripts.tools.figures.sketch import BLUE, GREEN, GREY, INK, ORANGE, PURPLE, Sketch

COLORS = [BLUE, ORANGE, GREEN, PURPLE]


def slot_rows(s: Sketch, y: float, rows: list[list[tuple[int, int, str]]]) -> None:
    """Two slots' rows from y down: (first step, steps, request) boxes per slot."""
    for slot, boxes in enumerate(rows):
        top = y - slot * 0.5
        s.text(1.05, top + 0.2, f"slot {slot}", GREY, ha="right")
        for first, steps, name in boxes:
            color = COLORS["ABCD".index(name)]
            s.box(1.2 + 0.42 * first, top, 0.42 * steps, 0.4, name, color)


# engine.py + planner.py: a request finished in a step leaves its slot at the end of
# that step (retire_finished), and the next step's prefill takes a waiting request
# into it (plan_chunk, place_prefilled). A static batch starts B requests together
# and starts the next B only when the slowest has finished.
def continuous_batching(out: Path) -> Path:
    s = Sketch(9, 4.4, "Continuous batching: a freed slot is refilled at once")
    s.text(0.25, 3.75, "static batch: A and B start together; C and D wait for B", INK)
    slot_rows(s, 3.1, [[(0, 3, "A"), (8, 5, "C")], [(0, 8, "B"), (8, 2, "D")]])
    s.text(0.25, 2.05, "continuous: C takes A's slot, D takes the next free one", INK)
    slot_rows(s, 1.4, [[(0, 3, "A"), (3, 5, "C")], [(0, 8, "B"), (8, 2, "D")]])
    for step in range(0, 14, 2):
        s.text(1.2 + 0.42 * step, 0.55, str(step), GREY, ha="center")
    s.text(7.2, 0.55, "steps", GREY)
    s.note(
        0.25,
        0.35,
        "Same requests, same tokens: the static batch needs 13 steps, continuous "
        "batching 10; a slot never idles while a request waits.",
        size=9,
    )
    return s.save(out, "concept-continuous-batching.png")


# policy.py: AlternatePolicy.plans runs a chunk's forward, then the decode rows'
# forward; planner.chunk_size cuts the prompt into prefill_step tokens, so the
# decoding requests get a token between any two chunks.
def chunked_prefill(out: Path) -> Path:
    s = Sketch(9, 3.6, "Chunked prefill: the decoders get a token between chunks")
    s.text(0.25, 2.95, "whole prompt: the decoders wait for all of it", INK)
    x = 1.2
    for _ in range(2):
        s.box(x, 2.35, 0.35, 0.4, "d", BLUE, size=9)
        x += 0.4
    s.box(x, 2.35, 3.2, 0.4, "prefill: the whole 512-token prompt", ORANGE)
    x += 3.25
    for _ in range(3):
        s.box(x, 2.35, 0.35, 0.4, "d", BLUE, size=9)
        x += 0.4
    s.text(0.25, 1.65, "chunks of 128: a decode forward after each chunk", INK)
    x = 1.2
    for n in range(4):
        s.box(x, 1.05, 0.35, 0.4, "d", BLUE, size=9)
        x += 0.4
        s.box(x, 1.05, 0.8, 0.4, f"chunk {n + 1}", ORANGE, size=9)
        x += 0.85
    s.box(x, 1.05, 0.35, 0.4, "d", BLUE, size=9)
    s.note(
        0.25,
        0.7,
        "d: one decode forward, a token for every decoding request.",
        "The longest wait between two tokens falls from the whole prompt to one "
        "chunk; the long prompt's own first token comes later.",
        size=9,
    )
    return s.save(out, "concept-chunked-prefill.png")
