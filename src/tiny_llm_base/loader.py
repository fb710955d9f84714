"""`load_model`: the embedded model, a local Hugging Face-format folder, or a Hub id.

Weights and tokenizers are loaded by mlx-lm; this course hand-writes what runs them.
"""

import os
from pathlib import Path

import mlx.nn as nn

from .embedded_model import Progress, ensure_embedded_model


class ModelLoadError(RuntimeError):
    """A model that cannot be loaded; the message says what to do instead."""


def load_model(
    name: str | None = None, progress: Progress | None = None
) -> tuple[nn.Module, object]:
    """Return `(mlx_model, tokenizer)` as mlx-lm loads them.

    name: None for the embedded SmolLM2-135M-Instruct (converted on first use), a
    local folder with config.json and safetensors, or a Hub repo id such as
    `Qwen/Qwen2-0.5B-Instruct-MLX` (needs internet the first time).
    """
    import mlx_lm

    if name is None:
        folder = ensure_embedded_model(progress=progress)
        return mlx_lm.load(str(folder))
    path = Path(name).expanduser()
    if path.exists():
        if not (path / "config.json").is_file() or not any(path.glob("*.safetensors")):
            raise ModelLoadError(
                f"{path} is not a model folder: it needs config.json and *.safetensors "
                "(a Hugging Face-format MLX model)"
            )
        return mlx_lm.load(str(path))
    if name.count("/") != 1 or name.startswith(("/", ".")):
        raise ModelLoadError(
            f"{name!r} is neither a local folder nor a Hub repo id like "
            "'Qwen/Qwen2-0.5B-Instruct-MLX'; leave --model out for the embedded model"
        )
    try:
        return mlx_lm.load(name)
    except Exception as error:
        offline = os.environ.get("HF_HUB_OFFLINE") == "1"
        raise ModelLoadError(
            f"could not load {name!r} from the Hugging Face Hub "
            f"({'offline mode is on' if offline else type(error).__name__}): "
            "download it on a machine with internet and pass its folder, "
            "or leave --model out for the embedded model"
        ) from error
