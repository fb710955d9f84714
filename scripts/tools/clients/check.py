"""Run one client module's features against a server and print one JSON line per
feature: {"feature", "verdict", "why"}, verdict "works", "fails" or "model",
after a first line {"feature_names": [...]} naming them all.

    python -m scripts.tools.clients.check MODULE BASE_URL MODEL API_KEY SECONDS

Runs in the client's own virtualenv, so it imports nothing of the project. Each
feature has SECONDS (SIGALRM interrupts a call that waits longer). "model" means
the exchange was what the API promises and the client rejected only what the
small model chose to write (a feature says so by raising ModelAnswer, after
checking the server's part); "fails" is everything else.
"""

import importlib
import json
import signal
import sys
import traceback

from scripts.tools.clients import ModelAnswer, ServerAddress


class FeatureTimeout(Exception):
    pass


def one_line(error: BaseException) -> str:
    """The error's type and first line, short enough for a table cell."""
    text = str(error).strip().splitlines()[0] if str(error).strip() else ""
    line = f"{type(error).__name__}: {text}" if text else type(error).__name__
    return line if len(line) <= 240 else line[:237] + "..."


def run_feature(feature, server: ServerAddress, seconds: int) -> dict:
    def expire(signum, frame):
        raise FeatureTimeout(f"no answer within {seconds} s")

    signal.signal(signal.SIGALRM, expire)
    signal.alarm(seconds)
    try:
        feature(server)
        return {"verdict": "works", "why": ""}
    except ModelAnswer as answer:
        return {"verdict": "model", "why": str(answer)}
    except BaseException as error:  # a feature's failure is a row, not a crash
        if isinstance(error, KeyboardInterrupt):
            raise
        traceback.print_exc(file=sys.stderr)
        return {"verdict": "fails", "why": one_line(error)}
    finally:
        signal.alarm(0)


def main() -> None:
    module_name, url, model, api_key, seconds = sys.argv[1:6]
    module = importlib.import_module(f"scripts.tools.clients.{module_name}")
    server = ServerAddress(url, model, api_key)
    print(json.dumps({"feature_names": list(module.FEATURES)}), flush=True)
    for name, feature in module.FEATURES.items():
        result = {"feature": name, **run_feature(feature, server, int(seconds))}
        print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
