"""The server on several ranks: rank 0 listens, the others follow.

RankZeroEngine is rank 0's engine as the server drives it (a ServedEngine): it
sends each new request and each abort to the other ranks at the start of the step
that admits it (two all_sums of a byte array), and follow() is the other ranks'
loop. A rank that goes away leaves a sum waiting for good: a Watchdog says so,
and the server's open requests end with a 503 (watch_ranks). See ranks.py for why
the ranks plan alike.

Imports the server (and so MLX): serve imports it after the project.
"""

import os
import pickle
import sys
import threading
import time
import zlib
from dataclasses import replace
from typing import NoReturn

from tiny_llm_serve.engine_protocol import EngineUnavailable

from scripts.commands.cli import fail
from scripts.commands.ranks import Ranks

STOP = "stop"
STOP_TIMEOUT_S = 5.0  # the most a stopping rank 0 waits to tell the others
# A sum over a ring that lost a rank never returns. The notes' sums return as soon
# as every rank has finished the step before (milliseconds: they run in lockstep);
# a whole step may take seconds (a long chunk on a busy machine).
NOTES_TIMEOUT_S = 10.0
STEP_TIMEOUT_S = 120.0


def digest(outputs) -> int:
    """A checksum of one step's RequestOutputs (ids, tokens, finish reasons): the
    other ranks compare theirs with rank 0's, so ranks that drifted apart stop with
    an error instead of pairing the wrong all_sums."""
    seen = [(o.request_id, list(o.tokens), o.finish_reason) for o in outputs]
    return zlib.crc32(repr(seen).encode())


class Watchdog:
    """Calls on_stuck(what) once, from its own thread, when a watched call on rank
    0's engine thread has run past its limit: the thread itself is stuck inside a
    sum that will never return, so someone else must say so."""

    def __init__(self, on_stuck) -> None:
        self.on_stuck = on_stuck
        self.lock = threading.Lock()
        self.deadline: float | None = None
        self.what = ""
        self.fired = False
        threading.Thread(target=self.watch, name="rank-watchdog", daemon=True).start()

    def arm(self, limit_s: float, what: str) -> None:
        with self.lock:
            self.deadline, self.what = time.monotonic() + limit_s, what

    def disarm(self) -> None:
        with self.lock:
            self.deadline = None

    def watch(self) -> None:
        while not self.fired:
            time.sleep(0.25)
            with self.lock:
                late = self.deadline is not None and time.monotonic() > self.deadline
                what = self.what
            if late:
                self.fired = True
                self.on_stuck(what)


class RankLost(EngineUnavailable):
    """A rank went away: the server cannot serve until it restarts (a 503)."""


class RankZeroEngine:
    """Rank 0's Engine as the server's EngineLoop sees it.

    add_request and abort only note what happened; step() first sends the notes to
    the other ranks (Ranks.broadcast), then hands them to the engine and steps it,
    so every rank's engine reads the same notes at the same step and gives the same
    ids. config, model, tokenizer, metrics, snapshot() and close() are the
    engine's. make_sampler: the server's sampler maker; a sampler it made travels
    as its settings, the other ranks make their own.
    """

    def __init__(self, engine, ranks: Ranks, make_sampler) -> None:
        self.engine, self.ranks = engine, ranks
        self.config, self.model = engine.config, engine.model
        self.tokenizer, self.metrics = engine.tokenizer, engine.metrics
        self.package_make_sampler = make_sampler
        self.lock = threading.Lock()
        self.notes: list[tuple] = []  # what the next step sends
        self.local: list[tuple] = []  # the same notes with the real samplers
        self.settings: dict[int, tuple] = {}  # id(sampler) -> (sampler, settings)
        self.next_id = 0
        self.seeded = False
        self.last_digest = digest([])
        self.broken = False  # a step raised: the ring may be gone
        self.watchdog: Watchdog | None = None  # set by the server (watch_ranks)

    def make_sampler(self, temp: float, top_p: float = 1.0, top_k: int | None = None):
        sampler = self.package_make_sampler(temp, top_p, top_k)
        with self.lock:
            self.settings[id(sampler)] = (sampler, (temp, top_p, top_k))
        return sampler

    def add_request(self, spec) -> int:
        """Note a PromptSpec (any thread); its id is the one the engines give it."""
        with self.lock:
            settings = None
            if spec.sampler is not None:
                made = self.settings.pop(id(spec.sampler), None)
                if made is None:
                    raise ValueError(
                        "under several ranks a request's sampler must come from "
                        "make_sampler: the other ranks make their own"
                    )
                settings = made[1]
            note = ("add", replace(spec, sampler=None), settings)
            pickle.dumps(note)  # a request that cannot travel fails here, alone
            request_id, self.next_id = self.next_id, self.next_id + 1
            self.notes.append(note)
            self.local.append(("add", spec))
        return request_id

    def abort(self, request_id: int, index: int | None = None) -> None:
        with self.lock:
            self.notes.append(("abort", request_id, index))
            self.local.append(("abort", request_id, index))

    def has_unfinished(self) -> bool:
        return bool(self.notes) or self.engine.has_unfinished()

    def step(self):
        if not self.seeded:  # on the engine thread, at its first step
            self.ranks.seed_this_thread()
            self.seeded = True
        with self.lock:
            notes, self.notes = self.notes, []
            local, self.local = self.local, []
        watchdog = self.watchdog
        try:
            if watchdog:
                watchdog.arm(NOTES_TIMEOUT_S, "the start of a step")
            try:
                self.ranks.broadcast((notes, self.last_digest))
            except RuntimeError as error:  # the ring's connection to a rank broke
                raise RankLost(
                    f"a rank was lost ({error}): the ranks cannot compute together "
                    "any more; restart the server"
                ) from error
            for note in local:
                if note[0] == "add":
                    self.engine.add_request(note[1])
                else:
                    self.engine.abort(note[1], note[2])
            if watchdog:
                watchdog.arm(STEP_TIMEOUT_S, "a step")
            outputs = self.engine.step()
        except BaseException:
            self.broken = True
            raise
        finally:
            if watchdog:
                watchdog.disarm()
        self.last_digest = digest(outputs)
        return outputs

    def snapshot(self):
        return self.engine.snapshot()

    def close(self) -> None:
        self.engine.close()

    def stop_ranks(self) -> None:
        """Tell the other ranks to stop (after the engine thread has stopped), unless
        a step failed: a sum over a ring that lost a rank may never return. Bounded
        by STOP_TIMEOUT_S all the same."""
        if self.broken:
            return

        def send() -> None:
            try:
                self.ranks.broadcast(([(STOP,)], self.last_digest))
            except RuntimeError:  # a rank has gone already
                pass

        sender = threading.Thread(target=send, name="stop-ranks", daemon=True)
        sender.start()
        sender.join(timeout=STOP_TIMEOUT_S)


def follow(engine, ranks: Ranks, make_sampler) -> NoReturn:
    """A rank other than 0 under the server: step the engine whenever rank 0 does,
    after the same notes; exit when rank 0 says stop or goes away."""
    from tiny_llm_base import PromptSpec

    ranks.seed_this_thread()
    mine = digest([])
    try:
        while True:
            notes, rank_zeros = ranks.broadcast()
            if rank_zeros != mine:
                fail(
                    f"rank {ranks.rank}'s last step differs from rank 0's (tokens or "
                    "finishes): the ranks no longer plan alike; stopping",
                    status=1,
                )
            for note in notes:
                if note[0] == STOP:
                    sys.exit(0)
                if note[0] == "add":
                    spec: PromptSpec = note[1]
                    if note[2] is not None:
                        spec = replace(spec, sampler=make_sampler(*note[2]))
                    engine.add_request(spec)
                else:
                    engine.abort(note[1], note[2])
            mine = digest(engine.step())
    except RuntimeError as error:
        fail(f"lost rank 0 ({error}): stopping", status=1)


def watch_ranks(engine_loop, engine: RankZeroEngine) -> None:
    """A rank that dies leaves rank 0's next sum waiting for good, and the server
    listening but answering nothing. When a step overruns its limit (Watchdog):
    every open request ends with a 503 saying so, then the process exits with an
    error line, and mlx.launch ends the other ranks."""

    def on_stuck(what: str) -> None:
        message = (
            f"a rank stopped answering during {what}: the ranks cannot compute "
            "together any more; restart the server"
        )
        engine_loop.fail_all(message, status=503)
        print(f"error: {message}", file=sys.stderr, flush=True)
        time.sleep(1.0)  # the failed requests' 503s go out first
        os._exit(1)

    engine.watchdog = Watchdog(on_stuck)


def stop_other_ranks_with(engine_loop, engine: RankZeroEngine) -> None:
    """Once the engine thread has stopped (the app's shutdown), tell the other
    ranks to stop: uvicorn ends the process by re-raising SIGTERM after the
    shutdown, so nothing after serve() would run."""
    stop = engine_loop.stop

    def stop_then_release() -> None:
        stop()
        engine.stop_ranks()

    engine_loop.stop = stop_then_release
