"""The NVIDIA Network Operator webhook's refusals besides the device plugin configs and the
OFED version (api/v1alpha1/validator/nicpolicy_webhook.go at b06827e): the image
repositories, ibKubernetes' pKey GUID pool range, docaTelemetryService's ConfigMap name and
ofedDriver's safeLoad. Each is a Note the audit reports as "the webhook refuses".

Pure. Not checked here (their rule needs what the webhook has and the audit has not): the
container resources (checked against the operator's rendered manifests), the overlap of a
NicClusterPolicy's sections with NicNodePolicies', and the sriov config's JSON schema.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, Final

from proto.nicpolicysections import Note

# The sections validateRepositories reads, each `repository` falling back to spec.global's.
REPOSITORY_SECTIONS: Final = (
    ("ofedDriver",), ("rdmaSharedDevicePlugin",), ("sriovDevicePlugin",), ("ibKubernetes",),
    ("nvIpam",), ("nicFeatureDiscovery",), ("docaTelemetryService",),
    ("secondaryNetwork", "cniPlugins"), ("secondaryNetwork", "ipoib"),
    ("secondaryNetwork", "multus"),
)  # fmt: skip
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
    notes += _ib_kubernetes(_map(spec.get("ibKubernetes")))
    telemetry = spec.get("docaTelemetryService")
    config = _map(telemetry).get("config") if isinstance(telemetry, Mapping) else None
    if isinstance(config, Mapping):
        name = str(config.get("fromConfigMap") or "")
        if len(name) > 253 or not _DNS1123_SUBDOMAIN.fullmatch(name):
            why = f"{name!r} is not a DNS-1123 subdomain (a ConfigMap name)"
            notes.append(_refused("spec.docaTelemetryService.config.fromConfigMap", why))
    return notes


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
