"""A stand-in benchmark for bench-speed's test: with `--out FILE` it writes a record
holding one missed goal there and exits 1, as a benchmark that missed one does."""

import json
import sys
from pathlib import Path

if __name__ == "__main__":
    goal = dict(name="step", value=2.0, bound=1.25, why="w", at_most=True, met=False)
    out = Path(sys.argv[sys.argv.index("--out") + 1])
    out.write_text(json.dumps({"goals": [goal]}))
    sys.exit(1)
