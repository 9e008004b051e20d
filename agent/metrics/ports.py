"""Pure: the agent's per-port and device-plugin metric families, built from live state.

Port state and rate come from the last port poll and snapshot, counters from the latest
counter batch (a fixed set of counter names, so cardinality is ports x PORT_COUNTERS),
device-plugin gauges from the manager's per-resource status. No I/O, no clock.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Final

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from proto.inventory import NodeSnapshot, PortStateName
from proto.messages.counters import CounterBatch
from proto.messages.status import ResourceStatus

PortStates = Mapping[tuple[str, int], tuple[PortStateName, str | None]]

# Exported counters, "<sysfs group>/<file>": the error and congestion counters the rules
# read (aggregator.rules.counters) plus traffic. Anything else stays in the counter batch.
PORT_COUNTERS: Final[tuple[str, ...]] = (
    "counters/symbol_error",
    "counters/link_error_recovery",
    "counters/link_downed",
    "counters/port_rcv_errors",
    "counters/port_rcv_remote_physical_errors",
    "counters/port_xmit_discards",
    "counters/local_link_integrity_errors",
    "counters/excessive_buffer_overrun_errors",
    "counters/port_xmit_wait",
    "hw_counters/out_of_buffer",
    "hw_counters/out_of_sequence",
    "hw_counters/packet_seq_err",
    "hw_counters/local_ack_timeout_err",
    "hw_counters/roce_adp_retrans",
    "hw_counters/rx_icrc_encapsulated",
    "hw_counters/req_transport_retries_exceeded",
    "hw_counters/req_rnr_retries_exceeded",
    "hw_counters/rp_cnp_handled",
    "hw_counters/rp_cnp_ignored",
    "hw_counters/np_cnp_sent",
    "hw_counters/np_ecn_marked_roce_packets",
)
# IBTA port state codes as sysfs prints them ("4: ACTIVE"); UNKNOWN: unreadable.
STATE_CODES: Final[Mapping[str, int]] = {
    "NOP": 0, "DOWN": 1, "INIT": 2, "ARMED": 3, "ACTIVE": 4, "ACTIVE_DEFER": 5, "UNKNOWN": -1,
}  # fmt: skip
ACTIVE: Final = frozenset({"ACTIVE", "ACTIVE_DEFER"})
PortKey = tuple[str, int]


def port_families(
    snapshot: NodeSnapshot | None, states: PortStates | None, counters: CounterBatch | None
) -> Iterator[Metric]:
    labels = ["device", "port"]
    up = GaugeMetricFamily(
        "nicfleet_agent_port_up",
        "1 while the port is ACTIVE (or ACTIVE_DEFER), else 0.",
        labels=labels,
    )
    state = GaugeMetricFamily(
        "nicfleet_agent_port_state",
        "IBTA port state code (1 DOWN, 2 INIT, 3 ARMED, 4 ACTIVE, 5 ACTIVE_DEFER; -1 unknown).",
        labels=labels,
    )
    for (dev, port), name in sorted(port_states(snapshot, states).items()):
        key = [dev, str(port)]
        up.add_metric(key, 1.0 if name in ACTIVE else 0.0)
        state.add_metric(key, STATE_CODES.get(name, -1))
    yield up
    yield state
    rate = GaugeMetricFamily(
        "nicfleet_agent_port_rate_bytes_per_second",
        "Negotiated link rate of the port (sysfs rate, Gb/s x 1e9 / 8), from the last snapshot.",
        labels=labels,
    )
    for device in snapshot.devices if snapshot is not None else ():
        for p in device.ports:
            if p.rate_gbps is not None:
                rate.add_metric([device.name, str(p.port)], p.rate_gbps * 1e9 / 8)
    yield rate
    yield from counter_families(counters)


def port_states(snapshot: NodeSnapshot | None, states: PortStates | None) -> dict[PortKey, str]:
    """The live poll's state per port, the snapshot's for ports the poll has not seen."""
    found: dict[PortKey, str] = {}
    for device in snapshot.devices if snapshot is not None else ():
        for p in device.ports:
            found[(device.name, p.port)] = p.state
    for key, (name, _phys) in (states or {}).items():
        found[key] = name
    return found


def counter_families(batch: CounterBatch | None) -> Iterator[Metric]:
    labels = ["device", "port"]
    received = CounterMetricFamily(
        "nicfleet_agent_port_received_bytes",
        "Bytes received by the port (port_rcv_data x 4), from the latest counter batch.",
        labels=labels,
    )
    sent = CounterMetricFamily(
        "nicfleet_agent_port_transmitted_bytes",
        "Bytes sent by the port (port_xmit_data x 4), from the latest counter batch.",
        labels=labels,
    )
    counted = CounterMetricFamily(
        "nicfleet_agent_port_stats",
        "Port counters from the latest counter batch, by counter (kernel file name; a fixed "
        "set, see docs/metrics.md). Absent when the driver has no such file.",
        labels=[*labels, "counter"],
    )
    for pc in sorted(batch.ports if batch is not None else (), key=lambda c: (c.device, c.port)):
        key = [pc.device, str(pc.port)]
        if pc.rx_bytes is not None:
            received.add_metric(key, pc.rx_bytes)
        if pc.tx_bytes is not None:
            sent.add_metric(key, pc.tx_bytes)
        groups = {"counters": pc.counters, "hw_counters": pc.hw_counters}
        for qualified in PORT_COUNTERS:
            group, name = qualified.split("/", 1)
            value = groups[group].get(name)
            if value is not None:
                counted.add_metric([*key, name], value)
    yield received
    yield sent
    yield counted
    errors = GaugeMetricFamily(
        "nicfleet_agent_counter_read_errors",
        "Counter files that could not be read in the latest batch, by group (counters, "
        "counters_ext, hw_counters).",
        labels=["group"],
    )
    for group, count in sorted(counter_errors_by_group(batch).items()):
        errors.add_metric([group], count)
    yield errors


def counter_errors_by_group(batch: CounterBatch | None) -> dict[str, int]:
    found: dict[str, int] = {}
    for error in batch.errors if batch is not None else ():
        parts = error.path.rstrip("/").split("/")
        group = parts[-2] if len(parts) >= 2 else "other"
        found[group] = found.get(group, 0) + 1
    return found


def device_plugin_families(resources: Sequence[ResourceStatus] | None) -> Iterator[Metric]:
    """Per resource; an agent without a device plugin exposes the families empty."""
    label = ["resource"]
    registered = GaugeMetricFamily(
        "nicfleet_agent_device_plugin_registered",
        "1 while the resource is registered with the kubelet.",
        labels=label,
    )
    state = GaugeMetricFamily(
        "nicfleet_agent_device_plugin_registration_state",
        "1 for the resource's current registration state (starting, waiting, registering, "
        "registered, retrying, rejected, stopped).",
        labels=[*label, "state"],
    )
    attempts = GaugeMetricFamily(
        "nicfleet_agent_device_plugin_registration_failures",
        "Failed registration attempts since the last success.",
        labels=label,
    )
    advertised = GaugeMetricFamily(
        "nicfleet_agent_device_plugin_devices",
        "Device IDs advertised to the kubelet for the resource.",
        labels=label,
    )
    healthy = GaugeMetricFamily(
        "nicfleet_agent_device_plugin_healthy_devices",
        "Advertised device IDs that are healthy.",
        labels=label,
    )
    for r in sorted(resources or (), key=lambda r: r.name):
        registered.add_metric([r.name], 1.0 if r.registration == "registered" else 0.0)
        state.add_metric([r.name, r.registration], 1.0)
        attempts.add_metric([r.name], r.registration_attempts)
        advertised.add_metric([r.name], r.advertised)
        healthy.add_metric([r.name], r.healthy)
    yield from (registered, state, attempts, advertised, healthy)
