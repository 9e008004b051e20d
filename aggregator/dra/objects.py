"""The parts of resource.k8s.io/v1 objects a claim explanation needs, parsed from plain
dicts (YAML/JSON documents) into frozen dataclasses: ResourceClaim (or a
ResourceClaimTemplate's spec), DeviceClass, ResourceSlice.

Pure and strict about shape: every error names the document and the field path, and the
Kubernetes API's size limits are enforced so a hostile file cannot make the search huge.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Final, Literal

from aggregator.errors import AggregatorError

# The API server's limits for resource.k8s.io/v1 (types.go): a document that passes them
# is one the cluster could hold.
MAX_REQUESTS: Final = 32
MAX_SUBREQUESTS: Final = 8
MAX_SELECTORS: Final = 32
MAX_CONSTRAINTS: Final = 32
MAX_EXPRESSION: Final = 10 * 1024
MAX_DEVICES_PER_SLICE: Final = 128
MAX_ATTRIBUTES: Final = 32
MAX_COUNT: Final = 32  # AllocationResultsMaxSize: devices one claim can get in all

AttributeValue = bool | int | str
AllocationMode = Literal["ExactCount", "All"]


class InvalidObject(AggregatorError, ValueError):
    """A document that is not the object it should be: `where` names document and field."""

    def __init__(self, where: str, reason: str) -> None:
        super().__init__(f"{where}: {reason}")
        self.where = where
        self.reason = reason


@dataclass(frozen=True)
class Selector:
    expression: str
    where: str  # e.g. "request nic selector #0", for CEL errors


@dataclass(frozen=True)
class Choice:
    """One way to satisfy a request: `exactly`, or one `firstAvailable` subrequest."""

    name: str  # "nic", or "nic/ib" for a subrequest
    device_class: str
    selectors: tuple[Selector, ...]
    mode: AllocationMode
    count: int


@dataclass(frozen=True)
class Request:
    name: str
    choices: tuple[Choice, ...]  # one for `exactly`; in order for `firstAvailable`


@dataclass(frozen=True)
class Constraint:
    requests: tuple[str, ...]  # empty: every request
    attribute: str  # fully qualified


@dataclass(frozen=True)
class Claim:
    name: str
    requests: tuple[Request, ...]
    constraints: tuple[Constraint, ...]


@dataclass(frozen=True)
class DeviceClass:
    name: str
    selectors: tuple[Selector, ...]


@dataclass(frozen=True)
class Device:
    driver: str
    pool: str
    node: str
    name: str
    attributes: Mapping[str, AttributeValue]  # fully qualified names
    capacity: Mapping[str, str]  # fully qualified names -> quantity strings


def qualify(name: str, driver: str) -> str:
    """An attribute name with its domain: unqualified names belong to the driver."""
    return name if "/" in name else f"{driver}/{name}"


def _map(value: object, where: str) -> Mapping[str, object]:
    if not isinstance(value, Mapping):
        raise InvalidObject(where, f"expected a mapping, got {type(value).__name__}")
    return value


def _list(value: object, where: str, limit: int) -> Sequence[object]:
    if value is None:
        return ()
    if not isinstance(value, list):
        raise InvalidObject(where, f"expected a list, got {type(value).__name__}")
    if len(value) > limit:
        raise InvalidObject(where, f"{len(value)} entries, the API allows at most {limit}")
    return value


def _str(value: object, where: str) -> str:
    if not isinstance(value, str) or not value:
        raise InvalidObject(where, "expected a non-empty string")
    return value


def _name(doc: Mapping[str, object], where: str) -> str:
    meta = doc.get("metadata")
    if meta is None:
        return ""
    name = _map(meta, f"{where}.metadata").get("name", "")
    return name if isinstance(name, str) else ""


def _selectors(value: object, where: str, owner: str) -> tuple[Selector, ...]:
    out = []
    for i, item in enumerate(_list(value, where, MAX_SELECTORS)):
        cel = _map(_map(item, f"{where}[{i}]").get("cel"), f"{where}[{i}].cel")
        expr = _str(cel.get("expression"), f"{where}[{i}].cel.expression")
        if len(expr) > MAX_EXPRESSION:
            raise InvalidObject(
                f"{where}[{i}].cel.expression", f"{len(expr)} characters, limit {MAX_EXPRESSION}"
            )
        out.append(Selector(expr, f"{owner} selector #{i}"))
    return tuple(out)


def _choice(spec: Mapping[str, object], name: str, where: str) -> Choice:
    mode = spec.get("allocationMode", "ExactCount")
    if mode not in ("ExactCount", "All"):
        raise InvalidObject(f"{where}.allocationMode", f"{mode!r} is not ExactCount or All")
    count = spec.get("count", 1)
    if mode == "All" and "count" in spec:
        raise InvalidObject(f"{where}.count", "must not be set with allocationMode All")
    if not isinstance(count, int) or isinstance(count, bool) or not 1 <= count <= MAX_COUNT:
        raise InvalidObject(f"{where}.count", f"{count!r} is not an integer in 1..{MAX_COUNT}")
    return Choice(
        name=name,
        device_class=_str(spec.get("deviceClassName"), f"{where}.deviceClassName"),
        selectors=_selectors(spec.get("selectors"), f"{where}.selectors", f"request {name}"),
        mode="All" if mode == "All" else "ExactCount",
        count=count,
    )


def _request(item: object, where: str) -> Request:
    spec = _map(item, where)
    name = _str(spec.get("name"), f"{where}.name")
    exactly, first = spec.get("exactly"), spec.get("firstAvailable")
    if (exactly is None) == (first is None):
        raise InvalidObject(where, "needs exactly one of `exactly` and `firstAvailable`")
    if exactly is not None:
        return Request(
            name, (_choice(_map(exactly, f"{where}.exactly"), name, f"{where}.exactly"),)
        )
    subs = []
    for i, sub in enumerate(_list(first, f"{where}.firstAvailable", MAX_SUBREQUESTS)):
        at = f"{where}.firstAvailable[{i}]"
        body = _map(sub, at)
        subs.append(_choice(body, f"{name}/{_str(body.get('name'), f'{at}.name')}", at))
    if not subs:
        raise InvalidObject(f"{where}.firstAvailable", "is empty")
    return Request(name, tuple(subs))


def parse_claim(doc: object, where: str = "claim") -> Claim:
    """A ResourceClaim, or a ResourceClaimTemplate (its spec.spec), as a Claim."""
    body = _map(doc, where)
    kind = body.get("kind")
    spec = _map(body.get("spec"), f"{where}.spec")
    at = f"{where}.spec"
    if kind == "ResourceClaimTemplate":
        spec, at = _map(spec.get("spec"), f"{at}.spec"), f"{at}.spec"
    elif kind not in ("ResourceClaim", None):
        raise InvalidObject(
            f"{where}.kind",
            f"{kind!r}: give a ResourceClaim or ResourceClaimTemplate "
            "(for a Pod, the template its spec.resourceClaims names)",
        )
    devices = _map(spec.get("devices"), f"{at}.devices")
    requests = tuple(
        _request(r, f"{at}.devices.requests[{i}]")
        for i, r in enumerate(
            _list(devices.get("requests"), f"{at}.devices.requests", MAX_REQUESTS)
        )
    )
    if not requests:
        raise InvalidObject(f"{at}.devices.requests", "no device request")
    names = [r.name for r in requests]
    if len(set(names)) != len(names):
        raise InvalidObject(f"{at}.devices.requests", f"duplicate request names in {names}")
    constraints = []
    ct = f"{at}.devices.constraints"
    for i, item in enumerate(_list(devices.get("constraints"), ct, MAX_CONSTRAINTS)):
        body_i = _map(item, f"{ct}[{i}]")
        attribute = body_i.get("matchAttribute")
        if attribute is None:
            continue  # distinctAttribute and future kinds: not explained here
        attribute = _str(attribute, f"{ct}[{i}].matchAttribute")
        if "/" not in attribute:
            raise InvalidObject(f"{ct}[{i}].matchAttribute", "must be domain/name")
        listed = tuple(
            _str(r, f"{ct}[{i}].requests[{j}]")
            for j, r in enumerate(
                _list(body_i.get("requests"), f"{ct}[{i}].requests", MAX_REQUESTS)
            )
        )
        for r in listed:
            if r.split("/")[0] not in names:
                raise InvalidObject(f"{ct}[{i}].requests", f"{r!r} is not a request of the claim")
        constraints.append(Constraint(listed, attribute))
    return Claim(_name(body, where), requests, tuple(constraints))


def parse_class(doc: object, where: str = "class") -> DeviceClass:
    body = _map(doc, where)
    if body.get("kind") != "DeviceClass":
        raise InvalidObject(f"{where}.kind", f"{body.get('kind')!r} is not DeviceClass")
    name = _name(body, where)
    if not name:
        raise InvalidObject(f"{where}.metadata.name", "missing")
    spec = _map(body.get("spec") or {}, f"{where}.spec")
    return DeviceClass(
        name, _selectors(spec.get("selectors"), f"{where}.spec.selectors", f"class {name}")
    )


def _attribute(value: object, where: str) -> AttributeValue:
    body = _map(value, where)
    for key in ("bool", "int", "string", "version"):
        if key in body:
            got = body[key]
            ok = (
                isinstance(got, bool)
                if key == "bool"
                else (
                    isinstance(got, int) and not isinstance(got, bool)
                    if key == "int"
                    else isinstance(got, str)
                )
            )
            if not ok:
                raise InvalidObject(f"{where}.{key}", f"{got!r} is not a {key}")
            return got  # type: ignore[return-value]
    raise InvalidObject(where, "needs one of bool, int, string, version")


def parse_slice(doc: object, where: str = "slice", *, any_node: bool = False) -> list[Device]:
    """The devices of one ResourceSlice; a slice not bound to one node has none here
    (with `any_node`, its devices with node "": the cluster view keeps every slice)."""
    body = _map(doc, where)
    if body.get("kind") != "ResourceSlice":
        raise InvalidObject(f"{where}.kind", f"{body.get('kind')!r} is not ResourceSlice")
    spec = _map(body.get("spec"), f"{where}.spec")
    driver = _str(spec.get("driver"), f"{where}.spec.driver")
    pool = _str(_map(spec.get("pool"), f"{where}.spec.pool").get("name"), f"{where}.spec.pool.name")
    node = spec.get("nodeName")
    if node is None and not any_node:
        return []  # allNodes / nodeSelector pools are not one node's devices
    node = "" if node is None else _str(node, f"{where}.spec.nodeName")
    devices = []
    for i, item in enumerate(
        _list(spec.get("devices"), f"{where}.spec.devices", MAX_DEVICES_PER_SLICE)
    ):
        at = f"{where}.spec.devices[{i}]"
        dev = _map(item, at)
        attrs = _map(dev.get("attributes") or {}, f"{at}.attributes")
        caps = _map(dev.get("capacity") or {}, f"{at}.capacity")
        if len(attrs) + len(caps) > MAX_ATTRIBUTES:
            raise InvalidObject(
                at, f"{len(attrs) + len(caps)} attributes+capacities, limit {MAX_ATTRIBUTES}"
            )
        capacity = {}
        for key, cap in caps.items():
            value = _map(cap, f"{at}.capacity.{key}").get("value")
            capacity[qualify(str(key), driver)] = str(value)
        devices.append(
            Device(
                driver=driver,
                pool=pool,
                node=node,
                name=_str(dev.get("name"), f"{at}.name"),
                attributes={
                    qualify(str(k), driver): _attribute(v, f"{at}.attributes.{k}")
                    for k, v in attrs.items()
                },
                capacity=capacity,
            )
        )
    return devices


def slice_documents(doc: object, where: str) -> list[tuple[object, str]]:
    """A ResourceSlice, or a List / ResourceSliceList of them, as (document, where) pairs."""
    body = _map(doc, where)
    if body.get("kind") in ("List", "ResourceSliceList"):
        items = _list(body.get("items"), f"{where}.items", 100_000)
        return [(item, f"{where}.items[{i}]") for i, item in enumerate(items)]
    return [(body, where)]
