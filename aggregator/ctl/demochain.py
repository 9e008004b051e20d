"""The demo's device-plugin side: each node's plugin config (k8s-rdma-shared-dev-plugin
format), and the compact views of `/api/v1/resources`, `/api/v1/trace` and the lab
kubelets' state files that the demo prints and puts in its JSON summary. Pure.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Final

# rdma/ib and rdma/roce: every adapter of the node's link layer, one device ID each (so the
# kubelet's count drops by one when one adapter fails). rdma/ib_rail1: upstream's
# one-resource-per-interface form (ib1, the faulted mlx5_3 on gpu-ib-01), shared by 8 pods.
IB_RESOURCES: Final = (
    {"resourceName": "ib", "exclusive": True, "selectors": {"linkLayers": ["InfiniBand"]}},
    {"resourceName": "ib_rail1", "rdmaHcaMax": 8, "selectors": {"ifNames": ["ib1"]}},
)
ROCE_RESOURCES: Final = (
    {"resourceName": "roce", "exclusive": True, "selectors": {"linkLayers": ["Ethernet"]}},
)
# What the demo traces on the faulted node: the whole-node resource (still usable, one
# adapter unhealthy) and the rail of the faulted adapter (broken at its port).
TRACED: Final = ("rdma/ib", "rdma/ib_rail1")


def plugin_config(node: str) -> dict[str, Any]:
    """The --device-plugin-config document of a demo node."""
    resources = IB_RESOURCES if "-ib-" in node else ROCE_RESOURCES
    return {"configList": [dict(r) for r in resources]}


def resource_names(node: str) -> tuple[str, ...]:
    return tuple(f"rdma/{r['resourceName']}" for r in plugin_config(node)["configList"])


def registered(resources: Mapping[str, Any] | None, nodes: Iterable[str]) -> bool:
    """Every node serves all its resources, registered with its kubelet and advertising."""
    if resources is None:
        return False
    rows = {
        (row["node"], item["name"]): row
        for item in resources.get("items", [])
        for row in item.get("nodes", [])
    }
    return all(
        (row := rows.get((node, name))) is not None
        and row.get("registration") == "registered"
        and (row.get("advertised") or 0) > 0
        for node in nodes
        for name in resource_names(node)
    )


def resources_view(resources: Mapping[str, Any]) -> dict[str, Any]:
    """Per resource: the nodes advertising it, capacity and healthy devices (API view)."""
    return {
        item["name"]: {
            "nodes": sorted(r["node"] for r in item["nodes"] if (r.get("advertised") or 0) > 0),
            "capacity": item["capacity"],
            "healthy": item["healthy"],
            "allocatable": item["allocatable"],
        }
        for item in resources.get("items", [])
    }


def trace_view(trace: Mapping[str, Any]) -> dict[str, Any]:
    """A trace's verdict, [link, status] pairs in chain order, the first broken link and its cause,
    and the evidence of each unknown link (why it is unknown)."""
    links = trace["links"]
    first = trace.get("first_broken")
    broken = links[first] if first is not None else None
    return {
        "ok": trace["ok"],
        "verdict": trace.get("verdict"),
        "links": [[link["name"], link["status"]] for link in links],
        "first_broken": broken["name"] if broken else None,
        "cause": broken.get("cause") if broken else None,
        "unknown": {
            link["name"]: link.get("evidence", {}) for link in links if link["status"] == "unknown"
        },
    }


def kubelet_view(state: Mapping[str, Any]) -> dict[str, Any]:
    """What one lab kubelet got from the plugins: capacity and allocatable per resource."""
    return {
        name: {"capacity": r["capacity"], "allocatable": r["allocatable"]}
        for name, r in sorted(state.get("resources", {}).items())
    }
