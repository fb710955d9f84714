"""Check the chat page in a real headless browser: `python -m scripts.tools.check_chat_page`.

Starts our server on 127.0.0.1 (or uses --url), opens `/?q=QUESTION` in Debian's
chromium (the page fills its box with the question; the script presses Send, as the
page asks a person to), waits (bounded) until the
page says the streamed answer is done, checks that the answer and the engine panel
are on the page, and saves a screenshot. Needs `apt-get install -y chromium`; not
part of CI.

Chromium is driven over the DevTools protocol on a pipe (--remote-debugging-pipe:
JSON messages ending in a NUL byte on file descriptors 3 and 4), so nothing but the
standard library is needed here.
"""

import argparse
import base64
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from urllib.parse import quote

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = "/usr/bin/chromium"
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--window-size=1200,800",
    "--remote-debugging-pipe",
]
QUESTION = "What is the capital of France?"


class Browser:
    """Chromium with the DevTools protocol on a pipe; `call` sends one command and
    returns its result, skipping the events in between."""

    def __init__(self, user_data_dir: str):
        to_browser_read, self.to_browser = os.pipe()
        self.from_browser, from_browser_write = os.pipe()
        command = " ".join([CHROMIUM, *FLAGS, f"--user-data-dir={user_data_dir}"])
        self.process = subprocess.Popen(
            ["bash", "-c", f"exec {command} about:blank 3<&{to_browser_read} "
             f"4>&{from_browser_write}"],
            pass_fds=(to_browser_read, from_browser_write),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )  # fmt: skip
        os.close(to_browser_read)
        os.close(from_browser_write)
        self.next_id = 0
        self.buffer = b""

    def call(self, method: str, session: str | None = None, **params) -> dict:
        self.next_id += 1
        message = {"id": self.next_id, "method": method, "params": params}
        if session:
            message["sessionId"] = session
        os.write(self.to_browser, json.dumps(message).encode() + b"\0")
        while True:
            reply = self.read()
            if reply.get("id") == self.next_id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply["result"]

    def read(self) -> dict:
        while b"\0" not in self.buffer:
            data = os.read(self.from_browser, 1 << 16)
            if not data:
                raise RuntimeError("chromium closed the DevTools pipe")
            self.buffer += data
        message, self.buffer = self.buffer.split(b"\0", 1)
        return json.loads(message)

    def close(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()


# The page only fills its box from ?q= (a link must not spend the user's key), so the
# check presses Send once the page has loaded.
SEND_WHEN_LOADED = (
    'document.readyState === "complete" && document.getElementById("send") !== null'
    ' && (document.getElementById("send").click(), true)'
)


def evaluate(browser: Browser, session: str, expression: str):
    result = browser.call(
        "Runtime.evaluate", session, expression=expression, returnByValue=True
    )
    return result["result"].get("value")


def start_server(port: int) -> subprocess.Popen:
    command = [sys.executable, "-m", "scripts.commands.serve", "--port", str(port)]
    process = subprocess.Popen(
        command, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    import httpx

    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        try:
            if (
                httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code
                == 200
            ):
                return process
        except httpx.HTTPError:
            time.sleep(0.5)
    process.kill()
    raise SystemExit("error: the server did not start within 180 s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", help="a running server (default: start one)")
    parser.add_argument("--port", type=int, default=8123)
    parser.add_argument(
        "--screenshot",
        type=Path,
        default=ROOT / "book" / "src" / "images" / "serving-chat-page.png",
    )
    parser.add_argument("--timeout", type=float, default=120.0)
    args = parser.parse_args()
    if not Path(CHROMIUM).exists():
        raise SystemExit(f"error: {CHROMIUM} is missing: apt-get install -y chromium")
    server = None if args.url else start_server(args.port)
    url = args.url or f"http://127.0.0.1:{args.port}"
    with tempfile.TemporaryDirectory() as profile:
        browser = Browser(profile)
        try:
            page = f"{url}/?max_tokens=48&q={quote(QUESTION)}"
            target = browser.call("Target.createTarget", url=page)["targetId"]
            session = browser.call(
                "Target.attachToTarget", targetId=target, flatten=True
            )["sessionId"]
            deadline = time.monotonic() + args.timeout
            state, sent = None, False
            while time.monotonic() < deadline:
                if not sent:
                    sent = evaluate(browser, session, SEND_WHEN_LOADED)
                state = evaluate(browser, session, "document.body.dataset.state")
                if state in ("done", "error"):
                    break
                time.sleep(0.25)
            time.sleep(1.5)  # one more refresh of the engine panel
            answer = evaluate(
                browser, session, "document.querySelector('.assistant').innerText"
            )
            chunks = evaluate(
                browser, session, "document.querySelector('.assistant').dataset.chunks"
            )
            panel = evaluate(
                browser, session, "document.getElementById('stats').innerText"
            )
            shot = browser.call("Page.captureScreenshot", session, format="png")
            args.screenshot.parent.mkdir(parents=True, exist_ok=True)
            args.screenshot.write_bytes(base64.b64decode(shot["data"]))
        finally:
            browser.close()
            if server is not None:
                server.terminate()
                server.wait(timeout=30)
    print(f"page state: {state}\nanswer ({chunks} chunks): {answer!r}")
    print(f"engine panel: {panel!r}")
    print(f"screenshot: {args.screenshot}")
    streamed = int(chunks or 0) >= 2
    if state != "done" or not streamed or "Paris" not in (answer or ""):
        raise SystemExit("error: the page did not show a streamed answer about Paris")
    if "slots" not in (panel or ""):
        raise SystemExit("error: the engine panel is empty")


if __name__ == "__main__":
    main()
