"""The char-devices link on a node whose RDMA subsystem is in exclusive netns mode: a shared
resource is broken (a pod with its own netns gets EPERM opening uverbs), an exclusive
resource holds with a note, shared and unknown modes change nothing but the evidence."""

from __future__ import annotations

import msgspec
import pytest

from aggregator.trace.chain import trace
from proto.http import Link, Trace
from proto.inventory import Platform, RdmaNetnsMode
from proto.policy import Policy
from tests.support.builders import rdma_policy
from tests.unit.aggregator.trace.test_trace import HEALTHY, NODE, RES


def _trace(mode: RdmaNetnsMode | None, policy: Policy | None = None) -> Trace:
    fleet = HEALTHY.fleet()
    record = fleet[NODE]
    assert record.snapshot is not None
    snap = msgspec.structs.replace(record.snapshot, platform=Platform(rdma_netns_mode=mode))
    fleet[NODE] = msgspec.structs.replace(record, snapshot=snap)
    return trace(
        NODE,
        RES,
        fleet=fleet,
        cluster=HEALTHY.cluster(),
        policies=(policy,) if policy is not None else HEALTHY.policies,
        now=HEALTHY.now,
        stale_after=30.0,
        validation=HEALTHY.validation,
    )


def _char_devices(result: Trace) -> Link:
    return next(link for link in result.links if link.name == "char-devices")


def test_exclusive_mode_breaks_a_shared_resource() -> None:
    result = _trace("exclusive")
    link = _char_devices(result)
    assert link.status == "broken"
    assert result.first_broken is not None and result.links[result.first_broken] == link
    assert link.cause is not None
    assert "exclusive netns mode" in link.cause and "EPERM" in link.cause
    assert RES in link.cause and "hostNetwork" in link.cause
    assert link.fix is not None and "netns_mode=0" in link.fix and "rdma-cni" in link.fix
    assert link.evidence["rdma_netns_mode"] == "exclusive"


def _exclusive_policy() -> Policy:
    policy = rdma_policy("ib", RES)
    plugin = policy.spec.rdma_shared_device_plugin
    assert plugin is not None
    configs = tuple(msgspec.structs.replace(c, exclusive=True) for c in plugin.config_list)
    spec = msgspec.structs.replace(
        policy.spec, rdma_shared_device_plugin=msgspec.structs.replace(plugin, config_list=configs)
    )
    return msgspec.structs.replace(policy, spec=spec)


def test_exclusive_mode_holds_for_an_exclusive_resource_with_a_note() -> None:
    link = _char_devices(_trace("exclusive", _exclusive_policy()))
    assert link.status == "ok"
    assert "rdma-cni" in link.evidence["note"]


@pytest.mark.parametrize("mode", ["shared", None])
def test_shared_or_unknown_mode_keeps_the_link(mode: RdmaNetnsMode | None) -> None:
    result = _trace(mode)
    link = _char_devices(result)
    assert link.status == "ok"
    assert link.evidence["rdma_netns_mode"] == mode
    assert result.verdict == HEALTHY.trace().verdict
