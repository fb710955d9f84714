"""batch-main and serve on several ranks: tensor parallelism under mlx.launch.

    pdm run mlx.launch -n 2 --backend ring -- python batch-main.py --max-tokens 32
    pdm run mlx.launch -n 2 --backend ring -- python -m scripts.commands.serve

A command started by mlx.launch with more than one rank runs sharded on its own
(mx.distributed.init() has more than one rank): every rank loads the model, keeps
its slice (ShardedQwen2Model) and runs the same Engine. The engines never talk about
plans: each makes the same decisions because it sees the same inputs, and this
module is what keeps them the same.

- Requests: batch-main gives every rank the same prompts. The server listens on
  rank 0 only; RankZeroEngine sends each new request and each abort to the other
  ranks at the start of the step that admits it (two all_sums of a byte array), and
  follow() is the other ranks' loop.
- Time: no decision may depend on a clock, since each rank reads its own. The
  planner's one such decision is a batch request's deadline (batch_patience); it only
  matters between requests of different priorities. batch-main's are all "batch";
  the server's are not, so the server serves in arrival order under several ranks.
- The paged pool: its default size is half the memory available to each process,
  and ranks with more KV heads need more bytes a token; every rank takes the
  smallest pool in blocks of any rank (agreed_num_blocks).
- Sampling: the logits are the same bits on every rank, and every rank seeds MLX's
  random state with rank 0's seed, so sampled tokens agree too. The state is
  per thread: each rank seeds the thread that steps its engine.
- Output: only rank 0 prints; the others keep only their `error:` lines.

Imports nothing from MLX at module level (scripts.commands.cli's rule).
"""

import os
import pickle
import sys
import threading
import time
import zlib
from dataclasses import replace
from typing import NoReturn

from scripts.commands.cli import fail
from scripts.commands.interrupt import interrupted

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


def launched_rank() -> int:
    """This process's rank as mlx.launch set it (MLX_RANK; 0 when not launched),
    read before MLX is imported."""
    try:
        return int(os.environ.get("MLX_RANK", "0"))
    except ValueError:
        return 0


class ErrorLinesOnly:
    """A stderr for ranks other than 0: only `error:` lines get through, marked with
    the rank; progress, notes and warnings are rank 0's to say."""

    encoding = "utf-8"

    def __init__(self, stream, rank: int):
        self.stream, self.rank, self.pending = stream, rank, ""

    def write(self, text: str) -> int:
        self.pending += text
        *lines, self.pending = self.pending.split("\n")
        for line in lines:
            if line.startswith("error:"):
                self.stream.write(f"error (rank {self.rank}):{line[6:]}\n")
                self.stream.flush()
        return len(text)

    def flush(self) -> None:
        pass

    def isatty(self) -> bool:
        return False


def quiet_unless_rank_zero() -> None:
    """On a rank other than 0: nothing on stdout, only errors on stderr. An
    exception nothing caught still gets through, as one `error (rank N):` line:
    otherwise the rank would exit 1 and the launcher could only say that it did."""
    rank = launched_rank()
    if rank > 0:
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115  (for the whole run)
        sys.stderr = ErrorLinesOnly(sys.stderr, rank)

        def uncaught(kind, error, _traceback) -> None:
            if not interrupted[0]:  # an interrupt's exit says so itself
                print(f"error: {kind.__name__}: {error}", file=sys.stderr)

        sys.excepthook = uncaught


class Ranks:
    """The ranks of mx.distributed.init(): one when the command was not launched
    by mlx.launch (or with -n 1)."""

    def __init__(self) -> None:
        import mlx.core as mx

        self.mx = mx
        self.group = mx.distributed.init()
        self.rank, self.size = self.group.rank(), self.group.size()
        self.seed: int | None = None

    @property
    def sharded(self) -> bool:
        return self.size > 1

    def broadcast(self, value=None):
        """Rank 0's `value` on every rank (the others pass None): pickled, then
        sent as bytes in two all_sums, its length and its bytes, the other ranks
        adding zeros. Every rank must call it at the same point."""
        import numpy as np

        mx = self.mx
        data = pickle.dumps(value) if self.rank == 0 else b""
        length = mx.distributed.all_sum(mx.array([len(data)]), group=self.group)
        length = int(length.item())
        if self.rank != 0:
            data = bytes(length)
        payload = mx.array(np.frombuffer(data, dtype=np.uint8).astype(np.int32))
        payload = mx.distributed.all_sum(payload, group=self.group)
        return pickle.loads(np.array(payload).astype(np.uint8).tobytes())

    def smallest(self, value: int) -> int:
        """The smallest of every rank's `value`."""
        mx = self.mx
        values = mx.distributed.all_gather(mx.array([value]), group=self.group)
        return int(values.min().item())

    def agree_seed(self) -> None:
        """Rank 0's random seed, on every rank."""
        self.seed = self.broadcast(
            int.from_bytes(os.urandom(4)) if self.rank == 0 else None
        )

    def seed_this_thread(self) -> None:
        """Seed MLX's random state, which is per thread, with the agreed seed: the
        thread that steps the engine then samples the same tokens on every rank, as
        long as every rank samples in the same order."""
        self.mx.random.seed(self.seed)


def join_ranks() -> Ranks:
    """The ranks this command runs on; under several, says so once and seeds the
    random state alike."""
    try:
        ranks = Ranks()
        if ranks.sharded:
            print(
                f"tensor parallel over {ranks.size} ranks (mlx.launch): each rank "
                "holds its share of the heads and the MLP; rank 0 prints",
                file=sys.stderr,
            )
            ranks.agree_seed()
            ranks.seed_this_thread()  # batch-main steps its engine on this thread
    except RuntimeError as error:  # the ring's own errors: a port, a lost peer
        fail(
            f"the ranks could not join: {error}; another program may hold one of "
            "the ring's ports (mlx.launch --starting-port and the next ones, one "
            "a rank): choose another --starting-port",
            status=1,
        )
    return ranks


def sharded_model(package, mlx_model, ranks: Ranks, solution: str):
    """This rank's ShardedQwen2Model (fast kernels where the package has them),
    after one token through it; a failure exits with one line."""
    mx = ranks.mx
    for fast in (True, False) if solution == "learner" else (True,):
        try:
            model = package.ShardedQwen2Model(
                mlx_model, ranks.group, use_fast_kernels=fast
            )
            mx.eval(model(mx.array([[0]]), 0, model.create_kv_cache()))
            return model
        except NotImplementedError as error:
            if not fast or solution != "learner":
                fail(f"not implemented yet in src/tiny_llm: {error}", status=1)
        except ValueError as error:
            fail(f"cannot shard the model over {ranks.size} ranks: {error}")


def agreed_num_blocks(
    package,
    model,
    ranks: Ranks,
    batch_size: int,
    max_seq_len: int,
    block_size: int,
    kv_memory: int | None,
    kv_dtype: str = "float32",
) -> int:
    """The paged pool's size in blocks, the same on every rank: each rank's pool
    for `kv_memory` (default: half its available memory) at its own bytes a token
    (at kv_dtype), then the smallest. A budget too small for one request exits with
    its error."""
    config = package.EngineConfig(
        batch_size=batch_size,
        max_seq_len=max_seq_len,
        kv_cache="paged",
        block_size=block_size,
        kv_memory=kv_memory,
        kv_dtype=kv_dtype,
    )
    try:
        blocks, problem = config.pool_blocks(model), None
    except ValueError as error:
        blocks, problem = 0, str(error)
    smallest = ranks.smallest(blocks)
    if problem is not None:
        fail(problem.replace("kv_memory", "--kv-memory"))
    if smallest == 0:
        fail("another rank's KV budget cannot hold one request: see its error")
    return smallest


def budget_source(ranks: Ranks, kv_memory: int | None) -> str:
    """What sized the agreed pool, for the KV cache line."""
    what = "--kv-memory" if kv_memory else "half the available memory"
    return f"{what}, the smallest pool of {ranks.size} ranks"


def refuse_clock_decisions(args) -> None:
    """The server under several ranks: --batch-patience orders requests of
    different priorities by wall-clock deadlines, and each rank reads its own clock,
    so the ranks could plan differently. Arrival order (0) is the same everywhere."""
    if args.batch_patience:
        fail(
            f"--batch-patience {args.batch_patience:g} compares wall-clock times, and "
            "each rank reads its own clock, so ranks could plan differently: under "
            "mlx.launch the server serves in arrival order; leave --batch-patience "
            "out or pass 0"
        )
    args.batch_patience = 0.0


# --- The server: rank 0 listens, the others follow --------------------------------


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


class RankLost(RuntimeError):
    """A rank went away: the server cannot serve until it restarts (a 503)."""

    http_status = 503


class RankZeroEngine:
    """Rank 0's Engine as the server's EngineLoop sees it.

    add_request and abort only note what happened; step() first sends the notes to
    the other ranks (Ranks.broadcast), then hands them to the engine and steps it,
    so every rank's engine reads the same notes at the same step and gives the same
    ids. Everything else is the engine's. make_sampler: the server's sampler maker;
    a sampler it made travels as its settings, the other ranks make their own.
    """

    def __init__(self, engine, ranks: Ranks, make_sampler) -> None:
        self.engine, self.ranks = engine, ranks
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

    def __getattr__(self, name: str):
        return getattr(self.engine, name)

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
