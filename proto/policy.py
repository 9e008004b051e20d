"""The NicFleetPolicy document (`nicfleet.io/v1alpha1`) and its validation.

The same shape is read from the Kubernetes CRD and, when there is no cluster, from a
YAML file (one or more documents). Validation errors name the document and field path.
Pure: parsing text is the caller's business (`load_policies` takes the text).
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec
import yaml

from proto.dpconfig import ConfigError, parse_device_plugin_config
from proto.errors import ProtoError
from proto.messages.config import DevicePluginConfig

API_VERSION = "nicfleet.io/v1alpha1"
KIND = "NicFleetPolicy"

Relation = Literal["PIX", "PXB", "PHB", "NODE", "SYS"]


class PolicyError(ProtoError, ValueError):
    """A policy document that is not valid; names the source, document and field."""

    def __init__(self, source: str, path: str, reason: str) -> None:
        self.source = source
        self.path = path
        self.reason = reason
        super().__init__(f"{source}: {path}: {reason}")


class Strict(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Policy documents are written by people: a misspelt field is an error, not ignored."""


class LabelSelectorRequirement(Strict, frozen=True, kw_only=True):
    key: str
    operator: Literal["In", "NotIn", "Exists", "DoesNotExist"]
    values: tuple[str, ...] = ()


class LabelSelector(Strict, frozen=True, kw_only=True, rename="camel"):
    match_labels: dict[str, str] = msgspec.field(default_factory=dict)
    match_expressions: tuple[LabelSelectorRequirement, ...] = ()


class Expect(Strict, frozen=True, kw_only=True, rename="camel"):
    """What the selected nodes should look like; unset means "not checked"."""

    link_layer: Literal["InfiniBand", "Ethernet"] | None = None
    min_rate_gbps: float | None = None
    mtu: int | None = None
    min_firmware: dict[str, str] = msgspec.field(default_factory=dict)  # model -> version
    max_gpu_nic_relation: Relation | None = None
    gpu_direct: bool | None = None
    adapters_per_node: int | None = None


class PolicySpec(Strict, frozen=True, kw_only=True, rename="camel"):
    node_selector: LabelSelector = LabelSelector()
    rdma_shared_device_plugin: DevicePluginConfig | None = None
    expect: Expect = Expect()
    alerts: dict[str, Any] = msgspec.field(default_factory=dict)


class Metadata(Strict, frozen=True, kw_only=True):
    name: str
    labels: dict[str, str] = msgspec.field(default_factory=dict)


class Policy(Strict, frozen=True, kw_only=True, rename="camel"):
    api_version: Literal["nicfleet.io/v1alpha1"]
    kind: Literal["NicFleetPolicy"]
    metadata: Metadata
    spec: PolicySpec = PolicySpec()


def load_policies(text: str, *, source: str) -> tuple[Policy, ...]:
    """Every policy in a YAML stream; raises PolicyError naming document and field."""
    try:
        documents = [d for d in yaml.safe_load_all(text) if d is not None]
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else "$"
        raise PolicyError(source, where, f"not valid YAML: {exc}") from exc
    except RecursionError as exc:  # the YAML composer recurses once per nesting level
        raise PolicyError(source, "$", "not valid YAML: nested too deeply") from exc
    policies: list[Policy] = []
    names: set[str] = set()
    for index, document in enumerate(documents):
        document, plugin_config = _split_plugin_config(document)
        try:
            policy = msgspec.convert(document, Policy)
        except RecursionError as exc:
            raise PolicyError(source, f"document {index}: $", "nested too deeply") from exc
        except msgspec.ValidationError as exc:
            text_ = str(exc)
            reason, _, at = text_.partition(" - at `")
            path = at.rstrip("`") if at else "$"
            raise PolicyError(source, f"document {index}: {path}", reason) from exc
        if policy.metadata.name in names:
            raise PolicyError(
                source, f"document {index}: $.metadata.name", f"duplicate {policy.metadata.name!r}"
            )
        names.add(policy.metadata.name)
        _check_semantics(policy, source, index)
        if plugin_config is not None:
            policy = _with_plugin_config(policy, plugin_config, source, index)
        policies.append(policy)
    return tuple(policies)


def _split_plugin_config(document: Any) -> tuple[Any, Any]:
    """The document without spec.rdmaSharedDevicePlugin, and that part on its own: it is
    checked by proto.dpconfig, the validator the agent uses too, not by the lenient wire
    Struct the policy field is typed with."""
    spec = document.get("spec") if isinstance(document, dict) else None
    if not isinstance(spec, dict) or spec.get("rdmaSharedDevicePlugin") is None:
        return document, None
    rest = {key: value for key, value in spec.items() if key != "rdmaSharedDevicePlugin"}
    return {**document, "spec": rest}, spec["rdmaSharedDevicePlugin"]


def _with_plugin_config(policy: Policy, raw: Any, source: str, index: int) -> Policy:
    where = f"document {index}: $.spec.rdmaSharedDevicePlugin"
    if not isinstance(raw, dict):
        # parse_device_plugin_config would read a string as JSON/YAML text; here the
        # document is embedded as YAML, never as a string holding it (NicClusterPolicy's way).
        raise PolicyError(source, where, "must be a mapping (the config document itself)")
    try:
        config = parse_device_plugin_config(raw, source=source)
    except ConfigError as exc:
        path = where if exc.path == "$" else f"{where}.{exc.path}"
        reason = exc.reason
        if exc.resource_name is not None:
            reason = f"{reason} (resourceName {exc.resource_name!r})"
        raise PolicyError(source, path, reason) from None
    spec = msgspec.structs.replace(policy.spec, rdma_shared_device_plugin=config)
    return msgspec.structs.replace(policy, spec=spec)


def _check_semantics(policy: Policy, source: str, index: int) -> None:
    where = f"document {index}: $.spec"
    expect = policy.spec.expect
    for field, value in (
        ("minRateGbps", expect.min_rate_gbps),
        ("mtu", expect.mtu),
        ("adaptersPerNode", expect.adapters_per_node),
    ):
        if value is not None and value <= 0:
            raise PolicyError(source, f"{where}.expect.{field}", f"must be > 0, got {value}")
    for i, requirement in enumerate(policy.spec.node_selector.match_expressions):
        needs_values = requirement.operator in ("In", "NotIn")
        if needs_values != bool(requirement.values):
            raise PolicyError(
                source,
                f"{where}.nodeSelector.matchExpressions[{i}].values",
                f"operator {requirement.operator} "
                + ("needs values" if needs_values else "takes no values"),
            )
