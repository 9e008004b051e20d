"""Garbage sysfs: a rendered lab tree with random files overwritten by random bytes, empty
or 2 MB content, turned into directories, FIFOs or symlink loops, and chmod 000. The
snapshot and the counter reader report per-file errors and never raise (seeded loop)."""

from __future__ import annotations

import os
import random
from pathlib import Path

import msgspec
import pytest

from agent.counters.reader import CounterReader
from agent.host.inventory import collect_snapshot
from agent.host.sysfs import Sysfs
from agent.lab.render import render
from agent.lab.spec import load_builtin
from proto.codec import encode
from proto.inventory import NodeSnapshot, ReadError

SEEDS = range(12)
MUTATIONS = 40  # files changed per tree (of ~570)
HUGE = 2 * 1024 * 1024
# Root reads through mode 000, so chmod only bites as an ordinary user; as root the
# "cannot read" class is covered by FIFOs (refused unread), directories and loops.
IS_ROOT = os.geteuid() == 0


def _files(root: Path) -> list[Path]:
    return sorted(p for p in (root / "devices").rglob("*") if p.is_file() and not p.is_symlink())


def _mutate(path: Path, rng: random.Random) -> str:
    how = rng.choice(["bytes", "empty", "huge", "dir", "loop", "fifo", "chmod"])
    if how == "bytes":
        path.write_bytes(rng.randbytes(rng.randint(1, 300)))
    elif how == "empty":
        path.write_bytes(b"")
    elif how == "huge":
        path.write_bytes(rng.randbytes(64) * (HUGE // 64))
    elif how == "dir":
        path.unlink()
        path.mkdir()
        (path / "junk").write_bytes(rng.randbytes(16))
    elif how == "loop":
        path.unlink()
        twin = path.with_name(path.name + ".loop")
        if not twin.exists():
            os.symlink(path.name, twin)
        os.symlink(twin.name, path)  # path -> twin -> path
    elif how == "fifo":
        path.unlink()
        os.mkfifo(path)
    else:
        path.chmod(0)
    return how


def garbage_tree(root: Path, seed: int) -> tuple[Path, list[tuple[str, str]]]:
    render(load_builtin("roce-cx6dx"), root)
    rng = random.Random(seed)
    files = _files(root)
    chosen = rng.sample(files, MUTATIONS)
    # Always hit files the inventory certainly reads, so errors must show up.
    port = next(p for p in files if p.name == "state" and "/ports/1/" in str(p))
    fw = next(p for p in files if p.name == "fw_ver")
    changed = [(str(p.relative_to(root)), _mutate(p, rng)) for p in chosen if p not in (port, fw)]
    port.unlink()
    os.symlink(port.name, port)  # a link to itself: ELOOP
    fw.unlink()
    fw.mkdir()  # EISDIR
    return root, changed


def _all_errors(snap: NodeSnapshot) -> list[str]:
    errors = [e.path for e in snap.errors]
    for device in snap.devices:
        errors.extend(e.path for e in device.errors)
    return errors


@pytest.mark.parametrize("seed", SEEDS)
def test_garbage_tree_gives_a_snapshot_with_per_file_errors(tmp_path: Path, seed: int) -> None:
    root, _changed = garbage_tree(tmp_path / "sys", seed)
    snap = collect_snapshot(Sysfs(root), node="fuzz", seq=1, now=0.0, agent_version="test")
    # A timeout would come back as a single host-level error; the tree is small enough.
    assert [e.error for e in snap.errors if "timeout" in e.error.lower()] == []
    assert len(snap.devices) == 4
    errors = _all_errors(snap)
    assert any(path.endswith("/fw_ver") for path in errors), errors
    assert any(path.endswith("/ports/1/state") for path in errors), errors
    # Whatever was read is still a valid wire message.
    assert msgspec.msgpack.decode(encode(snap), type=NodeSnapshot) == snap


@pytest.mark.parametrize("seed", SEEDS)
def test_garbage_tree_counter_reader_never_raises(tmp_path: Path, seed: int) -> None:
    root, _changed = garbage_tree(tmp_path / "sys", seed)
    with CounterReader(Sysfs(root), timeout=10.0) as reader:
        first = reader.collect(node="fuzz", seq=1, now=1.0)
        second = reader.collect(node="fuzz", seq=2, now=2.0)
    for batch in (first, second):
        encode(batch)
        for port in batch.ports:
            assert all(isinstance(v, int) for v in port.counters.values())


@pytest.mark.skipif(IS_ROOT, reason="root reads files with mode 000; FIFOs cover it above")
def test_permission_denied_files_are_named(tmp_path: Path) -> None:
    root = tmp_path / "sys"
    render(load_builtin("roce-cx6dx"), root)
    fw = next(p for p in _files(root) if p.name == "fw_ver")
    fw.chmod(0)
    snap = collect_snapshot(Sysfs(root), node="fuzz", seq=1, now=0.0, agent_version="test")
    assert any(e.path.endswith("/fw_ver") and e.error == "EACCES" for e in _all_errors_full(snap))


def _all_errors_full(snap: NodeSnapshot) -> list[ReadError]:
    return [*snap.errors, *(e for d in snap.devices for e in d.errors)]
