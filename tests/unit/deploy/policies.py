"""What the admission-policy tests of deploy/ share: a rendered ValidatingAdmissionPolicy (or
its binding) looked up by overlay and name, every CEL expression a policy holds, one
decision on a request (tests/unit/deploy/admission.py), and a minimal ResourceSlice of a
node's pool for the two ResourceSlice policies (deploy/overlays/dra, dra-agent-publish).
Pure apart from the cached render."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from proto import dranames
from tests.unit.deploy import admission
from tests.unit.deploy.rendered import find, render


def policy(target: str, name: str) -> dict[str, Any]:
    """The ValidatingAdmissionPolicy `name` of the kustomization `target` ("" is deploy/)."""
    found: dict[str, Any] = find(render(target), "ValidatingAdmissionPolicy", name)
    return found


def binding(target: str, name: str) -> dict[str, Any]:
    found: dict[str, Any] = find(render(target), "ValidatingAdmissionPolicyBinding", name)
    return found


def expressions(doc: Mapping[str, Any]) -> list[str]:
    """Every CEL expression of a policy: match conditions, variables, validations and
    their message expressions."""
    spec = doc["spec"]
    return [
        *(c["expression"] for c in spec.get("matchConditions", [])),
        *(v["expression"] for v in spec.get("variables", [])),
        *(v["expression"] for v in spec["validations"]),
        *(v["messageExpression"] for v in spec["validations"] if "messageExpression" in v),
    ]


def decide(
    doc: Mapping[str, Any],
    resource: str,
    operation: str,
    new: Any,
    old: Any = None,
    *,
    username: str,
    extra: Mapping[str, list[str]] | None = None,
) -> admission.Decision:
    """The policy's decision on `operation` by `username` of `new` (`old` before it)."""
    return admission.admit(
        doc,
        resource=resource,
        operation=operation,
        username=username,
        obj=new,
        old=old,
        extra=extra,
    )


def slice_of(
    node: str | None, *, driver: str = dranames.DRIVER, pool: str | None = None
) -> dict[str, Any]:
    """A one-device ResourceSlice of `node` (None: allNodes) in the pool `pool` (default
    the node's name, or "shared")."""
    spec: dict[str, Any] = {
        "driver": driver,
        "pool": {"name": pool or node or "shared", "generation": 1, "resourceSliceCount": 1},
        "devices": [{"name": "mlx5-0", "attributes": {"linkLayer": {"string": "InfiniBand"}}}],
    }
    if node is None:
        spec["allNodes"] = True
    else:
        spec["nodeName"] = node
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": f"{node or 'shared'}-{driver.replace('.', '-')}-0"},
        "spec": spec,
    }
