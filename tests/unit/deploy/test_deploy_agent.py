"""The agent DaemonSet: valid for the pinned Kubernetes version, and held to the least
privilege docs/security.md documents — no privileged mode, every capability dropped and
only documented ones added, /sys read-only, every host path a documented row with the same
access, and arguments `nicfleet-agent run` parses. Each check is shown to bite."""

from __future__ import annotations

import copy
import re
import tomllib
from pathlib import Path
from typing import Any

import click
import kubernetes_validate
import pytest
import yaml

from agent.cli import main, run
from tests.support.paths import REPO

MANIFEST = REPO / "deploy" / "base" / "agent-daemonset.yaml"
SECURITY = REPO / "docs" / "security.md"
KUBERNETES_VERSION = "1.37"  # the schemas kubernetes-validate 1.37.0 ships
SECTION = "## Agent on the host: least privilege"
# Values the kubelet substitutes for $(VAR) in args, to parse them like the agent will.
ENV_EXAMPLES = {"NODE_NAME": "gpu-node-01", "NODE_IP": "10.0.0.7"}
# Flags whose value is a directory the agent writes below.
WRITE_DIR_FLAGS = ("--device-plugin-dir", "--plugins-registry-dir", "--cdi-dir")
PATH_FLAGS = (
    "--sysfs-root",
    "--verbs-path",
    *WRITE_DIR_FLAGS,
    "--nats-nkey-seed-file",
    "--nats-password-file",
    "--nats-tls-ca",
    "--nats-tls-cert",
    "--nats-tls-key",
)


def _section() -> str:
    text = SECURITY.read_text()
    start = text.index(SECTION)
    end = text.find("\n## ", start + len(SECTION))
    return text[start : end if end >= 0 else len(text)]


def _table(heading: str) -> list[list[str]]:
    """Rows (cells stripped) of the first table under `### heading` in the section."""
    part = _section().split(f"### {heading}\n", 1)[1].split("\n### ", 1)[0]
    lines = [line for line in part.splitlines() if line.startswith("|")]
    return [[c.strip() for c in line.strip("|").split("|")] for line in lines[2:]]


def _codes(cell: str) -> list[str]:
    return re.findall(r"`([^`]+)`", cell)


def documented_capabilities() -> dict[str, str]:
    """Capability -> "default" | "opt-in" | "never", from the capability table."""
    return {cap: row[1] for row in _table("Capabilities") for cap in _codes(row[0])}


def documented_host_paths() -> dict[str, tuple[str, str, str]]:
    """Host path -> (path in the container, "ro" | "rw", "default" | "opt-in")."""
    return {_codes(r[0])[0]: (_codes(r[1])[0], r[2], r[3]) for r in _table("Host paths")}


def load() -> dict[str, Any]:
    document: dict[str, Any] = yaml.safe_load(MANIFEST.read_text())
    return document


def _container(doc: dict[str, Any]) -> dict[str, Any]:
    (container,) = doc["spec"]["template"]["spec"]["containers"]
    result: dict[str, Any] = container
    return result


def _args(container: dict[str, Any]) -> list[str]:
    args = [*container.get("command", []), *container.get("args", [])]
    return [re.sub(r"\$\((\w+)\)", lambda m: ENV_EXAMPLES[m[1]], a) for a in args]


def _flag_values(args: list[str]) -> dict[str, str]:
    return dict(a.split("=", 1) for a in args if a.startswith("--") and "=" in a)


def violations(doc: dict[str, Any]) -> list[str]:
    """Every way `doc` breaks the documented least privilege (empty: none)."""
    found: list[str] = []
    pod = doc["spec"]["template"]["spec"]
    container = _container(doc)
    sc = container.get("securityContext", {})
    if sc.get("privileged", False):
        found.append("privileged")
    if sc.get("allowPrivilegeEscalation", True):
        found.append("allowPrivilegeEscalation not false")
    if not sc.get("readOnlyRootFilesystem", False):
        found.append("root filesystem writable")
    caps = sc.get("capabilities", {})
    if caps.get("drop") != ["ALL"]:
        found.append("capabilities not drop: [ALL]")
    allowed = {c for c, granted in documented_capabilities().items() if granted != "never"}
    found += [f"capability {c} not documented" for c in caps.get("add", []) if c not in allowed]
    for key in ("hostPID", "hostIPC"):
        if pod.get(key, False):
            found.append(key)
    if pod.get("automountServiceAccountToken", True):
        found.append("service account token mounted")
    if "hostUsers" in pod and "SYS_ADMIN" in caps.get("add", []):
        found.append("SYS_ADMIN counts only in the initial user namespace")
    documented = documented_host_paths()
    mounts = {m["name"]: m for m in container.get("volumeMounts", [])}
    volumes = {v["name"]: v for v in pod.get("volumes", [])}
    writable: list[str] = []
    readable: list[str] = []
    for name, mount in mounts.items():
        host = volumes[name].get("hostPath", {}).get("path")
        if host is None:
            found.append(f"volume {name} is not a documented host path")
            continue
        if host not in documented:
            found.append(f"host path {host} not documented")
            continue
        at, access, _ = documented[host]
        read_only = mount.get("readOnly", False)
        if mount["mountPath"] != at:
            found.append(f"{host} mounted at {mount['mountPath']}, documented {at}")
        if read_only != (access == "ro"):
            found.append(f"{host} mounted {'ro' if read_only else 'rw'}, documented {access}")
        if host == "/sys" and (not read_only or mount.get("recursiveReadOnly") == "Disabled"):
            found.append("/sys not read-only")
        (readable if read_only else writable).append(mount["mountPath"])
    args = _args(container)
    if args[:2] != ["nicfleet-agent", "run"]:
        found.append(f"not `nicfleet-agent run`: {args[:2]}")
    else:
        try:
            # With the group's settings: click caches the help option a context makes.
            run.make_context("run", args[2:], **main.context_settings)
        except click.ClickException as exc:
            found.append(f"args: {exc.format_message()}")
    values = _flag_values(args)
    for flag in PATH_FLAGS:
        if flag not in values:
            continue
        roots = writable if flag in WRITE_DIR_FLAGS else writable + readable
        if not any(Path(values[flag]).is_relative_to(r) for r in roots):
            found.append(
                f"{flag}={values[flag]} is not under a {'rw ' * (flag in WRITE_DIR_FLAGS)}mount"
            )
    return found


def test_is_a_valid_daemonset_for_the_pinned_kubernetes() -> None:
    doc = load()
    assert (doc["apiVersion"], doc["kind"]) == ("apps/v1", "DaemonSet")
    assert kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True) == KUBERNETES_VERSION


def test_has_the_documented_least_privilege() -> None:
    assert violations(load()) == []


def test_adds_no_capability_and_mounts_only_default_host_paths() -> None:
    """The base grants nothing marked opt-in: those are overlay patches."""
    container = _container(load())
    assert container["securityContext"]["capabilities"].get("add", []) == []
    volumes = load()["spec"]["template"]["spec"]["volumes"]
    documented = documented_host_paths()
    assert {documented[v["hostPath"]["path"]][2] for v in volumes} == {"default"}
    assert {p for p, (_, _, default) in documented.items() if default == "default"} == {
        v["hostPath"]["path"] for v in volumes
    }


def test_the_documentation_tables_are_what_the_checks_read() -> None:
    caps = documented_capabilities()
    assert caps["SYS_ADMIN"] == "opt-in"
    assert {"NET_ADMIN", "IPC_LOCK", "DAC_OVERRIDE"} <= {c for c, g in caps.items() if g == "never"}
    assert set(caps.values()) <= {"default", "opt-in", "never"}
    paths = documented_host_paths()
    assert paths["/sys"][1] == "ro"
    assert {access for _, access, _ in paths.values()} <= {"ro", "rw"}
    assert paths["/dev/infiniband"][1:] == ("ro", "opt-in")
    assert paths["/var/run/cdi"][1:] == ("rw", "opt-in")


def test_pod_wiring() -> None:
    doc = load()
    pod = doc["spec"]["template"]["spec"]
    container = _container(doc)
    assert pod["hostNetwork"] is True and pod["dnsPolicy"] == "ClusterFirstWithHostNet"
    assert pod["priorityClassName"] == "system-node-critical"
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod[
        "tolerations"
    ]
    env = {e["name"]: e for e in container["env"]}
    assert env["NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    assert env["PYTHONDONTWRITEBYTECODE"]["value"] == "1"  # read-only root: no .pyc writes
    values = _flag_values(_args(container))
    port = int(values["--metrics-addr"].rsplit(":", 1)[1])
    probe = container["livenessProbe"]["httpGet"]
    (named,) = [p for p in container["ports"] if p["name"] == probe["port"]]
    assert (probe["path"], named["containerPort"]) == ("/metrics", port)
    assert "memory" in container["resources"]["limits"]
    assert "cpu" not in container["resources"]["limits"]  # see docs/security.md
    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts[container["command"][0]] == "agent.cli:main"


def _set(path: str, value: object) -> Any:
    def change(doc: dict[str, Any]) -> None:
        *parents, last = path.split(".")
        node: Any = doc["spec"]["template"]["spec"]
        for key in parents:
            node = node[int(key)] if key.isdigit() else node[key]
        node[last] = value

    return change


def _add_arg(arg: str) -> Any:
    return lambda doc: _container(doc)["args"].append(arg)


def _add_host_path(host: str, at: str, read_only: bool) -> Any:
    def change(doc: dict[str, Any]) -> None:
        doc["spec"]["template"]["spec"]["volumes"].append(
            {"name": "extra", "hostPath": {"path": host}}
        )
        _container(doc)["volumeMounts"].append(
            {"name": "extra", "mountPath": at, "readOnly": read_only}
        )

    return change


C = "containers.0.securityContext"


@pytest.mark.parametrize(
    ("change", "problem"),
    [
        pytest.param(_set(f"{C}.privileged", True), "privileged", id="privileged"),
        pytest.param(_set(f"{C}.allowPrivilegeEscalation", True), "allowPrivilegeEscalation",
                     id="escalation"),
        pytest.param(_set(f"{C}.readOnlyRootFilesystem", False), "root filesystem", id="rw-root"),
        pytest.param(_set(f"{C}.capabilities", {"drop": ["NET_RAW"]}), "drop: [ALL]",
                     id="drop-not-all"),
        pytest.param(_set(f"{C}.capabilities", {"drop": ["ALL"], "add": ["NET_ADMIN"]}),
                     "NET_ADMIN not documented", id="net-admin"),
        pytest.param(_set(f"{C}.capabilities", {"drop": ["ALL"], "add": ["SYS_MODULE"]}),
                     "SYS_MODULE not documented", id="undocumented-cap"),
        pytest.param(_set("hostPID", True), "hostPID", id="host-pid"),
        pytest.param(_set("automountServiceAccountToken", True), "token", id="token"),
        pytest.param(_set("containers.0.volumeMounts.0.readOnly", False), "/sys not read-only",
                     id="sys-rw"),
        pytest.param(_set("containers.0.volumeMounts.0.recursiveReadOnly", "Disabled"),
                     "/sys not read-only", id="sys-submounts-rw"),
        pytest.param(_add_host_path("/", "/host", True), "host path / not documented",
                     id="host-root"),
        pytest.param(_add_host_path("/dev/infiniband", "/dev/infiniband", False),
                     "mounted rw, documented ro", id="dev-rw"),
        pytest.param(_add_host_path("/var/run/cdi", "/cdi", False), "documented /var/run/cdi",
                     id="cdi-elsewhere"),
        pytest.param(_add_arg("--privileged-mode"), "No such option", id="unknown-flag"),
        pytest.param(_add_arg("--verbs=maybe"), "'maybe' is not one of", id="bad-choice"),
        pytest.param(_add_arg("--cdi-dir=/var/run/cdi"), "--cdi-dir=/var/run/cdi is not under",
                     id="writes-outside-mounts"),
        pytest.param(_set("containers.0.command", ["python"]), "not `nicfleet-agent run`",
                     id="other-command"),
    ],
)  # fmt: skip
def test_each_check_bites(change: Any, problem: str) -> None:
    doc = copy.deepcopy(load())
    change(doc)
    assert any(problem in v for v in violations(doc)), violations(doc)


def test_documented_opt_ins_pass_the_checks() -> None:
    """SYS_ADMIN, the verbs probe and CDI, added as docs/security.md describes."""
    doc = copy.deepcopy(load())
    _container(doc)["securityContext"]["capabilities"]["add"] = ["SYS_ADMIN"]
    _add_host_path("/dev/infiniband", "/dev/infiniband", True)(doc)
    doc["spec"]["template"]["spec"]["volumes"][-1]["name"] = "dev-infiniband"
    _container(doc)["volumeMounts"][-1]["name"] = "dev-infiniband"
    _add_host_path("/var/run/cdi", "/var/run/cdi", False)(doc)
    _container(doc)["args"] += ["--verbs=on", "--cdi", "--cdi-dir=/var/run/cdi"]
    _container(doc)["args"].remove("--verbs=off")
    assert violations(doc) == []
    assert kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True) == KUBERNETES_VERSION
