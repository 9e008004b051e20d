"""deploy/overlays/acs: the one opt-in that turns ACS from unknown into known. Rendered by
the pinned kustomize; the agent's DaemonSet differs from the base by CAP_SYS_ADMIN only,
passes the documented least-privilege checks, and is the overlay the agent's "ACS is
unknown" error names."""

from __future__ import annotations

import copy
from typing import Any

import kubernetes_validate

from agent.host import pciconfig
from tests.support.paths import REPO
from tests.unit.deploy import test_deploy_agent as agent_checks
from tests.unit.deploy.rendered import find, render

OVERLAY = "overlays/acs"


def _agent(target: str) -> dict[str, Any]:
    doc: dict[str, Any] = find(render(target), "DaemonSet", "nicfleet-agent")
    return doc


def test_adds_sys_admin_and_nothing_else() -> None:
    base, acs = _agent(""), _agent(OVERLAY)
    caps = acs["spec"]["template"]["spec"]["containers"][0]["securityContext"]["capabilities"]
    assert caps == {"drop": ["ALL"], "add": ["SYS_ADMIN"]}
    stripped = copy.deepcopy(acs)
    del stripped["spec"]["template"]["spec"]["containers"][0]["securityContext"]["capabilities"][
        "add"
    ]
    assert stripped == base


def test_passes_the_documented_least_privilege_and_the_schema() -> None:
    acs = _agent(OVERLAY)
    assert agent_checks.violations(acs) == []
    version = agent_checks.KUBERNETES_VERSION
    assert kubernetes_validate.validate(acs, version, strict=True) == version


def test_every_other_object_is_the_base_unchanged() -> None:
    def others(target: str) -> list[dict[str, Any]]:
        return [d for d in render(target) if d["kind"] != "DaemonSet"]

    assert others(OVERLAY) == others("")


def test_the_agent_names_this_overlay_when_acs_is_unknown() -> None:
    assert (REPO / pciconfig.ACS_OVERLAY / "kustomization.yaml").is_file()
    assert f"deploy/{OVERLAY}" == pciconfig.ACS_OVERLAY
    reason = pciconfig.HeaderOnly(bytes(64)).reason
    assert reason.endswith(f"so ACS is unknown; enable {pciconfig.ACS_OVERLAY}")
