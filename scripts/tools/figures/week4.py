"""Week 4's concept figures: tensor parallelism and tool calls."""

from pathlib import Path

from scripts.tools.figures.sketch import (
    BLUE,
    GREEN,
    GREY,
    ORANGE,
    PURPLE,
    RED,
    SMALL,
    TEXT,
    Sketch,
)


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


# draft_head.DraftHead: fc [2E -> E] over (feature, the token's embedding), a SwiGLU
# MLP with a residual, out_norm; logits over the K draft rows of the embedding;
# draft() feeds its own prediction and draft back k times. runner.keep_hidden_states
# keeps the hidden state of the row the next token was sampled from; verification
# is week 3 day 4's (the model checks every draft in the mixed step).
def learned_drafter(out: Path) -> Path:
    s = Sketch(9, 5.2, "A learned drafter: a head on the model's own hidden state")
    s.box(0.3, 3.9, 2.3, 0.5, "the model's last layer at t", BLUE, size=TEXT)
    s.text(1.55, 3.6, "h_t, kept by\nthe runner", GREY, size=9)
    s.box(0.3, 2.75, 2.3, 0.5, "final norm: f_t", BLUE, fill=0.12, size=TEXT)
    s.arrow(1.45, 3.88, 1.45, 3.27)
    s.text(0.3, 2.5, "x_t+1: the token sampled from h_t", GREY)
    x0, step = 3.1, 1.95
    for j in range(3):
        x = x0 + j * step
        fed = "x_t+1" if j == 0 else f"d_{j}"
        s.box(x, 3.95, 1.6, 0.4, f"e({fed})", ORANGE, size=TEXT)
        s.box(x, 2.75, 1.6, 0.6, "head\nfc, MLP, norm", PURPLE, size=TEXT)
        s.arrow(x + 0.8, 3.93, x + 0.8, 3.37)
        s.box(x, 1.75, 1.6, 0.45, f"f^_t+{j + 1}", PURPLE, fill=0.12, size=TEXT)
        s.arrow(x + 0.8, 2.73, x + 0.8, 2.22)
        s.box(x + 0.2, 0.85, 1.2, 0.45, f"d_{j + 1}", GREEN, size=TEXT)
        s.arrow(x + 0.8, 1.73, x + 0.8, 1.32)
        s.text(x + 0.85, 1.52, "x draft rows", GREY, size=9)
        if j < 2:  # its own prediction and its own draft feed the next call
            s.arrow(x + 1.62, 1.97, x + step - 0.02, 3.0, PURPLE, rad=-0.25)
            s.arrow(x + 1.42, 1.07, x + step - 0.02, 4.15, GREEN)
    s.arrow(2.62, 3.0, x0 - 0.02, 3.0, BLUE)
    s.bracket(
        x0,
        x0 + 2 * step + 1.6,
        4.55,
        "k calls, each read before the next",
        PURPLE,
        False,
    )
    s.note(
        0.3,
        0.55,
        "The drafts d_1 .. d_k join the step's mixed forward after x_t+1 and are",
        "verified there (week 3 day 4): a wrong guess costs time, never a token.",
    )
    return s.save(out, "concept-learned-drafter.png")
