"""batch-main and serve on several ranks: tensor parallelism under mlx.launch.

    pdm run mlx.launch -n 2 --backend ring -- python batch-main.py --max-tokens 32
    pdm run mlx.launch -n 2 --backend ring -- python -m scripts.commands.serve

A command started by mlx.launch with more than one rank runs sharded on its own
(mx.distributed.init() has more than one rank): every rank loads the model, keeps
its slice (ShardedQwen2Model) and runs the same Engine. The engines never talk about
plans: each makes the same decisions because it sees the same inputs, and this
module is what keeps them the same.

- Requests: batch-main gives every rank the same prompts. The server listens on
  rank 0 only (rank_server.py); its RankZeroEngine sends each new request and each abort to the other
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

from scripts.commands.cli import fail
from scripts.commands.interrupt import interrupted


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
        from tiny_llm_base import fast_blas  # first: before mlx.core

        import mlx.core as mx

        self.mx = mx
        self.group = mx.distributed.init()
        self.rank, self.size = self.group.rank(), self.group.size()
        fast_blas.share_cores(self.size)  # the ranks share this machine's cores
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
