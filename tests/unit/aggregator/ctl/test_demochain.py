"""The demo's device-plugin configs pass the shared validator, and its views of the
resources list, traces and lab-kubelet state read the API's and kubelet's documents."""

from __future__ import annotations

import json
from typing import Any

import pytest

from aggregator.ctl.demochain import (
    TRACED,
    kubelet_view,
    plugin_config,
    registered,
    resource_names,
    resources_view,
    trace_view,
)
from aggregator.ctl.demofleet import DEMO_NODES, FAULT_NODE
from proto.dpconfig import parse_device_plugin_config, resource_full_name


@pytest.mark.parametrize("node", [n for n, _ in DEMO_NODES])
def test_every_demo_config_is_valid_and_named_by_link_layer(node: str) -> None:
    config = parse_device_plugin_config(json.dumps(plugin_config(node)).encode(), source=node)
    names = tuple(resource_full_name(r) for r in config.config_list)
    assert names == resource_names(node)
    assert names[0] == ("rdma/ib" if "-ib-" in node else "rdma/roce")


def test_the_faulted_node_serves_what_the_demo_traces() -> None:
    assert set(TRACED) <= set(resource_names(FAULT_NODE))


def _row(node: str, registration: str = "registered", advertised: int = 8) -> dict[str, Any]:
    return {"node": node, "registration": registration, "advertised": advertised}


def _resources(*rows: tuple[str, dict[str, Any]]) -> dict[str, Any]:
    items: dict[str, list[dict[str, Any]]] = {}
    for name, row in rows:
        items.setdefault(name, []).append(row)
    return {
        "items": [
            {"name": n, "nodes": r, "capacity": 8, "healthy": 7, "allocatable": None}
            for n, r in items.items()
        ]
    }


ALL_IB = (("rdma/ib", _row("gpu-ib-02")), ("rdma/ib_rail1", _row("gpu-ib-02")))


@pytest.mark.parametrize(
    ("doc", "ready"),
    [
        pytest.param(_resources(*ALL_IB), True, id="all-registered"),
        pytest.param(None, False, id="api-unreachable"),
        pytest.param(_resources(ALL_IB[0]), False, id="one-resource-missing"),
        pytest.param(
            _resources(ALL_IB[0], ("rdma/ib_rail1", _row("gpu-ib-02", "waiting"))),
            False,
            id="waiting-for-kubelet",
        ),
        pytest.param(
            _resources(ALL_IB[0], ("rdma/ib_rail1", _row("gpu-ib-02", advertised=0))),
            False,
            id="advertises-nothing",
        ),
    ],
)
def test_registered(doc: dict[str, Any] | None, ready: bool) -> None:
    assert registered(doc, ["gpu-ib-02"]) is ready


def test_resources_view_lists_advertising_nodes_only() -> None:
    doc = _resources(("rdma/ib", _row("gpu-ib-02")), ("rdma/ib", _row("gpu-ib-01", advertised=0)))
    assert resources_view(doc) == {
        "rdma/ib": {"nodes": ["gpu-ib-02"], "capacity": 8, "healthy": 7, "allocatable": None}
    }


def test_trace_view_names_the_first_broken_link_and_why_links_are_unknown() -> None:
    trace = {
        "ok": False,
        "verdict": "broken",
        "first_broken": 1,
        "links": [
            {"name": "agent", "status": "ok", "evidence": {}},
            {"name": "rdma-device", "status": "broken", "cause": "port down", "evidence": {}},
            {"name": "allocatable", "status": "unknown", "evidence": {"cluster": "no cluster"}},
        ],
    }
    assert trace_view(trace) == {
        "ok": False,
        "verdict": "broken",
        "links": [["agent", "ok"], ["rdma-device", "broken"], ["allocatable", "unknown"]],
        "first_broken": "rdma-device",
        "cause": "port down",
        "unknown": {"allocatable": {"cluster": "no cluster"}},
    }


def test_kubelet_view() -> None:
    state = {"resources": {"rdma/ib": {"capacity": 8, "allocatable": 7, "unhealthy": ["x"]}}}
    assert kubelet_view(state) == {"rdma/ib": {"capacity": 8, "allocatable": 7}}
    assert kubelet_view({}) == {}
