"""Week 3 days 4-5's concept figures: draft verification and a DFA's token
index."""

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
