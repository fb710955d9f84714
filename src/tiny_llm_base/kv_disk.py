"""The prefix cache's disk tier: named KV blocks kept in files, so that an engine
started later finds the blocks an earlier one computed.

One file per block, named by the block's chain hash (week 3 day 3), in a folder
named by the model's identity:

    kv_disk_dir/secret                              this install's HMAC key (0600)
    kv_disk_dir/<model identity>/<chain hash>.safetensors
        keys, values: [layers, H, block_size, W], as the pool stores them
        metadata: format, model identity, chain hash, token ids, signature

A block on disk only saves time: computing it again is always correct, so every
doubt means computing it. A file is used only when it matches what the lookup asked
for: this model's identity (kv_identity.model_identity: another model's blocks live
in another folder, and a file moved across is refused), the block's name and token
ids, the pool's layout (kv_identity.block_layout: layers, heads, block size, row
width, dtype), and its signature. Anything else is refused with one warning line and
removed. A file operation that fails (a read-only folder, a full disk) costs only
that block: one warning line, the block absent; a failed write stops writing for
the run.

Trust: the signature is HMAC-SHA256, keyed by a secret made once per kv_disk_dir
(32 random bytes, mode 0600), over the block's name, tokens, identity and bytes. A
file written by anyone without the secret (another install's, one edited or forged
with the right shapes) is refused, so whoever may write the folder but not read the
secret cannot feed this engine wrong keys (a secret that is not this user's own,
mode 0600, stops the start). It does not stop anyone who can read the secret (this
user, root, a backup of the folder): they can sign anything. Nor does it hide
anything: the blocks are plain keys and values, readable by whoever can read them.

The budget covers every block file in kv_disk_dir, any model's: past it, the least
recently used go first.
"""

import contextlib
import hashlib
import hmac
import io
import logging
import math
import os
import re
import secrets
import stat
import tempfile
import time
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from pathlib import Path

import mlx.core as mx

from .kv_identity import FORMAT

BLOCK_FILE = re.compile(r"[0-9a-f]{64}\.safetensors")
SECRET_BYTES = 32
HEADER_BYTES = 2**20  # room in a block file for its header (metadata, tokens)
ACCESS = "let this process read and write kv_disk_dir"
log = logging.getLogger("tiny_llm.kv_disk")


def install_secret(root: Path) -> bytes:
    """root/secret, the key that signs this install's blocks: a regular file of this
    user's, SECRET_BYTES long, that nobody else may read or write. Made when missing
    (random bytes, mode 0600), written under a temporary name and linked into
    place: no process sees half of it or has its own replaced."""
    path = root / "secret"
    try:
        if not path.exists():
            handle, temporary = tempfile.mkstemp(dir=root, suffix=".tmp")  # 0600
            try:
                with os.fdopen(handle, "wb") as file:
                    file.write(secrets.token_bytes(SECRET_BYTES))
                os.link(temporary, path)
            except FileExistsError:
                pass  # another process made it first: theirs is the one
            finally:
                os.unlink(temporary)
        with open(os.open(path, os.O_RDONLY | os.O_NOFOLLOW), "rb") as file:
            info = os.fstat(file.fileno())
            secret = file.read()
    except OSError as error:
        raise ValueError(
            f"kv_disk_dir {str(root)!r}: cannot make or read {path} "
            f"({error.strerror or error}): remove it, or pass a folder this process "
            "may write"
        ) from None
    if (
        not stat.S_ISREG(info.st_mode)
        or info.st_uid != os.geteuid()
        or info.st_mode & 0o077
        or len(secret) != SECRET_BYTES
    ):
        raise ValueError(
            f"{path} is not a secret of this user's that only it may read "
            f"({SECRET_BYTES} bytes, mode 0600): remove it (a new one is made, and "
            "the blocks signed before are refused)"
        )
    return secret


def token_text(tokens: Sequence[int]) -> str:
    return ",".join(str(int(token)) for token in tokens)


class KvDiskStore:
    """The files of one model's blocks, and the budget of the folder they share.

    folder: kv_disk_dir/<identity>. names: the chain hashes this model has on disk.
    files: every block file under kv_disk_dir (any model's) -> its bytes, least
    recently used first (read from the files' times when the store opens; anything
    not a regular file is skipped with one warning). layout: (shape, dtype) of
    kv_identity.block_layout, which every block read must have; largest: the most
    bytes a block file of that layout takes.
    Counters: blocks_read, read_seconds (loading and checking), blocks_written,
    write_seconds, files_refused.
    """

    def __init__(
        self,
        root: str | os.PathLike,
        budget: int,
        identity: str,
        layout: tuple[tuple, mx.Dtype],
    ):
        self.root = Path(root)
        self.identity = identity
        self.layout = layout
        shape, dtype = layout
        self.largest = 2 * math.prod(shape) * dtype.size + HEADER_BYTES
        self.folder = self.root / identity[:32]
        self.budget = budget
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
        except OSError as error:
            raise ValueError(
                f"kv_disk_dir {str(root)!r}: cannot make {self.folder} "
                f"({error.strerror or error}): pass a folder this process may write"
            ) from None
        self.secret = install_secret(self.root)
        found = self.scan()
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

    def scan(self) -> list[tuple[int, Path, int]]:
        """(time, path, bytes) of every block file under kv_disk_dir, oldest first;
        anything else named like one (a folder, a link, an entry it may not look
        at) is skipped with one warning."""
        found = []
        for path in self.root.glob("*/*.safetensors"):
            if not BLOCK_FILE.fullmatch(path.name):
                continue
            try:
                info = path.lstat()
            except FileNotFoundError:  # another process removed it
                continue
            except OSError as error:
                why = error.strerror or str(error)
            else:
                if stat.S_ISREG(info.st_mode):
                    found.append((info.st_mtime_ns, path, info.st_size))
                    continue
                why = "not a regular file"
            log.warning(
                "kv disk tier: skipped %s: %s; move it out of kv_disk_dir", path, why
            )
        return sorted(found)

    def __contains__(self, block_hash: bytes) -> bool:
        return block_hash in self.names

    @property
    def bytes_used(self) -> int:
        return sum(self.files.values())

    def path(self, block_hash: bytes) -> Path:
        return self.folder / f"{block_hash.hex()}.safetensors"

    def signature(
        self, block_hash: bytes, tokens: Sequence[int], keys: mx.array, values: mx.array
    ) -> str:
        """HMAC-SHA256 under the install's secret of the format, the model's
        identity, the block's name and tokens, then the keys' and values' bytes."""
        mx.eval(keys, values)
        text = f"{FORMAT}\n{self.identity}\n{block_hash.hex()}\n{token_text(tokens)}\n"
        mac = hmac.new(self.secret, text.encode(), hashlib.sha256)
        mac.update(memoryview(mx.contiguous(keys)))
        mac.update(memoryview(mx.contiguous(values)))
        return mac.hexdigest()

    def write(
        self, block_hash: bytes, tokens: Sequence[int], keys: mx.array, values: mx.array
    ) -> None:
        """Keep a block: its tokens, keys and values [layers, H, block_size, W].
        Written to a temporary file first and renamed, so a reader never sees half a
        file. A block already on disk is only marked used. A write that fails (a
        full disk, a read-only folder) stops the writing for this run, with one
        warning."""
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
            tokens=token_text(tokens),
            signature=self.signature(block_hash, tokens, keys, values),
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
            self.stamp(path)
            self.files[path] = path.stat().st_size
        except OSError as error:
            if temporary is not None:
                with contextlib.suppress(OSError):
                    os.unlink(temporary)
            self.writable = False
            log.warning(
                "kv disk tier: cannot write %s (%s): no more blocks are written to "
                "disk in this run; %s, or free space on its disk",
                path,
                error.strerror or error,
                ACCESS,
            )
            return
        self.names.add(block_hash)
        self.blocks_written += 1
        self.write_seconds += time.perf_counter() - start
        self.keep_budget()

    def read(
        self, block_hash: bytes, tokens: Sequence[int]
    ) -> tuple[mx.array, mx.array] | None:
        """The keys and values of the block the lookup names by `block_hash` and
        `tokens`, checked; None when its file is gone, cannot be read (one warning,
        the block absent for this run) or is refused (one warning, removed)."""
        start = time.perf_counter()
        path = self.path(block_hash)
        try:
            with path.open("rb") as file:
                data = file.read(self.largest + 1)
        except FileNotFoundError:  # another process removed it
            self.forget(path)
            return None
        except OSError as error:
            self.cannot("read", path, error)
            return None
        problem = f"it is larger than a block file ({self.largest:,} bytes)"
        if len(data) <= self.largest:
            try:
                arrays, metadata = mx.load(
                    io.BytesIO(data), format="safetensors", return_metadata=True
                )
                problem = self.problem(block_hash, tokens, arrays, metadata)
            except (RuntimeError, ValueError) as error:
                problem = f"it does not load ({error})"
        if problem is not None:
            self.refuse(path, problem)
            return None
        self.blocks_read += 1
        self.read_seconds += time.perf_counter() - start
        return arrays["keys"], arrays["values"]

    def problem(
        self, block_hash: bytes, tokens: Sequence[int], arrays: dict, metadata: dict
    ) -> str | None:
        """Why a loaded file is not the block the lookup asked for (None: it is)."""
        if metadata.get("format") != FORMAT:
            return f"its format is {metadata.get('format')!r}, not {FORMAT!r}"
        if metadata.get("model") != self.identity:
            return "another model's block (its identity differs)"
        if metadata.get("block") != block_hash.hex():
            return "it holds another block than its name says"
        if metadata.get("tokens") != token_text(tokens):
            return "it holds other tokens than the lookup's"
        if set(arrays) != {"keys", "values"}:
            return f"it holds {sorted(arrays)}, not keys and values"
        shape, dtype = self.layout
        for name in ("keys", "values"):
            array = arrays[name]
            if (array.shape, array.dtype) != (shape, dtype):
                return (
                    f"its {name} are {array.shape} {array.dtype}, not this engine's "
                    f"{shape} {dtype}"
                )
        signature = self.signature(block_hash, tokens, arrays["keys"], arrays["values"])
        if not hmac.compare_digest(signature, metadata.get("signature", "")):
            return "its signature is wrong (altered, or not written by this install)"
        return None

    def refuse(self, path: Path, why: str) -> None:
        """Leave out a file that is not what it should be, and remove it."""
        self.files_refused += 1
        self.forget(path)
        try:
            path.unlink(missing_ok=True)
        except OSError as error:
            log.warning(
                "kv disk tier: ignored %s: %s; cannot remove it (%s): %s",
                path,
                why,
                error.strerror or error,
                ACCESS,
            )
            return
        log.warning("kv disk tier: ignored and removed %s: %s", path, why)

    def cannot(self, doing: str, path: Path, error: OSError) -> None:
        """One warning for a file operation that failed; the file is left out for
        the rest of the run (its block absent)."""
        self.forget(path)
        log.warning(
            "kv disk tier: cannot %s %s (%s): left out for this run; %s",
            doing,
            path,
            error.strerror or error,
            ACCESS,
        )

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
                except OSError as error:
                    self.cannot("mark the use of", path, error)

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
            self.forget(path)
            total -= size
            try:
                path.unlink(missing_ok=True)
            except OSError as error:
                self.cannot("remove", path, error)
