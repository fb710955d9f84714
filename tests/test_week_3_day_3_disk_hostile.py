"""Week 3 Day 3's disk tier against hostile and broken folders (given code:
tiny_llm_base/kv_disk.py). A block on disk only saves time, so whatever the folder
holds, the engine starts and answers with mlx-lm's tokens:
- a file that does not load, was altered, was forged without the install's secret,
  or is another model's, of another layout or for other tokens is ignored with one
  warning line and removed, and its block computed;
- a folder this process may not change costs one warning line per file, never an
  error (simulated: the tests may run as root, whom chmod does not stop);
- a folder or link named like a block is skipped at the start and left alone;
- the secret is made once, mode 0600, and one that others may read stops the start.
"""

import copy
import errno
import logging
import os
import stat
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest

from .disk_checks import (
    BLOCK,
    MAX_TOKENS,
    block_files,
    chain_path,
    disk_warnings,
    make_engine,
    run_and_close,
)
from .helpers import assert_like_mlx_lm
from .paged_checks import run_engine

pytestmark = pytest.mark.task(2)

ACCESS = "let this process read and write kv_disk_dir"


@pytest.fixture
def first_run(pair, tokenizer, no_eos, tmp_path):
    """(prompt, its tokens, follow-up, folder): run_and_close on tmp_path."""
    mlx_model, model = pair
    vocab = mlx_model.args.vocab_size
    return *run_and_close(model, vocab, tokenizer, no_eos[0], tmp_path), tmp_path


def rewrite(path: Path, disk, change) -> None:
    """The block file with change(keys, values, tokens) applied, signed with
    `disk`'s secret: what a writer holding the secret (or a bug) could leave."""
    arrays, metadata = mx.load(str(path), return_metadata=True)
    tokens = [int(token) for token in metadata["tokens"].split(",")]
    keys, values, tokens = change(arrays["keys"], arrays["values"], tokens)
    block_hash = bytes.fromhex(path.stem)
    metadata["tokens"] = ",".join(map(str, tokens))
    metadata["signature"] = disk.signature(block_hash, tokens, keys, values)
    mx.save_safetensors(str(path), dict(keys=keys, values=values), metadata)


def spoil_garbage(path: Path, disk) -> None:
    path.write_bytes(np.random.default_rng(0).bytes(path.stat().st_size))


def spoil_truncated(path: Path, disk) -> None:
    path.write_bytes(path.read_bytes()[:-100])


def spoil_oversized(path: Path, disk) -> None:
    path.write_bytes(path.read_bytes() + bytes(2**21))  # junk past the arrays


def spoil_one_byte(path: Path, disk) -> None:
    data = bytearray(path.read_bytes())
    data[-7] ^= 0x40  # inside the values: the file still loads
    path.write_bytes(bytes(data))


def spoil_foreign(path: Path, disk) -> None:
    arrays, metadata = mx.load(str(path), return_metadata=True)
    metadata["model"] = "0" * 64  # another model's identity, its signature intact
    mx.save_safetensors(str(path), arrays, metadata)


def spoil_forged(path: Path, disk) -> None:
    """The values zeroed and the file signed again with a guessed key: all that
    someone who cannot read the secret can do."""
    guessed = copy.copy(disk)
    guessed.secret = bytes(32)
    rewrite(path, guessed, lambda k, v, t: (k, mx.zeros_like(v), t))


def resigned(change):
    return lambda path, disk: rewrite(path, disk, change)


@pytest.mark.parametrize(
    "spoil, words",
    [
        (spoil_garbage, "does not load"),
        (spoil_truncated, "does not load"),
        (spoil_oversized, "larger than"),
        (spoil_one_byte, "signature is wrong"),
        (spoil_foreign, "another model's block"),
        (spoil_forged, "signature is wrong"),
        (resigned(lambda k, v, t: (k[:-1], v[:-1], t)), "not this engine's"),
        (resigned(lambda k, v, t: (k[:, :1], v[:, :1], t)), "not this engine's"),
        (resigned(lambda k, v, t: (k[:, :, :2], v[:, :, :2], t)), "not this engine's"),
        (resigned(lambda k, v, t: (k[..., :8], v[..., :8], t)), "not this engine's"),
        (
            resigned(lambda k, v, t: (k.astype(mx.float16), v.astype(mx.float16), t)),
            "not this engine's",
        ),
        (resigned(lambda k, v, t: (k, v, t[::-1])), "other tokens than the lookup's"),
    ],
    ids=[
        "garbage",
        "truncated",
        "oversized",
        "one byte",
        "foreign",
        "forged without the secret",
        "layers",
        "heads",
        "block size",
        "head size",
        "dtype",
        "tokens",
    ],
)
def test_a_spoiled_file_is_ignored_with_one_warning(
    pair, tokenizer, no_eos, first_run, caplog, spoil, words
):
    """The chain's third file spoiled, before any request (the pool still empty): the
    follow-up finds the two blocks before it on disk, computes the rest, gets
    mlx-lm's tokens; one warning line names the file, which is removed."""
    mlx_model, model = pair
    sampler, banned = no_eos
    prompt, _, follow_up, folder = first_run
    engine = make_engine(model, tokenizer, sampler, folder)
    third = chain_path(engine.kv.disk.folder, follow_up, 3)
    spoil(third, engine.kv.disk)
    with caplog.at_level(logging.WARNING, "tiny_llm.kv_disk"):
        (reply,) = run_engine(engine, [follow_up])
    (warning,) = disk_warnings(caplog)
    assert str(third) in warning and words in warning and "\n" not in warning
    assert not third.exists()
    assert reply.cached_tokens == 2 * BLOCK
    assert_like_mlx_lm([reply], mlx_model, [follow_up], MAX_TOKENS, tokenizer, banned)


def make_read_only(monkeypatch, folder: Path) -> None:
    """Every change under `folder` (a file made, written, renamed, removed or its
    time set) fails with PermissionError, as in a folder this process may not
    write."""

    def guarded(real, changes=lambda *args: True):
        def call(path, *args, **kwargs):
            if os.fspath(path).startswith(str(folder)) and changes(*args):
                raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), path)
            return real(path, *args, **kwargs)

        return call

    for name in ("replace", "unlink", "utime"):
        monkeypatch.setattr(os, name, guarded(getattr(os, name)))
    writes = os.O_WRONLY | os.O_RDWR | os.O_CREAT
    monkeypatch.setattr(os, "open", guarded(os.open, lambda flags, *_: flags & writes))


@pytest.mark.parametrize(
    "meets, words, cached_blocks",
    [
        ("a budget below the folder", "cannot remove", 2),
        ("blocks it uses", "cannot mark the use of", 9),
        ("a spoiled file", "cannot remove it", 2),
        ("closing", "cannot write", 9),
    ],
)
def test_a_folder_it_may_not_change_costs_only_warnings(
    pair, tokenizer, no_eos, first_run, caplog, monkeypatch, meets, words, cached_blocks
):
    """The first run's folder, made read-only: the engine starts, answers with
    mlx-lm's tokens, and says what failed in one warning line per file, never
    twice, each saying what to do."""
    mlx_model, model = pair
    sampler, banned = no_eos
    _, _, follow_up, folder = first_run
    if meets == "a spoiled file":
        chain_path(block_files(folder)[0].parent, follow_up, 3).write_bytes(b"junk")
    settings = {}
    if meets == "a budget below the folder":
        size = max(path.stat().st_size for path in block_files(folder))
        settings["kv_disk_budget"] = 2 * size
    make_read_only(monkeypatch, folder)
    with caplog.at_level(logging.WARNING, "tiny_llm.kv_disk"):
        engine = make_engine(model, tokenizer, sampler, folder, **settings)
        (reply,) = run_engine(engine, [follow_up])
        engine.close()
    warnings = disk_warnings(caplog)
    assert any(words in warning for warning in warnings), warnings
    assert len(set(warnings)) == len(warnings)
    for warning in warnings:
        assert ACCESS in warning and "\n" not in warning
    assert reply.cached_tokens == cached_blocks * BLOCK
    assert_like_mlx_lm([reply], mlx_model, [follow_up], MAX_TOKENS, tokenizer, banned)


def test_a_block_it_cannot_read_is_left_out(pair, tokenizer, no_eos, first_run, caplog):
    """The chain's third file made a folder after the engine started: reading it
    fails; one warning line, the folder left, the block computed."""
    mlx_model, model = pair
    sampler, banned = no_eos
    _, _, follow_up, folder = first_run
    engine = make_engine(model, tokenizer, sampler, folder)
    third = chain_path(engine.kv.disk.folder, follow_up, 3)
    third.unlink()
    third.mkdir()
    with caplog.at_level(logging.WARNING, "tiny_llm.kv_disk"):
        (reply,) = run_engine(engine, [follow_up])
    (warning,) = disk_warnings(caplog)
    assert f"cannot read {third}" in warning and ACCESS in warning
    assert third.is_dir() and reply.cached_tokens == 2 * BLOCK
    assert_like_mlx_lm([reply], mlx_model, [follow_up], MAX_TOKENS, tokenizer, banned)


def test_folders_and_links_named_like_blocks_are_skipped(
    pair, tokenizer, no_eos, first_run, caplog, monkeypatch
):
    """A folder named like a block in this model's folder and in another's, a link
    named like one to a file outside kv_disk_dir, and a block file it may not look
    at, with a budget of 2 of the folder's files: the engine starts, one warning
    line for each, none of them removed; the follow-up finds the 2 blocks kept."""
    mlx_model, model = pair
    sampler, banned = no_eos
    _, _, follow_up, folder = first_run
    files = block_files(folder)
    size = max(path.stat().st_size for path in files)
    mine = files[0].parent
    hidden = chain_path(mine, follow_up, 9)  # the chain's last: its loss costs least
    outside = folder.parent / f"{folder.name}-outside"
    outside.write_text("not a block")
    strays = [
        mine / f"{'a' * 64}.safetensors",
        folder / "other" / f"{'b' * 64}.safetensors",
    ]
    for stray in strays:
        stray.mkdir(parents=True)
    link = mine / f"{'c' * 64}.safetensors"
    link.symlink_to(outside)
    lstat = Path.lstat

    def may_not_look(path):
        if path == hidden:
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(path))
        return lstat(path)

    monkeypatch.setattr(Path, "lstat", may_not_look)
    with caplog.at_level(logging.WARNING, "tiny_llm.kv_disk"):
        engine = make_engine(model, tokenizer, sampler, folder, kv_disk_budget=2 * size)
    monkeypatch.undo()
    warnings = disk_warnings(caplog)
    assert len(warnings) == 4
    for path, why in [(hidden, "Permission denied"), (link, "not a regular file")]:
        assert any(f"skipped {path}: {why}" in warning for warning in warnings)
    for stray in strays:
        assert any(f"skipped {stray}: not a regular file" in w for w in warnings)
    assert all(stray.is_dir() for stray in strays) and outside.exists()
    assert hidden.exists()
    (reply,) = run_engine(engine, [follow_up])
    assert reply.cached_tokens == 2 * BLOCK
    assert_like_mlx_lm([reply], mlx_model, [follow_up], MAX_TOKENS, tokenizer, banned)


def test_the_secret_is_made_once_for_this_user_only(pair, tokenizer, tmp_path):
    """kv_disk_dir/secret: 32 bytes, mode 0600, the same for every engine on the
    folder; once others may read it, an engine refuses to start and says what to
    do."""
    _, model = pair
    engine = make_engine(model, tokenizer, None, tmp_path)
    secret = tmp_path / "secret"
    assert stat.S_IMODE(secret.stat().st_mode) == 0o600
    assert len(secret.read_bytes()) == 32
    again = make_engine(model, tokenizer, None, tmp_path)
    assert engine.kv.disk.secret == again.kv.disk.secret == secret.read_bytes()
    secret.chmod(0o644)
    with pytest.raises(ValueError, match="mode 0600.*remove it"):
        make_engine(model, tokenizer, None, tmp_path)


def test_a_secret_another_process_made_first_is_the_one(
    pair, tokenizer, tmp_path, monkeypatch
):
    """Two engines starting together on a new folder: the one that links its
    secret second reads the first one's, and leaves no temporary file."""
    _, model = pair
    theirs = bytes(range(32))
    link = os.link

    def link_after_them(source, target, **kwargs):
        Path(target).write_bytes(theirs)
        Path(target).chmod(0o600)
        return link(source, target, **kwargs)

    monkeypatch.setattr(os, "link", link_after_them)
    engine = make_engine(model, tokenizer, None, tmp_path)
    assert engine.kv.disk.secret == theirs
    assert sorted(p.name for p in tmp_path.iterdir() if p.is_file()) == ["secret"]
