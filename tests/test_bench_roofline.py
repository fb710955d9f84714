"""The decode roofline's arithmetic and the optional llama.cpp peer, without a
benchmark run: the bytes a decode step of the embedded model's shapes reads, its
keys' and values' share, MBU, counted here by hand from the model's config numbers;
bandwidth's denominator the larger of the two measured; llama.cpp looked for and,
where absent (PATH emptied, llama_cpp not importable), one line on how to get it.
"""

import stat
import sys
from types import SimpleNamespace

import pytest
from mlx_lm.models import llama

from scripts.bench.benchlib import llama_cpp_peer
from scripts.bench.benchlib.roofline import (
    Bandwidth,
    bytes_per_step,
    kv_bytes_per_step,
    mbu,
    weight_bytes_per_token,
)

# SmolLM2-135M-Instruct, the embedded model (its GGUF's llama.* metadata).
HIDDEN, FFN, LAYERS, HEADS, KV_HEADS, HEAD_DIM, VOCAB = 576, 1536, 30, 9, 3, 64, 49152


@pytest.fixture(scope="module")
def embedded_shapes():
    """An mlx-lm llama model of the embedded model's shapes, float32 (its random
    weights stay unevaluated: only their shapes are read)."""
    args = llama.ModelArgs(
        model_type="llama",
        hidden_size=HIDDEN,
        num_hidden_layers=LAYERS,
        intermediate_size=FFN,
        num_attention_heads=HEADS,
        rms_norm_eps=1e-5,
        vocab_size=VOCAB,
        head_dim=HEAD_DIM,
        num_key_value_heads=KV_HEADS,
        tie_word_embeddings=True,
    )
    return llama.Model(args)


def test_a_decode_step_reads_every_weight_once_and_one_embedding_row(embedded_shapes):
    q_o = 2 * HIDDEN * HEADS * HEAD_DIM
    k_v = 2 * HIDDEN * KV_HEADS * HEAD_DIM
    mlp = 3 * HIDDEN * FFN
    layer = q_o + k_v + mlp + 2 * HIDDEN  # and two norms
    floats = LAYERS * layer + HIDDEN + HIDDEN + VOCAB * HIDDEN  # norm, row, tied head
    assert floats == 134_515_584  # the book's "~134.5 M floats"
    assert weight_bytes_per_token(embedded_shapes) == 4 * floats


def test_the_keys_and_values_a_step_reads():
    args = SimpleNamespace(
        num_hidden_layers=LAYERS,
        num_key_value_heads=KV_HEADS,
        head_dim=HEAD_DIM,
        hidden_size=HIDDEN,
        num_attention_heads=HEADS,
    )
    # a key and a value of 3 heads x 64 floats, 30 layers: 46,080 bytes a position
    assert kv_bytes_per_step(args, 1) == 46_080
    assert kv_bytes_per_step(args, 100, rows=8) == 46_080 * 100 * 8
    args.head_dim = None  # mlx-lm's default: hidden_size / heads
    assert kv_bytes_per_step(args, 100, rows=8) == 46_080 * 100 * 8


def test_mbu_of_a_step_of_8_rows(embedded_shapes):
    step = bytes_per_step(embedded_shapes, 50, 8)
    assert step == 538_062_336 + 46_080 * 50 * 8  # weights once, 8 rows' caches
    # 12 tokens/s at batch 8 is 1.5 steps/s: 1.5 * 556.5 MB over 30 GB/s
    assert mbu(step, 12 / 8, 30e9) == pytest.approx(0.027826, rel=1e-4)


def test_the_bandwidth_an_mbu_counts_against_is_the_larger():
    assert Bandwidth(25e9, 33e9, 2).best == 33e9
    assert Bandwidth(25e9, 20e9, 2).best == 25e9
    assert "33.0 GB/s on 2 threads" in Bandwidth(25e9, 33e9, 2).line()


def test_without_llama_cpp_it_says_how_to_get_it(monkeypatch):
    monkeypatch.setenv("PATH", "")
    monkeypatch.setitem(sys.modules, "llama_cpp", None)  # not importable
    said = []
    assert llama_cpp_peer.find(said.append) is None
    assert said == [llama_cpp_peer.HOW]
    assert "pip install llama-cpp-python" in said[0] and "llama-bench" in said[0]
    entry = llama_cpp_peer.not_installed()
    assert entry == {"installed": False, "how": llama_cpp_peer.HOW}


def test_llama_bench_on_path_is_found_and_its_json_read(tmp_path, monkeypatch):
    """A stand-in llama-bench printing llama-bench's JSON: its generation test's
    tokens/s, and the GGUF's precision from the file (the embedded one is Q4_1)."""
    from tiny_llm_base.embedded_model import gguf_path

    exe = tmp_path / "llama-bench"
    exe.write_text(
        "#!/bin/sh\necho '["
        '{"n_prompt": 0, "n_gen": 16, "avg_ts": 123.5, "stdev_ts": 1.5, '
        '"n_threads": 2, "model_type": "llama ?B Q4_1"}'
        "]'\n"
    )
    exe.chmod(exe.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", str(tmp_path))
    found = llama_cpp_peer.find(pytest.fail)
    assert found == llama_cpp_peer.LlamaCpp("llama-bench", str(exe))
    entry = llama_cpp_peer.measure(found, gguf_path(), [1, 2], 16, 3)
    assert "error" not in entry, entry
    assert entry["precision"] == "Q4_1"
    assert (entry["tokens_per_s"], entry["threads"]) == (123.5, 2)
    line = llama_cpp_peer.line(entry, 20.0)
    assert "123.5 tokens/s" in line and "Q4_1" in line and "ours 20.0" in line


def test_with_llama_quantize_beside_it_a_float32_copy_is_benched_too(
    tmp_path, monkeypatch
):
    """Stand-ins: llama-quantize writes the copy it is asked for (and must be asked
    for F32, requantizing allowed); llama-bench answers 50 tokens/s on that copy
    and 120 on the GGUF itself. The entry and the line carry both."""
    from tiny_llm_base.embedded_model import gguf_path

    quantize = tmp_path / "llama-quantize"
    quantize.write_text(
        '#!/bin/sh\n[ "$1" = --allow-requantize ] && [ "$4" = F32 ] || exit 3\n'
        'echo copy > "$3"\n'
    )
    bench = tmp_path / "llama-bench"
    bench.write_text(
        "#!/bin/sh\n"
        'case "$2" in *float32.gguf) ts=50.0 ;; *) ts=120.0 ;; esac\n'
        'echo "[{\\"n_prompt\\": 0, \\"n_gen\\": 8, \\"avg_ts\\": $ts, '
        '\\"n_threads\\": 2}]"\n'
    )
    for exe in (quantize, bench):
        exe.chmod(exe.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", str(tmp_path))
    found = llama_cpp_peer.find(pytest.fail)
    entry = llama_cpp_peer.measure(found, gguf_path(), [1, 2], 8, 2)
    assert "error" not in entry, entry
    assert entry["tokens_per_s"] == 120.0
    assert entry["float32"]["tokens_per_s"] == 50.0
    assert "float32 copy 50.0" in llama_cpp_peer.line(entry, 20.0)
