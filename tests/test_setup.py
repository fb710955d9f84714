"""The machinery around the course: fast BLAS, the embedded model, load_model, the CLI."""

import ctypes
import json
import subprocess
import sys
from pathlib import Path

import pytest

from tiny_llm_base import ModelLoadError, fast_blas, load_model
from tiny_llm_base import embedded_model as store

ROOT = Path(__file__).resolve().parents[1]


def symbol_address(library: ctypes.CDLL, name: str) -> int:
    return ctypes.cast(getattr(library, name), ctypes.c_void_p).value


def test_fast_blas_serves_mlx_where_openblas_is_available():
    if not fast_blas.needs_openblas():
        assert fast_blas.STATUS == fast_blas.BlasStatus(None, None)
        return
    path = fast_blas.find_openblas()
    if path is None:
        assert (
            not fast_blas.STATUS.active
            and fast_blas.DEBIAN_PACKAGE in fast_blas.STATUS.hint
        )
        return
    assert fast_blas.STATUS.library == path
    # libmlx binds cblas_sgemm through the global scope: it must be OpenBLAS's.
    process = ctypes.CDLL(None)
    assert symbol_address(process, "cblas_sgemm") == symbol_address(
        ctypes.CDLL(path), "cblas_sgemm"
    )
    assert (
        path in Path("/proc/self/maps").read_text()
        or Path(path).resolve().as_posix() in Path("/proc/self/maps").read_text()
    )


def test_embedded_model_folder_is_complete_and_pinned(embedded_model):
    folder = (
        store.default_models_dir() / store.MODEL_DIR_NAME
    )  # converted by the fixture
    assert store.folder_is_complete(folder)
    config = json.loads((folder / "config.json").read_text())
    assert (
        config["num_hidden_layers"],
        config["hidden_size"],
        config["num_attention_heads"],
    ) == (30, 576, 9)
    tokenizer_config = json.loads((folder / "tokenizer_config.json").read_text())
    assert (
        tokenizer_config["eos_token"] == "<|im_end|>"
        and "im_start" in tokenizer_config["chat_template"]
    )


def test_a_damaged_model_folder_is_detected_and_rebuilt(tmp_path):
    events = []
    folder = store.ensure_embedded_model(tmp_path, lambda *e: events.append(e[0]))
    assert "rebuild" not in events and "convert" in events
    (folder / "model.safetensors").write_bytes(b"truncated")
    assert not store.folder_is_complete(folder)
    events.clear()
    assert (
        store.ensure_embedded_model(tmp_path, lambda *e: events.append(e[0])) == folder
    )
    assert events[0] == "rebuild" and store.folder_is_complete(folder)


def test_an_interrupted_conversion_is_rebuilt(tmp_path):
    folder = tmp_path / store.MODEL_DIR_NAME
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    assert not store.folder_is_complete(folder)
    store.ensure_embedded_model(tmp_path)
    assert store.folder_is_complete(folder)


def test_load_model_explains_a_folder_that_is_not_a_model(tmp_path):
    with pytest.raises(ModelLoadError, match="not a model folder"):
        load_model(str(tmp_path))


def test_load_model_explains_a_name_that_is_neither_folder_nor_repo():
    with pytest.raises(
        ModelLoadError, match="neither a local folder nor a Hub repo id"
    ):
        load_model("no-such-model")


def test_load_model_explains_an_unreachable_hub_repo(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(
        ModelLoadError, match="could not load 'tiny-llm-test/absent-model'"
    ):
        load_model("tiny-llm-test/absent-model")


@pytest.mark.parametrize(
    "args, message",
    [
        (["--prompt", "  "], "--prompt is empty"),
        (["--max-tokens", "0"], "--max-tokens must be at least 1"),
        (["--temp", "-1"], "temp"),
        (["--top-p", "1.5"], "top_p"),
        (["--solution", "nope"], "unknown --solution"),
        (["--loader", "week9"], "unknown --loader"),
        (["--max-tokens", "many"], "invalid int value"),
    ],
)
def test_main_rejects_bad_input_with_one_line(args, message):
    result = subprocess.run(
        [sys.executable, "main.py", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and result.stderr.startswith("error:")
    assert message in result.stderr


def test_check_installation_reports_device_blas_and_rate():
    result = subprocess.run(
        [sys.executable, "scripts/check_installation.py"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert (
        "default device" in result.stdout
        and "BLAS:" in result.stdout
        and "GFLOP/s" in result.stdout
    )
