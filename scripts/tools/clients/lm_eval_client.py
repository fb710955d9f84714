"""lm-eval (the evaluation harness): its CLI's documented runs against a local
OpenAI-compatible server, on the tiny tasks in lm_eval_tasks/ (four documents
each): local-completions on a loglikelihood task (multiple choice: the prompt's
logprobs, echoed) and local-chat-completions on a generation task.

The tokenizer is the served model's own folder (CLIENT_CHECK_TOKENIZER, set by
client_check.py): local-completions sends token ids and counts the context."""

import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

from scripts.tools.clients import ServerAddress

TASKS = Path(__file__).parent / "lm_eval_tasks"
SECONDS = 200  # inside the feature's own bound


def evaluate(
    server: ServerAddress, model: str, task: str, endpoint: str, *extra
) -> dict:
    """`lm_eval --model MODEL --tasks TASK ...`'s results for TASK; extra: more
    options, model_args as "key=value" strings first."""
    more = [arg for arg in extra if "=" in arg]
    extra = tuple(arg for arg in extra if "=" not in arg)
    model_args = ",".join(
        [f"model={server.model}", f"base_url={server.v1}/{endpoint}"]
        + ["num_concurrent=1", "max_retries=1", *more]
    )
    with tempfile.TemporaryDirectory() as out:
        command = [
            *(sys.executable, "-m", "lm_eval", "--model", model),
            *("--tasks", task, "--include_path", str(TASKS), "--limit", "4"),
            *("--model_args", model_args, "--output_path", out, *extra),
        ]
        env = os.environ | {"OPENAI_API_KEY": server.api_key}
        run = subprocess.run(
            command, capture_output=True, text=True, timeout=SECONDS, env=env
        )
        results = list(Path(out).rglob("results_*.json"))
        if run.returncode != 0 or not results:
            raise RuntimeError(last_error(run.stdout + run.stderr))
        return json.loads(results[0].read_text())["results"][task]


def last_error(output: str) -> str:
    """The most telling line of a failed run: the server's refusal if any."""
    refusals = re.findall(r'"message":\s*"((?:[^"\\]|\\.)*)"', output)
    if refusals:
        return f"the server answered 400: {refusals[-1]}"
    lines = [line.strip() for line in output.splitlines() if "rror" in line]
    return lines[-1] if lines else output.strip()[-200:] or "no output"


def loglikelihood(server: ServerAddress) -> None:
    tokenizer = os.environ["CLIENT_CHECK_TOKENIZER"]
    metrics = evaluate(
        server,
        "local-completions",
        "tiny_capitals",
        "completions",
        "tokenizer_backend=huggingface",
        f"tokenizer={tokenizer}",
    )
    assert "acc,none" in metrics, metrics


def generation(server: ServerAddress) -> None:
    metrics = evaluate(
        server,
        "local-chat-completions",
        "tiny_arithmetic",
        "chat/completions",
        "--apply_chat_template",
    )
    assert "exact_match,none" in metrics, metrics


FEATURES = {
    "local-completions, loglikelihood task": loglikelihood,
    "local-chat-completions, generation task": generation,
}
