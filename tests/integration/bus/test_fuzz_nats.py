"""Hostile NATS payloads: hypothesis feeds the aggregator's Ingest (and the agent's desired
config updates and decoder) valid messages of every kind, random bytes, truncations, type confusion,
deep nesting, huge arrays, oversize payloads, bad subjects and node mismatches. Nothing
raises, every rejection is counted by reason, good messages around bad ones all apply."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass

import httpx
import msgspec
import nats
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry

from agent.bus.desired import DesiredConfigWatcher
from agent.bus.desiredorder import Via
from aggregator.bus.natsserver import NatsServer
from aggregator.fleet.ingest import Ingest
from aggregator.fleet.state import Fleet, Ignored
from aggregator.metrics import Metrics
from aggregator.service import AggregatorService, AggregatorSettings
from proto import subjects
from proto.codec import MAX_PAYLOAD, decode, encode
from proto.dpconfig import validate_device_plugin_config
from proto.inventory import NodeSnapshot
from proto.messages.config import (
    DesiredConfig,
    DesiredUpdate,
    DevicePluginConfig,
    ResourceConfig,
    Selectors,
)
from proto.messages.counters import CounterBatch
from proto.messages.events import LinkEvent
from proto.messages.status import DevicePluginStatus
from tests.support import builders
from tests.support.builders import T0
from tests.support.waits import wait_until

NODE = "fuzz-01"
TYPES: dict[str, type[msgspec.Struct]] = {
    subjects.SNAPSHOT: NodeSnapshot,
    subjects.COUNTERS: CounterBatch,
    subjects.EVENT: LinkEvent,
    subjects.STATUS: DevicePluginStatus,
}
FUZZ = settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))


@dataclass
class Rig:
    fleet: Fleet
    metrics: Metrics
    ingest: Ingest
    persisted: list[NodeSnapshot]

    def count(self, name: str, **labels: str) -> float:
        value = self.metrics.registry.get_sample_value(name, labels)
        return value or 0.0

    def total(self, name: str) -> float:
        return sum(
            s.value
            for metric in self.metrics.registry.collect()
            for s in metric.samples
            if s.name == name
        )


def rig() -> Rig:
    fleet = Fleet()
    metrics = Metrics.create(CollectorRegistry())
    persisted: list[NodeSnapshot] = []
    ingest = Ingest(
        fleet=fleet,
        metrics=metrics,
        clock=lambda: T0,
        on_snapshot=lambda snap, _now: persisted.append(snap),
    )
    return Rig(fleet, metrics, ingest, persisted)


def subject(kind: str, node: str = NODE) -> str:
    return subjects.node_subject(node, kind)


def encodable(message: msgspec.Struct) -> bytes:
    try:
        return encode(message)
    except (OverflowError, msgspec.EncodeError, TypeError):  # ints beyond 64 bits
        assume(False)
        raise AssertionError("unreachable") from None


def valid_message(kind: str, node: str = NODE) -> st.SearchStrategy[bytes]:
    cls = TYPES[kind]
    return st.from_type(cls).map(lambda m: msgspec.structs.replace(m, node=node)).map(encodable)


KIND = st.sampled_from(subjects.NODE_KINDS)


def nested(depth: int, *, as_map: bool) -> bytes:
    """{"x": {"x": ... nil}} or [[... nil]] `depth` levels deep, as raw msgpack."""
    return (b"\x81\xa1x" if as_map else b"\x91") * depth + b"\xc0"


def tagged_with(kind: str, field: bytes, body: bytes) -> bytes:
    """A map with the right schema tag plus one extra field whose value is `body`."""
    tag = TYPES[kind].__struct_config__.tag
    assert isinstance(tag, str)
    return b"\x82" + msgspec.msgpack.encode("schema") + msgspec.msgpack.encode(tag) + field + body


@st.composite
def hostile(draw: st.DrawFn) -> tuple[str, bytes, str]:
    """(subject, payload, reason it must be rejected for)."""
    kind = draw(KIND)
    case = draw(
        st.sampled_from(
            ["bytes", "truncated", "confused", "deep", "huge", "oversize", "subject", "mismatch"]
        )
    )
    if case == "bytes":
        data = draw(st.binary(max_size=512))
        assume(data[:1] not in (b"\x80",))  # {} could only fail later for missing fields anyway
        return subject(kind), data, "decode"
    if case == "truncated":
        full = draw(valid_message(kind))
        cut = draw(st.integers(0, len(full) - 1))
        return subject(kind), full[:cut], "decode"
    if case == "confused":
        other = draw(st.sampled_from([k for k in subjects.NODE_KINDS if k != kind]))
        return subject(kind), draw(valid_message(other)), "decode"
    if case == "deep":
        depth = draw(st.sampled_from([1_000, 10_000, 100_000]))
        body = nested(depth, as_map=draw(st.booleans()))
        where = draw(st.sampled_from([b"\xa5extra", b"\xa4node", b"\xa7devices"]))
        return (
            subject(kind),
            draw(st.sampled_from([body, tagged_with(kind, where, body)])),
            "decode",
        )
    if case == "huge":
        count = draw(st.sampled_from([100_000, 2**32 - 1]))
        # array32 header claiming `count` items, followed by far fewer (or none)
        items = b"\xc0" * draw(st.sampled_from([0, 1000, 100_000]))
        body = b"\xdd" + count.to_bytes(4, "big") + items
        return subject(kind), tagged_with(kind, b"\xa7devices", body), "decode"
    if case == "oversize":
        return subject(kind), b"\x90" * (MAX_PAYLOAD + draw(st.integers(1, 4096))), "decode"
    if case == "subject":
        bad = draw(
            st.one_of(
                st.text(max_size=80),
                st.sampled_from(
                    [
                        f"{subjects.PREFIX}.node.{NODE}.bogus",
                        f"{subjects.PREFIX}.node.UPPER.snapshot",
                        f"{subjects.PREFIX}.node.-x.counters",
                        f"{subjects.PREFIX}.node..event",
                        f"{subjects.PREFIX}.node.{NODE}.status.extra",
                        f"nicfleet.v2.node.{NODE}.snapshot",
                        f"{subjects.PREFIX}.node.{'a' * 300}.snapshot",
                    ]
                ),
            )
        )
        return bad, draw(valid_message(kind)), "subject"
    other = draw(st.sampled_from(["fuzz-02", "gpu-001", "a.b.c"]))
    return subject(kind), draw(valid_message(kind, other)), "node-mismatch"


@FUZZ
@given(kind=KIND, data=st.data())
def test_valid_messages_of_every_kind_are_accepted_or_ignored_never_raise(
    kind: str, data: st.DataObject
) -> None:
    r = rig()
    payload = data.draw(valid_message(kind))
    assert r.ingest.handle(subject(kind), payload) is True
    # Applied, or ignored with a reason (a random counter delta has no base): counted once.
    applied = r.count("nicfleet_ingest_messages_total", kind=kind)
    ignored = sum(
        r.count("nicfleet_ingest_ignored_total", kind=kind, reason=reason.value)
        for reason in Ignored
    )
    assert applied + ignored == 1
    assert r.fleet.get(NODE) is not None


@FUZZ
@given(case=hostile())
def test_hostile_message_is_rejected_and_counted_by_reason(case: tuple[str, bytes, str]) -> None:
    sub, payload, reason = case
    r = rig()
    r.ingest.handle(subject(subjects.SNAPSHOT), encode(builders.snapshot(NODE)))
    before = r.fleet.get(NODE)
    assert r.ingest.handle(sub, payload) is False
    kind = sub.rsplit(".", 1)[-1] if reason != "subject" else "unknown"
    assert r.count("nicfleet_ingest_rejected_total", kind=kind, reason=reason) == 1
    assert r.total("nicfleet_ingest_rejected_total") == 1
    assert r.fleet.get(NODE) is before  # nothing stored is touched
    assert len(r.persisted) == 1


@pytest.mark.parametrize("kind", subjects.NODE_KINDS)
@pytest.mark.parametrize("as_map", [True, False])
def test_nesting_deeper_than_the_decoder_follows_is_a_decode_rejection(
    kind: str, as_map: bool
) -> None:
    # Regression: msgspec raised RecursionError (not DecodeError) on ~100k levels inside
    # a skipped unknown field, which escaped Ingest.handle.
    r = rig()
    payload = tagged_with(kind, b"\xa5extra", nested(200_000, as_map=as_map))
    assert r.ingest.handle(subject(kind), payload) is False
    assert r.count("nicfleet_ingest_rejected_total", kind=kind, reason="decode") == 1


@FUZZ
@given(subject_=st.text(max_size=100), payload=st.binary(max_size=256))
def test_any_subject_and_bytes_are_accepted_or_counted(subject_: str, payload: bytes) -> None:
    r = rig()
    accepted = r.ingest.handle(subject_, payload)
    seen = r.total("nicfleet_ingest_messages_total") + r.total("nicfleet_ingest_rejected_total")
    assert seen == 1
    assert accepted == (r.total("nicfleet_ingest_messages_total") == 1)


def good_stream(count: int) -> list[tuple[str, bytes]]:
    """Snapshots, counters, events and statuses for two nodes, each newer than the last."""
    out: list[tuple[str, bytes]] = []
    for i in range(count):
        node = ("fuzz-01", "fuzz-02")[i % 2]
        seq = i + 1
        at = T0 + i
        kind = subjects.NODE_KINDS[i % 4]
        message: msgspec.Struct
        if kind == subjects.SNAPSHOT:
            message = builders.snapshot(node, seq=seq, collected_at=at, gpus=2)
        elif kind == subjects.COUNTERS:
            message = builders.counters(node, seq=seq, collected_at=at, rx=i)
        elif kind == subjects.EVENT:
            message = builders.port_event(
                node, seq=seq, observed_at=at, new="DOWN" if i % 3 else "ACTIVE"
            )
        else:
            message = builders.plugin_status(node, builders.resource_status(), observed_at=at)
        out.append((subject(kind, node), encode(message)))
    return out


@FUZZ
@given(
    good=st.integers(4, 24).map(good_stream),
    bad=st.lists(hostile(), max_size=12),
    data=st.data(),
)
def test_good_messages_interleaved_with_bad_ones_are_all_applied(
    good: list[tuple[str, bytes]], bad: list[tuple[str, bytes, str]], data: st.DataObject
) -> None:
    positions = sorted(data.draw(st.lists(st.integers(0, len(good)), min_size=len(bad))))
    mixed: list[tuple[str, bytes, bool]] = [(s, p, True) for s, p in good]
    for offset, (pos, (sub, payload, _)) in enumerate(zip(positions, bad, strict=False)):
        mixed.insert(pos + offset, (sub, payload, False))
    clean, dirty = rig(), rig()
    for sub, payload in good:
        assert clean.ingest.handle(sub, payload)
    for sub, payload, is_good in mixed:
        assert dirty.ingest.handle(sub, payload) is is_good
    assert dirty.fleet.records() == clean.fleet.records()
    assert dirty.persisted == clean.persisted
    assert dirty.total("nicfleet_ingest_rejected_total") == len(bad)
    assert dirty.total("nicfleet_ingest_messages_total") == len(good)


# --- the agent's consumed input: DesiredConfig from KV, in a DesiredUpdate -------------


def good_desired(generation: int) -> bytes:
    resource = ResourceConfig(
        resource_name="ib_a", rdma_hca_max=8, selectors=Selectors(vendors=("15b3",))
    )
    return encode(
        DesiredConfig(
            node=NODE,
            generation=generation,
            device_plugin=DevicePluginConfig(config_list=(resource,)),
        )
    )


def hostile_desired() -> st.SearchStrategy[bytes]:
    valid = good_desired(1)
    return st.one_of(
        st.binary(max_size=512),
        st.integers(0, len(valid) - 1).map(lambda cut: valid[:cut]),
        st.from_type(DesiredConfig).map(encodable),  # random, usually invalid, values
        st.from_type(DesiredConfig)
        .map(lambda m: msgspec.structs.replace(m, node=NODE))
        .map(encodable),
        valid_message(subjects.SNAPSHOT),  # type confusion
        st.sampled_from(["deep", "oversize"]).map(big_payload),  # no huge strategy repr
    )


def big_payload(which: str) -> bytes:
    return nested(100_000, as_map=True) if which == "deep" else b"\x90" * (MAX_PAYLOAD + 1)


def update(revision: int, config: bytes | None, node: str = NODE) -> bytes:
    return encode(DesiredUpdate(node=node, revision=revision, config=config))


def hostile_message() -> st.SearchStrategy[tuple[str, bytes]]:
    """What may arrive on the node's desired subject: a KV value that is garbage inside a
    well-formed update (the aggregator relays the KV as it is), garbage instead of the
    update itself, or an update for another node."""
    return st.one_of(
        hostile_desired().map(lambda b: ("inner", b)),
        hostile_desired().map(lambda b: ("whole", b)),
        st.just(("other-node", good_desired(9))),
    )


def wire(revision: int, kind: str, payload: bytes) -> bytes:
    if kind == "inner":
        return update(revision, payload)
    if kind == "other-node":
        return update(revision, payload, node="fuzz-02")
    return payload


def watcher(on_config: Callable[[DesiredConfig | None], None]) -> DesiredConfigWatcher:
    return DesiredConfigWatcher(node=NODE, url="nats://127.0.0.1:1", on_config=on_config)


@FUZZ
@given(payload=hostile_desired())
def test_desired_config_garbage_is_rejected_or_fully_valid(payload: bytes) -> None:
    for via in Via:
        w = watcher(lambda _c: None)
        config = w._decode(payload)
        if config is None:
            assert w.rejected == 1
        else:  # only a config that passes the agent's own validator gets through
            assert config.node == NODE
            validate_device_plugin_config(config.device_plugin, source="test")
        handed: list[DesiredConfig | None] = []
        w = watcher(handed.append)
        w._receive(update(1, payload), via)  # the same bytes as a relayed KV value
        assert handed == ([] if config is None else [config])
        assert w.rejected == (1 if config is None else 0)


@settings(FUZZ, max_examples=15)
@given(
    bad=st.lists(hostile_message(), min_size=1, max_size=5),
    slots=st.lists(st.integers(0, 8), min_size=3, max_size=3),
)
def test_garbage_in_kv_never_reaches_the_device_plugin(
    bad: list[tuple[str, bytes]], slots: list[int]
) -> None:
    applied: list[DesiredConfig | None] = []
    w = watcher(applied.append)
    goods = [good_desired(g) for g in (1, 2, 3)]
    stream: list[tuple[str, bytes]] = list(bad)
    last = -1
    for good, slot in zip(goods, slots, strict=True):
        last = max(min(slot, len(stream)), last + 1)
        stream.insert(last, ("inner", good))
    for revision, (kind, payload) in enumerate(stream, start=1):  # as announced, in order
        w._receive(wire(revision, kind, payload), Via.ANNOUNCED)
    wanted = [decode(g, DesiredConfig) for g in goods]
    assert [c for c in applied if c in wanted] == wanted  # garbage may be valid, never lost
    for config in applied:
        assert config is not None and config.node == NODE
        validate_device_plugin_config(config.device_plugin, source="test")
    assert w.rejected == len(stream) - len(applied)


# --- through a real nats-server into a running aggregator ------------------------------


def burst(nodes: int = 10, rounds: int = 25) -> tuple[list[tuple[str, bytes]], int, int]:
    """~500 messages: per round, a counter batch per node plus one bad message per node."""
    messages: list[tuple[str, bytes]] = []
    good = bad = 0
    junk: list[tuple[str, bytes]] = [
        (subject(subjects.COUNTERS, "burst-00"), b"\xff\x00garbage"),
        (subject(subjects.COUNTERS, "burst-00"), encode(builders.snapshot("burst-00"))),
        (subject(subjects.SNAPSHOT, "burst-00"), nested(50_000, as_map=True)),
        (subject(subjects.STATUS, "burst-00"), encode(builders.counters("burst-01"))),
        (f"{subjects.PREFIX}.node.BAD.snapshot", encode(builders.snapshot("burst-00"))),
        (subject(subjects.EVENT, "burst-00"), encode(builders.port_event())[:-3]),
    ]
    for r in range(rounds):
        for n in range(nodes):
            node = f"burst-{n:02d}"
            if r == 0:
                messages.append((subject(subjects.SNAPSHOT, node), encode(builders.snapshot(node))))
                good += 1
            batch = builders.counters(node, seq=r + 1, collected_at=T0 + r, rx=r)
            messages.append((subject(subjects.COUNTERS, node), encode(batch)))
            messages.append(junk[(r * nodes + n) % len(junk)])
            good += 1
            bad += 1
    return messages, good, bad


def metric(service: AggregatorService, name: str) -> float:
    return sum(
        s.value for m in service.metrics.registry.collect() for s in m.samples if s.name == name
    )


@pytest.mark.integration
async def test_burst_of_mixed_messages_through_nats(nats_server: NatsServer) -> None:
    service = AggregatorService(
        AggregatorSettings(nats_url=nats_server.url, listen_host="127.0.0.1", listen_port=0)
    )
    messages, good, bad = burst()
    stop = asyncio.Event()
    async with asyncio.TaskGroup() as tasks:
        tasks.create_task(service.run(stop))
        try:
            await asyncio.wait_for(service.ready.wait(), timeout=15)
            base_ok = metric(service, "nicfleet_ingest_messages_total")
            base_bad = metric(service, "nicfleet_ingest_rejected_total")
            nc = await nats.connect(nats_server.url)
            try:
                for sub, payload in messages:
                    await nc.publish(sub, payload)
                await nc.flush()
            finally:
                await nc.close()

            def all_in() -> bool:
                ok = metric(service, "nicfleet_ingest_messages_total") - base_ok
                rejected = metric(service, "nicfleet_ingest_rejected_total") - base_bad
                return ok == good and rejected == bad

            await wait_until(all_in, what="every message counted", timeout=20)
            for n in range(10):
                record = service.fleet.get(f"burst-{n:02d}")
                assert record is not None and record.snapshot is not None
                assert record.counters is not None and record.counters.seq == 25
            async with httpx.AsyncClient(base_url=service.api_url or "") as client:
                assert (await client.get("/healthz")).status_code == 200
                listing = (await client.get("/api/v1/nodes")).json()
            names = {item["name"] for item in listing["items"]}
            assert {f"burst-{n:02d}" for n in range(10)} <= names
        finally:
            stop.set()
