"""Week 4 Day 1 from the command line: batch-main and the server under mlx.launch.

Two local ranks (ring backend, 127.0.0.1) run each command as a user would start it,
and what they print or answer is compared with one rank's: batch-main's table with
batch-main's on one rank, the server's answer with batch_generate in this process.
Each launch runs in a session of its own, is bounded in time, and leaves no process
behind (tests/launches.py).

The model is a small random Qwen2 saved as a model folder with the embedded model's
tokenizer: 9 query and 3 KV heads like the embedded model (6 and 3 on two ranks,
so the ranks' KV bytes a token differ), but it loads and runs in a moment, where the
embedded model sharded on 2 busy cores takes ~10 s to build and ~1.5 s a step.
"""

import http.client
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import mlx.core as mx
import psutil
import pytest
from mlx.utils import tree_flatten

from tiny_llm_base import load_model
from tiny_llm_base.embedded_model import MODEL_DIR_NAME, default_models_dir

from scripts.commands.ports import free_port, free_ports

from .cli_runs import run_in_process
from .helpers import WAIT_S, sharpened
from .launches import LAUNCH_TIMEOUT, assert_no_rank_left, launch_command
from .random_models import random_model
from .servers import wait_idle
from .solution import SOLUTION, tiny

pytestmark = pytest.mark.task(2)

ROOT = Path(__file__).resolve().parents[1]
MAX_TOKENS = 6
# qwen2, hidden, heads, KV heads, intermediate, layers: the embedded model's heads.
SMALL = ("qwen2", 144, 9, 3, 160, 2)
SEED = 5
PROMPTS = ["What is the capital of France?", "Hi!"]
MAX_SEQ_LEN = 64
TOO_LONG = " ".join(["word"] * 80)  # over MAX_SEQ_LEN: that request alone fails


def start(command: list[str], out: Path) -> subprocess.Popen:
    """The launcher in a session of its own, its stdout and stderr into files."""
    return subprocess.Popen(
        command,
        cwd=ROOT,
        stdin=subprocess.DEVNULL,
        stdout=(out / "stdout").open("w"),
        stderr=(out / "stderr").open("w"),
        env=os.environ | {"COLUMNS": "200"},  # rich's table: whole short answers
        start_new_session=True,
    )


def output(out: Path) -> tuple[str, str]:
    return (out / "stdout").read_text(), (out / "stderr").read_text()


def stop(process: subprocess.Popen, out: Path) -> None:
    """Kill the launcher's session if it still runs; then no rank may be left."""
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
    assert_no_rank_left(process.pid)


@pytest.fixture(scope="module")
def model_folder(tmp_path_factory, embedded_model) -> Path:
    """The small model as a folder --model loads: config.json, model.safetensors,
    and the embedded model's tokenizer (its vocabulary sets the model's)."""
    folder = tmp_path_factory.mktemp("small-model")
    embedded = default_models_dir() / MODEL_DIR_NAME
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(embedded / name, folder / name)
    vocab = embedded_model[0].args.vocab_size
    model = sharpened(random_model(*SMALL, vocab, True, seed=SEED))
    mx.save_safetensors(
        str(folder / "model.safetensors"), dict(tree_flatten(model.parameters()))
    )
    arch, hidden, heads, kv_heads, intermediate, layers = SMALL
    config = {
        "model_type": arch,
        "hidden_size": hidden,
        "num_hidden_layers": layers,
        "intermediate_size": intermediate,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "rms_norm_eps": 1e-6,
        "vocab_size": vocab,
        "tie_word_embeddings": True,
        "rope_theta": 10000.0 + 37 * SEED,
        "max_position_embeddings": 4096,
    }
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def one_rank_texts(folder: Path, prompts) -> list:
    """batch_generate's greedy results on the unsharded model in this process."""
    mlx_model, tokenizer = load_model(folder)
    model = tiny.Qwen2ModelWeek2(mlx_model, use_fast_kernels=True)
    return tiny.batch_generate(
        model, tokenizer, prompts, max_tokens=MAX_TOKENS, max_seq_len=MAX_SEQ_LEN
    )


def batch_main(folder: Path, prompts: Path) -> list[str]:
    return [
        "batch-main.py",
        "--model", str(folder),
        "--prompts-file", str(prompts),
        "--max-tokens", str(MAX_TOKENS),
        "--max-seq-len", str(MAX_SEQ_LEN),
        "--solution", SOLUTION,
    ]  # fmt: skip


def run_to_the_end(command: list[str], out: Path) -> tuple[str, str]:
    """Run a command to its end within LAUNCH_TIMEOUT; its stdout and stderr."""
    out.mkdir()
    process = start(command, out)
    try:
        process.wait(timeout=LAUNCH_TIMEOUT)
    except subprocess.TimeoutExpired:
        pytest.fail(f"{' '.join(command[:8])} ran past {LAUNCH_TIMEOUT} s")
    finally:
        stop(process, out)
    return output(out)


def table_rows(stdout: str) -> list[list[str]]:
    """The results table's rows, each cell stripped, without TTFT (a time)."""
    rows = [line for line in stdout.splitlines() if re.match(r"│ *\d+ │", line)]
    cells = [[cell.strip() for cell in row.strip("│").split("│")] for row in rows]
    return [row[:4] + row[5:] for row in cells]


def test_batch_main_on_two_ranks_prints_one_ranks_table_once(tmp_path, model_folder):
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("\n".join([*PROMPTS, TOO_LONG]) + "\n")
    command = batch_main(model_folder, prompts)
    stdout, stderr = run_to_the_end(launch_command(2, *command), tmp_path / "two")
    one = run_in_process(*command, env={"COLUMNS": "200"})  # one rank: no process
    one_out, one_err = one.stdout, one.stderr
    assert stdout.count("results") == 1, stdout[-3000:] + stderr[-3000:]
    rows = table_rows(stdout)
    assert len(rows) == 3, stdout[-3000:]
    assert rows == table_rows(one_out)
    assert [row[1] for row in rows] != ["error"] * 3
    # The request over --max-seq-len fails alone, with one rank's error, said once.
    assert rows[2][1] == "error"
    [failure] = [line for line in one_err.splitlines() if line.startswith("request #")]
    assert stderr.count(failure) == 1, stderr
    assert stderr.count("tensor parallel over 2 ranks") == 1, stderr


def test_free_ports_are_free_in_a_row_and_outside_the_ephemeral_range():
    """A ring's ports (starting_port + rank) all bind, and all lie below the ports
    the kernel gives out to bind(0) and outgoing connections (its ephemeral range,
    sampled: 20 ports it gave out)."""
    given = []
    for _ in range(20):
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            given.append(sock.getsockname()[1])
    for count in (1, 3):
        start = free_ports(count)
        assert start + count <= min(given), given
        sockets = [socket.socket() for _ in range(count)]
        for port, sock in zip(range(start, start + count), sockets):
            sock.bind(("127.0.0.1", port))
        for sock in sockets:
            sock.close()


def test_a_ring_port_in_use_is_one_error_line_from_each_rank(tmp_path):
    """Another program holds rank 1's ring port: rank 1 cannot bind, rank 0 loses
    its peer. Each rank says so in one line naming --starting-port, and no
    traceback (a rank other than 0 prints only error lines: its failure was
    silent, the launcher saying only that it exited with code 1)."""
    start_port = free_ports(2)
    with socket.socket() as held:
        held.bind(("127.0.0.1", start_port + 1))
        held.listen()
        command = launch_command(
            2, "batch-main.py", "--solution", SOLUTION, starting_port=start_port
        )
        stderr = run_to_the_end(command, tmp_path / "out")[1]
    assert "Traceback" not in stderr, stderr[-3000:]
    rank_one = [line for line in stderr.splitlines() if "(rank 1)" in line]
    assert len(rank_one) == 1, stderr[-3000:]
    assert "could not join" in rank_one[0] and "--starting-port" in rank_one[0]


def post(port: int, body: dict, timeout: float = WAIT_S) -> tuple[int, dict]:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        connection.request(
            "POST",
            "/v1/chat/completions",
            json.dumps(body),
            {"Content-Type": "application/json"},
        )
        response = connection.getresponse()
        return response.status, json.loads(response.read())
    finally:
        connection.close()


def serve_options(port: int, folder: Path) -> list[str]:
    return [
        "--model", str(folder),
        "--port", str(port),
        "--max-seq-len", "256",
        "--solution", SOLUTION,
    ]  # fmt: skip


def wait_until_serving(port: int, process: subprocess.Popen, out: Path) -> None:
    """GET /health until it answers, the launcher exits, or LAUNCH_TIMEOUT."""
    deadline = time.monotonic() + LAUNCH_TIMEOUT
    while time.monotonic() < deadline:
        if process.poll() is not None:
            pytest.fail(f"the server stopped before serving:\n{output(out)[1][-3000:]}")
        try:
            connection = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
            connection.request("GET", "/health")
            if connection.getresponse().status == 200:
                return
        except OSError:
            pass
        finally:
            connection.close()
        time.sleep(0.5)
    pytest.fail(f"no answer on port {port} within {LAUNCH_TIMEOUT} s")


def start_two_rank_server(
    port: int, folder: Path, out: Path, module: str = "scripts.commands.serve"
) -> subprocess.Popen:
    """The server (`python -m module`) under mlx.launch on 2 ranks, answering on
    `port`."""
    process = start(launch_command(2, "-m", module, *serve_options(port, folder)), out)
    try:
        wait_until_serving(port, process, out)
    except BaseException:
        stop(process, out)
        raise
    return process


def listeners(session: int, port: int) -> list[tuple[int, str]]:
    """(pid, address) of each rank of the launcher's session listening on port."""
    return [
        (rank.pid, connection.laddr.ip)
        for rank in psutil.Process(session).children()
        for connection in rank.net_connections("inet")
        if connection.status == psutil.CONN_LISTEN and connection.laddr.port == port
    ]


def abort_a_stream(port: int) -> None:
    """A streamed answer the client leaves after its first chunk: an abort."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=WAIT_S)
    body = {
        "messages": [{"role": "user", "content": "Tell me a long story."}],
        "max_tokens": 48,
        "stream": True,
    }
    connection.request(
        "POST",
        "/v1/chat/completions",
        json.dumps(body),
        {"Content-Type": "application/json"},
    )
    response = connection.getresponse()
    assert response.status == 200
    assert response.readline().startswith(b"data: ")
    connection.close()


def test_server_on_two_ranks_answers_as_one_rank_and_leaves_nothing(
    tmp_path, model_folder
):
    port = free_port()
    process = start_two_rank_server(port, model_folder, tmp_path)
    try:
        zero = rank_pid(process.pid, 0)
        assert listeners(process.pid, port) == [(zero, "127.0.0.1")], (
            "rank 0 alone, on 127.0.0.1 only"
        )
        question = [{"role": "user", "content": PROMPTS[0]}]
        with ThreadPoolExecutor(3) as pool:  # in the same steps: fewer of them
            aborted = pool.submit(abort_a_stream, port)
            greedy = pool.submit(
                post,
                port,
                {"messages": question, "max_tokens": MAX_TOKENS, "temperature": 0},
            )
            sampled = pool.submit(
                post, port, {"messages": question, "max_tokens": 3, "temperature": 0.8}
            )
            aborted.result()
            status, greedy = greedy.result()
            assert status == 200, greedy
            status, sampled = sampled.result()
            assert status == 200, sampled  # ranks that sampled apart would stop
        # The abort lands once the server sees the client gone: read /metrics only
        # once /engine shows nothing running (every finish is counted by then).
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=WAIT_S) as web:
            wait_idle(web)
            metrics = web.get("/metrics").text
        # A clean stop: SIGTERM to rank 0, which tells rank 1 to stop.
        os.kill(zero, signal.SIGTERM)
        process.wait(timeout=WAIT_S)
    finally:
        stop(process, tmp_path)
    stdout, stderr = output(tmp_path)
    assert 'finished_reason="abort"} 1.0' in metrics
    tokenizer = load_model(model_folder)[1]
    ids = tokenizer.apply_chat_template(question, add_generation_prompt=True)
    [expected] = one_rank_texts(model_folder, [ids])
    assert greedy["choices"][0]["message"]["content"] == expected.text
    assert "2 ranks" in stderr, stderr[-3000:]
    assert "lost rank 0" not in stderr and "differs from rank 0" not in stderr


def rank_pid(session: int, rank: int) -> int:
    """The pid of `rank` among the launcher's children (MLX_RANK in its
    environment): mlx.launch starts each local rank as a child of its own."""
    found = [
        child.pid
        for child in psutil.Process(session).children()
        if child.environ().get("MLX_RANK") == str(rank)
    ]
    assert len(found) == 1, f"rank {rank}: {found} among the launcher's children"
    return found[0]


@pytest.mark.parametrize(
    "sig, words",
    [
        # Rank 1 dies: whichever comes first, mlx.launch stopping rank 0 or rank 0's
        # next step finding the ring broken, the request gets a 503 saying so.
        (signal.SIGKILL, ("shutting down", "a rank was lost")),
        # A rank that hangs (stopped): nobody notices but rank 0's watchdog, once
        # the step's first sum has waited NOTES_TIMEOUT_S (here shortened to 2 s by
        # tests/serve_quick_watchdog.py: the test waits for it).
        (signal.SIGSTOP, ("a rank stopped answering",)),
    ],
    ids=["killed", "hung"],
)
def test_a_lost_rank_gets_a_503_and_the_server_exits(
    tmp_path, model_folder, sig, words
):
    """Rank 1 lost while the server is idle: rank 0's next step would wait for
    good on a sum that never returns, leaving a port that answers nothing. The
    waiting request gets a 503 saying why, and the whole launch ends."""
    port = free_port()
    hangs = sig == signal.SIGSTOP
    module = "tests.serve_quick_watchdog" if hangs else "scripts.commands.serve"
    process = start_two_rank_server(port, model_folder, tmp_path, module)
    try:
        zero, one = rank_pid(process.pid, 0), rank_pid(process.pid, 1)
        zero_process = psutil.Process(zero)
        os.kill(one, sig)
        question = [{"role": "user", "content": PROMPTS[0]}]
        status, reply = post(port, {"messages": question, "max_tokens": MAX_TOKENS})
        assert status == 503, reply
        assert any(w in reply["error"]["message"] for w in words), reply
        try:  # rank 0 ends (a stopped rank 1 stays)
            zero_process.wait(timeout=WAIT_S)
        except psutil.TimeoutExpired:
            pytest.fail(f"rank 0 is still running {WAIT_S} s after the 503")
    finally:
        stop(process, tmp_path)
    stderr = output(tmp_path)[1]
    assert "Exception in ASGI" not in stderr, stderr[-3000:]
    if sig == signal.SIGSTOP:
        assert "error: a rank stopped answering" in stderr, stderr[-3000:]
