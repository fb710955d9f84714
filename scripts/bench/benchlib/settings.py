"""Engine settings from a benchmark's command line: --set [NAME:]KEY=VALUE changes a
setting of one named row of settings (no NAME: the default row), and every row is
checked as an EngineConfig before any model loads, a bad one refused in one line.
"""

import json

from scripts.commands.cli import fail
from tiny_llm_base import EngineConfig


def parse_value(text: str):
    """none, a number, true/false, or the text as it is (a policy's name)."""
    if text.strip().lower() == "none":
        return None
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text.strip()


def parse_sets(items: list[str], rows, default: str) -> dict[str, dict]:
    """--set [NAME:]KEY=VALUE items as settings per row name (no NAME: `default`);
    rows: the names a NAME may be."""
    overrides = {name: {} for name in rows}
    for item in items:
        target, key = default, item
        if ":" in item.split("=", 1)[0]:
            target, key = item.split(":", 1)
        key, equals, value = key.partition("=")
        if not equals or not key.strip():
            fail(f"--set takes [NAME:]KEY=VALUE, e.g. prefill_step=64, got {item!r}")
        if target not in rows:
            fail(f"--set {item}: no row {target!r}: choose from {', '.join(rows)}")
        overrides[target][key.strip()] = parse_value(value)
    return overrides


def check_rows(rows: list[tuple[str, dict]]) -> None:
    """Each (name, settings) made into an EngineConfig: a bad setting ends the run
    in one line naming the row, before the model loads."""
    for name, settings in rows:
        try:
            EngineConfig.of(None, settings)
        except (TypeError, ValueError) as error:
            fail(f"--set: {name}: {error}")
