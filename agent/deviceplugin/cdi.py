"""The CDI spec file for nicfleet's RDMA devices (kind nicfleet.io/rdma).

`cdi_spec` is pure: one CDI device per adapter holding its uverbs/umad/issm nodes, and
rdma_cm once in the spec-wide edits (applied whenever any of the devices is requested).
`write_cdi_spec` replaces the file atomically so a runtime never reads half a spec.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Final

from agent.deviceplugin.plan import (
    CDI_KIND,
    DEVICE_PERMISSIONS,
    Adapter,
    adapter_char_devices,
    rdma_cm_node,
)

# 0.5.0 is the first spec version with `hostPath` on device nodes, the only newer field
# used here; writing the lowest sufficient version keeps older runtimes able to read it.
CDI_VERSION: Final = "0.5.0"
SPEC_FILE: Final = "nicfleet.io-rdma.json"


def cdi_spec(adapters: Iterable[Adapter]) -> dict[str, Any]:
    """The spec document for `adapters` (deduplicated by name, sorted)."""
    unique = {a.name: a for a in adapters}
    devices = [
        {
            "name": name,
            "containerEdits": {
                "deviceNodes": [_node(c) for c in adapter_char_devices(unique[name])],
            },
        }
        for name in sorted(unique)
    ]
    spec: dict[str, Any] = {"cdiVersion": CDI_VERSION, "kind": CDI_KIND, "devices": devices}
    cm = rdma_cm_node(list(unique.values()))
    if cm is not None:
        spec["containerEdits"] = {"deviceNodes": [_node(cm)]}
    return spec


def _node(path: str) -> dict[str, str]:
    return {"path": path, "hostPath": path, "permissions": DEVICE_PERMISSIONS}


def write_cdi_spec(directory: Path, spec: dict[str, Any]) -> Path:
    """Write `spec` to `directory`/nicfleet.io-rdma.json via a temp file and rename.

    The temp file starts with a dot and ends in .tmp, so CDI caches watching the directory
    (they load *.json and *.yaml) never pick it up.
    """
    directory.mkdir(parents=True, exist_ok=True)
    target = directory / SPEC_FILE
    data = (json.dumps(spec, indent=2, sort_keys=True) + "\n").encode()
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=f".{SPEC_FILE}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return target


def remove_cdi_spec(directory: Path) -> None:
    (directory / SPEC_FILE).unlink(missing_ok=True)
