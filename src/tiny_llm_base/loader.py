"""`load_model`: the embedded model, a local Hugging Face-format folder, or a Hub id.

Weights and tokenizers are loaded by mlx-lm; this course hand-writes what runs them.
A local folder is checked first, so that a damaged one fails with a ModelLoadError
naming the file and the problem rather than with mlx-lm's traceback.
"""

import json
import os
from pathlib import Path

import mlx.nn as nn

from .embedded_model import Progress, ensure_embedded_model


class ModelLoadError(RuntimeError):
    """A model that cannot be loaded; the message says what to do instead."""


def load_model(
    name: str | os.PathLike | None = None, progress: Progress | None = None
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
    name = os.fspath(name)
    if not name.strip():
        raise ModelLoadError(
            "the model name is empty: give a model folder or a Hub repo id, or None "
            "for the embedded model"
        )
    path = Path(name).expanduser()
    if path.exists():
        return load_folder(path)
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


def load_folder(path: Path) -> tuple[nn.Module, object]:
    """mlx-lm's model and tokenizer from a Hugging Face-format folder, or a
    ModelLoadError that names the file at fault: config.json that is not a JSON
    object, has no model_type, or does not match the weights; tokenizer files that
    do not load."""
    from mlx_lm.utils import load_model as load_mlx_model
    from mlx_lm.utils import load_tokenizer

    config_path = path / "config.json"
    if not config_path.is_file() or not any(path.glob("*.safetensors")):
        raise ModelLoadError(
            f"{path} is not a model folder: it needs config.json and *.safetensors "
            "(a Hugging Face-format MLX model)"
        )
    try:
        config = json.loads(config_path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, ValueError) as error:
        raise ModelLoadError(
            f"{config_path} is not valid JSON ({one_line(error)}): restore the "
            "model's original config.json"
        ) from None
    if not isinstance(config, dict):
        raise ModelLoadError(
            f"{config_path} holds a JSON {type(config).__name__}, not an object: "
            "restore the model's original config.json"
        )
    if "model_type" not in config:
        raise ModelLoadError(
            f'{config_path} has no "model_type" (e.g. "qwen2" or "llama"): restore '
            "the model's original config.json"
        )
    try:
        model, config = load_mlx_model(path)
    except Exception as error:  # mlx-lm: ValueError, TypeError, KeyError, ...
        raise ModelLoadError(
            f"{config_path} does not match the weights in {path}: {one_line(error)}"
        ) from error
    try:
        tokenizer = load_tokenizer(path, eos_token_ids=config.get("eos_token_id"))
    except Exception as error:
        raise ModelLoadError(
            f"the tokenizer files in {path} could not be loaded "
            f"({type(error).__name__}: {one_line(error)}): the folder needs "
            "tokenizer.json and tokenizer_config.json"
        ) from error
    return model, tokenizer


def one_line(error: Exception, limit: int = 240) -> str:
    """An error's message on one line; long lists (of parameter names) shortened."""
    text = " ".join(str(error).split())
    return text if len(text) <= limit else text[: limit - 3].rstrip() + "..."
