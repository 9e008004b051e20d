"""The ResourceSlice policy of deploy/overlays/dra-agent-publish (the agent-publishes design
of docs/dra.md), evaluated offline with a real CEL implementation
(tests/unit/deploy/admission.py) on the expressions of the rendered overlay: an agent's
pod-bound token may write its own node's slices of driver rdma.nicfleet.io and nothing
else; other users are not this policy's business. Each refusal comes from the rule that
names it."""

from __future__ import annotations

import copy
from typing import Any, Final

import pytest

from tests.unit.deploy import admission, policies
from tests.unit.deploy.policies import slice_of

TARGET: Final = "overlays/dra-agent-publish"
NAME: Final = "nicfleet-agent-resourceslices"
AGENT: Final = "system:serviceaccount:nicfleet-system:nicfleet-agent"
NODE_CLAIM: Final = "authentication.kubernetes.io/node-name"
NO_NODE: Final = "the agent's token names no node: use a pod-bound ServiceAccount token"
OWN_NODE: Final = "an agent writes only the ResourceSlices of its own node (spec.nodeName)"
DRIVER_RULE: Final = "an agent writes only ResourceSlices of driver rdma.nicfleet.io"
POOL_RULE: Final = "an agent's ResourceSlices are in the pool named after its node"


def policy() -> dict[str, Any]:
    return policies.policy(TARGET, NAME)


def decide(
    operation: str,
    new: Any,
    old: Any = None,
    *,
    username: str = AGENT,
    node: str | None = "gpu-a",
) -> admission.Decision:
    extra = None if node is None else {NODE_CLAIM: [node]}
    return policies.decide(
        policy(), "resourceslices", operation, new, old, username=username, extra=extra
    )


def test_the_overlay_binds_the_policy_to_deny() -> None:
    binding = policies.binding(TARGET, NAME)
    assert binding["spec"] == {"policyName": NAME, "validationActions": ["Deny"]}
    assert policy()["spec"]["failurePolicy"] == "Fail"
    ((rule,),) = [policy()["spec"]["matchConstraints"]["resourceRules"]]
    assert rule["apiGroups"] == ["resource.k8s.io"]
    assert set(rule["operations"]) == {"CREATE", "UPDATE", "DELETE"}


def test_every_expression_is_standard_cel() -> None:
    found = policies.expressions(policy())
    assert len(found) == 7
    for expression in found:
        admission.check_standard(expression)


@pytest.mark.parametrize(
    ("operation", "new", "old"),
    [
        pytest.param("CREATE", slice_of("gpu-a"), None, id="create"),
        pytest.param("UPDATE", slice_of("gpu-a"), slice_of("gpu-a"), id="update"),
        pytest.param("DELETE", None, slice_of("gpu-a"), id="delete"),
    ],
)
def test_an_agent_writes_its_own_nodes_slices(operation: str, new: Any, old: Any) -> None:
    decision = decide(operation, new, old)
    assert decision.applies and decision.allowed, decision.refused


@pytest.mark.parametrize(
    ("operation", "new", "old", "rules"),
    [
        pytest.param("CREATE", slice_of("gpu-b"), None, (OWN_NODE, POOL_RULE),
                     id="create-another-nodes"),
        pytest.param("CREATE", slice_of("gpu-b", pool="gpu-a"), None, (OWN_NODE,),
                     id="another-node-in-own-pool"),
        pytest.param("UPDATE", slice_of("gpu-b"), slice_of("gpu-b"), (OWN_NODE, POOL_RULE),
                     id="update-another-nodes"),
        pytest.param("UPDATE", slice_of("gpu-a"), slice_of("gpu-b", pool="gpu-a"), (OWN_NODE,),
                     id="take-over-another-nodes"),
        pytest.param("UPDATE", slice_of("gpu-b", pool="gpu-a"), slice_of("gpu-a"), (OWN_NODE,),
                     id="move-own-to-another-node"),
        pytest.param("DELETE", None, slice_of("gpu-b"), (OWN_NODE, POOL_RULE),
                     id="delete-another-nodes"),
        pytest.param("CREATE", slice_of(None, pool="gpu-a"), None, (OWN_NODE,),
                     id="no-nodeName"),
        pytest.param("DELETE", None, slice_of(None, pool="gpu-a"), (OWN_NODE,),
                     id="delete-no-nodeName"),
        pytest.param("CREATE", slice_of("gpu-a", driver="gpu.nvidia.com"), None,
                     (DRIVER_RULE,), id="another-driver"),
        pytest.param("CREATE", slice_of("gpu-a", pool="gpu-b"), None, (POOL_RULE,),
                     id="another-pool"),
    ],
)  # fmt: skip
def test_anything_else_is_refused_by_its_rule(
    operation: str, new: Any, old: Any, rules: tuple[str, ...]
) -> None:
    decision = decide(operation, new, old)
    assert decision.applies
    assert decision.refused == rules


@pytest.mark.parametrize(
    "extra",
    [
        pytest.param(None, id="no-extra"),
        pytest.param({}, id="no-node-claim"),
        pytest.param({NODE_CLAIM: []}, id="empty-node-claim"),
        pytest.param({NODE_CLAIM: ["gpu-a", "gpu-b"]}, id="two-nodes"),
    ],
)
def test_a_token_without_exactly_one_node_writes_nothing(extra: Any) -> None:
    decision = policies.decide(
        policy(), "resourceslices", "CREATE", slice_of("gpu-a"), username=AGENT, extra=extra
    )
    assert decision.applies
    assert decision.refused[0] == NO_NODE


@pytest.mark.parametrize(
    "username",
    [
        "system:serviceaccount:nicfleet-system:nicfleet-aggregator",
        "system:serviceaccount:nvidia-dra-driver-gpu:nvidia-dra-driver-gpu-service-account",
        f"{AGENT}x",
        "system:admin",
    ],
)
def test_other_users_are_not_matched(username: str) -> None:
    """The aggregator (today's publisher), other drivers and admins keep RBAC alone."""
    decision = decide("CREATE", slice_of("gpu-b"), username=username, node=None)
    assert not decision.applies


def test_the_node_comparison_bites() -> None:
    """Without the nodeName rule the same request from gpu-a for gpu-b's slice would pass
    every other rule but the pool's; with a pool of gpu-a, nothing else catches it."""
    loose = copy.deepcopy(policy())
    loose["spec"]["validations"] = [
        v for v in loose["spec"]["validations"] if v["message"] != OWN_NODE
    ]
    decision = policies.decide(
        loose,
        "resourceslices",
        "CREATE",
        slice_of("gpu-b", pool="gpu-a"),
        username=AGENT,
        extra={NODE_CLAIM: ["gpu-a"]},
    )
    assert decision.allowed
