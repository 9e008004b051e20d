"""deploy/overlays/auth-callout: agents join with a projected ServiceAccount token (audience
nicfleet, short expiry) instead of a host seed file, the aggregator answers the callout
with the seeds `nats-auth --auth-callout` writes, and the base stays in seed mode."""

from __future__ import annotations

from typing import Any

import pytest

from agent.cli import main as agent_main
from agent.cli import run as agent_run
from aggregator.cli.main import main as aggregator_main
from aggregator.cli.main import run as aggregator_run
from tests.unit.deploy import test_deploy_agent as agent_checks
from tests.unit.deploy.rendered import find, render

OVERLAY = "overlays/auth-callout"


def pod(
    docs: tuple[dict[str, Any], ...] | list[dict[str, Any]], kind: str, name: str
) -> dict[str, Any]:
    spec: dict[str, Any] = find(docs, kind, name)["spec"]["template"]["spec"]
    return spec


def test_agents_present_a_projected_token_and_no_seed() -> None:
    docs = render(OVERLAY)
    spec = pod(docs, "DaemonSet", "nicfleet-agent")
    container = spec["containers"][0]
    values = agent_checks._flag_values(container["args"])
    assert "--nats-nkey-seed-file" not in values
    token_file = values["--nats-token-file"]
    # Still no Kubernetes API token in the pod: only the nicfleet-audience one.
    assert spec["automountServiceAccountToken"] is False
    assert spec["serviceAccountName"] == "nicfleet-agent"
    account = find(docs, "ServiceAccount", "nicfleet-agent")
    assert account["metadata"]["namespace"] == "nicfleet-system"
    (mount,) = [m for m in container["volumeMounts"] if token_file.startswith(m["mountPath"] + "/")]
    assert mount["readOnly"] is True
    (volume,) = [v for v in spec["volumes"] if v["name"] == mount["name"]]
    (source,) = volume["projected"]["sources"]
    projected = source["serviceAccountToken"]
    assert projected["audience"] == "nicfleet"
    assert projected["expirationSeconds"] <= 3600  # short-lived: the kubelet rotates it
    assert f"{mount['mountPath']}/{projected['path']}" == token_file
    assert not [
        v for v in spec["volumes"] if v.get("hostPath", {}).get("path") == "/etc/nicfleet/nats"
    ]
    args = [a.replace("$(NODE_NAME)", "gpu-node-01").replace("$(NODE_IP)", "10.0.0.7")
            for a in container["args"]]  # fmt: skip
    agent_run.make_context("run", args[1:], **agent_main.context_settings)


def test_the_aggregator_answers_with_the_callout_seeds_of_its_secret() -> None:
    docs = render(OVERLAY)
    spec = pod(docs, "Deployment", "nicfleet-aggregator")
    container = spec["containers"][0]
    # The template exists only in the pod (test_deploy.py checks that flag).
    args = [a.replace("$(POD_NAME)", "nicfleet-aggregator-0") for a in container["args"]
            if not a.startswith("--validation-template=")]  # fmt: skip
    ctx = aggregator_run.make_context("run", args[1:], **aggregator_main.context_settings)
    issuer = ctx.params["nats_callout_issuer_seed_file"]
    nkey = ctx.params["nats_callout_nkey_seed_file"]
    assert ctx.params["nats_callout_agent_serviceaccount"] == "nicfleet-system:nicfleet-agent"
    assert ctx.params["in_cluster"] is True  # TokenReview
    (volume,) = [
        v
        for v in spec["volumes"]
        if v.get("secret", {}).get("secretName") == "nicfleet-aggregator-nats"
    ]
    items = {i["path"] for i in volume["secret"]["items"]}
    (mount,) = [m for m in container["volumeMounts"] if m["name"] == volume["name"]]
    assert {issuer.name, nkey.name} <= items
    assert {str(issuer.parent), str(nkey.parent)} == {mount["mountPath"]}
    rules = find(docs, "ClusterRole", "nicfleet-aggregator")["rules"]
    assert any("tokenreviews" in r["resources"] and "create" in r["verbs"] for r in rules)


@pytest.mark.parametrize("kind", ["DaemonSet", "Deployment"])
def test_the_base_keeps_seed_mode(kind: str) -> None:
    name = "nicfleet-agent" if kind == "DaemonSet" else "nicfleet-aggregator"
    args = pod(render(""), kind, name)["containers"][0]["args"]
    assert any(a.startswith("--nats-nkey-seed-file=") for a in args)
    assert not any(a.startswith(("--nats-token-file", "--nats-callout-")) for a in args)
