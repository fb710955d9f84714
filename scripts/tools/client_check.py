"""Run the clients people use against our server: `pdm run client-check`.

pdm run client-check                         # every client, table on stdout
pdm run client-check --clients openai,lm_eval --feature-timeout 300

Each client of scripts/tools/clients/ gets a virtualenv of its own under
.cache/client-venv/<client>, made (once, and again when its pinned
requirements/<client>.txt changes) from PyPI: their pins conflict (openai-agents
needs openai 3, llama-index's OpenAILike openai 2, instructor a jiter that
pydantic-ai's openai refuses). openai and anthropic run in the project's own
environment, where they are dev dependencies. The script starts `serve` (the
embedded model) on a free loopback port, waits for /health, runs each client's
first documented usage of each feature in a subprocess with a time bound, stops
the server (also on failure or Ctrl-C), and prints a table: works, fails (one
line why), or model (the server kept its side; the client refused what the
135M-parameter model wrote). Exit status 1 when any feature fails.
"""

import argparse
import hashlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

from tiny_llm_base.embedded_model import MODEL_DIR_NAME, default_models_dir
from scripts.commands.ports import free_port

ROOT = Path(__file__).resolve().parents[2]
CLIENTS = ROOT / "scripts" / "tools" / "clients"
VENVS = ROOT / ".cache" / "client-venv"
LOGS = ROOT / ".cache" / "client-check"
# --clients name (clients/NAME_client.py, requirements/NAME.txt) -> table name.
ORDER = {
    "openai": "openai",
    "anthropic": "anthropic",
    "instructor": "instructor",
    "langchain": "langchain-openai",
    "pydantic_ai": "pydantic-ai",
    "agents": "openai-agents",
    "litellm": "litellm",
    "llama_index": "llama-index OpenAILike",
    "lm_eval": "lm-eval",
}
IN_PROJECT = ("openai", "anthropic")  # dev dependencies: the project's environment
API_KEY = "client-check"
INSTALL_S = 1200
START_S = 600  # the first start converts the embedded model
IMPORT_S = 180  # a client's imports, on a busy machine
# What the clients must not do here: phone home, fetch cost maps, trace to OpenAI.
QUIET = {
    "HF_HUB_OFFLINE": "1",
    "HF_DATASETS_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "LITELLM_LOCAL_MODEL_COST_MAP": "True",
    "OPENAI_AGENTS_DISABLE_TRACING": "1",
    "LANGCHAIN_TRACING_V2": "false",
    "DO_NOT_TRACK": "1",
    "TOKENIZERS_PARALLELISM": "false",
}


def python_for(client: str) -> Path:
    """The client's interpreter, its virtualenv made or refreshed first."""
    if client in IN_PROJECT:
        return Path(sys.executable)
    requirements = CLIENTS / "requirements" / f"{client}.txt"
    venv = VENVS / client
    python = venv / "bin" / "python"
    stamp = venv / "requirements.sha256"
    digest = hashlib.sha256(requirements.read_bytes()).hexdigest()
    if python.exists() and stamp.exists() and stamp.read_text() == digest:
        return python
    print(f"installing {requirements.relative_to(ROOT)} into {venv}", flush=True)
    log = LOGS / f"install-{venv.name}.log"
    with log.open("w") as out:
        made = subprocess.run(
            [sys.executable, "-m", "venv", "--clear", str(venv)], stdout=out, stderr=out
        )
        pip = [str(python), "-m", "pip", "install", "--disable-pip-version-check"]
        pip += ["-r", str(requirements)]
        if (
            made.returncode
            or subprocess.run(pip, stdout=out, stderr=out, timeout=INSTALL_S).returncode
        ):
            raise RuntimeError(f"installing {requirements.name} failed: see {log}")
    stamp.write_text(digest)
    return python


def start_server(port: int, model: str, log: Path) -> subprocess.Popen:
    """`serve` on 127.0.0.1:port, once /health answers; its output goes to log."""
    command = [sys.executable, "-m", "scripts.commands.serve", "--host", "127.0.0.1"]
    command += ["--port", str(port), "--api-key", API_KEY, "--model-name", model]
    with log.open("w") as out:
        server = subprocess.Popen(command, cwd=ROOT, stdout=out, stderr=out)
    deadline = time.monotonic() + START_S
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise RuntimeError(f"serve exited with {server.returncode}: see {log}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5):
                return server
        except OSError:
            time.sleep(0.5)
    stop_server(server)
    raise RuntimeError(f"serve did not answer /health within {START_S} s: see {log}")


def stop_server(server: subprocess.Popen) -> None:
    if server.poll() is None:
        server.send_signal(signal.SIGTERM)
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()


def run_client(client: str, python: Path, url: str, model: str, seconds: int) -> list:
    """[(feature, verdict, why)]: what the client's run printed, and for the
    features it never reached (it was killed at its bound, or crashed), fails.
    Its first line names its features; each has `seconds` (check.py's alarm),
    and the whole run that many times over, after IMPORT_S to start."""
    env = os.environ | QUIET | {"PYTHONPATH": str(ROOT)}
    env["CLIENT_CHECK_TOKENIZER"] = str(default_models_dir() / MODEL_DIR_NAME)
    command = [str(python), "-m", "scripts.tools.clients.check", f"{client}_client"]
    command += [url, model, API_KEY, str(seconds)]
    log = LOGS / f"{client}.log"
    lines, named = [], threading.Event()

    def read(stream) -> None:
        for line in stream:  # check.py's JSON lines, among what a client prints
            if line.startswith('{"feature'):
                lines.append(json.loads(line))
                named.set()

    with log.open("w") as err:
        child = subprocess.Popen(
            command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=err,
            text=True, start_new_session=True,  # its own group: lm-eval's CLI too
        )  # fmt: skip
        reader = threading.Thread(target=read, args=(child.stdout,), daemon=True)
        reader.start()
        features = lines[0]["feature_names"] if named.wait(IMPORT_S) and lines else []
        try:
            child.wait(timeout=seconds * len(features) + 30 if features else 1)
            why = f"the run exited with {child.returncode}: see {log}"
        except subprocess.TimeoutExpired:
            why = f"stopped at the run's bound: see {log}"
        finally:  # also on Ctrl-C: the group is not in the terminal's
            if child.poll() is None:
                os.killpg(child.pid, signal.SIGKILL)
                child.wait()
        reader.join(timeout=10)
    rows = [(r["feature"], r["verdict"], r["why"]) for r in lines[1:]]
    done = {feature for feature, _, _ in rows}
    missing = [f for f in features if f not in done] or ([] if features else ["-"])
    return rows + [(feature, "fails", why) for feature in missing]


def table(results: dict) -> str:
    lines = ["| client | feature | verdict | why |", "|---|---|---|---|"]
    for client, rows in results.items():
        for feature, verdict, why in rows:
            why = why.replace("|", "\\|")
            lines.append(f"| {client} | {feature} | {verdict} | {why} |")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", help="comma-separated, of: " + ", ".join(ORDER))
    parser.add_argument("--feature-timeout", type=int, default=240, metavar="S")
    parser.add_argument("--model-name", default="SmolLM2-135M-Instruct")
    args = parser.parse_args()
    chosen = args.clients.split(",") if args.clients else list(ORDER)
    unknown = [c for c in chosen if c not in ORDER]
    if unknown:
        parser.error(f"unknown clients {unknown}: choose from {', '.join(ORDER)}")
    LOGS.mkdir(parents=True, exist_ok=True)
    pythons = {client: python_for(client) for client in chosen}
    port = free_port()
    server = start_server(port, args.model_name, LOGS / "serve.log")
    results = {}
    try:
        for client in chosen:
            started = time.monotonic()
            rows = run_client(
                client, pythons[client], f"http://127.0.0.1:{port}",
                args.model_name, args.feature_timeout,
            )  # fmt: skip
            results[ORDER[client]] = rows
            print(
                f"{ORDER[client]}: {sum(v == 'works' for _, v, _ in rows)}/{len(rows)}"
                f" work ({time.monotonic() - started:.0f} s)",
                flush=True,
            )
    finally:
        stop_server(server)
    print(table(results))
    return (
        1 if any(v == "fails" for rows in results.values() for _, v, _ in rows) else 0
    )


if __name__ == "__main__":
    sys.exit(main())
