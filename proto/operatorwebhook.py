"""The NVIDIA Network Operator webhook's refusals besides the device plugin configs and the
OFED version (api/v1alpha1/validator/nicpolicy_webhook.go at b06827e): the image
repositories, the container resources, ibKubernetes' pKey GUID pool range,
docaTelemetryService's ConfigMap name, ofedDriver's safeLoad, and (pkg/policyoverlap) a
section set in both a NicClusterPolicy and a NicNodePolicy or a node two NicNodePolicies
select. Each is a Note the audit reports as "the webhook refuses".

Pure. Not checked here: the sriov config's JSON schema.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from decimal import Decimal, InvalidOperation
from fractions import Fraction
from typing import Any, Final

from proto.nicpolicysections import Note

# The sections validateRepositories reads, each `repository` falling back to spec.global's.
REPOSITORY_SECTIONS: Final = (
    ("ofedDriver",), ("rdmaSharedDevicePlugin",), ("sriovDevicePlugin",), ("ibKubernetes",),
    ("nvIpam",), ("nicFeatureDiscovery",), ("docaTelemetryService",),
    ("secondaryNetwork", "cniPlugins"), ("secondaryNetwork", "ipoib"),
    ("secondaryNetwork", "multus"),
)  # fmt: skip
# The containers of each state's Deployments and DaemonSets (spec.template.spec.containers,
# not initContainers) as state.ParseContainerNames finds them in the manifests the webhook
# renders with its dummy catalog (plain Kubernetes, so the OpenShift-only
# openshift-driver-toolkit-ctr of state-ofed-driver is never among them). Read from
# manifests/state-*/ at b06827e085c59726b699faffcc526342d4d8e395.
CONTAINER_NAMES: Final[Mapping[tuple[str, ...], tuple[str, ...]]] = {
    ("ofedDriver",): ("mofed-container",),  # state-ofed-driver/0050_ofed-driver-ds.yaml
    ("rdmaSharedDevicePlugin",): ("rdma-shared-dp",),  # 0060_rdma-shared-dev-plugin-ds.yaml
    ("sriovDevicePlugin",): ("kube-sriovdp",),  # 0030-sriov-dp-daemonset.yaml
    ("ibKubernetes",): ("ib-kubernetes",),  # 0070-deployment.yaml
    ("nvIpam",): ("nv-ipam-controller", "nv-ipam-node"),  # 040-nv-ipam-{controller,node}
    ("nicFeatureDiscovery",): ("nic-feature-discovery",),  # 030-nic-feature-discovery-ds
    ("secondaryNetwork", "cniPlugins"): ("cni-plugins",),  # 0010-container-networking-…
    ("secondaryNetwork", "ipoib"): ("ipoib-cni",),  # 0050-ipoib-cni-ds.yml
    ("secondaryNetwork", "multus"): ("kube-multus",),  # 0050-multus-ds.yml
}
# validateResources: the only resource names it takes; both must be non-zero.
_COMPUTE: Final = ("cpu", "memory")
# pkg/policyoverlap DetectSectionConflict's sections (a non-nil pointer is "set").
OVERLAP_SECTIONS: Final = ("ofedDriver", "rdmaSharedDevicePlugin", "sriovDevicePlugin")
# k8s.io/apimachinery resource.Quantity's grammar: a decimal number, then a binary-SI,
# decimal-SI or e/E-exponent suffix.
_QUANTITY: Final = re.compile(r"([+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+))([a-zA-Z]*[-+]?[0-9]*)")
_SUFFIXES: Final[Mapping[str, Fraction]] = {
    "": Fraction(1), "n": Fraction(1, 10**9), "u": Fraction(1, 10**6), "m": Fraction(1, 1000),
    "k": Fraction(10**3), "M": Fraction(10**6), "G": Fraction(10**9), "T": Fraction(10**12),
    "P": Fraction(10**15), "E": Fraction(10**18), "Ki": Fraction(2**10), "Mi": Fraction(2**20),
    "Gi": Fraction(2**30), "Ti": Fraction(2**40), "Pi": Fraction(2**50), "Ei": Fraction(2**60),
}  # fmt: skip
_EXPONENT: Final = re.compile(r"[eE]([-+]?[0-9]+)")
_GUID: Final = re.compile(r"([0-9A-Fa-f]{2}:){7}[0-9A-Fa-f]{2}")
# k8s.io/apimachinery IsDNS1123Subdomain.
_DNS1123_SUBDOMAIN: Final = re.compile(
    r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*"
)

# distribution/reference's grammar (ReferenceRegexp), ASCII as Go's regexp is.
_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|[-]+)[a-z0-9]+)*"
_DOMAIN_PART = r"(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])"
_DOMAIN = rf"(?:{_DOMAIN_PART}(?:\.{_DOMAIN_PART})*|\[[a-fA-F0-9:]+\])(?::[0-9]+)?"
_REFERENCE: Final = re.compile(
    rf"(?P<name>(?:{_DOMAIN}/)?{_COMPONENT}(?:/{_COMPONENT})*)"
    r"(?::[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?"
    r"(?:@[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,})?"
)
_HEX64: Final = re.compile(r"[a-f0-9]{64}")
_NAME_MAX: Final = 255


def repository_error(repo: str) -> str | None:
    """Why reference.ParseNormalizedNamed refuses `repo`; None when it parses."""
    if _HEX64.fullmatch(repo):
        return "a 64-character hexadecimal string is not a repository name"
    if not repo:
        return "empty (no repository here nor in spec.global)"
    # splitDockerDomain: a first component without "." or ":" (not "localhost", lowercase)
    # is a Docker Hub path; a single Hub name gets "library/".
    first, slash, rest = repo.partition("/")
    hub = not slash or (
        not any(c in first for c in ".:") and first != "localhost" and first.lower() == first
    )
    domain, remainder = ("docker.io", repo) if hub else (first, rest)
    if domain == "index.docker.io":
        domain = "docker.io"
    if domain == "docker.io" and "/" not in remainder:
        remainder = "library/" + remainder
    remote = remainder.split(":", 1)[0]
    if remote.lower() != remote:
        return f"the repository name ({remote}) must be lowercase"
    found = _REFERENCE.fullmatch(f"{domain}/{remainder}")
    if found is None:
        return "not a container image reference"
    if len(found["name"]) > _NAME_MAX:
        return f"the repository name is longer than {_NAME_MAX} characters"
    return None


def webhook_notes(kind: str, spec: Mapping[str, Any]) -> list[Note]:
    """Every refusal of these rules for a NicClusterPolicy (all) or NicNodePolicy
    (safeLoad only: validateNicNodePolicy checks no repository, GUID or ConfigMap)."""
    notes = _safe_load(spec)
    if kind != "NicClusterPolicy":
        return notes
    notes += _repositories(spec)
    notes += container_resource_notes(spec)
    notes += _ib_kubernetes(_map(spec.get("ibKubernetes")))
    telemetry = spec.get("docaTelemetryService")
    config = _map(telemetry).get("config") if isinstance(telemetry, Mapping) else None
    if isinstance(config, Mapping):
        name = str(config.get("fromConfigMap") or "")
        if len(name) > 253 or not _DNS1123_SUBDOMAIN.fullmatch(name):
            why = f"{name!r} is not a DNS-1123 subdomain (a ConfigMap name)"
            notes.append(_refused("spec.docaTelemetryService.config.fromConfigMap", why))
    return notes


def parse_quantity(value: object) -> Fraction | None:
    """A Kubernetes quantity (a string, or a YAML number) as an exact number; None when the
    API server could not decode it (it then refuses the object before any webhook)."""
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        return None
    found = _QUANTITY.fullmatch(str(value).strip())
    if found is None:
        return None
    number, suffix = found[1], found[2]
    try:
        base = Fraction(Decimal(number))
    except InvalidOperation:
        return None
    if suffix in _SUFFIXES:
        return base * _SUFFIXES[suffix]
    exponent = _EXPONENT.fullmatch(suffix)
    return None if exponent is None else base * Fraction(10) ** int(exponent[1])


def container_resource_notes(spec: Mapping[str, Any]) -> list[Note]:
    """validateContainerResources for a NicClusterPolicy (the webhook does not check a
    NicNodePolicy's): each containerResources entry names a container of that state's
    manifests, takes only cpu and memory, none zero, and no limit below its request."""
    notes = []
    for path, containers in CONTAINER_NAMES.items():
        section: object = spec
        for key in path:
            section = _map(section).get(key)
        entries = _map(section).get("containerResources")
        if not isinstance(section, Mapping) or not isinstance(entries, Sequence):
            continue
        where = "spec." + ".".join(path) + ".containerResources"
        for i, entry in enumerate(entries):
            notes += _resource_entry_notes(f"{where}[{i}]", _map(entry), containers)
    return notes


def _resource_entry_notes(
    where: str, entry: Mapping[str, Any], containers: tuple[str, ...]
) -> list[Note]:
    notes = []
    name = str(entry.get("name") or "")
    if name not in containers:
        supported = ", ".join(containers)
        why = f"container {name!r} is not in this state's manifests (supported: {supported})"
        notes.append(_refused(f"{where}.name", why))
    amounts: dict[str, dict[str, Fraction]] = {}
    for kind in ("requests", "limits"):
        amounts[kind] = {}
        for resource, raw in _map(entry.get(kind)).items():
            path = f"{where}.{kind}.{resource}"
            if resource not in _COMPUTE:
                notes.append(_refused(path, f"{resource!r} is not supported (only cpu, memory)"))
                continue
            amount = parse_quantity(raw)
            if amount is None:
                why = f"{raw!r} is not a Kubernetes quantity: the API server refuses the object"
                notes.append(Note(section="webhook", severity="critical", path=path, message=why))
                continue
            if amount == 0:
                notes.append(_refused(path, f"the {kind[:-1]} for {resource} is zero"))
            amounts[kind][str(resource)] = amount
    for resource, limit in amounts["limits"].items():
        request = amounts["requests"].get(resource)
        if request is not None and limit < request:
            why = f"the {resource} request is greater than the limit"
            notes.append(_refused(f"{where}.requests.{resource}", why))
    return notes


def section_conflicts(cluster_spec: Mapping[str, Any], node_spec: Mapping[str, Any]) -> list[str]:
    """The sections (OVERLAP_SECTIONS) set in both: the webhook refuses the NicNodePolicy or
    the NicClusterPolicy, whichever is created or updated second."""
    return [s for s in OVERLAP_SECTIONS
            if cluster_spec.get(s) is not None and node_spec.get(s) is not None]  # fmt: skip


def node_overlaps(selected: Mapping[str, frozenset[str]]) -> list[tuple[str, tuple[str, ...]]]:
    """(node, the NicNodePolicies selecting it) for each node two or more select, by node;
    `selected` maps a policy to its nodes (an empty nodeSelector selects every node)."""
    by_node: dict[str, list[str]] = {}
    for policy, nodes in selected.items():
        for node in nodes:
            by_node.setdefault(node, []).append(policy)
    return [(n, tuple(sorted(p))) for n, p in sorted(by_node.items()) if len(p) > 1]


def _safe_load(spec: Mapping[str, Any]) -> list[Note]:
    policy = _map(_map(spec.get("ofedDriver")).get("upgradePolicy"))
    if policy.get("safeLoad") is True and policy.get("autoUpgrade") is not True:
        why = "safeLoad requires spec.ofedDriver.upgradePolicy.autoUpgrade to be true"
        return [_refused("spec.ofedDriver.upgradePolicy.safeLoad", why)]
    return []


def _repositories(spec: Mapping[str, Any]) -> list[Note]:
    default = str(_map(spec.get("global")).get("repository") or "")
    notes = []
    for path in REPOSITORY_SECTIONS:
        section: object = spec
        for key in path:
            section = _map(section).get(key)
        if not isinstance(section, Mapping):
            continue
        repo = str(section.get("repository") or "") or default
        why = repository_error(repo)
        if why is not None:
            where = "spec." + ".".join(path) + ".repository"
            notes.append(_refused(where, f"{repo!r}: invalid container image repository ({why})"))
    return notes


def _ib_kubernetes(ib: Mapping[str, Any]) -> list[Note]:
    if not ib:
        return []
    start = str(ib.get("pKeyGUIDPoolRangeStart") or "")
    end = str(ib.get("pKeyGUIDPoolRangeEnd") or "")
    path = "spec.ibKubernetes."
    bad = [(k, v) for k, v in (("pKeyGUIDPoolRangeStart", start), ("pKeyGUIDPoolRangeEnd", end))
           if not _GUID.fullmatch(v)]  # fmt: skip
    if bad:
        return [_refused(path + k, f"{v!r} is not a GUID (xx:xx:xx:xx:xx:xx:xx:xx, hex)")
                for k, v in bad]  # fmt: skip
    if int(end.replace(":", ""), 16) <= int(start.replace(":", ""), 16):
        why = f"the pKey GUID pool {start} - {end} is not a range (end must be above start)"
        return [_refused(path + "pKeyGUIDPoolRangeEnd", why)]
    return []


def _refused(path: str, why: str) -> Note:
    return Note(section="webhook", severity="critical", path=path,
                message=f"the operator's webhook refuses it: {why}")  # fmt: skip


def _map(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}
