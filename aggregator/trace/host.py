"""The host side of the chain trace: agent, adapter, driver/firmware, RDMA ports and char
devices — and the `Link`/`ChainContext` types every link check shares.

Pure: each check is a function of the context (records, policies, cluster, `now`); no I/O,
no clock, no logging. The device-plugin and Kubernetes links are in `aggregator.trace.chain`.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any, Final

import msgspec

from aggregator.cluster import ClusterView, PodRequest
from aggregator.fleet.state import NodeRecord
from aggregator.fleet.views import node_state
from aggregator.trace.verdict import DEGRADED_ADAPTERS
from proto.http import Link
from proto.ibta import ACTIVE_STATES
from proto.inventory import Device, NodeSnapshot
from proto.messages.config import ResourceConfig
from proto.messages.status import ResourceStatus
from proto.policy import Policy

RDMA_CM: Final = "/dev/infiniband/rdma_cm"
PASSTHROUGH_DRIVERS: Final = frozenset({"vfio-pci", "pci-stub"})


class ChainContext(msgspec.Struct, frozen=True, kw_only=True):
    node: str
    resource: str
    record: NodeRecord | None
    cluster: ClusterView
    policies: tuple[Policy, ...]  # the ones selecting the node
    config: ResourceConfig | None
    status: ResourceStatus | None
    now: float
    stale_after: float
    pod: PodRequest | None = None  # a pod's own chain (`trace --pod`), else the node's

    @property
    def snapshot(self) -> NodeSnapshot | None:
        return self.record.snapshot if self.record is not None else None

    @property
    def selected(self) -> tuple[Device, ...]:
        """The adapters the agent selected for the resource; every adapter when it has not
        reported the resource (so the hardware links are still checked)."""
        devices = self.snapshot.devices if self.snapshot is not None else ()
        if self.status is None:
            return devices
        return tuple(d for d in devices if d.name in self.status.devices)

    def has_module(self, name: str) -> bool:
        return self.snapshot is not None and name in self.snapshot.modules


def link_ok(name: str, **evidence: Any) -> Link:
    return Link(name=name, status="ok", evidence=evidence)


def link_unknown(name: str, **evidence: Any) -> Link:
    return Link(name=name, status="unknown", evidence=evidence)


def link_degraded(name: str, cause: str, fix: str, adapters: list[str], **evidence: Any) -> Link:
    """The link holds with reduced capacity; `adapters` (RDMA devices) reduce it."""
    evidence = {**evidence, DEGRADED_ADAPTERS: adapters}
    return Link(name=name, status="degraded", evidence=evidence, cause=cause, fix=fix)


def link_broken(name: str, cause: str, fix: str, **evidence: Any) -> Link:
    return Link(name=name, status="broken", evidence=evidence, cause=cause, fix=fix)


def compact(value: msgspec.Struct) -> Any:
    """A config Struct as JSON-ready data without its empty/unset fields (for evidence)."""
    return _drop_empty(msgspec.to_builtins(value))


def _drop_empty(value: Any) -> Any:
    if isinstance(value, dict):
        kept = {k: _drop_empty(v) for k, v in value.items()}
        return {k: v for k, v in kept.items() if v not in (None, [], {})}
    if isinstance(value, list | tuple):
        return [_drop_empty(v) for v in value]
    return value


def _iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def check_agent(ctx: ChainContext) -> Link:
    name = "agent"
    fix = (
        f"check the nicfleet-agent pod on {ctx.node} (kubectl get pods -A -o wide "
        f"--field-selector spec.nodeName={ctx.node}) and its NATS connection"
    )
    record = ctx.record
    if record is None:
        return link_broken(
            name, f"no agent has ever reported from {ctx.node}", fix, in_cluster=True
        )
    state = node_state(record, ctx.now, ctx.stale_after)
    evidence = {"state": state, "last_seen": record.last_seen, "age_s": ctx.now - record.last_seen}
    if state == "stale":
        cause = (
            f"agent not reporting since {_iso(record.last_seen)} "
            f"({ctx.now - record.last_seen:.0f}s ago, stale after {ctx.stale_after:g}s)"
        )
        return link_broken(name, cause, fix, **evidence)
    if state == "no-snapshot":
        return link_broken(
            name, "the agent reports but has sent no inventory snapshot", fix, **evidence
        )
    assert record.snapshot is not None
    return link_ok(name, agent_version=record.snapshot.agent_version, **evidence)


def check_adapter(ctx: ChainContext) -> Link:
    name = "adapter"
    snap = ctx.snapshot
    if snap is None:
        return link_unknown(name, reason="no inventory snapshot")
    present = [d.name for d in snap.devices]
    evidence: dict[str, Any] = {"rdma_devices": present}
    if ctx.status is not None:
        evidence |= {
            "selected": list(ctx.status.devices),
            "unmatched": ctx.status.unmatched,
            "excluded": ctx.status.excluded,
        }
    if ctx.config is not None and ctx.config.selectors is not None:
        evidence["selectors"] = compact(ctx.config.selectors)
    if not present:
        missing = [m for m in ("mlx5_core", "mlx5_ib") if not ctx.has_module(m)]
        if missing:  # the agent sees adapters through their RDMA devices only
            return link_unknown(name, reason=f"{', '.join(missing)} not loaded", **evidence)
        return link_broken(
            name,
            "no RDMA adapter on the node although the drivers are loaded",
            "check the adapter is visible (lspci -d 15b3:) and that mlx5_core probed it (dmesg)",
            **evidence,
        )
    if ctx.status is None:
        return link_ok(name, note="device plugin has not reported the resource", **evidence)
    if not ctx.status.devices:
        why = {**ctx.status.unmatched, **ctx.status.excluded}
        detail = "; ".join(f"{a}: {r}" for a, r in sorted(why.items())) or "no adapters"
        return link_broken(
            name,
            f"no adapter matches the selectors of {ctx.resource} ({detail})",
            "change the resource's selectors in the policy to match this node's adapters "
            "(nicfleetctl node shows vendor, device ID, netdevs and link layer)",
            **evidence,
        )
    gone = sorted(set(ctx.status.devices) - set(present))
    if gone:
        return link_broken(
            name,
            f"selected adapter(s) {', '.join(gone)} missing from the inventory",
            "check the adapter did not fall off the bus (dmesg, lspci) and reset or reseat it",
            **evidence,
        )
    return link_ok(name, **evidence)


def check_driver(ctx: ChainContext) -> Link:
    name = "driver"
    snap = ctx.snapshot
    if snap is None:
        return link_unknown(name, reason="no inventory snapshot")
    modules = sorted(snap.modules)
    evidence: dict[str, Any] = {
        "modules": modules,
        "drivers": {d.name: d.driver for d in ctx.selected},
        "firmware": {d.name: d.fw_ver for d in ctx.selected},
    }
    if not snap.devices:
        if not ctx.has_module("mlx5_core"):
            return link_broken(
                name,
                "mlx5_core not loaded: the adapters have no driver",
                "load it (modprobe mlx5_core) or check the OFED/driver install and dmesg",
                **evidence,
            )
        if not ctx.has_module("mlx5_ib"):
            return link_broken(
                name,
                "mlx5_ib not loaded: RDMA devices cannot exist",
                "load mlx5_ib (modprobe mlx5_ib) or check the OFED install",
                **evidence,
            )
        return link_unknown(name, reason="no RDMA devices", **evidence)
    unbound = [d.name for d in ctx.selected if d.driver is None]
    passthrough = [d.name for d in ctx.selected if d.driver in PASSTHROUGH_DRIVERS]
    no_fw = [d.name for d in ctx.selected if not d.fw_ver]
    if unbound:
        return link_broken(
            name,
            f"no driver bound to {', '.join(unbound)}",
            "bind mlx5_core (echo the PCI address to /sys/bus/pci/drivers/mlx5_core/bind) "
            "and check dmesg for probe errors",
            **evidence,
        )
    if passthrough:
        return link_broken(
            name,
            f"{', '.join(passthrough)} bound to a passthrough driver, not mlx5_core",
            "unbind it from vfio-pci and bind mlx5_core, or remove it from this resource",
            **evidence,
        )
    if no_fw:
        return link_broken(
            name,
            f"no firmware version readable on {', '.join(no_fw)}: the firmware did not start",
            "check dmesg for mlx5_core firmware errors; reset the adapter (mlxfwreset) or "
            "reflash the firmware",
            **evidence,
        )
    return link_ok(name, **evidence)


def check_rdma_device(ctx: ChainContext) -> Link:
    name = "rdma-device"
    if ctx.snapshot is None or not ctx.selected:
        return link_unknown(name, reason="no selected RDMA device")
    ports = {
        f"{d.name}/{p.port}": f"{p.state}/{p.phys_state or '?'} {p.link_layer}"
        for d in ctx.selected
        for p in d.ports
    }
    up = [
        d.name
        for d in ctx.selected
        if any(p.state in ACTIVE_STATES and p.phys_state in (None, "LinkUp") for p in d.ports)
    ]
    down = [d for d in ctx.selected if d.name not in up]
    evidence: dict[str, Any] = {"ports": ports, "adapters_up": up}
    if not down:
        return link_ok(name, adapters_down=[], **evidence)
    cause, fix = _port_cause(down, partial=bool(up))
    if up:  # the resource still works, on fewer adapters
        names = [d.name for d in down]
        cause = f"{len(up)} of {len(ctx.selected)} selected adapters up; {cause}"
        return link_degraded(name, cause, fix, names, adapters_down=names, **evidence)
    return link_broken(name, cause, fix, **evidence)


def _port_cause(down: list[Device], *, partial: bool = False) -> tuple[str, str]:
    """Why the `down` adapters have no active port; `partial`: others are up, so the cause
    names only these ports rather than "the selected adapters"."""
    ports = [p for d in down for p in d.ports]
    if not ports:
        return "the selected RDMA devices have no ports", "check the adapter and driver (dmesg)"
    names = ", ".join(f"{d.name}/{p.port}" for d in down for p in d.ports)
    where = f"{names} not active" if partial else (
        f"no active port on the selected adapters ({names})")  # fmt: skip
    if all(p.phys_state == "LinkUp" and p.link_layer == "InfiniBand" for p in ports):
        return (
            f"link is up but no subnet manager configured {names} (state INIT/ARMED)",
            "start or check the fabric's subnet manager (opensm / UFM) and run sminfo",
        )
    if all(p.link_layer == "Ethernet" for p in ports):
        return (
            f"{where}: netdev down or no carrier",
            "bring the netdev up (ip link set <if> up); check cable, transceiver, switch port",
        )
    return (
        f"{where}: no physical link",
        "check cable, transceiver and switch port (ibstat, mlxlink -d <pci>)",
    )


def check_char_devices(ctx: ChainContext) -> Link:
    name = "char-devices"
    snap = ctx.snapshot
    if snap is None or not ctx.selected:
        return link_unknown(name, reason="no selected RDMA device")
    have = {d.name: list(d.char_devices) for d in ctx.selected}
    evidence: dict[str, Any] = {
        "char_devices": have,
        "rdma_netns_mode": snap.platform.rdma_netns_mode,
    }

    def lacking(prefix: str) -> list[str]:
        return [n for n, paths in have.items() if not any(_is(p, prefix) for p in paths)]

    for prefix, module, what in (
        ("uverbs", "ib_uverbs", "verbs cannot be opened in pods"),
        ("umad", "ib_umad", "MAD tools (ibstat, UD QP1 users) fail in pods"),
    ):
        missing = lacking(prefix)
        if missing:
            loaded = ctx.has_module(module)
            cause = (
                f"no /dev/infiniband/{prefix}N for {', '.join(missing)}"
                + ("" if loaded else f": {module} not loaded")
                + f", so {what}"
            )
            fix = f"load {module} (modprobe {module})" if not loaded else "check udev and dmesg"
            return link_broken(name, cause, fix, **evidence)
    if not any(RDMA_CM in paths for paths in have.values()):
        return link_broken(
            name,
            "no /dev/infiniband/rdma_cm: rdma_ucm not loaded, so RDMA CM users (NCCL, UCX) fail",
            "load rdma_ucm (modprobe rdma_ucm)",
            **evidence,
        )
    if snap.platform.rdma_netns_mode == "exclusive":
        return _exclusive_netns(name, ctx, evidence)
    return link_ok(name, **evidence)


def _exclusive_netns(name: str, ctx: ChainContext, evidence: dict[str, Any]) -> Link:
    """In exclusive mode an RDMA device belongs to one netns (the host's until moved) and
    ib_uverbs_open refuses any process of another netns with EPERM: the char devices are
    there but a pod with its own network namespace cannot use them."""
    if ctx.config is not None and ctx.config.exclusive:
        return link_ok(
            name,
            note="RDMA subsystem in exclusive netns mode: a pod can open an adapter only once "
            "its RDMA device is moved into the pod's netns (rdma-cni in the attachment's CNI "
            "chain); hostNetwork pods use them in place",
            **evidence,
        )
    return link_broken(
        name,
        "RDMA subsystem in exclusive netns mode (ib_core netns_mode=N): the RDMA devices stay "
        "in the host's network namespace, so a pod with its own gets EPERM opening "
        f"/dev/infiniband/uverbsN; a shared resource like {ctx.resource} works only for "
        "hostNetwork pods",
        "for shared resources set shared mode: drop the ib_core netns_mode=0 module option and "
        "reboot (rdma system set netns shared fails with EBUSY while other namespaces exist); "
        "or give each pod a dedicated device moved into its netns (SR-IOV VFs with rdma-cni)",
        **evidence,
    )


def _is(path: str, prefix: str) -> bool:
    return path.rsplit("/", 1)[-1].startswith(prefix)
