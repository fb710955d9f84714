"""The servers a benchmark talks to over HTTP, each in a subprocess on 127.0.0.1:
ours (scripts/commands/serve.py) and the peer, mlx_lm.server on the embedded
model's folder, the fast BLAS loaded first as for ours.

Imports nothing from MLX at module level: the benchmark is only a client.
"""

import json
import os
import re
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[3]
START_TIMEOUT_S = 180
# The peer imports the project first, like ours: the fast BLAS loads before mlx.core.
PEER = (
    "import sys, tiny_llm_base; from mlx_lm.server import main; "
    "sys.argv = ['mlx_lm.server'] + sys.argv[1:]; main()"
)


class Server:
    """A server in a subprocess on 127.0.0.1, its output in a log file; ready once
    `ready_path` answers 200 (at most START_TIMEOUT_S). `with` stops it."""

    def __init__(self, name: str, command: list[str], port: int, ready_path: str):
        self.name = name
        self.url = f"http://127.0.0.1:{port}"
        self.log_path = Path(f"/tmp/bench-serve-{name}-{port}.log")
        env = os.environ | {"PYTHONUNBUFFERED": "1"}
        with open(self.log_path, "w") as log:
            self.process = subprocess.Popen(
                command, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, env=env
            )
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            if self.process.poll() is not None:
                raise RuntimeError(f"{name} exited while starting: see {self.log_path}")
            try:
                if httpx.get(self.url + ready_path, timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"{name} did not start in {START_TIMEOUT_S} s")
            time.sleep(0.5)

    def __enter__(self) -> "Server":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()

    def metrics(self) -> dict[str, float]:
        """Our /metrics as {name{labels}: value} (the peer has none)."""
        values = {}
        for line in httpx.get(self.url + "/metrics", timeout=10).text.splitlines():
            match = re.fullmatch(r"(\S+) (\S+)", line)
            if match and not line.startswith("#"):
                values[match[1]] = float(match[2])
        return values

    def settled(self, timeout_s: float) -> dict[str, float]:
        """metrics() once no request is running or waiting (or at timeout_s)."""
        deadline = time.monotonic() + timeout_s
        while True:
            now = self.metrics()
            busy = (
                now["tiny_llm:num_requests_running"]
                + now["tiny_llm:num_requests_waiting"]
            )
            if not busy or time.monotonic() > deadline:
                return now
            time.sleep(0.5)

    def chat(self, bodies: list[dict], concurrency: int) -> list[tuple]:
        """Each body posted to /v1/chat/completions, `concurrency` at a time: its
        (response, seconds), in order."""

        def post(body: dict) -> tuple:
            start = time.perf_counter()
            url = self.url + "/v1/chat/completions"
            response = httpx.post(url, json=body, timeout=900)
            return response, time.perf_counter() - start

        with ThreadPoolExecutor(concurrency) as pool:
            return list(pool.map(post, bodies))


def ours(port: int, solution: str, *options: str) -> Server:
    """`pdm run serve` of package `solution` with more of its options."""
    command = [sys.executable, "-m", "scripts.commands.serve", "--port", str(port)]
    return Server(
        "tiny-llm", [*command, "--solution", solution, *options], port, "/health"
    )


def peer(port: int, concurrency: int, float32: bool) -> Server:
    """mlx_lm.server on the embedded folder (float32: its float32 copy), decoding
    and prefilling `concurrency` requests at once."""
    from tiny_llm_base.embedded_model import ensure_embedded_model

    folder = ensure_embedded_model()
    if float32:
        folder = float32_folder(folder)
    command = [sys.executable, "-c", PEER, "--model", str(folder), "--port", str(port)]
    command += ["--host", "127.0.0.1", "--decode-concurrency", str(concurrency)]
    command += ["--prompt-concurrency", str(concurrency)]
    return Server("mlx_lm.server", command, port, "/v1/models")


def float32_folder(folder: Path) -> Path:
    """The model of `folder` with every weight in float32 (ours computes in float32),
    written once next to it, for a peer on the same weights as ours."""
    import mlx_lm
    from mlx_lm.utils import save_model

    from tiny_llm_base.mlx_lm_reference import float32_copy

    target = folder.with_name(folder.name + "-float32")
    if (target / "config.json").exists():
        return target
    model, _ = mlx_lm.load(str(folder))
    save_model(target, float32_copy(model))
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(folder / name, target / name)
    config = json.loads((folder / "config.json").read_text())
    config.pop("quantization", None)
    config.pop("quantization_config", None)
    config["torch_dtype"] = "float32"
    (target / "config.json").write_text(json.dumps(config, indent=2))  # written last
    return target
