"""Where trained draft heads live (week 4 day 3).

The embedded model's head ships here, so that the tests, the server and the
benchmarks never train one; `pdm run train-drafter` writes a new one (by default
over this file for the embedded model, or where --out says).
"""

from pathlib import Path

TRAIN_COMMAND = "pdm run train-drafter"
EMBEDDED_HEAD = Path(__file__).with_name("SmolLM2-135M-Instruct.safetensors")
