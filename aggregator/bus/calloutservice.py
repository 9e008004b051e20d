"""The auth-callout responder: answers nats-server's `$SYS.REQ.USER.AUTH` requests for
agents joining with their projected ServiceAccount token (docs/security.md).

Owns the I/O around `authcallout`: one TokenReview per token at a time through an injected
`review`, answers cached by the token's SHA-256 until min(TTL, the token's `exp`), one log
line per refusal (never the token) and an `on_decision` hook for the metric. A review that
cannot be made refuses the join and is not cached. Stopping it refuses new connections;
the server keeps the ones it admitted.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import nkeys

from aggregator.bus import authcallout
from aggregator.bus.authcallout import Decision, JoinSettings, Reason, Refused, Reviewed
from aggregator.bus.permissions import agent_permissions
from aggregator.errors import KubeError
from aggregator.reviewmemo import ReviewMemo
from proto.runtime.natsconnect import NatsClientSecurity, NatsSecurityError

log = logging.getLogger(__name__)

AUTH_SUBJECT: Final = "$SYS.REQ.USER.AUTH"
MAX_CACHED: Final = 16384
# nats-server gives the callout 2 s per request: with 1,000 joins at once and a 20 ms
# TokenReview, 64 at a time answer the last one in ~0.3 s (bench/agent_join.py).
MAX_CONCURRENT_REVIEWS: Final = 64
REFUSAL_LOG_EVERY_S: Final = 60.0

Review = Callable[[str, tuple[str, ...]], Awaitable[Reviewed]]
# Several aggregator replicas answer as one: the server takes one answer per request.
QUEUE_GROUP: Final = "nicfleet-auth-callout"


@dataclass(frozen=True, kw_only=True)
class CalloutSettings:
    """`run --nats-callout-*`: who may join, the key that signs the answers and the
    credentials of the responder's own connection (`nats-auth --auth-callout` writes both)."""

    join: JoinSettings
    issuer_seed_file: Path
    security: NatsClientSecurity


def read_issuer_seed(path: Path) -> str:
    """The account seed (SA...) in `path`; NatsSecurityError naming the flag if not."""
    flag = "--nats-callout-issuer-seed-file"
    try:
        seed = path.read_text().strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise NatsSecurityError(flag, path, str(exc)) from exc
    try:
        authcallout.issuer_public_key(seed)
    except ValueError as exc:
        raise NatsSecurityError(flag, path, str(exc)) from exc
    return seed


class CalloutResponder:
    """Turns authorization requests into signed answers; `serve` runs it on a connection."""

    def __init__(
        self,
        *,
        settings: JoinSettings,
        review: Review,
        issuer_seed: str,
        wall_clock: Callable[[], float],  # Unix seconds: JWT `iat`/`exp` are wall time
        partitioned: bool = False,
        on_decision: Callable[[Decision], None] = lambda _decision: None,
    ) -> None:
        self.settings = settings
        self._review = review
        self._signer = nkeys.from_seed(bytearray(issuer_seed.encode()))
        self.issuer = authcallout.issuer_public_key(issuer_seed)
        self._clock = wall_clock
        self._partitioned = partitioned
        self._on_decision = on_decision
        self._memo: ReviewMemo[Decision] = ReviewMemo(MAX_CACHED, clock=wall_clock)
        self._slots = asyncio.Semaphore(MAX_CONCURRENT_REVIEWS)
        self.reviews = 0  # calls made to `review`
        # Per refusal reason: when it was last logged, and how many were not logged since.
        self._refusals_logged: dict[Reason, tuple[float, int]] = {}

    def _log_refusal(self, request: authcallout.AuthRequest, decision: Refused, now: float) -> None:
        """One line per reason per REFUSAL_LOG_EVERY_S (a flood of bad tokens must not flood
        the log: the metric counts every one), naming how many were not logged."""
        last, quiet = self._refusals_logged.get(decision.reason, (None, 0))
        if last is not None and now - last < REFUSAL_LOG_EVERY_S:
            self._refusals_logged[decision.reason] = (last, quiet + 1)
            return
        self._refusals_logged[decision.reason] = (now, 0)
        log.warning(
            "refused NATS join from %s (client %r): %s: %s%s",
            request.client_host or "?",
            request.client_name,
            decision.reason,
            decision.message,
            f" ({quiet} more refusals for this reason not logged)" if quiet else "",
        )

    def __repr__(self) -> str:
        return f"CalloutResponder(issuer={self.issuer}, cached={len(self._memo.cache)})"

    async def answer(self, data: bytes) -> bytes | None:
        """The response JWT for one request; None for a message that is no request."""
        now = self._clock()
        try:
            request = authcallout.decode_request(data, now=now)
        except authcallout.CalloutRequestError as exc:
            log.warning("ignored a message on %s: %s", AUTH_SUBJECT, exc)
            return None
        decision = await self.decide(request.token)
        self._on_decision(decision)
        if isinstance(decision, Refused):
            self._log_refusal(request, decision, now)
            text = authcallout.response_jwt(
                request, issuer=self.issuer, signer=self._signer, now=now, error=decision.message
            )
        else:
            permissions = agent_permissions(decision.node, partitioned=self._partitioned)
            user = authcallout.user_jwt(
                request,
                decision.node,
                permissions,
                issuer=self.issuer,
                signer=self._signer,
                now=now,
            )
            text = authcallout.response_jwt(
                request, issuer=self.issuer, signer=self._signer, now=now, user=user
            )
        return text.encode()

    async def decide(self, token: str) -> Decision:
        if not token:
            return Refused(Reason.NO_TOKEN, "no token in CONNECT (and no NKey user matched)")
        now = self._clock()
        claims = authcallout.token_claims(token)
        early = authcallout.precheck(claims, self.settings, now=now)
        if early is not None or claims is None:
            return early or Refused(Reason.MALFORMED, "the token is not a ServiceAccount JWT")

        def trusted_until(decision: Decision, now: float) -> float | None:
            if isinstance(decision, Refused) and decision.reason is Reason.UNAVAILABLE:
                return None  # the review could not be made: ask again next time
            return authcallout.cache_until(decision, claims, self.settings, now=now)

        return await self._memo.decide(
            token,
            lambda: self._ask(token, claims),
            trusted_until,
            Refused(Reason.UNAVAILABLE, "token review interrupted"),
        )

    async def _ask(self, token: str, claims: authcallout.TokenClaims) -> Decision:
        async with self._slots:
            self.reviews += 1
            try:
                reviewed = await self._review(token, (self.settings.audience,))
            except KubeError as exc:
                return Refused(Reason.UNAVAILABLE, f"cannot verify the token: {exc}")
        return authcallout.decide(reviewed, claims, self.settings)

    async def serve(
        self, nc: Any, stop: asyncio.Event, *, ready: asyncio.Event | None = None
    ) -> None:
        """Answer requests on `nc` (a connected nats.aio.client.Client) until `stop`;
        `ready` is set once the server knows the subscription.

        Each request is its own task, so 1,000 agents joining at once wait on TokenReview
        together, not one after another.
        """
        async with asyncio.TaskGroup() as tasks:

            async def handle(msg: Any) -> None:
                tasks.create_task(self._reply(msg))

            sub = await nc.subscribe(AUTH_SUBJECT, queue=QUEUE_GROUP, cb=handle)
            await nc.flush()
            if ready is not None:
                ready.set()
            try:
                await stop.wait()
            finally:
                await sub.unsubscribe()

    async def _reply(self, msg: Any) -> None:
        answer = await self.answer(msg.data)
        if answer is None or not msg.reply:
            return
        try:
            await msg.respond(answer)
        except Exception as exc:  # a lost connection: the server times the join out
            log.warning("cannot answer an auth callout request: %s", exc)
