"""Draw the book's concept figures: `python -m scripts.tools.draw_figures`.

Pictures of ideas, drawn with matplotlib alone (Agg, no network) from the reference
code's rules, named in a comment above each function. Into book/src/images (--out):

- concept-fast-paths.png: fast_exp's bits and cpu_attention's blocks (week 2 day 3).
- concept-step-ahead.png: the engine's steps in sequence and a step ahead (week 2
  day 6's given step_ahead.py, and the mixed step's decode-only steps).
- concept-mixed-step.png: one mixed forward, and the alternate policy (week 3 day 1).
- concept-latency-sharing.png: a chat's first token beside a long prompt (week 3 day 1).
- concept-block-table.png: block tables into a pool of KV blocks (week 3 day 2).
- concept-prefix-cache.png: full blocks named by a hash chain, shared (week 3 day 3).
- concept-draft-verification.png: prompt-lookup drafts checked in one forward (day 4).
- concept-dfa-token-index.png: a regex's DFA and one state's token index (day 5).
- concept-tensor-parallel.png: one block over 2 ranks, two all_sums (week 4 day 1).
- concept-tool-calls.png: an answer's grammar under tool_choice (week 4 day 2).
"""

import argparse
from pathlib import Path

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.colors import to_rgb
from matplotlib.figure import Figure
from matplotlib.patches import Circle, FancyBboxPatch

ROOT = Path(__file__).resolve().parents[2]
INK, GREY, BLUE, ORANGE = "#333333", "#8C8C8C", "#4C72B0", "#DD8452"
GREEN, RED, PURPLE = "#55A868", "#C44E52", "#8172B3"
TEXT, SMALL, TITLE = 11, 10, 13


def light(color: str, amount: float) -> tuple[float, ...]:
    """`color` mixed with white, `amount` of it the colour."""
    return tuple(1 - amount * (1 - c) for c in to_rgb(color))


class Sketch:
    """A white Agg figure whose data units are inches, (0, 0) at the bottom left."""

    def __init__(self, width: float, height: float, title: str) -> None:
        self.fig = Figure(figsize=(width, height), facecolor="white")
        FigureCanvasAgg(self.fig)
        self.ax = self.fig.add_axes((0, 0, 1, 1), xlim=(0, width), ylim=(0, height))
        self.ax.axis("off")
        self.text(0.25, height - 0.3, title, size=TITLE, weight="bold")

    def text(
        self, x: float, y: float, text: str, color: str = INK, **kw: object
    ) -> None:
        """kw: size (SMALL), and matplotlib's; left-aligned, centred on y."""
        kw = {"va": "center", "fontsize": kw.pop("size", SMALL), **kw}
        self.ax.text(x, y, text, color=color, **kw)

    def note(self, x: float, y: float, *lines: str, **kw: object) -> None:
        """Lines of text, the first one's top at y."""
        self.text(x, y, "\n".join(lines), va="top", linespacing=1.5, **kw)

    def box(
        self, x: float, y: float, w: float, h: float, text: str, color: str, **kw: float
    ) -> None:
        """A rounded box edged in `color`, filled with it lightened to kw's fill
        (0.25), dashed with kw's dash; kw's size for the text (SMALL)."""
        style, ls = "round,pad=0,rounding_size=0.04", "--" if kw.get("dash") else "-"
        fc = light(color, kw.get("fill", 0.25))
        patch = FancyBboxPatch((x, y), w, h, boxstyle=style, lw=1.2, ls=ls, fc=fc)
        self.ax.add_patch(patch).set_edgecolor(color)
        self.text(x + w / 2, y + h / 2, text, size=kw.get("size", SMALL), ha="center")

    def circle(self, x: float, y: float, r: float, color: str, fill: float) -> None:
        self.ax.add_patch(Circle((x, y), r, fc=light(color, fill), ec=color, lw=1.3))

    def arrow(
        self, x0: float, y0: float, x1: float, y1: float, color: str = GREY, **kw: float
    ) -> None:
        """kw: rad (the bend), shrink (points kept clear at both ends)."""
        bend, clear = f"arc3,rad={kw.get('rad', 0)}", kw.get("shrink", 0)
        props = dict(arrowstyle="-|>", color=color, lw=1.2, connectionstyle=bend)
        props |= dict(shrinkA=clear, shrinkB=clear, mutation_scale=12)
        self.ax.annotate("", xy=(x1, y1), xytext=(x0, y0), arrowprops=props)

    def line(self, xs: list[float], ys: list[float], color: str, **kw: object) -> None:
        self.ax.plot(xs, ys, **{"color": color, "lw": 1.3, **kw})

    def bracket(
        self, x0: float, x1: float, y: float, text: str, color: str, up: bool
    ) -> None:
        """A bracket over x0 .. x1, its text above (up: ticks up, text under)."""
        tick, dy, va = (-0.08, -0.06, "top") if up else (0.08, 0.06, "bottom")
        self.line([x0, x0, x1, x1], [y - tick, y, y, y - tick], color)
        self.text((x0 + x1) / 2, y + dy, text, color, ha="center", va=va)

    def save(self, out: Path, name: str) -> Path:
        self.fig.savefig(out / name, dpi=160, facecolor="white")
        return out / name


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


# mixed_step.py: split_parts: the B decode rows first, then the chunks;
# runner.ModelRunner.run_mixed feeds `chunks + draft_parts(plan)`, each request's
# drafts a part of their own (row_view of its batch-cache row from offset + 1, all
# given logits) AFTER every chunk, though mixed_policy.plan_mixed plans them first.
# Every row fed counts against token_budget; only attention is split by part.
# engine.py: "alternate" = plan_chunk, then plan_decodes.
def mixed_step(out: Path) -> Path:
    s = Sketch(9, 6.6, "One mixed step: every row of the step in ONE forward")
    parts = [  # colour, label, positions used, rows given logits
        (BLUE, "decode rows\n(slots 0-2)", "o₀ o₁ o₂", "111"),
        (ORANGE, "req 7: prefill chunk\n(prompt goes on)", "40 41 42 43 44", "00000"),
        (GREEN, "req 9: chunk\nends prompt", "0 1", "01"),
        (PURPLE, "drafts of the req\nin slot 1 (day 4)", "o₁+1 o₁+2 o₁+3", "111"),
    ]
    caches = [
        "batch cache:\none row per slot,\neach at its offset",
        "req 7's own cache\nRoPE from offset 40\nchunk (causal) mask",
        "req 9's cache\nfrom offset 0",
        "slot 1's row\n(row_view)\nfrom o₁+1",
    ]
    x0, cell, x = 0.95, 0.6, 0.95
    for (color, label, positions, sampled), cache in zip(parts, caches):
        width = len(sampled) * cell
        s.text(x + width / 2, 5.3, label, color, ha="center", weight="bold")
        for i, position in enumerate(positions.split()):
            s.box(x + i * cell, 4.45, cell, 0.5, position, color)
            if sampled[i] == "1":
                s.circle(x + (i + 0.5) * cell, 4.23, 0.07, INK, 1)
        s.box(x + 0.04, 2.0, width - 0.08, 0.8, cache, color, size=9.5, fill=0.12)
        s.arrow(x + width / 2, 3.07, x + width / 2, 2.82, color)
        x += width
    budget = "token_budget = 13 (EngineConfig): every row fed counts"
    s.bracket(x0, x, 5.85, budget, INK, False)
    s.text(x0 - 0.1, 4.7, "position", ha="right")
    s.text(x0 - 0.1, 4.23, "logits", ha="right")
    s.box(x0, 3.45, x - x0, 0.55, "", GREY, fill=0.15)
    layers = "every layer: RMSNorms, q/k/v and o projections, MLP on all T = 13 rows"
    s.note(x0 + 0.15, 3.94, layers, "as one sequence [1, T, E]: each weight read once")
    s.text(x0, 3.22, "attention alone is split by part: its own KV cache, its offset")
    order = "Order in the forward: decode rows, chunks, then drafts (ModelRunner."
    order += "run_mixed\nfeeds chunks + draft_parts); plan_mixed plans the drafts "
    last = "before the chunks,\nso they take the budget first.   ● = a row given logits"
    s.note(x0, 1.85, order + last)
    s.box(0.25, 0.1, 8.5, 1.0, "", GREY, fill=0.06, dash=True)
    s.text(0.4, 0.9, 'policy="alternate": two forwards a step', weight="bold")
    s.text(0.4, 0.6, "forward 1: plan_chunk, ONE chunk")
    s.text(0.4, 0.3, "forward 2: plan_decodes")
    for i in range(5):
        s.box(3.2 + i * 0.32, 0.47, 0.3, 0.26, "", ORANGE)
        if i < 3:
            s.box(3.2 + i * 0.32, 0.17, 0.3, 0.26, "", BLUE)
    s.note(5.0, 0.8, "each forward reads every weight,\nthe decodes wait for the chunk")
    return s.save(out, "concept-mixed-step.png")


# mixed_policy.py: chunk_limit: a chunk is the least of the tokens left, the chunk
# size (prefill_step, 128 here) and, for a long prompt, long_prefill_token_threshold;
# may_start: a new prompt starts only while fewer than max_num_partial_prefills are
# partly prefilled. A step runs to its end: a chat that arrives during one joins the
# next, and its first token comes at the end of the step that runs its prompt. The
# step times are a model (a fixed cost plus one per token), not a measurement.
def latency_sharing(out: Path) -> Path:
    s = Sketch(10, 6.5, "Who shares a step: a short chat beside a long prompt")
    scale, rows, chat, arrive = 0.95, 4, 40, 1.4  # inches a time unit; tokens
    x0, height = 2.65, 0.75 / 128  # a lane's left edge; inches a token

    def steps(threshold: int | None, one_at_a_time: bool):
        """(start, length, document's chunk, chat's chunk) of each step."""
        t, left, chat_left, plan = 0.0, 768, chat, []
        while t < 7.5:
            doc = min(left, 128, threshold or left)
            may = chat_left and t >= arrive and not (one_at_a_time and left)
            chat_part = chat_left if may else 0
            length = 0.1 + 0.0075 * (rows + doc + chat_part)
            plan.append((t, length, doc, chat_part))
            t, left, chat_left = t + length, left - doc, chat_left - chat_part
        return plan

    lanes = [
        ("one prompt at a time", "max_num_partial_prefills=1", None, True),
        ("mixed, no cap", "chunks of 128", None, False),
        ("serve's defaults", "threshold 64: chunks <= 64", 64, False),
    ]
    for lane, (name, how, threshold, one) in enumerate(lanes):
        y = 4.5 - 1.5 * lane
        s.text(0.25, y + 0.45, name, size=TEXT, weight="bold")
        s.text(0.25, y + 0.18, how, GREY)
        for t, length, doc, chat_part in steps(threshold, one):
            x, w = x0 + t * scale, length * scale
            if x + w > 9.9:
                break
            s.box(x, y, w - 0.03, 0.1, "", BLUE, fill=0.6)
            if doc:
                s.box(x, y + 0.1, w - 0.03, doc * height, "", ORANGE, fill=0.35)
            if chat_part:
                base = y + 0.1 + doc * height
                s.box(x, base, w - 0.03, chat_part * height, "", GREEN, fill=0.6)
                first = x + w - 0.03
        a = x0 + arrive * scale
        s.arrow(a, y + 1.35, a, y + 1.12, RED)
        s.line([a, first], [y + 1.25, y + 1.25], RED)
        s.circle(first, y + 1.25, 0.05, RED, 1)
        ttft = f"first token after {(first - a) / scale:.1f} time units"
        s.text(a + 0.1, y + 1.37, ttft, RED)
    s.box(0.25, 0.12, 0.3, 0.1, "", BLUE, fill=0.6)
    s.text(0.65, 0.17, "4 decode rows, 1 token each")
    s.box(3.0, 0.1, 0.3, 0.14, "", ORANGE, fill=0.35)
    s.text(3.4, 0.17, "long prompt's chunk (768 tokens in all)")
    s.box(6.55, 0.1, 0.3, 0.14, "", GREEN, fill=0.6)
    s.text(6.95, 0.17, "the chat's 40-token prompt")
    note = "A box is one step: its width the time it runs (a fixed cost plus one per"
    note += " token), its height the tokens it feeds."
    s.note(
        0.25,
        0.75,
        note,
        "▼ the chat arrives: it joins the next step; ● its first token.",
    )
    return s.save(out, "concept-latency-sharing.png")


# block_pool.py: position p of a request lives in block table[p // block_size] at
# slot p % block_size; block_size 16 (EngineConfig's default); BlockPool.allocate
# takes the lowest given-back id (a heap), then a new id at high_water; one pool's
# ids serve every layer. PagedKvManager.reserve grows a table as each step needs
# blocks, so requests that prefill side by side get interleaved ids.
def block_table(out: Path) -> Path:
    s = Sketch(9, 5.4, "Paged KV cache: block tables into one pool of blocks")
    requests = [("A", BLUE, [0, 3, 6, 11], 53), ("B", ORANGE, [1, 4, 7], 40)]
    requests.append(("C", GREEN, [2, 5, 9], 35))
    gx, gy, cw, ch = 4.7, 0.95, 1.0, 0.8
    tag = {b: "free" if b < 12 else "never\nused" for b in (8, 10, 12, 13, 14, 15)}
    color_of, used = {}, {}
    for row, (name, color, table, offset) in enumerate(requests):
        y = 3.75 - row * 1.2
        s.text(0.3, y + 0.62, f"request {name}: offset {offset}", color, weight="bold")
        for i, block in enumerate(table):
            s.text(0.52 + i * 0.55, y + 0.33, f"[{i}]", GREY, size=9, ha="center")
            s.box(0.3 + i * 0.55, y - 0.2, 0.45, 0.4, str(block), color, size=TEXT)
            tag[block], color_of[block] = f"{name}[{i}]", color
            used[block] = min(16, offset - 16 * i)
    for block in range(16):
        bx, by = gx + block % 4 * cw + 0.04, gy + (3 - block // 4) * ch + 0.04
        color, held = color_of.get(block, GREY), block in color_of
        w, fill = cw - 0.08, 0.2 if held else 0.05
        s.box(bx, by, w, ch - 0.08, "", color, fill=fill, dash=not held)
        s.text(bx + 0.08, by + ch - 0.24, str(block), size=TEXT, weight="bold")
        s.text(bx + cw - 0.14, by + ch - 0.28, tag[block], GREY, size=9, ha="right")
        for slot in range(used.get(block, 0)):  # a tick per position held
            tick = bx + 0.1 + slot * 0.048
            s.line([tick, tick], [by + 0.1, by + 0.3], color, lw=2.2)
    s.text(0.3, 4.8, "block tables: block ids in position order", weight="bold")
    pool = "the pool: the same block ids in every layer;\n"
    s.note(gx, 4.9, pool + "block_size 16, a tick per position held")
    where = "position p → block table[p // 16], slot p % 16: A's position 50 → "
    where += "table[3] = block 11, slot 2.\nFree heap [8, 10]: allocate() takes 8 next "
    s.note(0.3, 0.75, where + "(the lowest id given back); new ids from 12 only after.")
    return s.save(out, "concept-block-table.png")


# block_pool.chain_hash: SHA-256 over the parent's digest (b'' for the first block),
# then the token ids as int64 bytes (array('q')); only full blocks are named, after
# the step that filled them (after_step). prefix_cache.py: cached_prefix =
# pool.lookup(prefill_tokens[:-1]), which stops at the first unknown name and raises
# each found block's refcount; admit starts the caches after them and returns their
# count, which Planner.admit advances the request by.
def prefix_cache(out: Path) -> Path:
    s = Sketch(9, 6.1, "Prefix caching: full blocks named by a hash chain, shared")
    rule = "hᵢ = SHA-256(hᵢ₋₁ ‖ the block's token ids as int64), h₀ = b''"
    s.text(0.3, 5.35, f"block_size 4 here (16 by default);  {rule}")
    system = [12, 87, 5, 40, 9, 9, 31, 2, 77, 3]
    prompts = [("A", BLUE, system + [18, 60, 4, 11], "h3")]
    prompts.append(("B", ORANGE, system + [25, 8, 61, 19, 7], "h3'"))
    tx = [1.45 + i * 0.36 + i // 4 * 0.15 for i in range(16)]  # blocks of 4, a gap
    for row, (name, color, tokens, third) in enumerate(prompts):
        y = 4.35 - row * 1.5
        s.text(0.3, y + 0.17, f"prompt {name}", color, size=TEXT, weight="bold")
        for i, token in enumerate(tokens):
            c = color if i < 10 or row == 0 else RED
            s.box(tx[i], y, 0.33, 0.34, str(token), c)
        for b, label in enumerate(["h1", "h2", third]):
            c = RED if label == "h3'" else GREEN
            s.box(tx[4 * b] + 0.3, y - 0.5, 0.8, 0.3, label, c, fill=0.15)
            if b:
                s.arrow(tx[4 * b] - 0.44, y - 0.35, tx[4 * b] + 0.3, y - 0.35)
        s.text(tx[12] + 0.6, y - 0.35, "partial:\nno name", GREY, ha="center")
    for b, label in enumerate(["found ✓", "found ✓", "unknown ✗: stop"]):
        s.text(tx[4 * b] + 0.7, 2.12, label, RED if b == 2 else GREEN, ha="center")
    system_prompt = "shared system prompt (10 tokens)"
    s.bracket(tx[0], tx[9] + 0.33, 4.85, system_prompt, INK, False)
    lookup = "B's lookup: prefill_tokens[:-1]"
    s.bracket(tx[0], tx[13] + 0.33, 3.4, lookup, ORANGE, False)
    s.text(0.3, 1.5, "pool", size=TEXT, weight="bold")
    for i, block in enumerate([7, 2, 9, 4, 0, 1]):  # A's, then B's own
        color = PURPLE if i < 2 else BLUE if i < 4 else ORANGE
        name = f": h{i + 1}" if i < 3 else ""
        label = f"block {block}{name}\nrefcount {2 if i < 2 else 1}"
        s.box(1.45 + i * 1.2, 1.2, 1.1, 0.6, label, color, size=9.5, fill=0.2)
    tables = "A's table [7, 2, 9, 4], B's [7, 2, 0, 1]: B shares blocks 7 and 2 "
    tables += "(refcount 2)\nand starts at offset 8, so it computes only positions 8-14"
    tables += " (the last token is\nalways computed). A shared block is never written;"
    s.note(0.3, 0.98, tables, "A's blocks got names (after_step) once its forward ran.")
    return s.save(out, "concept-prefix-cache.png")


# speculative.py: find_drafts: the k = 4 tokens after the latest earlier occurrence
# of the longest match of the last n tokens, n from 3 down (run on this text: 1871
# from granite cut); next_token at offset, drafts from offset + 1. verified_tokens
# (greedy): drafts kept while d_{j+1} == argmax b_j, then b_j. keep_accepted:
# set_offset hides the rejected keys (paged: their blocks go back).
def draft_verification(out: Path) -> Path:
    s = Sketch(9, 6.6, "Speculative decoding: prompt-lookup drafts, one forward")
    words = "… built in 1871 from granite cut on … The tower was built in".split()
    x, spans = 0.3, []
    for i, word in enumerate(words):
        color = PURPLE if i in (1, 2, 12, 13) else ORANGE if 3 <= i <= 6 else GREY
        width = 0.14 + 0.085 * len(word)
        s.box(x, 5.55, width, 0.36, word, color, fill=0.1 if color == GREY else 0.3)
        spans.append((x, x + width))
        x += width + 0.04
    for first, last, label, color in [
        (1, 2, "earlier occurrence", PURPLE),
        (3, 6, "what followed: 4 drafts", ORANGE),
        (12, 13, "the last 2 tokens", PURPLE),
    ]:
        s.bracket(spans[first][0], spans[last][1], 5.45, label, color, True)
    lookup = 'find_drafts: the last 3, "was built in", occur nowhere earlier; the last'
    lookup += ' 2, "built in", do:\nthe tokens after their latest earlier occurrence'
    s.note(0.3, 5.0, lookup + " are the drafts (k = 4).")
    fed, best = "in 1871 from granite cut".split(), "1871 from local stone .".split()
    x0, cw = 1.9, 1.25
    for y, label in zip([3.3, 2.1, 1.35, 0.65], ["fed", "argmax", "taken", "KV cache"]):
        s.text(0.3, y, label, size=TEXT)
    for j in range(5):
        x, color = x0 + j * cw, BLUE if j == 0 else GREEN if j < 3 else RED
        s.text(x + 0.5, 3.65, "offset" + (f"+{j}" if j else ""), GREY, ha="center")
        s.box(x, 3.1, 1.0, 0.4, fed[j], color, size=TEXT, fill=0.3)
        s.arrow(x + 0.5, 3.08, x + 0.5, 2.32)
        ink = INK if j < 3 else GREY
        s.box(x + 0.1, 1.9, 0.8, 0.4, f"b{j}={best[j]}", ink, fill=0.08)
        s.box(x, 0.45, 1.0, 0.4, fed[j], INK if j < 3 else RED, fill=0.08, dash=j > 2)
        if j < 4:  # b_j against the next draft d_{j+1}
            ok, style = fed[j + 1] == best[j], "-" if j < 3 else ":"
            c = GREEN if ok else RED if j < 3 else GREY
            s.line([x + 0.9, x + cw + 0.1], [2.3, 3.1], c, ls=style)
            mark = "✓" if ok else "✗" if j < 3 else ""
            s.text(x + 1.3, 2.62, mark, c, size=16, ha="center", weight="bold")
    taken = [("accepted d1", GREEN), ("accepted d2", GREEN), ("b2 replaces d3", BLUE)]
    for j, (label, color) in enumerate(taken):
        s.arrow(x0 + j * cw + 0.5, 1.88, x0 + j * cw + 0.5, 1.57)
        s.box(x0 + j * cw, 1.15, 1.0, 0.4, best[j], color, size=TEXT, fill=0.3)
        s.text(x0 + j * cw + 0.5, 1.02, label, color, size=9.5, ha="center")
    s.line([x0 + 3 * cw + 0.1, x0 + 4 * cw + 0.9], [0.65, 0.65], RED)
    s.bracket(x0, x0 + 1.0, 3.95, "decode row", BLUE, False)
    draft_part = "draft part: d1-d4, all given logits"
    s.bracket(x0 + cw, x0 + 4 * cw + 1.0, 3.95, draft_part, PURPLE, False)
    s.text(x0 + 3 * cw + 0.3, 1.0, "rolled back: never read", RED, size=9.5)
    end = "3 tokens this step (offset += 3); local is fed at offset+3 next step."
    s.text(0.3, 0.2, end + "  Had all 4 been kept: b4, the bonus token.")
    return s.save(out, "concept-draft-verification.png")


# automaton.py: determinize builds, for [0-9]+(\.[0-9]+)?, the 6-state DFA drawn here
# (checked with compile_regex: accepting 1, 2, 4, 5; not minimised, 1 ≡ 2, 4 ≡ 5);
# a missing edge is DEAD. constrained.TokenIndex.build: a token is allowed when the
# walk of all its characters never reaches DEAD, and leads to the state where it
# ends (the walks below are computed on the drawn table); EOS where a state accepts.
def dfa_token_index(out: Path) -> Path:
    title = r"Constrained decoding: the DFA of [0-9]+(\.[0-9]+)?, a token index"
    s = Sketch(9, 5.0, title)
    table = [{"d": 1}, {"d": 2, ".": 3}, {"d": 2, ".": 3}, {"d": 4}, {"d": 5}, {"d": 5}]
    spot = [(0.75 + 1.3 * (i - 2 * (i > 2)), 3.3 if i < 3 else 1.65) for i in range(6)]
    for a, edges in enumerate(table):
        (xa, ya), color = spot[a], PURPLE if a == 1 else BLUE
        for char, b in edges.items():
            label, (xb, yb) = "0-9" if char == "d" else "'.'", spot[b]
            if a == b:  # a loop
                s.arrow(xa + 0.12, ya + 0.28, xa - 0.12, ya + 0.28, INK, rad=2.2)
                s.text(xa, ya + 0.82, label, size=TEXT, ha="center")
                continue
            s.arrow(xa, ya, xb, yb, INK, shrink=23)
            dx, dy = (0, 0.17) if ya == yb else (0.2, 0)
            mid = ((xa + xb) / 2 + dx, (ya + yb) / 2 + dy)
            s.text(*mid, label, size=TEXT, ha="center")
        s.circle(xa, ya, 0.3, color, 0.2)
        if a in (1, 2, 4, 5):  # accepting
            s.circle(xa, ya, 0.24, color, 0)
        s.text(xa, ya, str(a), size=TEXT + 1, ha="center")
    s.arrow(0.15, 3.3, 0.44, 3.3, INK)
    legend = "start 0; double circle: accepting; a missing edge: DEAD;"
    s.note(0.3, 1.05, legend, "as determinize builds it (not minimised: 1 ≡ 2, 4 ≡ 5)")
    tx = 5.45
    s.text(tx, 4.3, 'token index of state 1 (text so far "7")', PURPLE, weight="bold")
    for dx, label in [(0, "token"), (0.8, "walk"), (2.45, "leads to")]:
        s.text(tx + dx, 3.95, label, GREY)
    for i, token in enumerate(["1", "12", ".", "3.", ".5", "1.5", "5..", "a", " 4"]):
        path = [1]
        for char in token:
            path.append(table[path[-1]].get("d" if char.isdigit() else char, -1))
            if path[-1] < 0:
                break
        y, color = 3.62 - i * 0.3, GREEN if path[-1] >= 0 else RED
        walk = "→".join(str(p) if p >= 0 else "DEAD" for p in path)
        s.text(tx, y, f'"{token}"', color, family="monospace")
        s.text(tx + 0.8, y, walk, color)
        s.text(tx + 2.45, y, str(path[-1]) if path[-1] >= 0 else "✗", color)
        if path[-1] < 0:
            s.line([tx - 0.05, tx + 0.55], [y, y], RED)
    for dx, text in [(0, "EOS"), (0.8, "state 1 accepts"), (2.45, "end")]:
        s.text(tx + dx, 3.62 - 9 * 0.3, text, GREEN)
    s.note(tx, 0.62, "allowed (green): kept by the logits mask;", "a walk to DEAD: out")
    return s.save(out, "concept-dfa-token-index.png")


# sharding.shard_heads(9, 3, 2): whole GQA groups, split_evenly(3, 2) = [2, 1]: rank
# 0 query heads 0-5 and KV heads 0-1, rank 1 query heads 6-8 and KV head 2; 768 of
# the 1536 MLP units each. tensor_parallel.py: q/k/v, gate/up by rows, o_proj, down
# by columns, each followed by an all_sum (o_proj's bias after it); norms whole. The
# week 4 chapter: a ring all_sum takes 2(n - 1) steps, each sending 1/n.
def tensor_parallel(out: Path) -> Path:
    s = Sketch(9, 7.6, "Tensor parallelism: one block over 2 ranks, two all_sums")
    ys = [6.55, 5.8, 4.75, 4.1, 3.55, 2.95, 2.4, 1.85, 1.35, 0.8, 0.2]
    hs = [0.4, 0.35, 0.9, 0.5, 0.4, 0.35, 0.35, 0.4, 0.35, 0.4, 0.35]
    colors = [GREY, GREY, BLUE, BLUE, BLUE, RED, GREY, ORANGE, ORANGE, ORANGE, RED]
    group = [BLUE, ORANGE, GREEN]  # a KV head's colour, and its query heads'
    ranks = [(0.3, range(6), [0, 1], "0-767"), (3.4, range(6, 9), [2], "768-1535")]
    for rank, (x, q_heads, kv_heads, units) in enumerate(ranks):
        kv = "-".join(map(str, kv_heads))
        steps = [
            "x [B, L, 576]: the same on both ranks",
            "RMSNorm (a whole copy)",
            "",
            f"attention per head, no communication;\nits KV cache holds kv{kv} only",
            "o_proj: its heads' columns → partial sum",
            "all_sum #1 (then o_proj's bias, once), + x → h",
            "RMSNorm (a whole copy)",
            f"gate_proj, up_proj: rows, units {units}",
            "SwiGLU, each unit alone",
            "down_proj: its 768 columns → partial sum",
            "all_sum #2, + h → the next layer's x, on both ranks",
        ]
        for i, (y, h, text, color) in enumerate(zip(ys, hs, steps, colors)):
            if i in (0, 5, 10) and rank == 0:  # one box over both ranks
                s.box(0.3, y, 6.0, h, text, color, size=TEXT if i == 0 else SMALL)
            elif i not in (0, 5, 10):
                s.box(x, y, 2.9, h, text, color, size=9.5, fill=0.06 if i == 2 else 0.2)
            if i:  # from the step before
                s.arrow(x + 1.45, ys[i - 1], x + 1.45, y + h + 0.02)
        s.text(x + 0.05, 6.36, f"rank {rank}", size=TEXT, weight="bold")
        s.text(x + 0.1, 5.45, "q/k/v_proj: the rows of its heads")
        for i, head in enumerate(q_heads):
            color = group[head // 3]
            s.box(x + 0.1 + i * 0.42, 5.02, 0.38, 0.3, f"q{head}", color, fill=0.35)
        for i, head in enumerate(kv_heads):
            hx, color = x + 0.1 + i * 0.42, group[head]
            s.box(hx, 4.8, 0.38, 0.2, f"kv{head}", color, size=9, fill=0.6)
    split = "split_evenly(3 KV heads, 2)\n= [2, 1]: whole GQA groups,\nthe extra group"
    split += " to rank 0\n(6/9 of the attention);\nMLP: 1536 = 768 + 768;\ncolour: a"
    s.note(6.55, 6.4, split + " KV head and the", "query heads that read it")
    s.text(6.55, 3.85, "ring all_sum, n = 4 ranks", weight="bold")
    spots = [(7.65, 3.5), (6.9, 2.75), (7.65, 2.0), (8.4, 2.75)]  # ranks 0-3
    for i, (px, py) in enumerate(spots):
        s.arrow(px, py, *spots[(i + 1) % 4], RED, rad=0.3, shrink=16)
        s.circle(px, py, 0.2, GREY, 0.2)
        s.text(px, py, str(i), ha="center")
    ring = "2(n-1) steps, each sends\n1/n of the array: each rank\n"
    s.note(6.55, 1.7, ring + "sends 2(n-1)/n of it:\n1.5x its size at n = 4")
    return s.save(out, "concept-tensor-parallel.png")


# tool_calls.py: tool_grammar: "auto" lets any text through until "<tool_call>",
# then the call's JSON under call_schema (the name a const per function, arguments
# that function's parameters), then "</tool_call>"; "required" and a named function
# allow calls only; "none" any text that never opens a call. parse_tool_calls reads
# the calls back.
def tool_calls(out: Path) -> Path:
    s = Sketch(
        9, 6.2, "Tool calls: the answer's grammar, a call constrained as it is written"
    )
    s.text(
        0.3,
        5.55,
        'tool_choice "auto": one answer, piece by piece',
        size=TEXT,
        weight="bold",
    )
    pieces = [  # x, width, text, colour, what the mask allows there
        (0.25, 1.35, "Let me check.", GREY, "any text\n(lazy: ends at\nthe first tag)"),
        (1.7, 1.15, "<tool_call>\\n", BLUE, "the tag the\nmodel wrote"),
        (
            2.95,
            1.95,
            '{"name":"get_weather",',
            ORANGE,
            "a name of tools,\nnothing else",
        ),
        (
            5.0,
            2.25,
            '"arguments":{"city":"Paris"}}',
            ORANGE,
            "its parameters'\nJSON Schema",
        ),
        (7.35, 1.05, "\\n</tool_call>", BLUE, "forced: closes\nthe call"),
        (8.45, 0.45, "EOS", GREY, "or\nmore"),
    ]
    for x, w, text, color, allowed in pieces:
        s.box(x, 4.55, w, 0.55, text, color, size=8.5)
        s.note(x + 0.05, 4.4, allowed, size=9)
    s.text(
        0.3,
        3.05,
        "the grammar (llguidance's Lark), per tool_choice",
        size=TEXT,
        weight="bold",
    )
    rules = [
        (
            '"auto"',
            'start: call{0,8} TEXT     call: head "\\n" %json {call schema} "\\n</tool_call>"',
            GREEN,
        ),
        ("", 'head[lazy]: TEXT "<tool_call>"     TEXT: /(?s:.*)/', GREEN),
        (
            '"required" / named',
            'start: call ("\\n" call){0,7}   (named: the call schema of that function only)',
            PURPLE,
        ),
        (
            '"none"',
            "start: TEXT, TEXT: any text & ~(any text containing <tool_call>)",
            RED,
        ),
    ]
    for i, (choice, rule, color) in enumerate(rules):
        y = 2.55 - i * 0.5
        s.text(0.3, y, choice, color, size=TEXT, weight="bold")
        s.text(2.0, y, rule, size=9.5, family="monospace")
    s.note(
        0.3,
        0.75,
        "call schema = anyOf over the tools: {name: const NAME, arguments: "
        "\\$ref #/\\$defs/NAME},",
        "each function's parameters (and its own \\$defs) moved under the call "
        "schema's \\$defs",
        size=9,
    )
    return s.save(out, "concept-tool-calls.png")


FIGURES = [
    fast_paths,
    step_ahead,
    mixed_step,
    latency_sharing,
    block_table,
    prefix_cache,
    draft_verification,
]
FIGURES += [dfa_token_index, tensor_parallel, tool_calls]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "book/src/images")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    for draw in FIGURES:
        print(draw(args.out))


if __name__ == "__main__":
    main()
