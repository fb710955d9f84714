"""Week 3 days 1-3's concept figures: the mixed step, latency sharing, the
block table and the prefix cache."""

from pathlib import Path

from scripts.tools.figures.sketch import (
    BLUE,
    GREEN,
    GREY,
    INK,
    ORANGE,
    PURPLE,
    RED,
    TEXT,
    Sketch,
)


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
