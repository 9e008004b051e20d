"""aggregator.bus.claimanswer.check_request: a claim request is answered only for the
node its subject names, only into that node's inbox."""

from __future__ import annotations

import pytest

from aggregator.bus.claimanswer import Refusal, check_request

GET = "nicfleet.v1.draclaims.gpu-01.get"


@pytest.mark.parametrize(
    ("subject", "reply", "expected"),
    [
        pytest.param(GET, "_INBOX.gpu-01.abc.1", "gpu-01", id="own-inbox"),
        pytest.param(
            "nicfleet.v1.draclaims.rack1_gpu-01.get", "_INBOX.rack1_gpu-01.x", "rack1.gpu-01",
            id="dotted-node",
        ),
        pytest.param(GET, "_INBOX.gpu-02.abc", Refusal.REPLY, id="another-nodes-inbox"),
        pytest.param(GET, "_INBOX.gpu-01", Refusal.REPLY, id="the-bare-prefix"),
        pytest.param(GET, "_INBOX.gpu-01.*", Refusal.REPLY, id="wildcard-reply"),
        pytest.param(GET, "_INBOX.gpu-01.>", Refusal.REPLY, id="full-wildcard-reply"),
        pytest.param(GET, "_INBOX.gpu-01..x", Refusal.REPLY, id="empty-token"),
        pytest.param(GET, "nicfleet.v1.control.resync", Refusal.REPLY, id="resync-subject"),
        pytest.param(
            GET, "nicfleet.v1.alert.critical.port-down.gpu-01", Refusal.REPLY, id="alert-subject"
        ),
        pytest.param(GET, "", Refusal.REPLY, id="no-reply"),
        pytest.param(GET, None, Refusal.REPLY, id="none-reply"),
        pytest.param(
            "nicfleet.v1.desired.gpu-01.get", "_INBOX.gpu-01.a", Refusal.SUBJECT,
            id="desired-subject",
        ),
        pytest.param("nicfleet.v1.draclaims.GPU.get", "_INBOX.GPU.a", Refusal.SUBJECT,
                     id="not-a-node-name"),
        pytest.param("nicfleet.v1.draclaims.gpu-01", "_INBOX.gpu-01.a", Refusal.SUBJECT,
                     id="no-get"),
    ],
)  # fmt: skip
def test_check_request(subject: str, reply: str | None, expected: str | Refusal) -> None:
    assert check_request(subject, reply) == expected
