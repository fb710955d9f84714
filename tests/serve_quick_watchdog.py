"""`python -m scripts.commands.serve ARGS` with rank 0's watchdog for the start of a
step at QUICK_NOTES_TIMEOUT_S instead of rank_server.NOTES_TIMEOUT_S (10 s): for
test_week_4_day_1_cli's rank that hangs, whose test waits for that watchdog to fire.
Everything else is serve's own."""

import runpy

import tiny_llm_base  # noqa: F401  (before mlx.core, which rank_server imports)

from scripts.commands import rank_server

QUICK_NOTES_TIMEOUT_S = 2.0

if __name__ == "__main__":
    assert rank_server.NOTES_TIMEOUT_S > QUICK_NOTES_TIMEOUT_S, "serve's watchdog moved"
    rank_server.NOTES_TIMEOUT_S = QUICK_NOTES_TIMEOUT_S
    runpy.run_module("scripts.commands.serve", run_name="__main__", alter_sys=True)
