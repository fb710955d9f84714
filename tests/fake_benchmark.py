"""A stand-in benchmark for bench-speed's tests: with `--out FILE` it writes a record
holding one missed goal there and exits 1, as a benchmark that missed one does; with
--wait it says so on stdout and waits instead (a benchmark still running when
bench-speed is interrupted), at most WAIT_S, so that a stray one never lingers. It
imports nothing of the project: it starts at once."""

import json
import sys
import threading
from pathlib import Path

WAITING_LINE = "waiting for Ctrl-C"
WAIT_S = 300  # tests/helpers.py's

if __name__ == "__main__":
    if "--wait" in sys.argv:
        print(WAITING_LINE, flush=True)
        threading.Event().wait(WAIT_S)
        sys.exit(3)
    goal = dict(name="step", value=2.0, bound=1.25, why="w", at_most=True, met=False)
    out = Path(sys.argv[sys.argv.index("--out") + 1])
    out.write_text(json.dumps({"goals": [goal]}))
    sys.exit(1)
