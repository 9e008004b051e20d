"""The `adapter-lost` rule: an RDMA adapter the node's agent reported is gone, or the node has
less than its policy or its own history says it should — a capacity drop that is otherwise
silent (the device plugin just advertises fewer devices).

Three subjects, each naming the adapters (RDMA device, PCI address, model):
- `<rdma device>`: a device the followed agent process reported is no longer listed
  (aggregator.fleet.adapterhistory: what that process showed *this* aggregator process, so a
  start or a takeover judges nothing it never observed). It resolves when a device of the
  same PCI address (any name) is listed again. Whether its PCI function is still on the
  bus (`NodeSnapshot.nic_functions`) tells an unregistered device from a lost card.
- `<resource>`: the device plugin advertises fewer than the highest it advertised under the
  same config generation.
- `adapters`: fewer compute adapters than the policy's `expect.adaptersPerNode` (durable:
  also after an agent restart, and offline).
Pure: reads the record's snapshot, device-plugin status and adapter history.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from typing import Final, Literal

from aggregator.fleet.adapterhistory import AdapterHistory, SeenAdapter, adapter_key, lists_devices
from aggregator.fleet.state import NodeRecord
from aggregator.rules.descriptor import Rule, RuleInput
from aggregator.rules.finding import Evidence, Finding
from aggregator.rules.fleetfacts import expectations, node_compute_adapters
from proto.inventory import NodeSnapshot
from proto.policy import Expect

RULE: Final = "adapter-lost"
PciFunctionState = Literal["present", "gone", "unknown"]
_FUNCTION_TEXT: Final[Mapping[PciFunctionState, str]] = {
    "present": "its PCI function is still on the bus, so the driver unregistered the RDMA "
    "device (mlx5_ib unloaded or reloaded, a firmware fatal error or reset)",
    "gone": "its PCI function is gone from the bus too, so the adapter fell off it (PCIe "
    "surprise removal, a link that went down, AER, a dead card)",
    "unknown": "whether its PCI function is still there is not known (the agent does not "
    "report the bus)",
}
POLICY_SUBJECT: Final = "adapters"
FIX: Final = (
    "read the node's kernel log (dmesg: mlx5_core firmware or health errors, PCIe AER, driver "
    "unload) and `lspci -s <pci>`; reload the driver, reset or reseat the adapter"
)


def check_adapter_lost(given: RuleInput) -> list[Finding]:
    expect = expectations(given.fleet, given.policies, given.cluster)
    found: list[Finding] = []
    for node in sorted(given.fleet):
        record = given.fleet[node]
        snap = record.snapshot
        if snap is None or not lists_devices(snap):
            continue  # no inventory, or one that could not list the devices: no verdict
        lost = _lost(record.adapters, snap)
        found += [_device_finding(node, a, record.adapters, snap) for a in lost]
        found += _capacity_findings(node, record, lost)
        found += _policy_findings(node, snap, expect.get(node, Expect()), lost)
    return found


def _lost(history: AdapterHistory | None, snap: NodeSnapshot) -> list[SeenAdapter]:
    if history is None:
        return []
    present = {adapter_key(d) for d in snap.devices}
    return [a for a in history.adapters if a.key not in present]


def _device_finding(
    node: str, adapter: SeenAdapter, history: AdapterHistory | None, snap: NodeSnapshot
) -> Finding:
    since = history.since if history is not None else adapter.first_seen
    function = _function_state(adapter, snap)
    return Finding(
        rule=RULE,
        severity="critical",
        node=node,
        subject=adapter.name,
        message=f"RDMA device {_named(adapter)} is gone from {node} (listed until "
        f"{_iso(adapter.last_seen)}), and pods lose its capacity: {_FUNCTION_TEXT[function]}; "
        f"{FIX}. Removed on purpose: restart the node's agent, which accepts the hardware as "
        "it is then.",
        evidence={
            **_identity(adapter),
            "pci_function": function,
            "last_seen": adapter.last_seen,
            "heard_since": since,
        },
    )


def _function_state(adapter: SeenAdapter, snap: NodeSnapshot) -> PciFunctionState:
    if snap.nic_functions is None or adapter.pci_address is None:
        return "unknown"
    return "present" if adapter.pci_address.lower() in snap.nic_functions else "gone"


def _capacity_findings(node: str, record: NodeRecord, lost: list[SeenAdapter]) -> list[Finding]:
    status, history = record.device_plugin, record.adapters
    if status is None or history is None:
        return []
    served = {r.name: r for r in status.resources if r.config_error is None}
    known = {a.name: a for a in history.adapters}
    gone_names = {a.name for a in lost}
    found = []
    for name, peak in sorted(history.peaks.items()):
        if peak.config_generation != status.config_generation:
            continue  # another config: its peak is not this one's
        r = served.get(name)
        advertised = r.advertised if r is not None else 0
        serving = r.devices if r is not None else ()
        dropped = sorted(set(peak.devices) - set(serving))
        if advertised >= peak.advertised and len(serving) >= len(peak.devices):
            continue
        adapters = [known[d] for d in dropped if d in known]
        why = ", ".join(_named(a) for a in adapters) or ", ".join(dropped) or "no adapter named"
        evidence: Evidence = {
            "advertised": advertised,
            "highest": peak.advertised,
            "adapters_serving": len(serving),
            "most_adapters": len(peak.devices),
            "highest_at": peak.at,
            "config_generation": peak.config_generation,
            "adapters": ",".join(dropped),
            "gone_from_inventory": ",".join(d for d in dropped if d in gone_names),
        }
        for a in adapters:
            evidence[f"adapter:{a.name}"] = _described(a)
        found.append(
            Finding(
                rule=RULE,
                severity="critical",
                node=node,
                subject=name,
                message=f"{name} on {node} offers {advertised} devices over {_count(serving)}, "
                f"down from {peak.advertised} over {_count(peak.devices)} (the most since this "
                f"agent started, same config): lost {why}; {FIX}.",
                evidence=evidence,
            )
        )
    return found


def _policy_findings(
    node: str, snap: NodeSnapshot, expect: Expect, lost: Iterable[SeenAdapter]
) -> list[Finding]:
    wanted = expect.adapters_per_node
    if wanted is None:
        return []
    have = node_compute_adapters(node, snap, expect)
    if len(have) >= wanted:
        return []
    gone = list(lost)
    named = f": lost {', '.join(_named(a) for a in gone)}" if gone else ""
    evidence: Evidence = {
        "expected": wanted,
        "found": len(have),
        "adapters": ",".join(f"{d.name}@{d.pci_address or '?'}" for d in have),
        "lost": ",".join(a.name for a in gone),
    }
    return [
        Finding(
            rule=RULE,
            severity="critical",
            node=node,
            subject=POLICY_SUBJECT,
            message=f"{node} has {len(have)} compute adapters where its policy expects "
            f"{wanted} (expect.adaptersPerNode){named}; {FIX}.",
            evidence=evidence,
        )
    ]


def _count(adapters: tuple[str, ...]) -> str:
    return f"{len(adapters)} adapter{'' if len(adapters) == 1 else 's'}"


def _named(a: SeenAdapter) -> str:
    return f"{a.name} ({_described(a)})"


def _described(a: SeenAdapter) -> str:
    # hca_type is the model (MT4129: ConnectX-7), board_id the PSID of its board/firmware.
    model = " ".join(x for x in (a.hca_type, a.board_id) if x) or a.device_id or "model unknown"
    return f"{a.pci_address or 'PCI address unknown'}, {model}"


def _identity(a: SeenAdapter) -> Evidence:
    return {
        "rdma_device": a.name,
        "pci_address": a.pci_address,
        "board_id": a.board_id,
        "hca_type": a.hca_type,
        "device_id": a.device_id,
        "netdevs": ",".join(a.netdevs),
    }


def _iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


RULES: Final[tuple[Rule, ...]] = (
    Rule(id=RULE, family="fleet", severity="critical", check=check_adapter_lost,
         reads=frozenset({"snapshot", "device_plugin", "adapters"})),
)  # fmt: skip
