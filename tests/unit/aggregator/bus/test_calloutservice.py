"""The callout responder's log under a flood of bad tokens: every refusal reaches the
metric hook, one line per reason per minute reaches the log (naming how many were not)."""

from __future__ import annotations

import logging
import os

import nkeys
import pytest

from aggregator.bus.authcallout import Decision, Refused, Reviewed
from aggregator.bus.calloutservice import REFUSAL_LOG_EVERY_S, CalloutResponder
from tests.unit.aggregator.bus.test_authcallout import NOW, SETTINGS, keypair, signed_request


async def never_reviewed(token: str, audiences: tuple[str, ...]) -> Reviewed:
    raise AssertionError("a malformed token needs no TokenReview")


async def test_a_flood_of_bad_tokens_is_counted_whole_and_logged_once_a_minute(
    caplog: pytest.LogCaptureFixture,
) -> None:
    now = [NOW]
    decisions: list[Decision] = []
    responder = CalloutResponder(
        settings=SETTINGS,
        review=never_reviewed,
        issuer_seed=nkeys.encode_seed(os.urandom(32), nkeys.PREFIX_BYTE_ACCOUNT).decode(),
        wall_clock=lambda: now[0],
        on_decision=decisions.append,
    )
    request = signed_request(keypair(nkeys.PREFIX_BYTE_SERVER)).encode()
    caplog.set_level(logging.WARNING, logger="aggregator.bus.calloutservice")

    for _ in range(50):
        assert await responder.answer(request) is not None  # a signed refusal, every time
    lines = [r.getMessage() for r in caplog.records]
    assert len(decisions) == 50 and all(isinstance(d, Refused) for d in decisions)
    assert len(lines) == 1 and "refused NATS join" in lines[0] and "malformed" in lines[0]

    now[0] += REFUSAL_LOG_EVERY_S
    fresh = signed_request(keypair(nkeys.PREFIX_BYTE_SERVER), exp=now[0] + 2)
    assert await responder.answer(fresh.encode()) is not None
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2 and "49 more refusals for this reason not logged" in lines[1]
