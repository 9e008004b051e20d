"""The rules' shortcuts answer exactly what the slow path does: GID subnets parsed without
`ipaddress`, the per-node memo (reused only for the same object and variant), and the
memoised snapshot problems of `data-quality` when only counters change."""

from __future__ import annotations

import msgspec
from hypothesis import given
from hypothesis import strategies as st

from aggregator.cluster import NO_CLUSTER
from aggregator.fleet.state import Fleet
from aggregator.rules.dataquality import check_data_quality
from aggregator.rules.descriptor import RuleInput
from aggregator.rules.engine.registry import evaluate
from aggregator.rules.fleetpolicy import _gid_subnet, _parsed_gid_subnet
from aggregator.rules.nodememo import NodeMemo
from aggregator.rules.thresholds import DEFAULT_THRESHOLDS
from tests.support.rules_cases import T0, adapter, batch, node, port_counters, roce

GROUPS = st.sampled_from(("0000", "ffff", "FFFF", "fFfF", "fe80", "0a00", "c0a8", "01fe"))
GIDS = st.one_of(
    st.lists(GROUPS | st.from_regex(r"[0-9a-fA-F]{4}", fullmatch=True), min_size=8, max_size=8).map(
        ":".join
    ),
    st.sampled_from(
        ("::ffff:10.1.2.3", "fe80::1", "::", "zzzz", "", "0000:0000:0000:0000:0000:ffff:0a00")
    ),
    st.text(max_size=40),
)


@given(gid=GIDS, infiniband=st.booleans())
def test_gid_subnets_without_ipaddress_are_those_of_ipaddress(gid: str, infiniband: bool) -> None:
    assert _gid_subnet(gid, infiniband) == _parsed_gid_subnet(gid, infiniband)


def test_a_roce_gid_names_its_ipv4_slash_24_and_an_infiniband_gid_its_prefix() -> None:
    assert _gid_subnet("0000:0000:0000:0000:0000:ffff:0a01:0205", False) == "10.1.2.0/24"
    assert _gid_subnet("fe80:0000:0000:0000:58a2:e103:001b:2576", True) == "fe80:0000:0000:0000"
    assert _gid_subnet("fe80:0000:0000:0000:58a2:e103:001b:2576", False) is None


def test_the_node_memo_reuses_a_value_only_for_the_same_object_and_variant() -> None:
    memo: NodeMemo[int] = NodeMemo()
    calls: list[str] = []

    def compute(tag: str) -> int:
        calls.append(tag)
        return len(calls)

    first, equal_copy = ["a"], ["a"]
    assert memo.get("n1", first, None, lambda: compute("1")) == 1
    assert memo.get("n1", first, None, lambda: compute("2")) == 1  # same object: reused
    assert memo.get("n1", equal_copy, None, lambda: compute("3")) == 2  # equal, not same
    assert memo.get("n1", equal_copy, "Ethernet", lambda: compute("4")) == 3  # variant
    assert memo.get("n2", equal_copy, "Ethernet", lambda: compute("5")) == 4  # other node
    assert calls == ["1", "3", "4", "5"]


def test_data_quality_is_the_same_when_only_counters_change() -> None:
    fleet = Fleet()
    bad = msgspec.structs.replace(adapter(), fw_ver="bogus")
    fleet.apply_snapshot(node("n1", bad, roce("mlx5_1", "0000:1a:00.0", "10.0.0.5", mtu=0)), T0)
    args = ((), NO_CLUSTER, T0, DEFAULT_THRESHOLDS)
    before = check_data_quality(RuleInput(fleet.view(), *args))
    assert {f.subject for f in before} == {"mlx5_0", "mlx5_1"}
    for seq, rate in ((2, float("nan")), (3, 1.0)):
        b = batch("n1", port_counters(rates={"counters/symbol_error": rate}))
        fleet.apply_counters(msgspec.structs.replace(b, seq=seq), T0)
        again = check_data_quality(RuleInput(fleet.view(), *args))
        assert again == [f for f in evaluate(fleet.view(), now=T0) if f.rule == "data-quality"]
        assert {f.subject for f in again} == {"mlx5_0", "mlx5_1"} | (
            {"mlx5_0/1"} if seq == 2 else set()
        )
    fixed = node("n1", adapter(), roce("mlx5_1", "0000:1a:00.0", "10.0.0.5", mtu=0), seq=4)
    fleet.apply_snapshot(fixed, T0)  # a new snapshot object: its problems are read again
    assert {f.subject for f in check_data_quality(RuleInput(fleet.view(), *args))} == {"mlx5_1"}
