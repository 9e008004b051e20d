"""RDMA device removal and re-add on a rendered tree: an unregistered ib_device (rmmod
mlx5_ib, driver reload) as a reader sees it. The RDMA device, its ports and uverbs/umad
devices go (class links first, as device_del does; directories are renamed into
<root>/.lab-removed/<device>/ so each vanishes at once); the PCI function and netdevs stay.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from agent.lab.faults import NAME_RE, Change, FaultError, FaultRecord, record, tree_root

STASH = ".lab-removed"  # at the tree root, next to .lab-tmp: outside what readers list
_CHAR_CLASSES = ("infiniband_verbs", "infiniband_mad")


def device_remove(root: Path, device: str) -> FaultRecord:
    """Remove class/infiniband/<device> and the function's infiniband/<device> (ports,
    counters), plus its uverbsN/umadN/issmN char devices (matched by `ibdev`)."""
    root = tree_root(root)
    if not NAME_RE.match(device):
        raise FaultError(device, "not an RDMA device name")
    class_link = root / "class" / "infiniband" / device
    if not class_link.is_symlink():
        raise FaultError(class_link, "no such RDMA device")
    stash = root / STASH / device
    if stash.exists():
        raise FaultError(stash, "a removed device of that name is still stashed")
    ib_dir = class_link.resolve()
    fn = ib_dir.parent.parent
    entries = [_entry(root, class_link, ib_dir)]
    for cls in _CHAR_CLASSES:
        base = fn / cls
        for name in sorted(os.listdir(base)) if base.is_dir() else []:
            if (base / name / "ibdev").read_text().strip() == device:
                entries.append(_entry(root, root / "class" / cls / name, base / name))
    stash.mkdir(parents=True)
    (stash / "manifest.json").write_text(json.dumps(entries))
    for entry in entries:
        os.unlink(root / entry["link"])
    for i, entry in enumerate(entries):
        os.rename(root / entry["dir"], stash / str(i))
    for glue in ("infiniband", *_CHAR_CLASSES):  # the kernel drops empty class glue dirs
        if (fn / glue).is_dir() and not os.listdir(fn / glue):
            os.rmdir(fn / glue)
    changes = [Change(path=e[k], old="present", new="absent") for e in entries for k in _KEYS]
    return record("device-remove", device, changes)


def device_add(root: Path, device: str) -> FaultRecord:
    """Bring back a device removed by device_remove, under the same name and paths."""
    root = tree_root(root)
    if not NAME_RE.match(device):
        raise FaultError(device, "not an RDMA device name")
    stash = root / STASH / device
    manifest = stash / "manifest.json"
    if not manifest.is_file():
        raise FaultError(stash, "no device of that name was removed by device-remove")
    if (root / "class" / "infiniband" / device).is_symlink():
        raise FaultError(root / "class" / "infiniband" / device, "device is present")
    entries: list[dict[str, str]] = json.loads(manifest.read_text())
    for i, entry in enumerate(entries):  # directories first, then the class links
        (root / entry["dir"]).parent.mkdir(parents=True, exist_ok=True)
        os.rename(stash / str(i), root / entry["dir"])
    for entry in entries:
        os.symlink(entry["target"], root / entry["link"])
    shutil.rmtree(stash)
    keys = tuple(reversed(_KEYS))
    changes = [Change(path=e[k], old="absent", new="present") for e in entries for k in keys]
    return record("device-add", device, changes)


_KEYS = ("link", "dir")


def _entry(root: Path, link: Path, directory: Path) -> dict[str, str]:
    rel = str(directory.relative_to(root.resolve()))
    return {"link": str(link.relative_to(root)), "target": os.readlink(link), "dir": rel}
