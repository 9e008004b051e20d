"""Typo-proof filters (aggregator.ctl.names): which names are known, and the message."""

from __future__ import annotations

import pytest

from aggregator.ctl.names import AUDIT_RULE_IDS, unknown_name
from aggregator.reconcile.nvidia import AUDIT_RULES

NODES = ("gpu-ib-01", "gpu-ib-02", "roce-01", "_fleet")


@pytest.mark.parametrize(
    ("name", "message"),
    [
        pytest.param("gpu-ib-01", None, id="known"),
        pytest.param("_fleet", None, id="fleet-filter"),
        pytest.param("gpu-ib-1", "unknown node 'gpu-ib-1'; did you mean: gpu-ib-01, gpu-ib-02?",
                     id="typo"),
        pytest.param("zzzz", "unknown node 'zzzz'; none of the 3 known nodes is close "
                     "(`nicfleetctl nodes` lists them)", id="nothing-close"),
    ],
)  # fmt: skip
def test_unknown_name(name: str, message: str | None) -> None:
    error = unknown_name("node", name, set(NODES))
    assert (None if error is None else error.message) == message


def test_nothing_known_yet_says_so() -> None:
    error = unknown_name("resource", "rdma/ib", set())
    assert error is not None
    assert error.exit_code == 1
    assert error.message == (
        "unknown resource 'rdma/ib'; the aggregator knows no resource yet "
        "(`nicfleetctl resources` lists them)"
    )


def test_audit_rule_ids_are_the_audits_own() -> None:
    # nicfleetctl may not import aggregator.reconcile; this keeps its copy honest.
    assert sorted(AUDIT_RULE_IDS) == sorted(AUDIT_RULES)
