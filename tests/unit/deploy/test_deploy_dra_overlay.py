"""deploy/overlays/dra: the base plus the agent's `--dra` and the driver's DeviceClasses.
Rendered by the pinned kustomize; every object validates against the 1.37 schemas, the
agent differs from the base by the DRA flags and three documented host paths only (the
paths the plugin's defaults write below), and the DeviceClasses are deploy/dra's."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import kubernetes_validate

from agent.dra.pluginrunner import DraSettings
from tests.unit.deploy import test_deploy_agent as agent_checks
from tests.unit.deploy.rendered import find, render

OVERLAY = "overlays/dra"
DRA_ARGS = ["--dra", "--cdi-dir=/var/run/cdi"]
DRA_PATHS = ["/var/lib/kubelet/plugins", "/var/run/cdi", "/var/lib/nicfleet/dra"]


def _agent(target: str) -> dict[str, Any]:
    doc: dict[str, Any] = find(render(target), "DaemonSet", "nicfleet-agent")
    return doc


def _pod(doc: dict[str, Any]) -> dict[str, Any]:
    pod: dict[str, Any] = doc["spec"]["template"]["spec"]
    return pod


def test_every_object_validates_for_the_pinned_kubernetes() -> None:
    version = agent_checks.KUBERNETES_VERSION
    for doc in render(OVERLAY):
        if doc["kind"] == "CustomResourceDefinition" or doc["apiVersion"].startswith(
            "nicfleet.io/"
        ):
            continue  # nicfleet's own kinds: no upstream schema (test_deploy.py checks them)
        assert kubernetes_validate.validate(doc, version, strict=True) == version, doc["kind"]


def test_the_agent_gets_the_dra_flags_and_three_host_paths_and_nothing_else() -> None:
    base, dra = _agent(""), _agent(OVERLAY)
    base_args = _pod(base)["containers"][0]["args"]
    args = _pod(dra)["containers"][0]["args"]
    assert args == base_args + DRA_ARGS
    added = [v for v in _pod(dra)["volumes"] if v not in _pod(base)["volumes"]]
    assert [v["hostPath"]["path"] for v in added] == DRA_PATHS
    mounts = _pod(dra)["containers"][0]["volumeMounts"]
    new_mounts = [m for m in mounts if m not in _pod(base)["containers"][0]["volumeMounts"]]
    assert [(m["mountPath"], m.get("readOnly", False)) for m in new_mounts] == [
        (p, False) for p in DRA_PATHS
    ]
    stripped = copy.deepcopy(dra)
    container = _pod(stripped)["containers"][0]
    container["args"] = base_args
    container["volumeMounts"] = [m for m in mounts if m not in new_mounts]
    _pod(stripped)["volumes"] = [v for v in _pod(dra)["volumes"] if v not in added]
    assert stripped == base


def test_the_agent_passes_the_documented_least_privilege() -> None:
    assert agent_checks.violations(_agent(OVERLAY)) == []
    documented = agent_checks.documented_host_paths()
    assert [documented[p][1:] for p in DRA_PATHS] == [("rw", "opt-in")] * 3


def test_the_plugin_writes_only_below_the_mounted_paths() -> None:
    """Where `nicfleet-agent run --dra` puts its sockets and files (DraSettings' defaults:
    plugins_dir and state_dir are not flags, the claims directory is left at its default)
    is below one of the rw mounts."""
    mounts = [Path(p) for p in DRA_PATHS] + [Path("/var/lib/kubelet/plugins_registry")]
    defaults = DraSettings()
    for path in (
        defaults.endpoint,
        defaults.registration_socket,
        defaults.checkpoint,
        defaults.cdi_dir,
        defaults.claims_dir,
    ):
        assert any(path.is_relative_to(m) for m in mounts), path


def test_the_device_classes_are_deploy_dra_and_the_rest_is_the_base() -> None:
    # Plus the aggregator's ResourceSlice policy (aggregator/dra/test_publisher_admission.py).
    policy = "nicfleet-aggregator-resourceslices"

    def others(target: str) -> list[dict[str, Any]]:
        return [
            d
            for d in render(target)
            if d["kind"] not in ("DaemonSet", "DeviceClass", "Deployment")
            and d["metadata"]["name"] != policy
        ]

    assert others(OVERLAY) == others("")
    added = [d["kind"] for d in render(OVERLAY) if d["metadata"]["name"] == policy]
    assert added == ["ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"]
    classes = [d for d in render(OVERLAY) if d["kind"] == "DeviceClass"]
    assert classes == list(render("dra"))


def test_the_aggregator_publishes_the_slices_and_nothing_else_changes() -> None:
    # The aggregator is the publisher (docs/dra.md, "Who publishes"): only --dra-publish.
    def aggregator(target: str) -> dict[str, Any]:
        (found,) = [d for d in render(target) if d["kind"] == "Deployment"]
        return found

    base, dra = aggregator(""), aggregator(OVERLAY)
    base_args = base["spec"]["template"]["spec"]["containers"][0]["args"]
    dra_args = dra["spec"]["template"]["spec"]["containers"][0]["args"]
    assert dra_args == [*base_args, "--dra-publish"]
    dra["spec"]["template"]["spec"]["containers"][0]["args"] = base_args
    assert dra == base
