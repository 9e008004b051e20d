"""The aggregator's ResourceSlice policy of deploy/overlays/dra (what `run --dra-publish`
may write), evaluated offline with a real CEL implementation (tests/unit/deploy/admission.py)
on the expressions of the rendered overlay: the aggregator's ServiceAccount may create,
update and delete rdma.nicfleet.io slices in the pool named after their node, exactly
what aggregator/dra/publishplan.py plans, and nothing else; other users are not matched.
Each refusal comes from the rule that names it."""

from __future__ import annotations

import copy
from typing import Any, Final

import kubernetes_validate
import pytest

from aggregator.dra.publishplan import PoolSource, owned, plan
from proto.draslices import SliceSettings
from tests.support.builders import nic, snapshot
from tests.unit.deploy import admission, policies
from tests.unit.deploy.policies import slice_of
from tests.unit.deploy.rendered import find, render

TARGET: Final = "overlays/dra"
NAME: Final = "nicfleet-aggregator-resourceslices"
AGGREGATOR: Final = "system:serviceaccount:nicfleet-system:nicfleet-aggregator"
DRIVER_RULE: Final = "the aggregator writes only ResourceSlices of driver rdma.nicfleet.io"
POOL_RULE: Final = "the aggregator's ResourceSlices are in the pool named after their spec.nodeName"


def policy() -> dict[str, Any]:
    return policies.policy(TARGET, NAME)


def decide(
    operation: str, new: Any, old: Any = None, *, username: str = AGGREGATOR
) -> admission.Decision:
    return policies.decide(policy(), "resourceslices", operation, new, old, username=username)


def test_the_overlay_binds_the_policy_to_deny() -> None:
    binding = policies.binding(TARGET, NAME)
    assert binding["spec"] == {"policyName": NAME, "validationActions": ["Deny"]}
    spec = policy()["spec"]
    assert spec["failurePolicy"] == "Fail"
    ((rule,),) = [spec["matchConstraints"]["resourceRules"]]
    assert rule["apiGroups"] == ["resource.k8s.io"]
    assert rule["resources"] == ["resourceslices"]
    assert set(rule["operations"]) == {"CREATE", "UPDATE", "DELETE"}
    for doc in (policy(), binding):
        assert kubernetes_validate.validate(doc, "1.37", strict=True) == "1.37"


def test_the_matched_user_is_the_aggregators_service_account() -> None:
    """The name in the match condition is the ServiceAccount the base binds its RBAC to."""
    (subject,) = find(render(TARGET), "ClusterRoleBinding", "nicfleet-aggregator")["subjects"]
    assert f"system:serviceaccount:{subject['namespace']}:{subject['name']}" == AGGREGATOR
    (condition,) = policy()["spec"]["matchConditions"]
    assert AGGREGATOR in condition["expression"]


def test_every_expression_is_standard_cel() -> None:
    found = policies.expressions(policy())
    assert len(found) == 4
    for expression in found:
        admission.check_standard(expression)


@pytest.mark.parametrize(
    ("operation", "new", "old"),
    [
        pytest.param("CREATE", slice_of("gpu-a"), None, id="create"),
        pytest.param("UPDATE", slice_of("gpu-a"), slice_of("gpu-a"), id="update"),
        pytest.param("DELETE", None, slice_of("gpu-a"), id="delete"),
        pytest.param("CREATE", slice_of("gpu-b"), None, id="any-nodes-own-pool"),
    ],
)
def test_the_aggregator_writes_rdma_slices_of_a_nodes_own_pool(
    operation: str, new: Any, old: Any
) -> None:
    decision = decide(operation, new, old)
    assert decision.applies and decision.allowed, decision.refused


@pytest.mark.parametrize(
    ("operation", "new", "old", "rules"),
    [
        pytest.param("CREATE", slice_of("gpu-a", driver="gpu.nvidia.com"), None,
                     (DRIVER_RULE,), id="create-another-driver"),
        pytest.param("CREATE", slice_of("gpu-a", pool="gpu-b"), None, (POOL_RULE,),
                     id="pool-not-the-node"),
        pytest.param("CREATE", slice_of(None, pool="gpu-a"), None, (POOL_RULE,),
                     id="no-nodeName"),
        pytest.param("UPDATE", slice_of("gpu-a", driver="gpu.nvidia.com"), slice_of("gpu-a"),
                     (DRIVER_RULE,), id="update-to-another-driver"),
        pytest.param("UPDATE", slice_of("gpu-a"), slice_of("gpu-a", driver="gpu.nvidia.com"),
                     (DRIVER_RULE,), id="take-over-another-drivers"),
        pytest.param("UPDATE", slice_of("gpu-a", pool="shared"), slice_of("gpu-a"),
                     (POOL_RULE,), id="update-pool-away-from-node"),
        pytest.param("DELETE", None, slice_of("gpu-a", driver="gpu.nvidia.com"),
                     (DRIVER_RULE,), id="delete-another-drivers"),
        pytest.param("DELETE", None, slice_of("gpu-a", pool="gpu-b"), (POOL_RULE,),
                     id="delete-a-shared-pools"),
        pytest.param("CREATE", slice_of("gpu-a", driver="gpu.nvidia.com", pool="x"), None,
                     (DRIVER_RULE, POOL_RULE), id="both"),
    ],
)  # fmt: skip
def test_anything_else_is_refused_by_its_rule(
    operation: str, new: Any, old: Any, rules: tuple[str, ...]
) -> None:
    decision = decide(operation, new, old)
    assert decision.applies
    assert decision.refused == rules


@pytest.mark.parametrize(
    "username",
    [
        "system:serviceaccount:nvidia-dra-driver-gpu:nvidia-dra-driver-gpu-service-account",
        "system:serviceaccount:nicfleet-system:nicfleet-agent",
        "system:node:gpu-a",
        f"{AGGREGATOR}x",
        "system:admin",
    ],
)
def test_other_users_are_not_matched(username: str) -> None:
    """Other drivers, kubelets (which delete a driver's slices) and admins keep RBAC alone."""
    for operation, new, old in (
        ("CREATE", slice_of("gpu-a", driver="gpu.nvidia.com"), None),
        ("DELETE", None, slice_of("gpu-a", driver="gpu.nvidia.com")),
    ):
        assert not decide(operation, new, old, username=username).applies


def test_everything_the_publisher_plans_is_admitted() -> None:
    """The planner's own bodies (copies, consumable, owner references, a pool split over
    slices) pass; the policy and `publishplan.owned` agree on what is the aggregator's."""
    devices = tuple(nic(f"mlx5_{i}", index=i) for i in range(3))
    sources = {
        "gpu-a": PoolSource(
            snapshot=snapshot("gpu-a", devices=devices),
            settings=SliceSettings(sharing="copies", share=2, max_devices=4),
            node_uid="uid-a",
        ),
        "gpu-b": PoolSource(
            snapshot=snapshot("gpu-b", devices=devices),
            settings=SliceSettings(sharing="consumable", share=4),
        ),
    }
    actions = plan(sources, [], cluster_nodes=None, settings=SliceSettings())
    assert len(actions) == 3
    for action in actions:
        body = getattr(action, "body", None)
        assert body is not None and owned(body)
        assert decide("CREATE", body).allowed
        later = copy.deepcopy(body)
        later["spec"]["devices"] = later["spec"]["devices"][:1]
        assert decide("UPDATE", later, body).allowed
        assert decide("DELETE", None, body).allowed


@pytest.mark.parametrize(
    "obj",
    [
        pytest.param(slice_of("gpu-a", driver="gpu.nvidia.com"), id="another-driver"),
        pytest.param(slice_of("gpu-a", pool="gpu-b"), id="another-pool"),
        pytest.param(slice_of(None, pool="gpu-a"), id="no-node"),
    ],
)
def test_what_the_publisher_would_never_touch_is_refused(obj: dict[str, Any]) -> None:
    assert not owned(obj)
    assert not decide("DELETE", None, obj).allowed
