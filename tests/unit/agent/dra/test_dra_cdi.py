"""Per-claim CDI specs: nodes per device, env and rdma_cm spec-wide, no host netdevs."""

from __future__ import annotations

import json
from pathlib import Path

from agent.dra.cdi import (
    CDI_KIND,
    cdi_id,
    claim_spec,
    remove_claim_spec,
    spec_file_name,
    valid_uid,
    write_claim_spec,
)
from tests.support.builders import nic

UID = "0b5e7f1c-2a3d-4e5f-8a9b-0c1d2e3f4a5b"


def test_two_devices_of_one_claim() -> None:
    spec = claim_spec(UID, [("mlx5-0", nic("mlx5_0")), ("mlx5-1", nic("mlx5_1", index=1))])
    assert spec["kind"] == CDI_KIND == "rdma.nicfleet.io/claim"
    assert [d["name"] for d in spec["devices"]] == [f"{UID}-mlx5-0", f"{UID}-mlx5-1"]
    first = [n["path"] for n in spec["devices"][0]["containerEdits"]["deviceNodes"]]
    assert first == ["/dev/infiniband/umad0", "/dev/infiniband/issm0", "/dev/infiniband/uverbs0"]
    edits = spec["containerEdits"]
    assert edits["env"] == [
        "NICFLEET_RDMA_DEVICES=mlx5_0,mlx5_1",
        "NICFLEET_PCI_ADDRESSES=0000:19:00.0,0000:1a:00.0",
    ]
    assert edits["deviceNodes"] == [
        {
            "path": "/dev/infiniband/rdma_cm",
            "hostPath": "/dev/infiniband/rdma_cm",
            "permissions": "rw",
        }
    ]
    assert "ib0" not in json.dumps(spec)  # the host netdev is not the pod's


def test_without_rdma_cm_there_are_no_spec_wide_nodes() -> None:
    spec = claim_spec(UID, [("mlx5-0", nic("mlx5_0", rdma_cm=False))])
    assert "deviceNodes" not in spec["containerEdits"]


def test_ids_and_files_are_named_after_the_claim_uid(tmp_path: Path) -> None:
    assert cdi_id(UID, "mlx5-0") == f"rdma.nicfleet.io/claim={UID}-mlx5-0"
    path = write_claim_spec(tmp_path, UID, claim_spec(UID, [("mlx5-0", nic())]))
    assert path.name == spec_file_name(UID) == f"rdma.nicfleet.io-claim_{UID}.json"
    assert [p.name for p in tmp_path.iterdir()] == [path.name]  # no temp file left
    remove_claim_spec(tmp_path, path.name)
    remove_claim_spec(tmp_path, path.name)  # twice: still fine
    assert list(tmp_path.iterdir()) == []


def test_only_uids_name_files() -> None:
    assert valid_uid(UID)
    assert not valid_uid("../../etc/passwd")
    assert not valid_uid(UID.upper())
    assert not valid_uid("")
