"""Why a ResourceClaim can or cannot be allocated, node by node: its requests' DeviceClass
and CEL selectors, counts (`exactly.count`, allocationMode All), `firstAvailable`
subrequests in order, and `matchAttribute` constraints, over the ResourceSlices' devices.

Pure: Claim, DeviceClasses and Devices in (aggregator.dra.objects), an Explanation out.
Health is the contract's: a rdma.nicfleet.io device whose `portState` is not ACTIVE is
not allocatable. What it cannot know: devices already allocated to other claims, and
slices not bound to one node.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Final

from aggregator.dra import celenv
from aggregator.dra.objects import (
    MAX_COUNT,
    AttributeValue,
    Choice,
    Claim,
    Device,
    DeviceClass,
    InvalidObject,
)
from proto.dranames import DRIVER

PORT_STATE: Final = f"{DRIVER}/portState"
MAX_COMBINATIONS: Final = 4096
_SHOWN: Final = 4  # rejected devices named per reason before "and N more"

# Called with "request nic selector #0: EXPR" before a selector runs over a node's devices:
# when the caller's time limit hits, the last one named is the expensive expression.
Progress = Callable[[str], None]


@dataclass(frozen=True)
class RequestResult:
    request: str
    ok: bool
    why: str
    devices: tuple[str, ...] = ()


@dataclass(frozen=True)
class NodeResult:
    node: str
    ok: bool
    requests: tuple[RequestResult, ...]


@dataclass(frozen=True)
class Explanation:
    claim: str
    nodes: tuple[NodeResult, ...]
    notes: tuple[str, ...] = ()

    @property
    def allocatable(self) -> bool:
        return any(n.ok for n in self.nodes)


@dataclass
class _Filtered:
    """One choice on one node: the devices it may get, and why the others may not."""

    choice: Choice
    candidates: list[Device] = field(default_factory=list)
    rejected: dict[str, list[Device]] = field(default_factory=dict)  # reason -> devices
    unhealthy: list[tuple[Device, str]] = field(default_factory=list)  # selected but unhealthy
    errors: list[str] = field(default_factory=list)


def health(device: Device) -> str | None:
    """None when the device's port is up, else why not (the contract's portState rule,
    which nicfleet's DeviceClasses select on)."""
    if device.driver != DRIVER:
        return None
    state = device.attributes.get(PORT_STATE)
    if state is None or state == "ACTIVE":
        return None
    return f"port {state}"


def explain(
    claim: Claim,
    classes: Mapping[str, DeviceClass],
    devices: Sequence[Device],
    *,
    progress: Progress | None = None,
) -> Explanation:
    """Raises InvalidObject for a class the claim names but `classes` lacks and
    celenv.CelCompileError for a selector that does not compile (both bad input)."""
    compiled = _compile(claim, classes)
    by_node: dict[str, list[Device]] = {}
    for device in devices:
        by_node.setdefault(device.node, []).append(device)
    results = tuple(
        _explain_node(claim, compiled, node, by_node[node], progress) for node in sorted(by_node)
    )
    notes = (
        "devices already allocated to other claims are not known here; "
        "they may make an 'ok' node fail",
    )
    return Explanation(claim.name, results, notes)


_Programs = dict[str, tuple[celenv.Compiled, ...]]  # choice name -> class then request selectors


def _compile(claim: Claim, classes: Mapping[str, DeviceClass]) -> _Programs:
    out: _Programs = {}
    for request in claim.requests:
        for choice in request.choices:
            cls = classes.get(choice.device_class)
            if cls is None:
                raise InvalidObject(
                    f"request {choice.name}",
                    f"deviceClassName {choice.device_class!r}: no such DeviceClass given "
                    f"(--class FILE; kubectl get deviceclass {choice.device_class} -o yaml)",
                )
            selectors = (*cls.selectors, *choice.selectors)
            out[choice.name] = tuple(celenv.compile_selector(s) for s in selectors)
    return out


def _filter(
    choice: Choice,
    programs: Sequence[celenv.Compiled],
    devices: Sequence[Device],
    progress: Progress | None,
) -> _Filtered:
    out = _Filtered(choice)
    alive = list(devices)
    for program in programs:
        if progress is not None:
            progress(f"{program.selector.where}: {program.selector.expression}")
        kept = []
        for device in alive:
            try:
                ok = celenv.matches(program, device)
            except celenv.CelRuntimeError as exc:
                out.errors.append(str(exc))
                continue
            if ok:
                kept.append(device)
                continue
            why = health(device) if _tests_port_state(program) else None
            if why is not None:
                # nicfleet's classes pass over a port that is not ACTIVE: say that, not
                # "selector #1 rejects".
                out.unhealthy.append((device, why))
            elif _worth_naming(program, device):
                out.rejected.setdefault(program.selector.where, []).append(device)
        alive = kept
    # What every selector keeps the scheduler may allocate, whatever its port: a class
    # without a portState selector hands out a DOWN device (dra-claim-unhealthy-device).
    out.candidates.extend(alive)
    return out


def _tests_port_state(program: celenv.Compiled) -> bool:
    return "portState" in program.selector.expression


def _worth_naming(program: celenv.Compiled, device: Device) -> bool:
    """A class selector that names a driver other than the device's rejects it for that
    alone: a GPU refused by a NIC class is noise in an explanation."""
    sel = program.selector
    if not sel.where.startswith("class "):
        return True
    return f'"{device.driver}"' in sel.expression or f"'{device.driver}'" in sel.expression


def _explain_node(
    claim: Claim,
    programs: _Programs,
    node: str,
    devices: Sequence[Device],
    progress: Progress | None,
) -> NodeResult:
    filtered = {
        choice.name: _filter(choice, programs[choice.name], devices, progress)
        for request in claim.requests
        for choice in request.choices
    }
    if any(f.errors for f in filtered.values()):
        # The scheduler stops at a CEL runtime error: the claim fails, not just the device.
        rows: list[RequestResult] = []
        for r in claim.requests:
            errors = dict.fromkeys(e for c in r.choices for e in filtered[c.name].errors)
            rows.append(RequestResult(r.name, not errors, "; ".join(errors)))
        return NodeResult(node, False, tuple(rows))
    every = itertools.product(*(r.choices for r in claim.requests))
    combos = list(itertools.islice(every, MAX_COMBINATIONS + 1))
    for combo in combos[:MAX_COMBINATIONS]:
        got = _allocate(claim, [filtered[c.name] for c in combo])
        if got is not None:
            ok = tuple(
                RequestResult(r.name, True, _got_why(r.name, c, devs), tuple(d.name for d in devs))
                for r, c, devs in zip(claim.requests, combo, got, strict=True)
            )
            return NodeResult(node, True, ok)
    return NodeResult(node, False, _blame(claim, filtered, node, len(combos) > MAX_COMBINATIONS))


def _got_why(request: str, choice: Choice, devices: Sequence[Device]) -> str:
    names = ", ".join(d.name for d in devices)
    return f"would get {names}" + (f" (subrequest {choice.name})" if choice.name != request else "")


def _binding(claim: Claim, request: str, choice: str) -> list[int]:
    """The constraints (by index) that bind `request` when `choice` is its chosen way: a
    constraint naming a subrequest binds only while that subrequest is the one chosen."""
    return [
        i
        for i, c in enumerate(claim.constraints)
        if not c.requests or request in c.requests or choice in c.requests
    ]


def _allocate(claim: Claim, chosen: Sequence[_Filtered]) -> list[list[Device]] | None:
    """Devices for each request (in claim order) satisfying counts, constraints and
    distinctness, or None. Each constraint gets one value, tried in turn from the values
    its requests' candidates have."""
    bound = [
        _binding(claim, r.name, f.choice.name) for r, f in zip(claim.requests, chosen, strict=True)
    ]
    used = sorted({i for b in bound for i in b})
    attr = {i: claim.constraints[i].attribute for i in used}
    values: list[list[AttributeValue]] = []
    for i in used:
        seen: dict[AttributeValue, None] = {}
        for f, b in zip(chosen, bound, strict=True):
            if i in b:
                seen.update(
                    (d.attributes[attr[i]], None) for d in f.candidates if attr[i] in d.attributes
                )
        values.append(list(seen))
    for n, assignment in enumerate(itertools.product(*values)):
        if n >= MAX_COMBINATIONS:
            return None
        wanted = dict(zip(used, assignment, strict=True))
        pools: list[list[Device]] = []
        for f, b in zip(chosen, bound, strict=True):
            fit = [d for d in f.candidates if all(_has(d, attr[i], wanted[i]) for i in b)]
            if f.choice.mode == "All" and len(fit) != len(f.candidates):
                break
            pools.append(fit)
        else:
            counts = [
                len(p) if f.choice.mode == "All" else f.choice.count
                for p, f in zip(pools, chosen, strict=True)
            ]
            if any(c == 0 for c in counts):
                continue
            got = _match(pools, counts)
            if got is not None:
                return got
    return None


def _has(device: Device, attribute: str, value: AttributeValue) -> bool:
    # bool is an int in Python: True must not match an int attribute of 1
    got = device.attributes.get(attribute)
    return got == value and type(got) is type(value)


def _match(pools: Sequence[Sequence[Device]], counts: Sequence[int]) -> list[list[Device]] | None:
    """Distinct devices for every slot (a request needing n devices has n slots):
    bipartite matching by augmenting paths."""
    slots = [i for i, n in enumerate(counts) for _ in range(n)]
    if len(slots) > MAX_COUNT:
        return None  # the API server refuses more results, and this keeps the recursion short
    owner: dict[int, int] = {}  # id(device) -> slot
    keep: dict[int, Device] = {}

    def place(slot: int, seen: set[int]) -> bool:
        for device in pools[slots[slot]]:
            key = id(device)
            if key in seen:
                continue
            seen.add(key)
            if key not in owner or place(owner[key], seen):
                owner[key], keep[key] = slot, device
                return True
        return False

    for slot in range(len(slots)):
        if not place(slot, set()):
            return None
    out: list[list[Device]] = [[] for _ in counts]
    for key, slot in owner.items():
        out[slots[slot]].append(keep[key])
    return [sorted(devices, key=lambda d: d.name) for devices in out]


def _names(devices: Iterable[Device]) -> str:
    names = [d.name for d in devices]
    more = f" and {len(names) - _SHOWN} more" if len(names) > _SHOWN else ""
    return ", ".join(names[:_SHOWN]) + more


def _shortfall(f: _Filtered, node: str) -> str:
    c = f.choice
    need = "all matching devices" if c.mode == "All" else f"{c.count} device{'s' * (c.count > 1)}"
    parts = [f"needs {need} of class {c.device_class}, {len(f.candidates)} allocatable on {node}"]
    if f.unhealthy:
        parts.append(", ".join(f"{d.name} {why}" for d, why in f.unhealthy[:_SHOWN]))
    for where, devs in f.rejected.items():
        parts.append(f"{where} rejects {_names(devs)}")
    return "; ".join(parts)


def _first_fit(f: _Filtered) -> bool:
    if not f.candidates:
        return False
    if f.choice.mode == "All":
        return True  # every device the selectors keep; those they pass over do not count
    return len(f.candidates) >= f.choice.count


def _blame(
    claim: Claim, filtered: Mapping[str, _Filtered], node: str, truncated: bool
) -> tuple[RequestResult, ...]:
    rows: dict[str, RequestResult] = {}
    alone: dict[str, _Filtered] = {}
    for request in claim.requests:
        fits = [filtered[c.name] for c in request.choices if _first_fit(filtered[c.name])]
        if fits:
            alone[request.name] = fits[0]
            continue
        why = " | ".join(
            (f"{c.name}: " if c.name != request.name else "") + _shortfall(filtered[c.name], node)
            for c in request.choices
        )
        rows[request.name] = RequestResult(request.name, False, why)
    if not rows:
        rows.update(_blame_constraints(claim, alone, node))
    if not rows and truncated:
        why = f"more than {MAX_COMBINATIONS} subrequest combinations; not searched"
        rows = {r.name: RequestResult(r.name, False, why) for r in claim.requests}
    if not rows:
        first = claim.requests[0].name
        rows[first] = RequestResult(
            first,
            False,
            f"the requests together need more distinct devices than {node} has allocatable"
            f" (or more than {MAX_COUNT}, the most one claim can get)",
        )
    return tuple(
        rows.get(r.name) or RequestResult(r.name, True, "satisfiable alone") for r in claim.requests
    )


def _blame_constraints(
    claim: Claim, alone: Mapping[str, _Filtered], node: str
) -> dict[str, RequestResult]:
    """For each matchAttribute: which request finds no allocatable device with a value
    its first request's devices have, and which devices with that value were refused."""
    rows: dict[str, RequestResult] = {}
    for constraint in claim.constraints:
        members = [
            r.name
            for r in claim.requests
            if not constraint.requests or _covered_by(constraint.requests, r.name)
        ]
        attr = constraint.attribute
        short = attr.rpartition("/")[2]
        anchor, *rest = members or [""]
        if anchor not in alone:
            continue
        values = {d.attributes[attr]: d for d in alone[anchor].candidates if attr in d.attributes}
        if not values:
            rows[anchor] = RequestResult(
                anchor, False, f"no allocatable device has {attr} (matchAttribute)"
            )
            continue
        for other in rest:
            if other not in alone or other in rows:
                continue
            f = alone[other]
            if any(d.attributes.get(attr) in values for d in f.candidates):
                continue
            shown = ", ".join(f"{v}: {d.name}" for v, d in list(values.items())[:_SHOWN])
            refused = [
                f"{d.name} {why}" for d, why in f.unhealthy if d.attributes.get(attr) in values
            ]
            for where, devs in f.rejected.items():
                same = [d for d in devs if d.attributes.get(attr) in values]
                if same:
                    refused.append(f"{_names(same)} rejected by {where}")
            have = sorted({str(d.attributes.get(attr)) for d in f.candidates})
            tail = (
                ": " + "; ".join(refused)
                if refused
                else (f"; its devices have {short} {', '.join(have)}" if have else "")
            )
            cls = f.choice.device_class
            why = f"no allocatable {cls} device with the {short} of request {anchor} ({shown})"
            why += f" on {node}{tail}"
            rows[other] = RequestResult(other, False, why)
    return rows


def _covered_by(listed: Sequence[str], request: str) -> tuple[str, ...]:
    return tuple(request for r in listed if r == request or r.startswith(f"{request}/"))
