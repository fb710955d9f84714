"""The prefix cache's disk tier: named KV blocks kept in files, so that an engine
started later finds the blocks an earlier one computed.

One file per block, named by the block's chain hash (week 3 day 3), in a folder
named by the model's identity:

    kv_disk_dir/<model identity>/<chain hash>.safetensors
        keys, values: [layers, H, block_size, D] at the KV dtype
        metadata: format, model identity, chain hash, SHA-256 of the arrays' bytes

The identity (model_identity) digests everything besides the tokens that a block's
keys and values depend on, so another model's blocks are never read: they live in
another folder, and a file moved across is refused by its metadata. A file that does
not load, or whose checksum, identity or name disagree, is ignored with one warning
line and removed: a block on disk only saves time, computing it again is always
correct. The budget covers every file in kv_disk_dir, any model's: past it, the
least recently used go first.
"""

import hashlib
import logging
import os
import re
import tempfile
import time
from collections import OrderedDict
from collections.abc import Iterable, Iterator
from pathlib import Path

import mlx.core as mx

FORMAT = "tiny-llm-kv-block/1"
SAMPLE = 4096  # values of each array that the identity reads
BLOCK_FILE = re.compile(r"[0-9a-f]{64}\.safetensors")
log = logging.getLogger("tiny_llm.kv_disk")


def model_identity(model, block_size: int, kv_dtype: str = "float32") -> str:
    """A hex digest of what a block's keys and values depend on besides its tokens:
    the block size, how the pool stores them (kv_dtype), and everything reachable
    from the model's attributes (its class and settings; every array's path, shape
    and dtype, and SAMPLE of its values, evenly spread, so that weights of the same
    shapes but other values differ)."""
    digest = hashlib.sha256(
        f"{FORMAT} block_size={block_size} kv_dtype={kv_dtype}".encode()
    )
    for path, value in model_state(model, type(model).__name__):
        if isinstance(value, mx.array):
            flat = value.reshape(-1)
            sample = flat[:: max(1, flat.size // SAMPLE)][:SAMPLE]
            digest.update(f"{path} {value.shape} {value.dtype}".encode())
            digest.update(memoryview(mx.contiguous(sample)))
        else:
            digest.update(f"{path}={value}".encode())
    return digest.hexdigest()


def model_state(value, path: str, seen: set[int] | None = None) -> Iterator:
    """(path, leaf) for every array and plain value reachable from `value` through
    attributes, lists, tuples and dicts, in their order; any other object counts by
    its type's name (a repr may hold an address that changes every run)."""
    seen = set() if seen is None else seen
    if isinstance(value, (mx.array, str, bytes, int, float, bool, type(None))):
        yield path, value
        return
    if isinstance(value, mx.Dtype):
        yield path, str(value)
        return
    if id(value) in seen:
        return
    seen.add(id(value))
    if isinstance(value, dict):
        items = value.items()
    elif isinstance(value, (list, tuple)):
        items = enumerate(value)
    elif hasattr(value, "__dict__"):
        items = vars(value).items()
    else:
        items = ()
    yield path, type(value).__name__
    for key, item in items:
        yield from model_state(item, f"{path}.{key}", seen)


def checksum(keys: mx.array, values: mx.array) -> str:
    """SHA-256 over the keys' bytes, then the values'."""
    mx.eval(keys, values)
    digest = hashlib.sha256(memoryview(mx.contiguous(keys)))
    digest.update(memoryview(mx.contiguous(values)))
    return digest.hexdigest()


class KvDiskStore:
    """The files of one model's blocks, and the budget of the folder they share.

    folder: kv_disk_dir/<identity>. names: the chain hashes this model has on disk.
    files: every block file under kv_disk_dir (any model's) -> its bytes, least
    recently used first (read from the files' times when the store opens).
    Counters: blocks_read, read_seconds (loading and checking), blocks_written,
    write_seconds, files_refused.
    """

    def __init__(self, root: str | os.PathLike, budget: int, identity: str):
        self.root = Path(root)
        self.identity = identity
        self.folder = self.root / identity[:32]
        self.budget = budget
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
        except OSError as error:
            raise ValueError(
                f"kv_disk_dir {str(root)!r}: cannot make {self.folder} "
                f"({error.strerror or error}): pass a folder this process may write"
            ) from None
        found = []
        for path in self.root.glob("*/*.safetensors"):
            if BLOCK_FILE.fullmatch(path.name):
                try:
                    stat = path.stat()
                except FileNotFoundError:  # another process removed it
                    continue
                found.append((stat.st_mtime_ns, path, stat.st_size))
        found.sort()
        self.files: OrderedDict[Path, int] = OrderedDict(
            (path, size) for _, path, size in found
        )
        self.last_stamp = found[-1][0] if found else 0
        self.names = {
            bytes.fromhex(p.stem) for p in self.files if p.parent == self.folder
        }
        self.writable = True
        self.blocks_read = self.blocks_written = self.files_refused = 0
        self.read_seconds = self.write_seconds = 0.0
        self.keep_budget()

    def __contains__(self, block_hash: bytes) -> bool:
        return block_hash in self.names

    @property
    def bytes_used(self) -> int:
        return sum(self.files.values())

    def path(self, block_hash: bytes) -> Path:
        return self.folder / f"{block_hash.hex()}.safetensors"

    def write(self, block_hash: bytes, keys: mx.array, values: mx.array) -> None:
        """Keep a block: keys and values [layers, H, block_size, D]. Written to a
        temporary file first and renamed, so a reader never sees half a file. A
        block already on disk is only marked used. A write that fails (a full disk)
        stops the writing for this run, with one warning."""
        if block_hash in self.names:
            self.used([block_hash])
            return
        if not self.writable or keys.nbytes + values.nbytes > self.budget:
            return
        start = time.perf_counter()
        metadata = dict(
            format=FORMAT,
            model=self.identity,
            block=block_hash.hex(),
            checksum=checksum(keys, values),
        )
        path = self.path(block_hash)
        temporary = None
        try:
            with tempfile.NamedTemporaryFile(
                dir=self.folder, suffix=".tmp", delete=False
            ) as file:
                temporary = file.name
                mx.save_safetensors(file, dict(keys=keys, values=values), metadata)
            os.replace(temporary, path)
            self.files[path] = path.stat().st_size
            self.stamp(path)
        except OSError as error:
            if temporary is not None:
                Path(temporary).unlink(missing_ok=True)
            self.writable = False
            log.warning(
                "kv disk tier: cannot write %s (%s): no more blocks are written to "
                "disk in this run",
                path,
                error.strerror or error,
            )
            return
        self.names.add(block_hash)
        self.blocks_written += 1
        self.write_seconds += time.perf_counter() - start
        self.keep_budget()

    def read(self, block_hash: bytes) -> tuple[mx.array, mx.array] | None:
        """A block's keys and values, checked; None when its file is gone or
        refused (refuse: one warning line, the file removed)."""
        start = time.perf_counter()
        path = self.path(block_hash)
        try:
            arrays, metadata = mx.load(str(path), return_metadata=True)
            problem = self.problem(block_hash, arrays, metadata)
        except (RuntimeError, OSError, ValueError) as error:
            if not path.exists():  # another process removed it
                self.forget(path)
                return None
            problem = f"it does not load ({error})"
        if problem is not None:
            self.refuse(path, problem)
            return None
        self.blocks_read += 1
        self.read_seconds += time.perf_counter() - start
        return arrays["keys"], arrays["values"]

    def problem(self, block_hash: bytes, arrays: dict, metadata: dict) -> str | None:
        """Why a loaded file is not this model's block (None: it is)."""
        if metadata.get("format") != FORMAT:
            return f"its format is {metadata.get('format')!r}, not {FORMAT!r}"
        if metadata.get("model") != self.identity:
            return "another model's block (its identity differs)"
        if metadata.get("block") != block_hash.hex():
            return "it holds another block than its name says"
        if set(arrays) != {"keys", "values"}:
            return f"it holds {sorted(arrays)}, not keys and values"
        keys, values = arrays["keys"], arrays["values"]
        if keys.ndim != 4 or keys.shape != values.shape or keys.dtype != values.dtype:
            return f"keys {keys.shape} and values {values.shape} do not pair"
        if checksum(keys, values) != metadata.get("checksum"):
            return "its bytes changed since it was written (checksum)"
        return None

    def refuse(self, path: Path, why: str) -> None:
        self.files_refused += 1
        log.warning("kv disk tier: ignored and removed %s: %s", path, why)
        path.unlink(missing_ok=True)
        self.forget(path)

    def forget(self, path: Path) -> None:
        self.files.pop(path, None)
        if path.parent == self.folder:
            self.names.discard(bytes.fromhex(path.stem))

    def used(self, block_hashes: Iterable[bytes]) -> None:
        """The blocks were just used, in this order: the last is the most recent
        (their files' times say so to a later run)."""
        for block_hash in block_hashes:
            path = self.path(block_hash)
            if path in self.files:
                self.files.move_to_end(path)
                try:
                    self.stamp(path)
                except FileNotFoundError:
                    self.forget(path)

    def stamp(self, path: Path) -> None:
        """The file's time, later than any other's: the order of use survives the
        process (file times from the clock alone can tie within a clock tick)."""
        self.last_stamp = max(time.time_ns(), self.last_stamp + 1)
        os.utime(path, ns=(self.last_stamp, self.last_stamp))

    def keep_budget(self) -> None:
        """Remove the least recently used files until the folder fits the budget."""
        total = self.bytes_used
        while total > self.budget and self.files:
            path, size = self.files.popitem(last=False)
            path.unlink(missing_ok=True)
            self.forget(path)
            total -= size
