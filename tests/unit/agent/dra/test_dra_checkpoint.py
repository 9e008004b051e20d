"""The DRA checkpoint: round trip, missing file, unreadable file, the directory sync."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent.dra.checkpoint import (
    Checkpoint,
    CheckpointError,
    PreparedClaim,
    PreparedDevice,
    load_checkpoint,
    save_checkpoint,
    sync_directory,
    write_atomic,
)


def test_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "state" / "checkpoint.json"
    assert load_checkpoint(path) == Checkpoint()
    claim = PreparedClaim(
        uid="u",
        namespace="ns",
        name="c",
        devices=(
            PreparedDevice(request_names=("nic",), pool="n", device="mlx5-0", cdi_ids=("x",)),
        ),
        cdi_spec="f.json",
    )
    save_checkpoint(path, Checkpoint(claims={"u": claim}))
    assert load_checkpoint(path).claims == {"u": claim}
    assert sorted(p.name for p in path.parent.iterdir()) == ["checkpoint.json"]


@pytest.mark.parametrize(
    "content",
    [
        pytest.param(b"{not json", id="garbage"),
        pytest.param(b'{"version": 99, "claims": {}}', id="future-version"),
        pytest.param(b'{"claims": {"u": {"uid": 1}}}', id="wrong-shape"),
    ],
)
def test_an_unreadable_checkpoint_is_an_error(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "checkpoint.json"
    path.write_bytes(content)
    with pytest.raises(CheckpointError):
        load_checkpoint(path)


def test_the_rename_is_synced_through_the_directory(tmp_path: Path) -> None:
    # write_atomic ends with sync_directory(parent): a real directory is synced, and what
    # is not one fails loudly rather than leaving the rename unsynced.
    write_atomic(tmp_path / "d" / "f.json", b"{}")
    assert (tmp_path / "d" / "f.json").read_bytes() == b"{}"
    sync_directory(tmp_path / "d")
    with pytest.raises(NotADirectoryError):
        sync_directory(tmp_path / "d" / "f.json")
    with pytest.raises(FileNotFoundError):
        sync_directory(tmp_path / "missing")
