"""Publishes one ValidationResult on `nicfleet.v1.validation.<id>` and waits until the
server has it (flush), within a deadline. Used by `verify` inside validation pods.

Owns a short-lived NATS connection of its own; knows nothing about evidence.
"""

from __future__ import annotations

import asyncio
import contextlib
import time

import nats
from nats.errors import Error as NatsError

from agent.errors import AgentError
from proto import subjects
from proto.codec import encode
from proto.messages.validation import ValidationResult
from proto.runtime.natsconnect import NatsClientSecurity, connect_options
from proto.runtime.natsflush import flush_in_order


class PublishFailed(AgentError):
    """The result could not be delivered to NATS before the deadline."""


async def _quiet(exc: Exception) -> None:
    """Connection errors end up in PublishFailed; nats.py would log each one."""


async def publish_result(
    result: ValidationResult, *, url: str, security: NatsClientSecurity, timeout: float
) -> str:
    """Publish and flush; returns the subject. Raises PublishFailed."""
    if result.validation_id is None:
        raise PublishFailed("the result carries no validation id")
    subject = subjects.validation_subject(result.validation_id)
    deadline = time.monotonic() + timeout
    last: Exception | None = None
    while (left := deadline - time.monotonic()) > 0:
        try:
            connecting = nats.connect(
                url,
                name=f"nicfleet-verify/{result.validation_id}",
                connect_timeout=max(1, int(left)),
                allow_reconnect=False,
                max_reconnect_attempts=0,
                error_cb=_quiet,
                **connect_options(security),
            )
            # nats.connect can keep retrying a refused first connect; the deadline rules.
            nc = await asyncio.wait_for(connecting, left)
        except (TimeoutError, OSError, NatsError) as exc:
            last = exc
            await asyncio.sleep(min(0.5, left))  # retry back-off, bounded by the deadline
            continue
        try:
            await nc.publish(subject, encode(result))
            await flush_in_order(nc, timeout=deadline - time.monotonic())
            return subject
        except (TimeoutError, OSError, NatsError) as exc:
            raise PublishFailed(f"publishing on {subject} failed: {exc}") from exc
        finally:
            with contextlib.suppress(TimeoutError, OSError, NatsError):
                await nc.close()
    raise PublishFailed(f"cannot reach NATS at {url} within {timeout:g} s: {last}")
