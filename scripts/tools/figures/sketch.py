"""The figures' drawing kit: a white Agg figure in inch units, its boxes,
arrows, brackets and notes, and the book's palette."""

from pathlib import Path

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.colors import to_rgb
from matplotlib.figure import Figure
from matplotlib.patches import Circle, FancyBboxPatch

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
