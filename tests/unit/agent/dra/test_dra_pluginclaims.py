"""Allocations from ResourceClaim objects: checked against the kubelet's claim, bounded."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from agent.dra.pluginclaims import (
    MAX_RESULTS,
    AllocatedDevice,
    ClaimDirectory,
    ClaimRef,
    ClaimUnavailable,
    InvalidClaim,
    StaticClaims,
    parse_allocation,
)
from agent.lab.kubeletdra import claim_object

UID = "0b5e7f1c-2a3d-4e5f-8a9b-0c1d2e3f4a5b"
REF = ClaimRef(namespace="ml", uid=UID, name="nic")
GOOD = claim_object(("ml", UID, "nic"), [("nic", "rdma.nicfleet.io", "node-1", "mlx5-0")])


def edited(path: tuple[str | int, ...], value: Any) -> Any:
    obj = copy.deepcopy(GOOD)
    target: Any = obj
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    return obj


RESULTS = ("status", "allocation", "devices", "results")


def test_a_good_claim() -> None:
    assert parse_allocation(GOOD, REF) == (
        AllocatedDevice(request="nic", driver="rdma.nicfleet.io", pool="node-1", device="mlx5-0"),
    )


@pytest.mark.parametrize(
    ("obj", "error"),
    [
        pytest.param([], InvalidClaim, id="not-an-object"),
        pytest.param(edited(("metadata", "uid"), "other"), InvalidClaim, id="recreated-claim"),
        pytest.param(edited(("metadata", "namespace"), "x"), InvalidClaim, id="other-namespace"),
        pytest.param(edited(("status",), {}), ClaimUnavailable, id="not-allocated"),
        pytest.param(edited(RESULTS, "x"), InvalidClaim, id="results-not-a-list"),
        pytest.param(edited((*RESULTS, 0, "device"), 7), InvalidClaim, id="device-not-a-string"),
        pytest.param(edited((*RESULTS, 0, "pool"), ""), InvalidClaim, id="empty-pool"),
        pytest.param(edited((*RESULTS, 0), None), InvalidClaim, id="result-not-an-object"),
        pytest.param(edited((*RESULTS, 0, "shareID"), "../x"), InvalidClaim, id="bad-share-id"),
        pytest.param(
            edited(RESULTS, [GOOD["status"]["allocation"]["devices"]["results"][0]] * 33),
            InvalidClaim,
            id="too-many-results",
        ),
    ],
)
def test_bad_claims(obj: Any, error: type[Exception]) -> None:
    assert MAX_RESULTS == 32
    with pytest.raises(error):
        parse_allocation(obj, REF)


async def test_the_directory_source(tmp_path: Path) -> None:
    source = ClaimDirectory(tmp_path)
    with pytest.raises(ClaimUnavailable):
        await source.allocation(REF)
    (tmp_path / f"{UID}.json").write_text(json.dumps(GOOD))
    assert [d.device for d in await source.allocation(REF)] == ["mlx5-0"]
    with pytest.raises(InvalidClaim):  # never a path outside the directory
        await source.allocation(ClaimRef(namespace="ml", uid="../x", name="nic"))
    (tmp_path / f"{UID}.json").write_text("{")
    with pytest.raises(InvalidClaim):
        await source.allocation(REF)


async def test_the_static_source() -> None:
    source = StaticClaims()
    with pytest.raises(ClaimUnavailable):
        await source.allocation(REF)
    source.put(REF, parse_allocation(GOOD, REF))
    assert len(await source.allocation(REF)) == 1
    with pytest.raises(InvalidClaim):
        await source.allocation(ClaimRef(namespace="ml", uid=UID, name="renamed"))
