"""API tokens checked by Kubernetes TokenReview: pure `result_from_review`/`decide` (identity
+ settings → scope or refusal), a bounded TTL cache keyed by the token's SHA-256, and
`TokenReviewer`: one review per token at a time through an injected `review` function. Fails
closed (a KubeError is `Unavailable`, a 503); no token is kept, logged or shown.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Final, Literal

from aggregator.errors import KubeError
from aggregator.kube.objects import TokenReviewResult
from aggregator.reviewmemo import DecisionCache, ReviewMemo, token_key

Scope = Literal["read", "admin"]
DEFAULT_READ_GROUPS: Final = ("nicfleet:readers",)
DEFAULT_ADMIN_GROUPS: Final = ("nicfleet:admins",)
RBAC_HINT: Final = (
    " (the aggregator needs 'create' on tokenreviews.authentication.k8s.io,"
    " e.g. the ClusterRole system:auth-delegator)"
)

Review = Callable[[str, tuple[str, ...]], Awaitable["TokenReviewResult"]]


@dataclass(frozen=True, kw_only=True)
class ReviewSettings:
    """Who gets which scope (admin implies read) and how long answers are trusted."""

    read_groups: tuple[str, ...] = DEFAULT_READ_GROUPS
    admin_groups: tuple[str, ...] = DEFAULT_ADMIN_GROUPS
    read_users: tuple[str, ...] = ()
    admin_users: tuple[str, ...] = ()
    audiences: tuple[str, ...] = ()  # () : tokens for the API server's own audience
    positive_ttl_s: float = 60.0  # authenticated answers (allowed or forbidden)
    negative_ttl_s: float = 10.0  # unauthenticated answers
    max_entries: int = 4096
    max_concurrent_reviews: int = 16


@dataclass(frozen=True)
class Allowed:
    scope: Scope
    username: str


@dataclass(frozen=True)
class Refused:
    """401 (`unauthenticated`) or 403 (`forbidden`); `message` names the user, never the token."""

    kind: Literal["unauthenticated", "forbidden"]
    message: str


@dataclass(frozen=True)
class Unavailable:
    """The review could not be made (API server down, RBAC missing): a 503, not cached."""

    message: str


Decision = Allowed | Refused | Unavailable


class ReviewCache(DecisionCache[Allowed | Refused]):
    """API decisions by token SHA-256 (never the token itself): aggregator/reviewmemo.py."""


def decide(result: TokenReviewResult, settings: ReviewSettings) -> Allowed | Refused:
    """The scope a reviewed identity gets, or why it gets none."""
    if not result.authenticated or not result.username:
        why = f": {result.error}" if result.error else ""
        return Refused("unauthenticated", f"invalid bearer token (TokenReview{why})")
    wanted = settings.audiences
    # An empty status.audiences means "valid for the API server" — not for us when we asked.
    if wanted and not set(wanted) & set(result.audiences):
        return Refused("unauthenticated", f"token is not issued for audience {' or '.join(wanted)}")
    groups = set(result.groups)
    if result.username in settings.admin_users or groups & set(settings.admin_groups):
        return Allowed("admin", result.username)
    if result.username in settings.read_users or groups & set(settings.read_groups):
        return Allowed("read", result.username)
    allowed = sorted({*settings.read_groups, *settings.admin_groups})
    return Refused(
        "forbidden",
        f"authenticated as {result.username} but not allowed: "
        f"not in any of the groups {allowed} nor a listed user",
    )


__all__ = ["ReviewCache", "TokenReviewer", "decide", "token_key"]


class TokenReviewer:
    """Decides bearer tokens via `review`: cached, one call per token at a time, bounded."""

    def __init__(
        self,
        review: Review,
        settings: ReviewSettings,
        *,
        clock: Callable[[], float],  # monotonic seconds
    ) -> None:
        self._review = review
        self.settings = settings
        self._clock = clock
        self._memo: ReviewMemo[Decision] = ReviewMemo(settings.max_entries, clock=clock)
        self.cache = self._memo.cache
        self._slots = asyncio.Semaphore(settings.max_concurrent_reviews)
        self.reviews = 0  # calls made to `review`

    def __repr__(self) -> str:
        return f"TokenReviewer(cached={len(self.cache)}, inflight={self._memo.inflight})"

    async def authenticate(self, token: str) -> Decision:
        return await self._memo.decide(
            token,
            lambda: self._ask(token),
            self._trusted_until,
            Unavailable("token review interrupted"),
        )

    def _trusted_until(self, decision: Decision, now: float) -> float | None:
        """Failures are never cached; unauthenticated answers expire sooner."""
        if isinstance(decision, Unavailable):
            return None
        if isinstance(decision, Refused) and decision.kind == "unauthenticated":
            return now + self.settings.negative_ttl_s
        return now + self.settings.positive_ttl_s

    async def _ask(self, token: str) -> Decision:
        async with self._slots:
            self.reviews += 1
            try:
                result = await self._review(token, self.settings.audiences)
            except KubeError as exc:
                hint = RBAC_HINT if exc.status in (401, 403) else ""
                return Unavailable(f"cannot verify the token: {exc}{hint}")
        return decide(result, self.settings)
