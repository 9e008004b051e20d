from __future__ import annotations

import pytest

from aggregator.cluster import (
    ClusterNode,
    ClusterView,
    policies_by_node,
    selected_nodes,
    selector_matches,
)
from proto.policy import LabelSelector, LabelSelectorRequirement, Metadata, Policy, PolicySpec


def policy(name: str, selector: LabelSelector) -> Policy:
    return Policy(
        api_version="nicfleet.io/v1alpha1",
        kind="NicFleetPolicy",
        metadata=Metadata(name=name),
        spec=PolicySpec(node_selector=selector),
    )


def req(key: str, op: str, *values: str) -> LabelSelectorRequirement:
    return LabelSelectorRequirement(key=key, operator=op, values=values)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("selector", "labels", "expected"),
    [
        pytest.param(LabelSelector(), {}, True, id="empty-selects-all"),
        pytest.param(LabelSelector(match_labels={"a": "1"}), {"a": "1"}, True, id="label"),
        pytest.param(LabelSelector(match_labels={"a": "1"}), {"a": "2"}, False, id="label-miss"),
        pytest.param(
            LabelSelector(match_expressions=(req("a", "In", "1", "2"),)), {"a": "2"}, True, id="in"
        ),
        pytest.param(
            LabelSelector(match_expressions=(req("a", "In", "1"),)), {}, False, id="in-absent"
        ),
        pytest.param(
            LabelSelector(match_expressions=(req("a", "NotIn", "1"),)), {}, True, id="notin-absent"
        ),
        pytest.param(
            LabelSelector(match_expressions=(req("a", "NotIn", "1"),)),
            {"a": "1"},
            False,
            id="notin",
        ),
        pytest.param(
            LabelSelector(match_expressions=(req("a", "Exists"),)), {"a": ""}, True, id="exists"
        ),
        pytest.param(
            LabelSelector(match_expressions=(req("a", "DoesNotExist"),)),
            {"a": "x"},
            False,
            id="does-not-exist",
        ),
    ],
)
def test_selector_semantics(
    selector: LabelSelector, labels: dict[str, str], expected: bool
) -> None:
    assert selector_matches(selector, labels) is expected


def test_without_a_cluster_every_known_node_is_selected() -> None:
    p = policy("p", LabelSelector(match_labels={"gpu": "true"}))
    assert selected_nodes(p, ["a", "b"], ClusterView()) == {"a", "b"}


def test_in_a_cluster_labels_decide_and_overlaps_are_kept_apart() -> None:
    cluster = ClusterView(
        present=True,
        nodes={
            "a": ClusterNode(name="a", labels={"gpu": "true", "fabric": "ib"}),
            "b": ClusterNode(name="b", labels={"gpu": "true"}),
        },
    )
    gpu = policy("gpu", LabelSelector(match_labels={"gpu": "true"}))
    ib = policy("ib", LabelSelector(match_labels={"fabric": "ib"}))
    by_node = policies_by_node([gpu, ib], ["a", "b"], cluster)
    assert [p.metadata.name for p in by_node["a"]] == ["gpu", "ib"]
    assert [p.metadata.name for p in by_node["b"]] == ["gpu"]
