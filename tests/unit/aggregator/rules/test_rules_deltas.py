"""Incremental rule evaluation over counter deltas (a node's findings of a counter rule
reused when the delta left the rule's keys alone; data-quality skipping batches found clean
at ingest) equals the full `registry.evaluate` of the same records with their
delta bookkeeping erased, after random sequences of full batches, deltas (error counters
included), saturated/reset counters, snapshots, events, removals and ticks."""

from __future__ import annotations

import math

import msgspec
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from agent.counters.deltas import delta_against
from aggregator.fleet.heldcounters import HeldCounters
from aggregator.fleet.state import Fleet, NodeRecord
from aggregator.rules.counterbase import same_counter_inputs
from aggregator.rules.engine.incremental import IncrementalRules
from aggregator.rules.engine.registry import COUNTER_KEYS, evaluate
from proto import codec
from proto.inventory import PortStateName
from proto.messages.counters import CounterBatch, PortCounters
from tests.support.builders import port_event
from tests.support.rules_cases import T0, batch, port_counters
from tests.unit.aggregator.rules.test_rules_incremental import snapshots

NODES = ("n0", "n1", "n2")
PORTS = (("mlx5_0", 1), ("mlx5_1", 1))
KEYS = (
    "counters/symbol_error",
    "counters/link_downed",
    "counters/port_xmit_data",
    "hw_counters/out_of_sequence",
    "hw_counters/req_transport_retries_exceeded",
    "hw_counters/rp_cnp_ignored",
    "hw_counters/rp_cnp_handled",
    "rx_bytes",
)
RATE_VALUES = (0.0, 0.0, 5.0, 1e6, math.nan, -1.0)
COUNTER_VALUES = (0, 7, -2)

# One port's values: key -> (rate or None, counter or None); saturated, resets.
PortValues = tuple[dict[str, tuple[float | None, int | None]], tuple[str, ...], tuple[str, ...]]


@st.composite
def port_values(draw: st.DrawFn) -> PortValues:
    keys = draw(st.lists(st.sampled_from(KEYS), unique=True, max_size=len(KEYS)))
    values = {
        k: (
            draw(st.sampled_from((None, *RATE_VALUES))),
            draw(st.sampled_from((None, *COUNTER_VALUES))) if k.startswith("counters/") else None,
        )
        for k in keys
    }
    odd = st.lists(st.sampled_from(KEYS[:2]), unique=True, max_size=1).map(tuple)
    flags = draw(st.sampled_from((0, 0, 0, 1, 2)))
    return values, draw(odd) if flags == 1 else (), draw(odd) if flags == 2 else ()


def make_port(device: str, number: int, values: PortValues) -> PortCounters:
    found, saturated, resets = values
    rates = {k: r for k, (r, _) in found.items() if r is not None}
    counters = {k[9:]: c for k, (_, c) in found.items() if c is not None}
    return port_counters(
        device, number, rates=rates, counters=counters, saturated=saturated, resets=resets
    )


def changed_port(base: PortCounters, edits: PortValues) -> PortCounters:
    """`base` with the drawn keys' rates/counters overwritten (None: removed)."""
    rates, counters = dict(base.rates), dict(base.counters)
    found, saturated, resets = edits
    for key, (rate, counter) in found.items():
        rates.pop(key, None) if rate is None else rates.__setitem__(key, rate)
        if key.startswith("counters/"):
            name = key[9:]
            counters.pop(name, None) if counter is None else counters.__setitem__(name, counter)
    return msgspec.structs.replace(
        base, rates=rates, counters=counters, saturated=saturated, resets=resets
    )


def erased(fleet: Fleet) -> dict[str, NodeRecord]:
    """The records without their delta bookkeeping: every rule reads all values."""
    return {
        name: msgspec.structs.replace(
            r,
            counters_held=None if r.counters is None else HeldCounters.of(r.counters),
            counters_base_seq=None,
            counters_delta=None,
        )
        for name, r in fleet.view().items()
    }


class Machine(RuleBasedStateMachine):
    @initialize()
    def start(self) -> None:
        self.fleet = Fleet()
        self.incremental = IncrementalRules()
        self.now = T0
        self.seq = 1
        self.bases: dict[str, CounterBatch] = {}  # the last full batch sent per node

    def _next(self) -> int:
        self.seq += 1
        return self.seq

    def _apply(self, message: CounterBatch) -> None:
        # Every other message as the ingest applies it: decoded as it does (a delta checked,
        # still packed) and held as its wire bytes.
        if message.seq % 2:
            wire = codec.encode(message)
            self.fleet.apply_counters(codec.decode_counters(wire), self.now, wire)
        else:
            self.fleet.apply_counters(message, self.now)

    @rule(name=st.sampled_from(NODES), data=st.data())
    def full(self, name: str, data: st.DataObject) -> None:
        ports = [make_port(d, p, data.draw(port_values())) for d, p in PORTS]
        full = msgspec.structs.replace(batch(name, *ports, at=self.now), seq=self._next())
        self.bases[name] = full
        self._apply(full)

    @rule(name=st.sampled_from(NODES), data=st.data(), count=st.integers(1, 3), full=st.booleans())
    def deltas_in_one_cycle(self, name: str, data: st.DataObject, count: int, full: bool) -> None:
        """Deltas on the node's last full batch (with `full`, a new one first), applied
        before the next evaluation: it never sees their base."""
        if full:
            self.full(name, data)
        for _ in range(count):
            base = self.bases.get(name)
            if base is None:
                return
            edits = data.draw(st.lists(port_values(), min_size=2, max_size=2))
            ports = tuple(changed_port(p, e) for p, e in zip(base.ports, edits, strict=True))
            current = msgspec.structs.replace(base, seq=self._next(), ports=ports)
            delta = delta_against(base, current)
            assert delta is not None
            self._apply(delta)

    @rule(name=st.sampled_from(NODES), data=st.data())
    def snapshot(self, name: str, data: st.DataObject) -> None:
        self.fleet.apply_snapshot(data.draw(snapshots(name, self._next(), self.now)), self.now)

    @rule(name=st.sampled_from(NODES), up=st.booleans())
    def event(self, name: str, up: bool) -> None:
        state: PortStateName
        state, phys = ("ACTIVE", "LinkUp") if up else ("DOWN", "Disabled")
        event = port_event(name, new=state, phys=phys, seq=self._next(), observed_at=self.now)
        self.fleet.apply_event(event, self.now)

    @rule(name=st.sampled_from(NODES))
    def remove(self, name: str) -> None:
        self.fleet = Fleet(r for r in self.fleet.records() if r.name != name)
        self.bases.pop(name, None)

    @rule(step=st.sampled_from((0.0, 1.0, 40.0)))
    def tick(self, step: float) -> None:
        self.now += step

    @invariant()
    def same_as_full(self) -> None:
        found = self.incremental.evaluate(self.fleet.view(), now=self.now)
        assert found == evaluate(erased(self.fleet), now=self.now)


Machine.TestCase.settings = settings(
    max_examples=80,
    stateful_step_count=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestDeltasEqualFull = Machine.TestCase


def _record(base_seq: int | None, delta: frozenset[str] | None, seq: int = 5) -> NodeRecord:
    counters = batch("n", port_counters())
    return NodeRecord(
        name="n",
        counters_held=HeldCounters.of(msgspec.structs.replace(counters, seq=seq)),
        counters_base_seq=base_seq,
        counters_delta=delta,
        first_seen=T0,
        last_seen=T0,
    )


def test_counter_inputs_are_the_same_only_when_known_and_disjoint() -> None:
    keys = COUNTER_KEYS["counter-errors"]
    busy = frozenset({"rx_bytes", "counters/port_xmit_data"})
    full = _record(4, frozenset(), seq=4)
    assert same_counter_inputs(full, _record(4, busy), keys)  # a delta on that base
    assert same_counter_inputs(_record(4, busy), _record(4, frozenset()), keys)
    assert not same_counter_inputs(full, _record(4, busy | {"counters/symbol_error"}), keys)
    assert not same_counter_inputs(_record(4, busy | {"counters/symbol_error"}), full, keys)
    assert not same_counter_inputs(full, _record(3, busy), keys)  # another base
    assert not same_counter_inputs(full, _record(None, None), keys)  # unknown
    assert not same_counter_inputs(_record(4, None), _record(4, busy), keys)
    assert not same_counter_inputs(None, _record(4, busy), keys)
    # A new full batch is read again, even under the seq of the old one (agent restart).
    assert not same_counter_inputs(full, _record(4, frozenset(), seq=4), keys)
    assert same_counter_inputs(full, full, keys)


def test_every_counter_rule_declares_keys_the_catalog_knows() -> None:
    assert set(COUNTER_KEYS) == {"counter-errors", "retries-exceeded", "cc-misconfigured",
                                 "link-flap"}  # fmt: skip
    assert all(keys and all("/" in k for k in keys) for keys in COUNTER_KEYS.values())


@pytest.mark.parametrize(
    ("rates", "counters"),
    [
        ({"rx_bytes": 1e6}, {}),  # busy, fine
        ({"rx_bytes": math.nan}, {}),
        ({"rx_bytes": math.inf, "counters/port_xmit_data": 5.0}, {}),
        ({"counters/port_xmit_data": -1.0}, {}),
        ({}, {"link_downed": -2}),  # a negative counter without a rate
        ({"counters/link_downed": 0.0}, {"link_downed": -2}),  # ... with a fine rate
        ({"counters/symbol_error": 50.0}, {"symbol_error": 9}),  # an error counter moves
        ({"hw_counters/rp_cnp_ignored": 3.0}, {}),
    ],
)
def test_a_delta_over_a_clean_base_is_judged_like_the_full_batch(
    rates: dict[str, float], counters: dict[str, int]
) -> None:
    fleet, incremental = Fleet(), IncrementalRules()
    clean = {"rx_bytes": 0.0, "counters/port_xmit_data": 0.0, "counters/symbol_error": 0.0}
    ports = [port_counters(d, p, rates=clean, counters={"link_downed": 0}) for d, p in PORTS]
    base = msgspec.structs.replace(batch("n0", *ports), seq=10)
    fleet.apply_counters(base, T0)
    assert incremental.evaluate(fleet.view(), now=T0) == evaluate(erased(fleet), now=T0)
    changed = tuple(
        msgspec.structs.replace(p, rates=p.rates | rates, counters=p.counters | counters)
        for p in base.ports
    )
    delta = delta_against(base, msgspec.structs.replace(base, seq=11, ports=changed))
    assert delta is not None
    record = fleet.apply_counters(delta, T0 + 1).record
    assert record.counters_delta is not None  # the delta path is the one judged
    found = incremental.evaluate(fleet.view(), now=T0 + 1)
    assert found == evaluate(erased(fleet), now=T0 + 1)
