"""`load_model`: the embedded model, a local Hugging Face-format folder, or a Hub id.

Weights and tokenizers are loaded by mlx-lm; this course hand-writes what runs them.
A local folder is checked first, so that a damaged one fails with a ModelLoadError
naming the file and the problem rather than with mlx-lm's traceback.
"""

import json
import os
import struct
from pathlib import Path

import mlx.nn as nn

from .embedded_model import Progress, ensure_embedded_model


class ModelLoadError(RuntimeError):
    """A model that cannot be loaded; the message says what to do instead."""


# config.json's sizes that must be whole numbers of at least 1 where they are given.
POSITIVE_INT_FIELDS = (
    "max_position_embeddings",
    "hidden_size",
    "intermediate_size",
    "num_attention_heads",
    "num_hidden_layers",
    "num_key_value_heads",
    "vocab_size",
)


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
    object, has no model_type, a size that is not a positive whole number, or does
    not match the weights; a safetensors file cut short; tokenizer files that do not
    load."""
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
    for field in POSITIVE_INT_FIELDS:
        value = config.get(field, 1)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ModelLoadError(
                f'{config_path} gives "{field}": {json.dumps(value)}, where it must be '
                "a whole number of at least 1: restore the model's original "
                "config.json"
            )
    for weights in sorted(path.glob("*.safetensors")):
        check_safetensors_size(weights)
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


def check_safetensors_size(path: Path) -> None:
    """Raise a ModelLoadError when `path` is shorter than its own header says: an
    interrupted download or copy. The header is 8 bytes of little-endian length, then
    JSON giving each tensor's data_offsets from the end of the header."""
    size = path.stat().st_size
    try:
        with open(path, "rb") as file:
            (length,) = struct.unpack("<Q", file.read(8))
            if 8 + length > size:
                raise ValueError("the header runs past the end of the file")
            header = json.loads(file.read(length))
        end = max(
            (
                entry["data_offsets"][1]
                for name, entry in header.items()
                if name != "__metadata__"
            ),
            default=0,
        )
    except (struct.error, ValueError, TypeError, KeyError, IndexError) as error:
        raise ModelLoadError(
            f"{path} is not a readable safetensors file ({one_line(error)}): download "
            "or copy it again"
        ) from None
    needed = 8 + length + end
    if size < needed:
        raise ModelLoadError(
            f"{path} is cut short: {size:,} bytes where its header needs {needed:,} "
            "(an interrupted download or copy): download or copy it again"
        )


def one_line(error: Exception, limit: int = 240) -> str:
    """An error's message on one line; long lists (of parameter names) shortened."""
    text = " ".join(str(error).split())
    return text if len(text) <= limit else text[: limit - 3].rstrip() + "..."
