"""check_request: a desired-config request is answered only into the asking node's inbox."""

from __future__ import annotations

import pytest

from aggregator.bus.desiredanswer import Refusal, check_request

GET_A = "nicfleet.v1.desired.node-a.get"


@pytest.mark.parametrize(
    ("subject", "reply", "expected"),
    [
        pytest.param(GET_A, "_INBOX.node-a.x1Y2.3", "node-a", id="own-inbox"),
        pytest.param(
            "nicfleet.v1.desired.rack1_gpu-01.get",
            "_INBOX.rack1_gpu-01.abc",
            "rack1.gpu-01",
            id="dotted-node",
        ),
        pytest.param(GET_A, "_INBOX.node-b.x1Y2.3", Refusal.REPLY, id="another-nodes-inbox"),
        pytest.param(GET_A, "_INBOX.node-ab.x", Refusal.REPLY, id="inbox-prefix-of-another"),
        pytest.param(GET_A, "_INBOX.node-a", Refusal.REPLY, id="bare-prefix"),
        pytest.param(GET_A, "_INBOX.node-a.", Refusal.REPLY, id="empty-token"),
        pytest.param(GET_A, "_INBOX.node-a.>", Refusal.REPLY, id="wildcard-full"),
        pytest.param(GET_A, "_INBOX.node-a.*.x", Refusal.REPLY, id="wildcard-token"),
        pytest.param(GET_A, "_INBOX.node-a.a..b", Refusal.REPLY, id="empty-middle-token"),
        pytest.param(GET_A, "_INBOX.node-a.a b", Refusal.REPLY, id="whitespace"),
        pytest.param(GET_A, "", Refusal.REPLY, id="no-reply"),
        pytest.param(GET_A, "nicfleet.v1.node.node-b.snapshot", Refusal.REPLY, id="node-subject"),
        pytest.param(
            GET_A, "nicfleet.v1.alert.critical.port-down.node-a", Refusal.REPLY, id="alert"
        ),
        pytest.param(GET_A, "nicfleet.v1.control.resync", Refusal.REPLY, id="resync"),
        pytest.param("nicfleet.v1.desired.node-a", "_INBOX.node-a.x", Refusal.SUBJECT, id="push"),
        pytest.param("nicfleet.v1.desired.NODE.get", "_INBOX.NODE.x", Refusal.SUBJECT, id="bad"),
        pytest.param("nicfleet.v1.desired.a.b.get", "_INBOX.a.x", Refusal.SUBJECT, id="tokens"),
    ],
)
def test_check_request(subject: str, reply: str, expected: str | Refusal) -> None:
    assert check_request(subject, reply) == expected
