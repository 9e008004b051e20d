"""The DRA plugin's checkpoint: which claims are prepared, with what, in one JSON file.

Kubelet repeats NodePrepareResources after an agent restart and NodeUnprepareResources
long after; both must answer from what was prepared then, not from today's inventory, so
the record is written (atomically: temp file, fsync, rename, fsync of the directory) before
Prepare answers. `write_atomic` is also how CDI specs are written.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Final

import msgspec

from agent.errors import AgentError

CHECKPOINT_VERSION: Final = 1


class CheckpointError(AgentError):
    """The checkpoint file exists but cannot be read as one (kept aside, not overwritten)."""


class PreparedDevice(msgspec.Struct, frozen=True, kw_only=True):
    request_names: tuple[str, ...]
    pool: str
    device: str
    cdi_ids: tuple[str, ...]
    share_id: str | None = None  # consumable capacity: which share of the device


class PreparedClaim(msgspec.Struct, frozen=True, kw_only=True):
    uid: str
    namespace: str
    name: str
    devices: tuple[PreparedDevice, ...]
    cdi_spec: str  # the spec file written for the claim (a name in the CDI dir)
    # Agent clock when it was prepared; 0.0 in checkpoints written before it was recorded.
    prepared_at: float = 0.0


class Checkpoint(msgspec.Struct, frozen=True, kw_only=True):
    version: int = CHECKPOINT_VERSION
    claims: dict[str, PreparedClaim] = msgspec.field(default_factory=dict)  # by claim UID


def load_checkpoint(path: Path) -> Checkpoint:
    """The checkpoint at `path`; an empty one when there is none yet."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return Checkpoint()
    except OSError as exc:
        raise CheckpointError(f"{path}: {exc.strerror}") from exc
    try:
        checkpoint = msgspec.json.decode(data, type=Checkpoint)
    except msgspec.DecodeError as exc:
        raise CheckpointError(f"{path}: {exc}") from exc
    if checkpoint.version != CHECKPOINT_VERSION:
        raise CheckpointError(f"{path}: version {checkpoint.version}, {CHECKPOINT_VERSION} known")
    return checkpoint


def save_checkpoint(path: Path, checkpoint: Checkpoint) -> None:
    write_atomic(path, msgspec.json.format(msgspec.json.encode(checkpoint), indent=2) + b"\n")


def write_atomic(path: Path, data: bytes, *, mode: int = 0o644) -> None:
    """Replace `path` with `data` so a reader sees the old or the new file, never half,
    and the new one survives a crash once this returns.

    The temp file starts with a dot and ends in .tmp: CDI caches watching the directory
    load only *.json and *.yaml.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    # The rename is an entry in the directory: until the directory is synced a crash can
    # bring back the old file (or none) although the data itself was synced.
    sync_directory(path.parent)


def sync_directory(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
