"""Small builders of resource.k8s.io/v1 dicts for the explainer's table tests."""

from __future__ import annotations

from typing import Any

from aggregator.dra.objects import Claim, Device, parse_claim, parse_slice

GPU = "gpu.nvidia.com"
NIC = "rdma.nicfleet.io"


def nic(
    name: str, root: str, *, link: str = "InfiniBand", state: str = "ACTIVE", rate: int = 400
) -> dict[str, Any]:
    return {
        "name": name,
        "attributes": {
            "resource.kubernetes.io/pcieRoot": {"string": root},
            "linkLayer": {"string": link},
            "portState": {"string": state},
            "rateGbps": {"int": rate},
        },
    }


def gpu(name: str, root: str) -> dict[str, Any]:
    return {
        "name": name,
        "attributes": {
            "type": {"string": "gpu"},
            "resource.kubernetes.io/pcieRoot": {"string": root},
        },
        "capacity": {"memory": {"value": "80Gi"}},
    }


def slice_doc(node: str, driver: str, *devices: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": f"{node}-{driver}"},
        "spec": {
            "driver": driver,
            "nodeName": node,
            "pool": {"name": node},
            "devices": list(devices),
        },
    }


def devices(*slices: dict[str, Any]) -> list[Device]:
    return [d for s in slices for d in parse_slice(s)]


def request(name: str, cls: str, *exprs: str, **extra: Any) -> dict[str, Any]:
    exactly: dict[str, Any] = {"deviceClassName": cls, **extra}
    if exprs:
        exactly["selectors"] = [{"cel": {"expression": e}} for e in exprs]
    return {"name": name, "exactly": exactly}


def claim(*requests: dict[str, Any], constraints: list[dict[str, Any]] | None = None) -> Claim:
    devices_spec: dict[str, Any] = {"requests": list(requests)}
    if constraints:
        devices_spec["constraints"] = constraints
    return parse_claim(
        {"kind": "ResourceClaim", "metadata": {"name": "c"}, "spec": {"devices": devices_spec}}
    )
