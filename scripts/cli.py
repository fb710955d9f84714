"""What the command-line programs share: one-line errors and model-preparation progress."""

import sys
from typing import NoReturn

from tqdm import tqdm

STAGES = {
    "verify": "checking the embedded model file",
    "convert": "converting the GGUF model for MLX",
}


def fail(message: str, status: int = 2) -> NoReturn:
    """Print one line to stderr and exit: bad input (2) or a failure to load (1)."""
    print(f"error: {message}", file=sys.stderr)
    sys.exit(status)


class ModelProgress:
    """Renders load_model's progress(stage, done, total) reports as tqdm bars."""

    def __init__(self) -> None:
        self.bars: dict[str, tqdm] = {}

    def __call__(self, stage: str, done: int, total: int) -> None:
        if stage == "rebuild":
            print(
                "the converted model folder is incomplete or damaged: rebuilding it",
                file=sys.stderr,
            )
            return
        if stage not in self.bars:
            unit = "B" if stage == "verify" else "tensor"
            self.bars[stage] = tqdm(
                total=total,
                desc=STAGES.get(stage, stage),
                unit=unit,
                unit_scale=stage == "verify",
                leave=False,
            )
        bar = self.bars[stage]
        bar.update(done - bar.n)

    def __enter__(self) -> "ModelProgress":
        return self

    def __exit__(self, *exc) -> None:
        for bar in self.bars.values():
            bar.close()


def load_model_or_exit(name: str | None):
    """load_model with progress bars; a model that cannot be loaded exits with status 1."""
    from tiny_llm_base import EmbeddedModelError, ModelLoadError, load_model

    try:
        with ModelProgress() as progress:
            return load_model(name, progress=progress)
    except (ModelLoadError, EmbeddedModelError) as error:
        fail(str(error), status=1)
