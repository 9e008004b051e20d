"""Property: over any interleaving of agent restarts, clock skews, late and duplicate
deliveries and aggregator restarts (the fleet rebuilt from what KV holds), the fleet ends at
the live agent's latest state (docs/wire.md, "Ordering").

A node runs agent processes one after another; each publishes rounds of (a port event when
its port changed, then a snapshot) stamped by its own clock. Every message arrives after a
random delay (maybe twice). The aggregator's clock is the true time.
"""

from __future__ import annotations

from dataclasses import dataclass

import msgspec
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from aggregator.fleet.ordering import OrderingSettings
from aggregator.fleet.state import Fleet
from proto.inventory import NodeSnapshot, PortStateName
from proto.messages.events import LinkEvent
from tests.support.builders import T0, port_event, snapshot

ORDERING = OrderingSettings(future_tolerance_s=5.0, takeover_s=30.0)
PROPERTY = settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
SKEWS = st.one_of(
    st.sampled_from([0.0, 2.0, -3.0, 6.0, 600.0, 650.0, -600.0]), st.floats(-700.0, 700.0)
)
# Clocks whose epochs are plainly a time or plainly from the future at every arrival: not
# ahead by more than the tolerance less a process's age, nor by less than the tolerance
# plus the longest delay and period (docs/wire.md, "Ordering": the limits).
CLEAR_SKEWS = st.one_of(
    st.sampled_from([0.0, 2.0, -3.0, 600.0, 650.0, -600.0]),
    st.floats(-700.0, 2.0),
    st.floats(30.0, 700.0),
)


@dataclass(frozen=True)
class Process:
    skew: float  # its clock minus the true time
    gap: float  # seconds between the previous process's last round and its start
    period: float  # seconds between its rounds
    states: tuple[PortStateName, ...]  # the port's state in each round


@dataclass(frozen=True)
class Sent:
    message: NodeSnapshot | LinkEvent
    process: int
    arrives: float


def processes(skew: st.SearchStrategy[float]) -> st.SearchStrategy[Process]:
    return st.builds(
        Process,
        skew=skew,
        gap=st.floats(1.0, 40.0),
        period=st.floats(0.5, 5.0),
        states=st.lists(st.sampled_from(["ACTIVE", "DOWN"]), min_size=1, max_size=6).map(tuple),
    )


def snap(seq: int, at: float, epoch: int, state: PortStateName) -> NodeSnapshot:
    base = snapshot(seq=seq, collected_at=at)
    dev = base.devices[0]
    ports = tuple(msgspec.structs.replace(p, state=state) for p in dev.ports)
    return msgspec.structs.replace(
        base, devices=(msgspec.structs.replace(dev, ports=ports),), epoch=epoch
    )


def publish(
    run: list[Process], delays: st.DataObject, max_delay: float
) -> tuple[list[Sent], list[int], float]:
    """Every message of every process with its arrival time; the epochs; the true time the
    last process published its last round."""
    sent: list[Sent] = []
    epochs: list[int] = []
    now = T0
    for index, proc in enumerate(run):
        now += proc.gap
        epoch = round((now + proc.skew) * 1e9)
        epochs.append(epoch)
        before: PortStateName = "ACTIVE"
        for seq, state in enumerate(proc.states, start=1):
            now += proc.period
            out: list[NodeSnapshot | LinkEvent] = []
            if state != before:
                event = port_event(new=state, old=before, observed_at=now - 0.1 + proc.skew,
                                   seq=seq, phys=None)  # fmt: skip
                out.append(msgspec.structs.replace(event, epoch=epoch))
            out.append(snap(seq, now + proc.skew, epoch, state))
            before = state
            for message in out:
                copies = delays.draw(st.integers(1, 2), label="copies")
                for _ in range(copies):
                    delay = delays.draw(st.floats(0.0, max_delay), label="delay")
                    sent.append(Sent(message, index, now + delay))
    assume(len(set(epochs)) == len(epochs))
    return sent, epochs, now


class Aggregator:
    """A fleet, its KV (the latest applied snapshot and its arrival) and restarts."""

    def __init__(self) -> None:
        self.fleet = Fleet(ordering=ORDERING)
        self.kv: tuple[NodeSnapshot, float] | None = None

    def deliver(self, message: NodeSnapshot | LinkEvent, at: float) -> bool:
        if isinstance(message, LinkEvent):
            return self.fleet.apply_event(message, at).applied
        outcome = self.fleet.apply_snapshot(message, at)
        if outcome.applied and outcome.record.snapshot is not None:
            self.kv = (outcome.record.snapshot, at)  # what ingest persists
        return outcome.applied

    def restart(self) -> None:
        self.fleet = Fleet(ordering=ORDERING)
        if self.kv is not None:
            self.fleet.apply_snapshot(*self.kv)  # as the aggregator loads KV on start

    def state(self) -> tuple[int, int, str]:
        record = self.fleet.get("gpu-001")
        assert record is not None and record.snapshot is not None
        snap_ = record.snapshot
        return snap_.epoch, snap_.seq, snap_.devices[0].ports[0].state


def run_deliveries(agg: Aggregator, sent: list[Sent], restarts: list[float]) -> list[Sent]:
    """Deliver in arrival order, restarting the aggregator at the given times; the applied."""
    applied: list[Sent] = []
    pending = sorted(restarts)
    for item in sorted(sent, key=lambda s: s.arrives):
        while pending and pending[0] <= item.arrives:
            pending.pop(0)
            agg.restart()
        if agg.deliver(item.message, item.arrives):
            applied.append(item)
    return applied


@PROPERTY
@given(
    run=st.lists(processes(SKEWS), min_size=1, max_size=4),
    restarts=st.lists(st.floats(T0, T0 + 400.0), max_size=2),
    data=st.data(),
)
def test_the_fleet_converges_to_the_live_agents_latest_state(
    run: list[Process], restarts: list[float], data: st.DataObject
) -> None:
    # Any skew per process: what cannot be ordered waits for `takeover_s` of silence, so
    # the live agent, publishing on, is followed at the latest that long after the last
    # stale delivery.
    sent, epochs, last = publish(run, data, max_delay=30.0)
    agg = Aggregator()
    run_deliveries(agg, sent, restarts)
    live = run[-1]
    seq = len(live.states)
    now = max([last, *(s.arrives for s in sent)])
    stop = now + ORDERING.takeover_s + 2
    while now < stop:
        now += 1.0
        seq += 1
        agg.deliver(snap(seq, now + live.skew, epochs[-1], live.states[-1]), now)
    assert agg.state() == (epochs[-1], seq, live.states[-1])


@PROPERTY
@given(
    skew=CLEAR_SKEWS,
    run=st.lists(processes(st.just(0.0)), min_size=1, max_size=4),
    restarts=st.lists(st.floats(T0, T0 + 400.0), max_size=2),
    data=st.data(),
)
def test_on_one_clock_a_dead_process_never_overwrites_the_live_one(
    skew: float, run: list[Process], restarts: list[float], data: st.DataObject
) -> None:
    # One node, one clock (any offset, 600 s ahead included): restarts are ordered at once.
    # Once the live process's snapshot is applied, nothing of an earlier one ever is, and
    # the fleet ends at its latest snapshot with no further message.
    run = [_with_skew(p, skew) for p in run]
    sent, epochs, _ = publish(run, data, max_delay=20.0)
    agg = Aggregator()
    applied = run_deliveries(agg, sent, restarts)
    live = len(run) - 1
    first_live = next(
        i
        for i, s in enumerate(applied)
        if s.process == live and isinstance(s.message, NodeSnapshot)
    )
    assert all(s.process == live for s in applied[first_live:])
    assert agg.state() == (epochs[-1], len(run[-1].states), run[-1].states[-1])


def _with_skew(proc: Process, skew: float) -> Process:
    return Process(skew=skew, gap=proc.gap, period=proc.period, states=proc.states)
